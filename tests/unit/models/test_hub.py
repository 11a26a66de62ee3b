"""``model.hf_path`` as a hub id: resolved offline in a cache this test builds in the hub's on-disk
layout (``models--Org--Name/refs/main``, ``snapshots/<sha>/``, ``blobs/``), and the one-line error for
an id that is not there (trainer and ``tools/convert_checkpoint.py import --hf``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fastrl.config import ModelConfig, RunConfig
from fastrl.models.hub import ModelNotAvailableError, hub_cache_dir, is_hub_id, resolve_model_dir
from fastrl.models.memory_plan import model_dims
from fastrl.training.policy_source import prepare_policy_dir

SHA = "0123456789abcdef0123456789abcdef01234567"
CONFIG = {
    "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300, "tie_word_embeddings": False,
}


def add_to_cache(hub: Path, repo_id: str, files: dict[str, bytes], sha: str = SHA) -> Path:
    """Write ``files`` as the hub does: blobs by content hash, snapshot entries linking to them,
    ``refs/main`` naming the snapshot. Returns the snapshot directory."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(sha)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob.name)
    return snapshot


@pytest.fixture
def offline_hf_home(tmp_path, monkeypatch) -> Path:
    """HF_HOME in tmp_path, offline, with Org/Tiny-Model in its cache; returns the snapshot."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return add_to_cache(tmp_path / "hf" / "hub", "Org/Tiny-Model", {
        "config.json": json.dumps(CONFIG).encode(), "model.safetensors": b"not really weights",
    })


def test_hub_id_resolves_to_its_cached_snapshot_offline(offline_hf_home):
    assert hub_cache_dir() == offline_hf_home.parents[2]
    path = resolve_model_dir("Org/Tiny-Model")
    assert path == offline_hf_home
    assert json.loads((path / "config.json").read_text())["hidden_size"] == 64
    assert resolve_model_dir("Org/Tiny-Model", revision=SHA) == offline_hf_home  # a commit pins the snapshot


def test_hf_hub_cache_takes_precedence_over_hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = add_to_cache(tmp_path / "cache", "Org/Other", {"config.json": b"{}"})
    assert resolve_model_dir("Org/Other") == snapshot


def test_local_directory_is_returned_as_it_is(tmp_path, offline_hf_home):
    (tmp_path / "Org" / "Tiny-Model").mkdir(parents=True)
    assert resolve_model_dir(tmp_path) == tmp_path
    assert resolve_model_dir(str(tmp_path)) == tmp_path


def test_missing_id_offline_is_one_line_with_the_download_command(offline_hf_home):
    with pytest.raises(ModelNotAvailableError) as err:
        resolve_model_dir("Qwen/Qwen2.5-VL-7B-Instruct")
    text = str(err.value)
    assert "\n" not in text
    assert "Qwen/Qwen2.5-VL-7B-Instruct" in text and "HF_HUB_OFFLINE=1" in text
    assert "hf download Qwen/Qwen2.5-VL-7B-Instruct" in text
    assert "huggingface-cli download Qwen/Qwen2.5-VL-7B-Instruct" in text
    assert str(offline_hf_home.parents[2]) in text  # the cache it looked in
    assert isinstance(err.value, FileNotFoundError)


def test_not_a_directory_and_not_an_id(offline_hf_home, tmp_path):
    for bad in (str(tmp_path / "missing" / "dir"), "./relative/missing", "no-slash-at-all"):
        assert not is_hub_id(bad)
        with pytest.raises(ModelNotAvailableError, match="does not exist"):
            resolve_model_dir(bad)


def test_snapshot_without_config_is_refused(tmp_path, offline_hf_home):
    add_to_cache(offline_hf_home.parents[2], "Org/Partial", {"tokenizer.json": b"{}"})
    with pytest.raises(ModelNotAvailableError, match="no config.json.*hf download Org/Partial"):
        resolve_model_dir("Org/Partial")


def test_trainer_starts_from_a_hub_id(offline_hf_home):
    cfg = RunConfig(model=ModelConfig(source="hf", hf_path="Org/Tiny-Model", architecture="qwen2"))
    path, metrics = prepare_policy_dir(cfg, train=[])
    assert (path, metrics) == (offline_hf_home, {})
    # the memory plan reads the counts of the cached config too, without downloading
    assert model_dims(cfg.model).hidden_size == 64
    missing = RunConfig(model=ModelConfig(source="hf", hf_path="Org/Missing", architecture="qwen2"))
    with pytest.raises(ModelNotAvailableError, match="hf download Org/Missing"):
        prepare_policy_dir(missing, train=[])


def test_convert_checkpoint_import_names_the_missing_id(offline_hf_home, tmp_path, capsys):
    import tools.convert_checkpoint as tool

    assert tool.main(["import", "--hf", "Org/Missing", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("convert_checkpoint: error: model Org/Missing is not a local directory, nor in the Hugging Face cache")
    assert "hf download Org/Missing" in err
    assert not (tmp_path / "out").exists()
