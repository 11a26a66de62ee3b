#!/usr/bin/env python
"""The CUDA memory timeline of one real training step at real dimensions on one GPU, beside the memory
plan's number for each phase (``fastrl/models/memory_plan.py``, the table ``python -m fastrl.train
--dry-run`` prints for the same layout).

What runs (one H100 or H200; no vLLM, no Transformer Engine, no network; part 4 of
``bench/gpu_check.py``, about 2-4 minutes):

- the model: the Qwen2.5-VL-3B-Instruct architecture from its published dimensions, random weights
  (``bench/timeline_model.py``: a Hugging Face directory holding ``config.json`` only), through the
  project's own ``build_policy`` (megatron-core, megatron-bridge; actor and frozen reference) and
  ``Actor`` (megatron's DistributedOptimizer, Adam), at the layout and settings of the recipe
  ``qwen25vl_3b_fastrl_grpo_geo3k_1xh200_bf16`` (TP1 PP1 DP1, bf16, micro-batch 1, KL loss);
- the rollouts: ``--rollouts`` (2) of ``--prompt-len`` + ``--response-len`` tokens (1,024 + 1,024, half
  the recipe's maximum lengths, the plan computed for the same lengths: without Transformer Engine
  megatron-core's local ``DotProductAttention`` keeps each layer's T x T attention probabilities for
  the backward pass (fp32 softmax output and bf16 copy: about 6 bytes x 16 heads x T^2 per layer by
  megatron-core 0.16.1's code, read, not measured: 13.5 GiB over 36 layers at T = 2,048, 54 GiB at
  4,096), which the plan, written for Transformer Engine's fused attention, does not count), each
  prompt one image at the processor's lower pixel bound (``data.min_pixels``:
  38 x 38 patches, 361 image tokens; the plan counts ``min_pixels / 784`` = 334);
- the engine: ``bench/engine_standin.py``, a process of its own on the same GPU that claims and frees
  the engine's share as vLLM's sleep levels do (its sizes are the plan's: weights, KV cache and
  runtime of ``rollout.gpu_memory_utilization`` x the GPU), and takes the refit through the engine
  server's own ``op_load_weights_ipc`` over FastRL's CUDA IPC transport
  (``fastrl/rollout/refit_transport.py``).

Phases, in a step's order (each row: ``torch.cuda.max_memory_allocated`` after the peak was reset at
the phase's start, the allocated and reserved memory at its end, the stand-in's reserved memory and
state, the whole device's used memory (``torch.cuda.mem_get_info``), and the plan's numbers for
the phase it is compared with):

1. ``start-up``: actor (bf16 weights, fp32 gradient buffer, fp32 main weights) and reference built,
   then the stand-in claims its whole share (plan "start-up"; the plan also counts the weight
   import's cached buffers, which a random initialization does not have);
2. ``warm-up step``: sleep, old, ref, update, ``empty_cache``, refit, wake, not compared with the
   plan: from here on the Adam moments exist, as in every step of the plan but the first;
3. ``generation``: the stand-in awake, the trainer idle (plan "generation");
4. ``old``: the stand-in sleeps (level 2), the old log-probs (plan "old/ref log-probs");
5. ``ref``: the reference log-probs (plan "old/ref log-probs");
6. ``update``: forward and backward of every micro-batch, the optimizer step (plan "update");
7. ``empty_cache``: ``release_cached_memory`` (plan: the full state allocated, nothing cached, the
   engine asleep);
8. ``refit``: the weights exported on the GPU, sent bucket by bucket through CUDA IPC into the
   stand-in (whose weights the server wakes first), then ``empty_cache`` (plan "refit");
9. ``validation``: the stand-in's KV cache back (plan "validation");
10. ``save dp_reshardable`` / ``save fully_reshardable``: the save's sharded state dict in each
    optimizer format FastRL supports, megatron-core's real ``DistributedOptimizer.sharded_state_dict``
    (``fastrl.checkpoint.actor_state.sharded_state_dict``; ``fully_reshardable`` gathers each fp32
    state on the GPU), with the engine awake (plan "save" of that format);
11. ``level-1 sleep`` / ``level-1 wake``: vLLM's level 1 (weights to host memory; FastRL sleeps at
    level 2), not in the plan.

Then a probe of at most ``--probe-seconds`` (15), ``fastrl.distributed.allgather_staging``: the peak
extra bytes torch allocates for an ``all_gather`` into a list of tensors and for an
``all_gather_into_tensor`` into one flat buffer, on the run's process group (NCCL, one rank), for
shards of 256 MiB to 4 GiB.

``--cpu-smoke``: the same code with tiny shapes on the CPU (gloo, fp32, the stand-in's sizes 1/4096
of the plan's in host memory), in well under a minute. Memory figures read "n/a (CPU)"; every
phase's code runs, the stand-in starts and exits, the state dict of each optimizer format is built.
The CUDA IPC handles cannot exist without a GPU: there, and only there, the recording fake of the
CUDA layer (``tests/rehearsal/fake_cuda.py``) stands in for torch's ``reduce_tensor`` /
``rebuild_cuda_tensor``, the device type of the bucket buffers and the stream synchronization.

Writes into ``--out`` (default ``$OUT`` when set, else runs/memory_timeline): ``memory_timeline.md``
(the tables), ``memory_timeline.json`` (rows, probe, plans, the stand-in's exit) and
``memory_timeline.jsonl`` (one row per phase as measured). Exit status 0 when every phase and the
probe ran and the stand-in exited cleanly, 1 otherwise, 2 without CUDA outside ``--cpu-smoke``. A
phase that runs out of memory is a row with its error, and the next phase runs; where the plan says
that phase does not fit the GPU, its row says so and it counts as run (the plan's prediction held).
By the plan (default lengths), on an H100 (79-80 GiB) this H200 layout fits only its start-up and
``empty_cache`` phases (old and ref about 80 GiB, update 88, generation 91 with the reserve), and on
an H200 (about 140 GiB) every phase but the ``fully_reshardable`` save (about 145 GiB: the gather of
each fp32 state with the engine awake).

    python bench/gpu_memory_timeline.py                  # on the GPU machine (bench/gpu_check.sh runs it)
    python bench/gpu_memory_timeline.py --cpu-smoke      # here
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timeline_model import QWEN25_VL_3B, SMOKE, hf_weight_names, image_grid, rollout_batch, write_model_dir  # noqa: E402
from bench.timeline_report import markdown, passed  # noqa: E402

STANDIN = REPO / "bench" / "engine_standin.py"
RECIPE = "qwen25vl_3b_fastrl_grpo_geo3k_1xh200_bf16"
#: The optimizer formats of ``checkpoint.optimizer_format`` (each gets a save row).
OPTIMIZER_FORMATS = ("dp_reshardable", "fully_reshardable")
GIB = 2**30
#: The CPU smoke run's stand-in holds 1/SMOKE_SCALE of the plan's engine bytes, in host memory.
SMOKE_SCALE = 4096
SMOKE_OVERRIDES = ["parallel.backend=gloo", "precision.mode=fp32", "algorithm.overlong_cache_length=8",
                   "data.min_pixels=3136", "rollout.refit_bucket_mb=0.05"]
#: Shard sizes of the all-gather probe (bytes): on a GPU, and in the CPU smoke run.
PROBE_BYTES = (256 * 2**20, 2**30, 2 * 2**30, 4 * 2**30)
PROBE_BYTES_SMOKE = (4096, 65536)
#: (row, the plan phase it is compared with or None); the save rows follow, one per optimizer format.
TIMELINE = (
    ("start-up", "start-up"), ("warm-up step", None), ("generation", "generation"), ("old", "old/ref log-probs"),
    ("ref", "old/ref log-probs"), ("update", "update"), ("empty_cache", "empty_cache"), ("refit", "refit"),
    ("validation", "validation"), *((f"save {fmt}", "save") for fmt in OPTIMIZER_FORMATS),
    ("level-1 sleep", None), ("level-1 wake", None),
)
PHASES = tuple(name for name, _ in TIMELINE)
MEASURED = ("peak_allocated_bytes", "allocated_bytes", "reserved_bytes", "peak_reserved_bytes", "device_used_bytes")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (gloo, fp32), well under a minute")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "runs" / "memory_timeline")
    p.add_argument("--rollouts", type=int, default=2, help="rollouts of the step (the recipe's micro-batch of 1: one micro-batch each)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 1024; 16 in --cpu-smoke)")
    p.add_argument("--response-len", type=int, default=None, help="response tokens (default 1024; 16 in --cpu-smoke)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="the engine's share of the GPU (default: the recipe's); the plan uses the same")
    p.add_argument("--probe-seconds", type=float, default=15.0, help="time limit of the all-gather probe")
    args = p.parse_args(argv)
    default_len = 16 if args.cpu_smoke else 1024
    args.prompt_len = args.prompt_len or default_len
    args.response_len = args.response_len or default_len
    if args.rollouts < 1:
        p.error(f"--rollouts must be >= 1, got {args.rollouts}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization < 1:
        p.error(f"--gpu-memory-utilization must be in (0, 1), got {args.gpu_memory_utilization}")
    return args


def plan_config(args: argparse.Namespace, gpu_gib: float, optimizer_format: str | None = None):
    """The recipe's config at this check's lengths, engine share and GPU size (the CPU smoke run:
    gloo, fp32, a small image and refit buckets), with ``optimizer_format`` when given."""
    from fastrl.cli import apply_overrides
    from recipes import get_recipe

    base = get_recipe(RECIPE)
    util = args.gpu_memory_utilization or base.rollout.gpu_memory_utilization
    overrides = [f"parallel.gpu_memory_gib={gpu_gib}", "parallel.world_size=1", f"rollout.gpu_memory_utilization={util}",
                 f"rollout.max_prompt_length={args.prompt_len}", f"rollout.max_response_length={args.response_len}"]
    overrides += SMOKE_OVERRIDES if args.cpu_smoke else []
    overrides += [f"checkpoint.optimizer_format={optimizer_format}"] if optimizer_format else []
    return apply_overrides(base, overrides)


def plan_numbers(plan, phase: str | None) -> dict[str, Any] | None:
    """The plan's GiB for ``phase`` on the generating GPU: ``trainer`` (allocated), ``reserved``
    (allocated + the allocator's cache), ``engine`` and ``total`` (with the reserve), and ``fits``
    (total <= the GPU). ``empty_cache`` is no phase of the plan: the full state allocated (the
    generation phase's trainer), nothing cached, the engine asleep."""
    if phase is None:
        return None
    if phase == "empty_cache":
        trainer, cache, engine = plan.row("generation").trainer_gib, 0.0, plan.engine_asleep_gib
    else:
        row = plan.row(phase)
        trainer, cache, engine = row.trainer_gib, row.cache_gib, row.engine_gib
    total = trainer + cache + engine + plan.reserve_gib
    return {"trainer_gib": trainer, "reserved_gib": trainer + cache, "engine_gib": engine, "total_gib": total,
            "fits": total <= plan.gpu_memory_gib}


def engine_sizes(plan, scale: int) -> dict[str, int]:
    """Bytes the stand-in claims per region: the plan's engine weights, KV cache (none when the share
    does not even hold the weights) and vLLM's runtime, divided by ``scale`` (at least 1 byte each)."""
    from fastrl.models.memory_plan import ENGINE_RUNTIME_GIB

    kv = max(0.0, plan.kv_cache_gib or 0.0)
    gib = {"weights": plan.engine_weights_gib, "kv_cache": kv, "runtime": ENGINE_RUNTIME_GIB}
    return {region: max(1, int(size * GIB / scale)) for region, size in gib.items()}


class EngineStandIn:
    """The trainer's end of ``bench/engine_standin.py`` (one request at a time over a socket pair,
    FastRL's engine wire); its output goes to this process's."""

    def __init__(self, device_type: str, sizes: dict[str, int], *, fake_cuda: bool) -> None:
        from fastrl.rollout import engine_wire

        self.wire = engine_wire
        parent, child = socket.socketpair()
        cmd = [sys.executable, str(STANDIN), "--fd", str(child.fileno()), "--device", device_type,
               "--weights-bytes", str(sizes["weights"]), "--kv-bytes", str(sizes["kv_cache"]),
               "--runtime-bytes", str(sizes["runtime"]), *(["--fake-cuda"] if fake_cuda else [])]
        self.proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), cwd=REPO)
        child.close()
        self.sock = parent

    def request(self, req: dict) -> None:
        self.wire.send_message(self.sock, req)

    def wait(self, _handle: Any = None) -> dict:
        """The next reply. Raises RuntimeError on an error reply (its message)."""
        reply = self.wire.recv_message(self.sock)
        if not reply.get("ok"):
            raise RuntimeError(f"engine stand-in: {reply.get('error')}")
        return reply

    def call(self, op: str, **fields: Any) -> dict:
        self.request({"op": op, **fields})
        return self.wait()

    def memory(self) -> dict:
        try:
            return self.call("memory")["memory"]
        except Exception as error:  # noqa: BLE001 -- a dead stand-in is recorded in the row
            return {"error": f"{type(error).__name__}: {error}"}

    def close(self) -> dict:
        """Shut the stand-in down: its pid, exit status and the sleep / wake calls it received."""
        calls = None
        try:
            self.request({"op": "shutdown"})
            calls = self.wire.recv_message(self.sock).get("calls")
        except Exception as error:  # noqa: BLE001
            calls = f"no reply to shutdown: {type(error).__name__}: {error}"
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.sock.close()
        return {"pid": self.proc.pid, "exit_code": code, "calls": calls}


