#!/usr/bin/env python
"""One-shot GPU check: actor-step throughput of the tiny and ~1B Qwen2.5-VL policies and 5 training
steps of the default recipe on CUDA with NCCL, the CUDA IPC refit, and the memory timeline of one
Qwen2.5-VL-3B-architecture step beside the memory plan, printed as tables. Started by bench/gpu_check.sh
(which installs the carried wheels first); ``--cpu-smoke`` runs the same code with tiny sizes on
the CPU (gloo) in under a minute, ``--dry-run`` prints the commands it would run.

    bench/gpu_check.sh                       # on the GPU machine: wheels, then this script
    python bench/gpu_check.py --cpu-smoke    # here: the same path, tiny, on the CPU

Parts (each a subprocess with its own time limit, so a crash or a hang in one still leaves the
table; whatever a part measured before it failed is kept):

1. ``bench/actor_step.py``: tiny and 1b, bf16 and fp8 (update tokens/s, MFU, peak memory; every
   prompt holds an image, so the vision tower runs). FP8 rows say "not measured (no Transformer
   Engine)" where Transformer Engine is missing -- never bf16 numbers under the FP8 name.
2. ``python -m fastrl.train`` on the default recipe for 5 steps (``parallel.backend=nccl``; no warm
   start, 64 validation questions): per step the loss and grad norm (finite?), the reward, the
   refit (tensors sent to the engine) and the time of each phase.
3. ``bench/ipc_refit_check.py`` (GPU only): the CUDA IPC refit between a trainer and a separate
   engine process with one and two worker processes, 2 GiB in 256 MiB buckets: bit-exact arrival,
   sums of squares, the trainer's memory back at its baseline, GB/s. The CPU smoke run says
   "not run" (a CUDA IPC handle needs a GPU).
4. ``bench/gpu_memory_timeline.py``: the CUDA memory timeline of one step of the Qwen2.5-VL-3B
   architecture (random weights) at the 1xH200 recipe's layout beside the memory plan's number for
   each phase, with an engine stand-in process claiming and freeing the engine's share as vLLM's
   sleep levels do, the refit over the CUDA IPC transport, the save's state dict in each optimizer
   format and an all-gather staging probe; its tables follow the main one. The CPU smoke run runs
   it with tiny shapes (memory figures "n/a (CPU)") after the first two parts.

Writes into ``--out`` (default ``$OUT`` when set, else runs/gpu_check): ``gpu_check.md`` (the
table), ``gpu_check.json``, ``actor_step.jsonl``, ``train_metrics.jsonl``, ``ipc_refit.jsonl``,
``memory_timeline.md`` / ``.json`` / ``.jsonl`` and the parts' logs. Exit status 0 when every part ran,
every training loss was finite and every IPC check passed, else 1. ``--total-timeout`` (default 560 s on
the GPU) shortens the limit of a part that would end past it, so that the table is written within it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

NO_TE = "not measured (no Transformer Engine)"
PHASES = ("gen", "reward", "old", "ref", "prune", "update", "refit", "step")
#: The training part's overrides of the default recipe (both modes), and the tiny sizes of the
#: CPU smoke run (the functional tests' tiny run).
TRAIN_COMMON = [
    "warm_start.enabled=false", "trainer.val_every=0", "data.val_size=64", "logging.progress_bar=false",
    "logging.tensorboard=false",
]
TRAIN_SMOKE = [
    "model.tiny_hidden_size=64", "model.tiny_num_layers=2", "model.tiny_intermediate_size=128",
    "model.tiny_vision_hidden_size=32", "model.tiny_vision_depth=1", "rollout.prompts_per_step=4", "rollout.n=4",
    "trainer.mini_batch_prompts=2", "parallel.micro_batch_size=4", "rollout.max_response_length=16",
    "data.val_size=16", "data.max_train_samples=64", "reward.num_workers=1", "trainer.torch_threads=1",
    "checkpoint.save_optimizer=false",
]
ACTOR_GPU = ["--models", "tiny,1b", "--precisions", "bf16,fp8", "--rollouts", "64", "--micro-batch", "8",
             "--prompt-len", "256", "--response-len", "768", "--image-size", "224", "--repeats", "2"]
IPC_GPU = ["--gib", "2", "--bucket-mib", "256", "--workers", "1,2"]
IPC_NOT_RUN = "not run (CPU smoke: a CUDA IPC handle needs a GPU)"
ACTOR_SMOKE = ["--models", "tiny", "--precisions", "fp32,fp8", "--rollouts", "4", "--micro-batch", "2",
               "--prompt-len", "10", "--response-len", "8", "--image-size", "56", "--repeats", "1"]


@dataclass
class Part:
    """One subprocess of the check."""

    name: str
    cmd: list[str]
    timeout_s: float
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    returncode: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        handle = self.log.open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True)
        handle.close()

    def wait(self) -> None:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout=max(1.0, self.timeout_s - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.returncode = -9
            self.notes.append(f"killed after its {self.timeout_s:.0f} s limit")
        self.seconds = time.monotonic() - self.started

    @property
    def status(self) -> str:
        if self.returncode == 0:
            return "ok"
        return "; ".join(self.notes) or f"exit {self.returncode}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (gloo), under a minute")
    mode.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "runs" / "gpu_check")
    p.add_argument("--work", type=Path, default=None,
                   help="scratch for models and checkpoints (default: a folder in /tmp, removed at the end)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 5; 1 in --cpu-smoke)")
    p.add_argument("--actor-timeout", type=float, default=None, help="seconds (default 180; 60 in --cpu-smoke)")
    p.add_argument("--train-timeout", type=float, default=None, help="seconds (default 150; 60 in --cpu-smoke)")
    p.add_argument("--ipc-timeout", type=float, default=90.0, help="seconds for the IPC refit part (GPU only)")
    p.add_argument("--timeline-timeout", type=float, default=None,
                   help="seconds for the memory-timeline part (default 240; 150 in --cpu-smoke)")
    p.add_argument("--total-timeout", type=float, default=None,
                   help="seconds for the whole check: a part that would end later gets a shorter limit (default 560 "
                        "on the GPU, under bench/gpu_check.sh's 590; none in --cpu-smoke)")
    p.add_argument("--skip-actor", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-ipc", action="store_true")
    p.add_argument("--skip-timeline", action="store_true")
    args = p.parse_args(argv)
    smoke = args.cpu_smoke
    args.steps = args.steps if args.steps is not None else (1 if smoke else 5)
    args.actor_timeout = args.actor_timeout or (60.0 if smoke else 180.0)
    args.train_timeout = args.train_timeout or (60.0 if smoke else 150.0)
    args.timeline_timeout = args.timeline_timeout or (150.0 if smoke else 240.0)
    args.total_timeout = args.total_timeout or (None if smoke else 560.0)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    args.remove_work = args.work is None
    args.work = args.work or Path("/tmp") / f"fastrl-gpu-check-{os.getpid()}"
    return args


def plan(args: argparse.Namespace) -> list[Part]:
    py = sys.executable
    parts = []
    if not args.skip_actor:
        sizes = ACTOR_SMOKE if args.cpu_smoke else ACTOR_GPU
        cmd = [py, "bench/actor_step.py", *sizes, "--out", str(args.work / "actor")]
        parts.append(Part("actor_step", cmd, args.actor_timeout, args.out / "actor.log"))
    if not args.skip_train:
        backend = "gloo" if args.cpu_smoke else "nccl"
        cmd = [py, "-m", "fastrl.train", *TRAIN_COMMON, *(TRAIN_SMOKE if args.cpu_smoke else []),
               f"trainer.max_steps={args.steps}", f"parallel.backend={backend}",
               f"logging.output_dir={args.work / 'train'}", "logging.run_name=gpu_check"]
        parts.append(Part("train", cmd, args.train_timeout, args.out / "train.log"))
    if not args.skip_ipc and not args.cpu_smoke:
        cmd = [py, "bench/ipc_refit_check.py", *IPC_GPU, "--out", str(args.work / "ipc")]
        parts.append(Part("ipc_refit", cmd, args.ipc_timeout, args.out / "ipc.log"))
    if not args.skip_timeline:
        cmd = [py, "bench/gpu_memory_timeline.py", *(["--cpu-smoke"] if args.cpu_smoke else []),
               "--out", str(args.work / "timeline")]
        parts.append(Part("memory_timeline", cmd, args.timeline_timeout, args.out / "memory_timeline.log"))
    return parts


#: Parts the CPU smoke run starts at once (the others follow, one at a time).
SMOKE_TOGETHER = ("actor_step", "train")


def run_order(parts: list[Part], smoke: bool) -> list[list[Part]]:
    """The groups of parts that run at once, in order: one part each on the GPU (timings and memory of
    their own); in the CPU smoke run the actor and training parts together, then each other part."""
    if not smoke:
        return [[p] for p in parts]
    together = [p for p in parts if p.name in SMOKE_TOGETHER]
    return ([together] if together else []) + [[p] for p in parts if p.name not in SMOKE_TOGETHER]


def environment() -> dict[str, str]:
    """What ran: torch, the device, Transformer Engine, the carried packages."""
    import importlib.metadata as md

    import torch

    from fastrl.config import transformer_engine_available

    info = {"torch": torch.__version__, "python": sys.version.split()[0]}
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    info["transformer_engine"] = "yes" if transformer_engine_available() else "no"
    for dist in ("megatron-core", "megatron-bridge", "transformers", "tokenizers"):
        try:
            info[dist] = md.version(dist)
        except md.PackageNotFoundError:
            info[dist] = "missing"
    return info


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by a crash
    return rows


def actor_rows(rows: list[dict], te_available: bool) -> list[dict]:
    """The table's actor-step rows: an FP8 row without Transformer Engine says so, and carries no numbers."""
    out = []
    for r in rows:
        r = dict(r)
        if r.get("precision") == "fp8" and not te_available:
            r = {"model": r.get("model"), "precision": "fp8", "status": NO_TE}
        out.append(r)
    return out


