"""The warm-start cache: one builder per key; concurrent callers wait for it and reuse its result."""

import json
import threading

from fastrl.config import WarmStartConfig
from fastrl.data import Record
from fastrl.models.cache_lock import exclusive_lock
from fastrl.training import warm_start
from fastrl.training.warm_start import run_warm_start, warm_start_key

RECORDS = [Record(question_id=0, problem="what color is the shape?", answer="red")]


def _finished_entry(tmp_path, cfg: WarmStartConfig):
    """A base model stamp and a complete cache entry (stamp written) for it; returns (base, root, key)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    root = tmp_path / "warm_start"
    key = warm_start_key(base, cfg, "tpl", 56, 3)
    (root / key).mkdir(parents=True)
    (root / key / warm_start._STAMP).write_text(json.dumps({"key": key, "metrics": {"warm_start/seconds": 41.5}}))
    return base, root, key


def test_a_finished_entry_is_reused_without_training(tmp_path, monkeypatch):
    cfg = WarmStartConfig()
    base, root, key = _finished_entry(tmp_path, cfg)
    monkeypatch.setattr(warm_start, "_train_and_save", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    out, metrics = run_warm_start(base, root, RECORDS, cfg, template="tpl", image_size=56, seed=3)
    assert out == root / key
    assert metrics == {"warm_start/seconds": 41.5, "warm_start/cached": 1.0}


def test_a_caller_waits_while_another_process_holds_the_key(tmp_path):
    cfg = WarmStartConfig()
    base, root, key = _finished_entry(tmp_path, cfg)
    results = []
    with exclusive_lock(root / f".{key}.lock"):  # a builder holding the key (flock: per open file)
        caller = threading.Thread(
            target=lambda: results.append(run_warm_start(base, root, RECORDS, cfg, template="tpl", image_size=56, seed=3))
        )
        caller.start()
        caller.join(timeout=1.0)
        assert caller.is_alive() and results == []  # blocked on the lock, not reading a half-written entry
    caller.join(timeout=30)
    assert not caller.is_alive()
    assert results == [(root / key, {"warm_start/seconds": 41.5, "warm_start/cached": 1.0})]


def test_the_second_of_two_callers_reuses_what_the_first_built(tmp_path, monkeypatch):
    cfg = WarmStartConfig()
    base, root, key = _finished_entry(tmp_path, cfg)
    (root / key / warm_start._STAMP).unlink()  # nothing built yet
    builds = []

    def build(base_dir, out, key_, records, cfg_, **kwargs):
        builds.append(key_)
        (out / warm_start._STAMP).write_text(json.dumps({"key": key_, "metrics": {"warm_start/seconds": 7.0}}))
        return {"warm_start/seconds": 7.0}

    monkeypatch.setattr(warm_start, "_train_and_save", build)
    first = run_warm_start(base, root, RECORDS, cfg, template="tpl", image_size=56, seed=3)
    second = run_warm_start(base, root, RECORDS, cfg, template="tpl", image_size=56, seed=3)
    assert builds == [key]
    assert first == (root / key, {"warm_start/seconds": 7.0})
    assert second == (root / key, {"warm_start/seconds": 7.0, "warm_start/cached": 1.0})