def describe_error(error: BaseException) -> str:
    import torch

    oom = isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()
    return f"{'out of memory: ' if oom else 'failed: '}{type(error).__name__}: {' '.join(str(error).split())[:300]}"


def measure(cuda: bool) -> dict[str, int | None]:
    """The trainer's memory counters now (bytes; None on the CPU)."""
    if not cuda:
        return {k: None for k in MEASURED}
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(), "allocated_bytes": torch.cuda.memory_allocated(),
            "reserved_bytes": torch.cuda.memory_reserved(), "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_used_bytes": total - free}


class Timeline:
    """Runs the phases: peaks reset at each phase's start, its counters, the stand-in's memory and
    the plan's numbers recorded in a row (appended to ``memory_timeline.jsonl`` at once)."""

    def __init__(self, cuda: bool, engine_ref: Callable[[], EngineStandIn | None], plans: dict, default_format: str,
                 jsonl: Path) -> None:
        self.cuda, self.engine_ref, self.plans, self.default_format = cuda, engine_ref, plans, default_format
        self.jsonl = jsonl
        self.rows: list[dict] = []
        jsonl.write_text("")

    def run(self, name: str, plan_phase: str | None, fn: Callable[[], Any], *, plan_format: str | None = None) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        row: dict = {"phase": name, "plan_phase": plan_phase, "status": "ok"}
        start = time.perf_counter()
        try:
            details = fn()
            if details:
                row["details"] = details
        except Exception as error:  # noqa: BLE001 -- recorded in the row; the next phase runs
            row["status"] = describe_error(error)
            row["traceback"] = traceback.format_exc()[-3000:]
        row["seconds"] = time.perf_counter() - start
        row.update(measure(self.cuda))
        engine = self.engine_ref()
        row["engine"] = engine.memory() if engine is not None else {"state": "not started"}
        row["plan"] = plan_numbers(self.plans[plan_format or self.default_format], plan_phase)
        self.rows.append(row)
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(f"memory_timeline: {name}: {row['status']} ({row['seconds']:.1f} s) "
              f"{ {k: row[k] for k in MEASURED} } engine {row['engine'].get('state')}", flush=True)


