"""The engine process killed during a refit, and a killed engine's error line (issue 45, items 7
and 8a), with the real client and engine server around a stand-in for vLLM
(``tests/unit/rollout/fake_vllm``, put on the engine's ``PYTHONPATH`` only): each engine start is a
real process, killed with SIGKILL as the OOM killer would."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fastrl.config import ModelConfig
from fastrl.models.tiny import build_tiny_text_model_dir
from fastrl.rollout.engine_client import EngineProcessClient
from fastrl.rollout.engine_process import EngineError

FAKE_VLLM = Path(__file__).with_name("fake_vllm")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    small = ModelConfig(tiny_hidden_size=64, tiny_num_layers=1, tiny_intermediate_size=128)
    return build_tiny_text_model_dir(tmp_path_factory.mktemp("restart") / "tiny_text", small)


def _client(model_dir: Path, tmp_path: Path, retries: int) -> EngineProcessClient:
    return EngineProcessClient(
        model_dir, python=sys.executable, timeout_s=60, startup_timeout_s=120, restart_retries=retries,
        bucket_bytes=16 * 1024, log_path=tmp_path / "engine.log",
        env={"PYTHONPATH": str(FAKE_VLLM), "FAKE_VLLM_DUMP": str(tmp_path / "loaded.pt"), "OMP_NUM_THREADS": "1"},
    )


def _kill(client: EngineProcessClient) -> int:
    pid = client.proc.pid
    os.kill(pid, signal.SIGKILL)
    client.proc.wait(timeout=30)
    return pid


def _refit(model_dir: Path, offset: float) -> list[tuple[str, torch.Tensor]]:
    return [(name, t + offset) for name, t in sorted(load_file(str(model_dir / "model.safetensors")).items())]


def _killed_midway(client: EngineProcessClient, weights: list[tuple[str, torch.Tensor]]):
    """The weight stream of a refit, killing the engine when half of it has been consumed."""
    for i, item in enumerate(weights):
        if i == len(weights) // 2:
            _kill(client)
        yield item


def test_engine_killed_during_a_refit_is_restarted_and_gets_the_refit(model_dir, tmp_path, caplog):
    """catches: a refit that only generate's restart covers (the kill raised EngineError out of the
    refit with rollout.engine_restart_retries=1), a restart that replays the previous refit's
    weights or only the buckets sent before the kill, or one that leaves the engine at the old
    weight version (every later generate refused as stale)."""
    client = _client(model_dir, tmp_path, retries=1)
    try:
        client.update_weights(iter(_refit(model_dir, 1.0)))
        first_pid = client.proc.pid
        refit2 = _refit(model_dir, 2.0)
        with caplog.at_level(logging.WARNING, logger="fastrl.rollout"):
            assert client.update_weights(_killed_midway(client, refit2)) == len(refit2)
        assert client.proc.pid != first_pid and client.proc.poll() is None  # a new engine process
        assert "restarting the engine and replaying refit 2" in caplog.text and "killed by signal 9" in caplog.text
        assert client.weight_version == 2 and client.loaded_weight_version() == 2
        loaded = torch.load(tmp_path / "loaded.pt")
        assert sorted(loaded) == [name for name, _ in refit2]
        for name, t in refit2:
            assert torch.equal(loaded[name], t), name  # exactly refit 2, every tensor
    finally:
        client.shutdown()


def test_without_restarts_a_refit_kill_is_an_error_and_the_version_stays(model_dir, tmp_path):
    """catches: a refit that restarts the engine although rollout.engine_restart_retries=0, or that
    counts a refit the engine never got."""
    client = _client(model_dir, tmp_path, retries=0)
    try:
        with pytest.raises(EngineError, match=r"killed by signal 9"):
            client.update_weights(_killed_midway(client, _refit(model_dir, 1.0)))
        assert client.weight_version == 0
    finally:
        client.shutdown()


def test_killed_engine_error_does_not_quote_its_benign_start_up_error_lines(model_dir, tmp_path):
    """catches: the log tail of an engine killed after start-up quoting vLLM's start-up ERROR lines
    ("[repo_utils.py:126] Error parsing config for .../tokenizer ...", logged by every healthy tiny
    engine) as the cause of its death."""
    client = _client(model_dir, tmp_path, retries=0)
    try:
        assert "Error parsing config" in (tmp_path / "engine.log").read_text()  # the premise
        pid = _kill(client)
        with pytest.raises(EngineError) as err:
            client.health()
        text = str(err.value)
        assert f"pid {pid}" in text and "killed by signal 9" in text
        assert "repo_utils" not in text and "Error parsing config" not in text, text
        assert "log tail: <nothing logged since start-up>" in text
    finally:
        client.shutdown()
