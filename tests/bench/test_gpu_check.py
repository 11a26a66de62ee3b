"""bench/gpu_check.sh / gpu_check.py on the CPU: argument handling, the table, and the CPU smoke run
of the same entry (tiny sizes, gloo) that the GPU machine runs at full size."""

import importlib.util
import json
import os
import re
import subprocess
import sys

from tests.functional.conftest import REPO


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check_bench", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def test_dry_run_prints_the_gpu_commands():
    proc = subprocess.run(["bench/gpu_check.sh", "--dry-run"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    actor, train, ipc, timeline = proc.stdout.strip().splitlines()
    assert actor.startswith("actor_step (limit 180 s):") and "--models tiny,1b --precisions bf16,fp8" in actor
    assert "--image-size 224" in actor
    assert train.startswith("train (limit 150 s):") and "-m fastrl.train" in train
    assert ipc.startswith("ipc_refit (limit 90 s):") and "bench/ipc_refit_check.py --gib 2 --bucket-mib 256 --workers 1,2" in ipc
    assert "trainer.max_steps=5" in train and "parallel.backend=nccl" in train and "--recipe" not in train  # the default recipe
    assert timeline.startswith("memory_timeline (limit 240 s):") and "bench/gpu_memory_timeline.py --out " in timeline
    assert "--cpu-smoke" not in timeline  # the 3B dimensions on the GPU


def test_wheel_list_is_pinned_and_complete():
    lines = [line.strip() for line in (REPO / "bench" / "gpu_wheels.txt").read_text().splitlines()]
    specs = [line for line in lines if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][A-Za-z0-9.]*", s) for s in specs), specs
    names = {s.split("==")[0] for s in specs}
    assert {"megatron-core", "megatron-bridge", "transformers", "tokenizers", "huggingface-hub"} <= names
    versions = dict(s.split("==") for s in specs)
    assert versions["megatron-core"] == "0.16.1" and versions["transformers"] == "4.57.6"
    assert versions["tokenizers"].startswith("0.22.")


def test_table_never_shows_fp8_numbers_without_transformer_engine():
    gc = _module()
    measured = {"status": "measured", "parameters": 1.03e9, "update_tokens_per_s": 12345.0, "update_mfu": 0.41,
                "peak_memory_bytes": 40 * 2**30, "grad_norm": 1.5, "update_seconds": 2.0}
    rows = [
        {"model": "1b", "precision": "bf16", **measured},
        {"model": "1b", "precision": "fp8", **measured},  # as if something had run bf16 under the FP8 name
        {"model": "tiny", "precision": "bf16", "status": "failed: out of memory: OutOfMemoryError: ..."},
    ]
    actor = gc.actor_rows(rows, te_available=False)
    assert actor[1] == {"model": "1b", "precision": "fp8", "status": "not measured (no Transformer Engine)"}
    train = [
        {"kind": "val", "step": 0},
        {"kind": "train", "step": 1, "actor/loss": 0.12, "actor/grad_norm": 0.5, "reward/mean": 0.25,
         "refit/tensors": 45.0, "time/gen": 1.0, "time/update": 0.5},
        {"kind": "train", "step": 2, "actor/loss": float("nan"), "actor/grad_norm": 0.5, "reward/mean": 0.25,
         "refit/tensors": 45.0},
    ]
    text = gc.table({"device": "NVIDIA H200"}, actor, train, [], steps=5)
    assert "| actor step | 1b bf16 (1030M) | measured | 12,345 | 41.0% | 40.00 |" in text
    assert "| actor step | 1b fp8 | not measured (no Transformer Engine) |" in text
    assert "12,345" not in text.split("1b fp8")[1].split("\n")[0]
    assert "| actor step | tiny bf16 | failed: out of memory" in text
    assert "| train step 1 | default recipe | finite |" in text and "gen 1.00 update 0.50" in text
    assert "| train step 2 | default recipe | NOT FINITE |" in text and "**nan**" in text
    assert gc.actor_rows(rows, te_available=True)[1]["status"] == "measured"
    ipc = [{"workers": 2, "status": "FAILED", "problems": ["refit 1: trainer GPU memory 2049 MiB above its baseline"],
            "refit1": {"tensors": 192, "seconds": 9.9, "gb_per_s": 0.2, "trainer_mib_above_baseline": 2049.4}}]
    text = gc.table({"device": "NVIDIA H200"}, actor, train, [], steps=5, ipc=ipc)
    assert "| ipc refit | 2 engine worker(s) | FAILED: refit 1: trainer GPU memory 2049 MiB above its baseline | 0.2 GB/s |" in text
    assert "2049 MiB above baseline" in text


def test_cpu_smoke_runs_the_same_entry_and_prints_one_table(tmp_path):
    proc = subprocess.run(
        ["bench/gpu_check.sh", "--cpu-smoke", "--out", str(tmp_path)], cwd=REPO, env=_env(),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.strip() in proc.stdout
    assert "| actor step | tiny fp32 (4M) | measured |" in table
    assert "| actor step | tiny fp8 | not measured (no Transformer Engine) |" in table
    assert re.search(r"\| train step 1 \| default recipe \| finite \|", table)
    assert "| part actor_step | | ok |" in table and "| part train | | ok |" in table
    assert "| ipc refit | | not run (CPU smoke: a CUDA IPC handle needs a GPU) |" in table
    assert "| part memory_timeline | | ok |" in table and "| refit | ok |" in table  # the timeline's tables follow
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["memory_timeline"]["engine_standin"]["exit_code"] == 0
    step = [r for r in result["train"] if r["kind"] == "train"][0]
    assert step["refit/tensors"] > 0 and all(f"time/{p}" in step for p in ("gen", "update", "refit"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "actor.log", "actor_step.jsonl", "gpu_check.json", "gpu_check.md", "memory_timeline.json", "memory_timeline.jsonl",
        "memory_timeline.log", "memory_timeline.md", "train.log", "train_metrics.jsonl",
    ]
