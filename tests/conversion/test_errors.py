"""Damaged checkpoints and bad arguments give a clear one-line error naming the file, exit status 1,
and no traceback from inside torch or megatron.

Errors found before the model-parallel group starts are tested by calling the CLI's ``main`` in
this process; the one found while megatron loads runs the CLI in a subprocess."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_tool

pytestmark = pytest.mark.distributed


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def assert_clean_failure(proc, *fragments: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("convert_checkpoint: error:")]
    assert len(error) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in error[0], error[0]


def export(ckpt: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture | None = None):
    """The CLI's export; in this process with ``capsys`` (only for errors found before megatron starts)."""
    args = ["export", "--ckpt", str(ckpt), "--out", str(out), "--no-progress", *extra]
    if capsys is None:
        return run_tool("convert_checkpoint", *args)
    from tools.convert_checkpoint import main

    capsys.readouterr()
    code = main(args)
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


@pytest.fixture()
def damaged(imported_tp1: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(imported_tp1, copy)
    return copy


def test_truncated_data_file(damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    data = damaged / "actor" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert_clean_failure(export(damaged, tmp_path / "out"), "actor/__0_0.distcp", "truncated")
    assert not (tmp_path / "out").exists()


def test_missing_data_file(damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    (damaged / "actor" / "__0_1.distcp").unlink()
    assert_clean_failure(export(damaged, tmp_path / "out"), "actor/__0_1.distcp", "missing")


def test_corrupted_index_file_of_the_same_size(damaged: Path, tmp_path: Path):
    """Same size, so the COMPLETE marker cannot notice: the index is read before megatron loads."""
    index = damaged / "actor" / ".metadata"
    index.write_bytes(b"\x00" * index.stat().st_size)
    assert_clean_failure(export(damaged, tmp_path / "out"), "actor/.metadata", "corrupted")
    assert not (tmp_path / "out").exists()


def test_interrupted_save_without_marker(damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    (damaged / "COMPLETE").unlink()
    assert_clean_failure(export(damaged, tmp_path / "out"), str(damaged), "COMPLETE marker")


def test_checkpoint_root_without_complete_step(damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    root = tmp_path / "checkpoints"
    step = root / "step_00000005"
    shutil.copytree(damaged, step)
    (step / "COMPLETE").write_text("{not json")
    assert_clean_failure(export(root, tmp_path / "out"), "step_00000005", "unreadable COMPLETE marker")
    assert_clean_failure(export(root, tmp_path / "out", "--step", "7"), "step_00000007", "does not exist")


def test_corrupted_train_state(trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    """A trainer checkpoint whose train_state.pt (read for the run's model config) is garbage."""
    step = tmp_path / "step_00000001"
    shutil.copytree(trained_run / "checkpoints" / "step_00000001", step)
    state = step / "train_state.pt"
    state.write_bytes(b"\x13" * state.stat().st_size)
    assert_clean_failure(export(step, tmp_path / "out"), "train_state.pt", "corrupted")


def test_existing_output_and_wrong_process_count(imported_tp1: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "out").mkdir()
    assert_clean_failure(export(imported_tp1, tmp_path / "out"), "already exists")
    assert_clean_failure(export(imported_tp1, tmp_path / "new", "--tp", "2"), "--tp 2", "1 processes")
    assert json.loads((imported_tp1 / "COMPLETE").read_text())["kind"] == "import"


def test_import_from_a_directory_that_is_not_a_model(tied_hf: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    from tools.convert_checkpoint import main

    def run_import(src: Path) -> Result:
        capsys.readouterr()
        code = main(["import", "--hf", str(src), "--out", str(tmp_path / "out")])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    assert_clean_failure(run_import(tmp_path / "missing"), "missing does not exist", "a hub id")
    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()
    assert_clean_failure(run_import(not_a_model), "not_a_model/config.json does not exist")
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(tied_hf / "config.json", config_only / "config.json")
    assert_clean_failure(run_import(config_only), "holds no safetensors weights")
    assert not (tmp_path / "out").exists()


def test_untied_model_without_lm_head_is_refused():
    """An export that lost the output layer of an untied model fails instead of writing a model that
    transformers would fill with a random head."""
    from types import SimpleNamespace

    import torch

    from fastrl.models.conversion import ConversionError, hf_weights

    def stream(chunks, cpu=True, show_progress=False):
        yield "model.embed_tokens.weight", torch.zeros(4, 2)

    policy = SimpleNamespace(chunks=[], bridge=SimpleNamespace(export_hf_weights=stream))
    with pytest.raises(ConversionError, match="no lm_head.weight was exported"):
        list(hf_weights(policy, {"tie_word_embeddings": False}, dtype=torch.float32))
    tied = list(hf_weights(policy, {"text_config": {"tie_word_embeddings": True}}, dtype=torch.float32))
    assert [name for name, _ in tied] == ["model.embed_tokens.weight"]

    def stream_with_head(chunks, cpu=True, show_progress=False):
        yield "model.embed_tokens.weight", torch.zeros(4, 2)
        yield "lm_head.weight", torch.ones(4, 2)

    policy = SimpleNamespace(chunks=[], bridge=SimpleNamespace(export_hf_weights=stream_with_head))
    with pytest.raises(ConversionError, match="tie_word_embeddings=true"):
        list(hf_weights(policy, {"tie_word_embeddings": True}, dtype=torch.float32))