def _fmt(value, spec: str = ".3g") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return f"**{value}**"
    return format(value, spec)


def ipc_lines(ipc: list[dict] | None) -> list[str]:
    """The IPC refit rows (None: the part did not run in this mode)."""
    if ipc is None:
        return [f"| ipc refit | | {IPC_NOT_RUN} | | | | | | | | |"]
    lines = []
    for r in ipc:
        status = r["status"] if not r.get("problems") else f"{r['status']}: {'; '.join(r['problems'])}"
        refits = [r[k] for k in ("refit1", "refit2") if k in r]
        gbs = " / ".join(f"{x['gb_per_s']:.1f}" for x in refits)
        above = max((x["trainer_mib_above_baseline"] for x in refits), default=float("nan"))
        times = " ".join(f"refit{i + 1} {x['seconds']:.2f}" for i, x in enumerate(refits))
        lines.append(
            f"| ipc refit | {r['workers']} engine worker(s) | {status} | {gbs} GB/s | | "
            f"{above:.0f} MiB above baseline | | | | {refits[0]['tensors'] if refits else ''} | {times} |"
        )
    return lines


def table(
    env: dict[str, str], actor: list[dict], train: list[dict], parts: list[Part], steps: int,
    ipc: list[dict] | None = None,
) -> str:
    """The one table: actor-step rows, training-step rows, IPC refit rows, then a row per part."""
    head = ", ".join(f"{k} {v}" for k, v in env.items())
    lines = [
        f"GPU check ({head}).",
        "",
        "| check | config | status | tokens/s | MFU | peak GiB | loss | grad norm | reward | refit tensors | time per phase (s) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in actor:
        config = f"{r.get('model')} {r.get('precision')}"
        if r.get("status") != "measured":
            lines.append(f"| actor step | {config} | {r.get('status')} | | | | | | | | |")
            continue
        mfu = f"{100 * r['update_mfu']:.1f}%" if r.get("update_mfu") is not None else "n/a"
        lines.append(
            f"| actor step | {config} ({r['parameters'] / 1e6:.0f}M) | measured | {r['update_tokens_per_s']:,.0f} | {mfu} "
            f"| {r['peak_memory_bytes'] / 2**30:.2f} | | {_fmt(r.get('grad_norm'))} | | | update {r['update_seconds']:.3f} |"
        )
    train_steps = [r for r in train if r.get("kind") == "train"]
    for r in train_steps:
        loss, grad = r.get("actor/loss"), r.get("actor/grad_norm")
        finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (loss, grad, r.get("reward/mean")))
        phases = " ".join(f"{p} {r[f'time/{p}']:.2f}" for p in PHASES if f"time/{p}" in r)
        lines.append(
            f"| train step {r['step']} | default recipe | {'finite' if finite else 'NOT FINITE'} | | | | {_fmt(loss)} "
            f"| {_fmt(grad)} | {_fmt(r.get('reward/mean'))} | {_fmt(r.get('refit/tensors'), '.0f')} | {phases} |"
        )
    if parts and any(p.name == "train" for p in parts) and len(train_steps) < steps:
        lines.append(f"| train | default recipe | {len(train_steps)} of {steps} steps logged | | | | | | | | |")
    lines.extend(ipc_lines(ipc))
    for p in parts:
        lines.append(f"| part {p.name} | | {p.status} | | | | | | | | {p.seconds:.0f} s wall |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = plan(args)
    if args.dry_run:
        for part in parts:
            print(f"{part.name} (limit {part.timeout_s:.0f} s): {' '.join(part.cmd)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        return _check(args, parts)
    finally:
        if args.remove_work:
            shutil.rmtree(args.work, ignore_errors=True)


def _check(args: argparse.Namespace, parts: list[Part]) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not args.cpu_smoke:  # the ~1B model directory (4 GB) goes with the scratch folder
        env.setdefault("FASTRL_CACHE_DIR", str(args.work / "cache"))
    if args.cpu_smoke:  # tiny models and the converted easy-vqa data come from the usual cache
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    info = environment()
    print("gpu_check:", ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    deadline = time.monotonic() + args.total_timeout if args.total_timeout else None
    for group in run_order(parts, args.cpu_smoke):
        for part in group:
            if deadline is not None and deadline - time.monotonic() < part.timeout_s:
                part.timeout_s = max(1.0, deadline - time.monotonic())
                print(f"gpu_check: {part.name}: limit shortened to {part.timeout_s:.0f} s (--total-timeout)", flush=True)
            print(f"gpu_check: {part.name}: {' '.join(part.cmd)}", flush=True)
            part.start(env)
        for part in group:
            part.wait()
    actor_jsonl, metrics = args.work / "actor" / "actor_step.jsonl", args.work / "train" / "gpu_check" / "metrics.jsonl"
    ipc_jsonl, timeline = args.work / "ipc" / "ipc_refit.jsonl", args.work / "timeline"
    copies = [(actor_jsonl, "actor_step.jsonl"), (metrics, "train_metrics.jsonl"), (ipc_jsonl, "ipc_refit.jsonl")]
    copies += [(timeline / f"memory_timeline.{ext}", f"memory_timeline.{ext}") for ext in ("md", "json", "jsonl")]
    for src, name in copies:
        if src.is_file():
            shutil.copyfile(src, args.out / name)
    te = info["transformer_engine"] == "yes"
    actor = actor_rows(read_jsonl(actor_jsonl), te)
    train = read_jsonl(metrics)
    # the IPC rows: what the part measured; None in the CPU smoke run ("not run"); none when skipped
    ipc = read_jsonl(ipc_jsonl) if any(p.name == "ipc_refit" for p in parts) else (None if args.cpu_smoke else [])
    text = table(info, actor, train, parts, args.steps, ipc=ipc)
    if any(p.name == "memory_timeline" for p in parts):  # its own tables (another layout of columns) after the main one
        md = timeline / "memory_timeline.md"
        text += "\n\n" + (md.read_text().strip() if md.is_file() else "Memory timeline: no table (see memory_timeline.log).")
    (args.out / "gpu_check.md").write_text(text + "\n")
    timeline_json = timeline / "memory_timeline.json"
    payload = {"environment": info, "actor": actor, "train": train, "ipc_refit": ipc,
               "memory_timeline": json.loads(timeline_json.read_text()) if timeline_json.is_file() else None,
               "parts": [{"name": p.name, "status": p.status, "seconds": p.seconds, "cmd": p.cmd} for p in parts]}
    (args.out / "gpu_check.json").write_text(json.dumps(payload, indent=1, default=str))
    print(text, flush=True)
    losses_ok = all(
        isinstance(r.get("actor/loss"), (int, float)) and math.isfinite(r["actor/loss"])
        for r in train if r.get("kind") == "train"
    )
    ok = all(p.returncode == 0 for p in parts) and losses_ok and all(r.get("status") == "ok" for r in ipc or [])
    if not args.skip_train:
        ok = ok and sum(r.get("kind") == "train" for r in train) >= args.steps
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
