"""bench/actor_step.py on the CPU: the tiny policy is measured, FP8 is reported as not measured."""

import json
import os
import subprocess
import sys

from tests.functional.conftest import REPO


def test_actor_step_table_on_cpu(tmp_path):
    cmd = [
        sys.executable, "bench/actor_step.py", "--models", "tiny", "--precisions", "fp32,fp8", "--rollouts", "4",
        "--micro-batch", "2", "--prompt-len", "8", "--response-len", "8", "--repeats", "1", "--out", str(tmp_path),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "actor_step.json").read_text())
    fp32, fp8 = result["rows"]
    assert fp32["status"] == "measured" and fp32["tokens_per_step"] == 4 * 16
    assert 3e6 < fp32["parameters"] < 4e6
    assert fp32["update_tokens_per_s"] > 0 and fp32["logprob_tokens_per_s"] > 0 and fp32["update_ratio"] == 1.0
    assert fp32["peak_memory_bytes"] > 0
    # never a silent bf16 run under the FP8 name
    assert fp8["status"].startswith("not measured") and "Transformer Engine" in fp8["status"]
    table = (tmp_path / "actor_step.md").read_text()
    assert "| tiny |" in table and "not measured" in table
