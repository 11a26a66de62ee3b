"""bench/actor_step.py on the CPU: the tiny policy is measured with an image per prompt (the vision
tower runs), FP8 is reported as not measured, rows are written as they are measured, and a failing
configuration is recorded as a row with its error instead of ending the benchmark."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.functional.conftest import REPO


def _module():
    spec = importlib.util.spec_from_file_location("actor_step_bench", REPO / "bench" / "actor_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_actor_step_table_on_cpu(tmp_path):
    cmd = [
        sys.executable, "bench/actor_step.py", "--models", "tiny", "--precisions", "fp32,fp8", "--rollouts", "4",
        "--micro-batch", "2", "--prompt-len", "10", "--response-len", "8", "--image-size", "56", "--repeats", "1",
        "--out", str(tmp_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "actor_step.json").read_text())
    fp32, fp8 = result["rows"]
    assert fp32["status"] == "measured" and fp32["tokens_per_step"] == 4 * 18
    assert fp32["image_tokens_per_rollout"] == 4  # a 56x56 image: 2x2 merged patches
    assert 3e6 < fp32["parameters"] < 4e6
    assert fp32["update_tokens_per_s"] > 0 and fp32["logprob_tokens_per_s"] > 0 and fp32["update_ratio"] == 1.0
    assert fp32["peak_memory_bytes"] > 0 and fp32["update_tflops"] > 0 and fp32["update_mfu"] is None  # no peak on CPU
    # never a silent bf16 run under the FP8 name
    assert fp8["status"].startswith("not measured") and "Transformer Engine" in fp8["status"]
    table = (tmp_path / "actor_step.md").read_text()
    assert "| tiny |" in table and "not measured" in table and "one 56x56 image per prompt" in table
    streamed = [json.loads(line) for line in (tmp_path / "actor_step.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in streamed] == ["fp32", "fp8"]


def test_prompt_must_hold_the_image():
    bench = _module()
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompt-len", "10", "--image-size", "224"])  # 64 image tokens
    assert bench.parse_args(["--prompt-len", "67", "--image-size", "224"]).image_size == 224


def test_failed_rows_are_recorded_and_every_row_is_written_at_once(tmp_path, monkeypatch):
    bench = _module()
    calls = []

    def fake_measure(name, precision, args, cache):
        calls.append((name, precision))
        if name == "1b":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if precision == "fp8":
            raise ValueError("shape mismatch")
        return {"model": name, "precision": precision, "status": "measured", "parameters": 1e6,
                "logprob_tokens_per_s": 10.0, "update_tokens_per_s": 5.0, "update_mfu": 0.5,
                "peak_memory_bytes": 2**30}

    monkeypatch.setattr(bench, "measure", fake_measure)
    writer = bench.RowWriter(tmp_path, "test device", "settings")
    for name, precision in [("tiny", "bf16"), ("tiny", "fp8"), ("1b", "bf16")]:
        writer.add(bench.measure_or_record_failure(name, precision, None, tmp_path))
        lines = (tmp_path / "actor_step.jsonl").read_text().splitlines()
        assert len(lines) == len(writer.rows)  # on disk before the next configuration starts
    rows = [json.loads(line) for line in lines]
    assert rows[0]["status"] == "measured"
    assert rows[1]["status"] == "failed: ValueError: shape mismatch"
    assert rows[2]["status"].startswith("failed: out of memory: OutOfMemoryError: CUDA out of memory")
    assert "Traceback" in rows[2]["traceback"]
    table = (tmp_path / "actor_step.md").read_text()
    assert "| 1b | | bf16 | failed: out of memory" in table and "| 50.0% |" in table
    assert calls == [("tiny", "bf16"), ("tiny", "fp8"), ("1b", "bf16")]