@contextlib.contextmanager
def fake_cuda_ipc():
    """CPU smoke only: the recording fake of the CUDA layer under the CUDA IPC transport
    (``tests/rehearsal/fake_cuda.py``): the bucket buffer typed as a GPU tensor, torch's
    ``reduce_tensor`` replaced by ``FakeReduceTensor`` (whose handle carries the buffer itself), the
    stream's synchronization recorded. Restored on exit."""
    import torch
    import torch.multiprocessing.reductions as reductions

    from fastrl.rollout import refit_transport
    from tests.rehearsal.fake_cuda import FakeCuda, FakeReduceTensor, cuda_typed

    cuda, reduce = FakeCuda(device_count=1), FakeReduceTensor()
    real_pack = refit_transport.pack_flat

    def pack(bucket):
        buffer, entries = real_pack([(name, torch.Tensor(t)) for name, t in bucket])
        return cuda_typed(buffer), entries

    saved = (reductions.reduce_tensor, torch.cuda.current_stream, refit_transport.pack_flat)
    reductions.reduce_tensor, torch.cuda.current_stream, refit_transport.pack_flat = reduce, cuda.current_stream, pack
    try:
        yield types.SimpleNamespace(cuda=cuda, reduce=reduce, typed=cuda_typed)
    finally:
        reductions.reduce_tensor, torch.cuda.current_stream, refit_transport.pack_flat = saved


