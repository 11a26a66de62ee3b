"""Data-file errors come first in start-up order, before the trainer's heavy imports, the process
group and the model build (issue 45, item 8c)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

DRIVER = """
import sys
from fastrl.train import main
rc = main(sys.argv[1:])
print("HEAVY", sorted(m for m in ("fastrl.training.trainer", "megatron.core", "fastrl.models.provider") if m in sys.modules))
sys.exit(rc)
"""


def _start(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", DRIVER, "--recipe", "qwen2_tiny_text_fastrl_grpo_vllm_cpu",
           f"logging.output_dir={tmp_path / 'runs'}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_and_bad_data_files_fail_before_the_heavy_start_up(tmp_path):
    """catches: the data loaded inside build_parts, after the trainer's imports (megatron-core,
    megatron-bridge: 13 s idle, 26-42 s on a loaded machine) and the process group: the user waited
    for them before reading that the file does not exist."""
    missing = _start(tmp_path, f"data.train_path={tmp_path / 'nope.jsonl'}")
    assert missing.returncode == 1, missing.stderr[-2000:]
    assert f"fastrl.train: error: DataError: data path {tmp_path / 'nope.jsonl'} does not exist" in missing.stderr
    assert "HEAVY []" in missing.stdout, missing.stdout[-2000:]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "2 + 2?", "answer": "4"}) + "\n" + json.dumps({"problem": "x", "answer": ""}) + "\n")
    proc = _start(tmp_path, f"data.train_path={bad}")
    assert proc.returncode == 1 and f"{bad} row 1 (line 2) column 'answer'" in proc.stderr, proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout
