"""``trainer.val_only=true``: validate the starting policy (and evaluate it on the held-out test
split when ``data.test_size`` asks for it) and exit, without training or saving."""

import pytest

from tests.functional.conftest import read_jsonl, run_train

pytestmark = pytest.mark.functional


def test_val_only_validates_and_trains_nothing(tmp_path):
    proc = run_train(tmp_path, "trainer.val_only=true", "data.test_size=12")
    run_dir = tmp_path / "easyvqa_tiny_fastrl_grpo_cpu"
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["kind"] for r in records if r["kind"] in ("train", "val", "test")] == ["val", "test"]
    val = next(r for r in records if r["kind"] == "val")
    assert val["step"] == 0 and val["val/questions"] == 16
    assert 0.0 <= val["val/accuracy"] <= 1.0
    # the test split's own questions (a test evaluation of the validation records would count 16)
    test = next(r for r in records if r["kind"] == "test")
    assert test["step"] == 0 and test["test/questions"] == 12 and not any(k.startswith("val/") for k in test)
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert not (run_dir / "FINISHED").exists()
    assert "validation @ step 0" in proc.stdout + proc.stderr
    assert "held-out test @ step 0" in proc.stdout + proc.stderr