def tensor_bytes(obj: Any) -> dict[str, int]:
    """Tensors in a (sharded) state dict and the bytes of their distinct storages, by device."""
    import torch

    out = {"tensors": 0, "cuda_bytes": 0, "cpu_bytes": 0}
    seen: set[tuple[str, int]] = set()

    def add(t: torch.Tensor) -> None:
        out["tensors"] += 1
        storage = t.untyped_storage()
        key = (t.device.type, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            out["cuda_bytes" if t.device.type == "cuda" else "cpu_bytes"] += storage.nbytes()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            add(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:  # megatron's ShardedTensor / ShardedTensorFactory / ShardedObject hold theirs in .data
            data = getattr(x, "data", None)
            if isinstance(data, (torch.Tensor, dict, list, tuple)):
                walk(data)

    walk(obj)
    return out


def run_timeline(args: argparse.Namespace, cfg, hf_dir: Path, names: list[str], batch_cpu, plans: dict, out: Path,
                 scale: int) -> dict:
    """Every phase, the probe and the stand-in's exit, inside the run's process group."""
    import torch

    from fastrl.checkpoint.actor_state import sharded_state_dict
    from fastrl.compat.bridge_export import use_weight_names
    from fastrl.distributed.allgather_staging import staging_probe
    from fastrl.distributed.session import distributed_session
    from fastrl.models.logprobs import compute_log_probs
    from fastrl.models.provider import build_policy, export_hf_weights
    from fastrl.rollout.refit_transport import CudaIpcTransport
    from fastrl.training.actor import Actor, build_lr_scheduler
    from fastrl.training.update_phase import release_cached_memory

    plan = plans[cfg.checkpoint.optimizer_format]
    s: dict[str, Any] = {}  # what the phases build and hand on
    with distributed_session(cfg.parallel, seed=cfg.model.seed) as ctx:
        device, cuda = ctx.device, ctx.device.type == "cuda"
        timeline = Timeline(cuda, lambda: s.get("engine"), plans, cfg.checkpoint.optimizer_format, out / "memory_timeline.jsonl")
        batch = batch_cpu.to(device)
        transport = CudaIpcTransport(int(cfg.rollout.refit_bucket_mb * 2**20), consumers=1)
        transport.record_sums = False  # an ordinary refit (the client asks for sums only on a verified one)

        def policy(trainable: bool):
            return build_policy(hf_dir, parallel=cfg.parallel, precision=cfg.precision, model=cfg.model,
                                trainable=trainable, load_weights=False)

        def start_up():
            actor_policy = policy(True)
            use_weight_names(actor_policy, names)  # the export's names (no weight files in hf_dir)
            s["actor"] = Actor(actor_policy, algorithm=cfg.algorithm, optimizer=cfg.optimizer, parallel=cfg.parallel,
                               precision=cfg.precision,
                               temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0)
            s["scheduler"] = build_lr_scheduler(s["actor"].optimizer, cfg.optimizer, 10)
            s["reference"] = policy(False)
            s["engine"] = EngineStandIn(device.type, engine_sizes(plan, scale), fake_cuda=not cuda)
            s["engine"].call("start")
            return {"parameters": sum(p.numel() for p in actor_policy.parameters())}

        def old():
            s["engine"].call("sleep")  # level 2, as the trainer puts the engine to sleep after generation
            s["old"] = s["actor"].log_probs(batch)

        def ref():
            actor = s["actor"]
            s["ref"] = compute_log_probs(s["reference"].chunks, batch, micro_batch_size=cfg.parallel.micro_batch_size,
                                         temperature=actor.temperature, sequence_multiple=actor.sequence_multiple)

        def update():
            actor = s["actor"]
            metrics = actor.forward_backward(batch.with_tensors(old_log_probs=s.pop("old"), ref_log_probs=s.pop("ref")),
                                             dp_size=1)  # one process
            metrics.update(actor.step(scheduler=s["scheduler"]))
            if not math.isfinite(metrics["actor/loss"]):
                raise FloatingPointError(f"the update's loss is {metrics['actor/loss']}")
            return {k: metrics[k] for k in ("actor/loss", "actor/grad_norm")}

        def empty_cache():
            release_cached_memory(device)

        def refit():
            engine = s["engine"]
            before = engine.memory()
            with (contextlib.nullcontext() if cuda else fake_cuda_ipc()) as fake:
                named = export_hf_weights(s["actor"].policy, cpu=False)
                if fake is not None:
                    named = ((name, fake.typed(t)) for name, t in named)
                start = time.perf_counter()
                count, nbytes = transport.send(named, engine.request, engine.wait)
                seconds = time.perf_counter() - start
            release_cached_memory(device)  # as fastrl.training.update_phase.refit does after a GPU export
            after = engine.memory()
            got = (after["received_tensors"] - before["received_tensors"], after["received_bytes"] - before["received_bytes"])
            if got != (count, nbytes):
                raise RuntimeError(f"the stand-in received {got[0]} tensors / {got[1]} bytes of {count} / {nbytes} sent")
            details = {"tensors": count, "bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9,
                       "bucket_bytes": transport.bucket_bytes}
            if fake is not None:
                details["fake_ipc_handles"] = len(fake.reduce.handles)
            return details

        def validation():
            s["engine"].call("wake")

        def save(fmt: str):
            actor = s["actor"]
            state = sharded_state_dict(actor.policy.chunks, actor.optimizer, is_loading=False, optimizer_format=fmt)
            if cuda:
                torch.cuda.synchronize()
            counted = {"model": tensor_bytes(state["model"]), "optimizer": tensor_bytes(state["optimizer"])}
            del state
            gc.collect()
            if counted["optimizer"]["tensors"] == 0:
                raise RuntimeError(f"the {fmt} state dict holds no optimizer tensor")
            return counted

        def sleep_level1():
            s["engine"].call("sleep_level1")  # vLLM level 1: the weights to host memory, the KV cache freed

        def wake_level1():
            s["engine"].call("wake_all")  # the weights copied back, the KV cache claimed

        def warm_up():
            for step in (old, ref, update, empty_cache, refit, validation):
                step()

        steps: dict[str, Callable[[], Any]] = {
            "start-up": start_up, "warm-up step": warm_up, "generation": lambda: None, "old": old, "ref": ref,
            "update": update, "empty_cache": empty_cache, "refit": refit, "validation": validation,
            "level-1 sleep": sleep_level1, "level-1 wake": wake_level1,
        }
        try:
            for name, plan_phase in TIMELINE:
                if name.startswith("save "):
                    fmt = name.removeprefix("save ")
                    timeline.run(name, plan_phase, lambda fmt=fmt: save(fmt), plan_format=fmt)
                else:
                    timeline.run(name, plan_phase, steps[name])
            probe = staging_probe(device, PROBE_BYTES if cuda else PROBE_BYTES_SMOKE, args.probe_seconds)
        finally:
            engine = s.get("engine")
            standin = engine.close() if engine is not None else {"exit_code": None, "calls": "never started"}
    return {"rows": timeline.rows, "collective_probe": probe, "engine_standin": standin,
            "parameters": (timeline.rows[0].get("details") or {}).get("parameters")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    import importlib.metadata as md

    import torch

    from fastrl.models.memory_plan import ModelDims, estimate_memory
    from fastrl.training.rollout_batch import sequence_multiple
    from recipes import get_recipe

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_smoke:
        print("gpu_memory_timeline: needs CUDA (or --cpu-smoke)", file=sys.stderr)
        return 2
    shapes, scale = (SMOKE, SMOKE_SCALE) if args.cpu_smoke else (QWEN25_VL_3B, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fastrl-memory-timeline-"))
    try:
        hf_dir = write_model_dir(work / "hf", shapes)
        dims = ModelDims.from_hf_config(json.loads((hf_dir / "config.json").read_text()), shapes.name)
        recipe_gib = get_recipe(RECIPE).parallel.gpu_memory_gib
        gpu_gib = min(torch.cuda.get_device_properties(0).total_memory / GIB, recipe_gib) if cuda else recipe_gib
        cfg = plan_config(args, gpu_gib)
        plans = {fmt: estimate_memory(plan_config(args, gpu_gib, fmt), 1, gpu_gib, dims=dims) for fmt in OPTIMIZER_FORMATS}
        grid = image_grid(cfg.data.min_pixels)
        batch = rollout_batch(shapes, rollouts=args.rollouts, prompt_len=args.prompt_len,
                              response_len=args.response_len, grid=grid,
                              multiple=sequence_multiple(cfg.precision, cfg.parallel))
        environment = {"device": torch.cuda.get_device_name(0) if cuda else "CPU", "torch": torch.__version__,
                       "megatron-core": md.version("megatron-core")}
        print(f"gpu_memory_timeline: {environment}; {plans[cfg.checkpoint.optimizer_format].summary()}", flush=True)
        result = run_timeline(args, cfg, hf_dir, hf_weight_names(shapes), batch, plans, args.out, scale)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(
        environment=environment,
        settings={"model": shapes.name, "recipe": RECIPE, "precision": cfg.precision.mode, "rollouts": len(batch),
                  "prompt_len": args.prompt_len, "response_len": args.response_len, "image_grid": list(grid),
                  "micro_batch_size": cfg.parallel.micro_batch_size, "gpu_memory_gib": gpu_gib,
                  "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization, "scale": scale,
                  "engine_bytes": engine_sizes(plans[cfg.checkpoint.optimizer_format], scale),
                  "optimizer_format": cfg.checkpoint.optimizer_format},
        plans={fmt: {"text": p.format(), "timeline": [dataclasses.asdict(r) for r in p.timeline]} for fmt, p in plans.items()},
    )
    text = markdown(result)
    (args.out / "memory_timeline.md").write_text(text + "\n")
    (args.out / "memory_timeline.json").write_text(json.dumps(result, indent=1, default=str))
    print(text, flush=True)
    return 0 if passed(result, PHASES) else 1


if __name__ == "__main__":
    raise SystemExit(main())
