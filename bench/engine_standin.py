#!/usr/bin/env python
"""The engine stand-in of the memory-timeline check (``bench/gpu_memory_timeline.py``): a process of
its own on the trainer's GPU that holds, phase by phase, the GPU memory a colocated vLLM engine
holds, and takes the refit through the engine server's own code. vLLM is not installed on the check
machine.

Memory, as vLLM 0.32's sleep mode (``LLM.sleep`` / ``LLM.wake_up``) holds it, with the memory
plan's runtime (``fastrl.models.memory_plan.ENGINE_RUNTIME_GIB``):

- **start** (``start``): vLLM claims its whole share at start-up: the runtime, the weights and the
  KV cache; the stand-in, like the plan, keeps the runtime on the GPU through every sleep. (vLLM
  0.32's own sleep keeps less there: its ``CuMemBackend.suspend`` copies the CuMem pools tagged
  ``runtime`` and ``cudagraph`` to host memory and unmaps them at every level, and maps them back
  at any wake; what stays is the memory outside those pools, the CUDA context and NCCL's buffers.
  So the stand-in, as the plan, errs high while the engine sleeps.)
- **sleep level 2** (``sleep``, the engine server's ``op_sleep``, what FastRL does between steps):
  weights and KV cache discarded, the weights not copied to host memory (vLLM keeps only the
  model's buffers and the pools above there);
- **sleep level 1** (``sleep_level1``; FastRL does not use it): the weights copied to host memory
  and their GPU memory freed, the KV cache discarded;
- **wake** (``wake_up(tags)``): the tagged regions claimed again; after level 1 the weights are
  copied back from host memory; after level 2 they are allocated but hold nothing until a refit.

Each region is one uint8 tensor of its size on the device (``--device``); freeing one ends with
``torch.cuda.empty_cache()``, so the GPU memory goes back to the device as vLLM's allocator unmaps it.

Refit: ``load_weights_ipc`` requests go to ``fastrl/rollout/engine_server.py``'s own
``Server.op_load_weights_ipc`` (loaded by path, as the engine process loads it), which wakes the
weights (``wake_up(tags=["weights"])``), opens the CUDA IPC handle and calls ``reload_weights`` of
this stand-in's worker through ``collective_rpc``; the worker copies every tensor's bytes into the
weights region in order (wrapping around when the refit carries more bytes than the region holds:
fp32 in the CPU smoke run), as vLLM copies into the parameters it holds. A reload into weights that
are asleep raises, as it would fail in vLLM. ``sleep`` and ``wake`` are the server's ``op_sleep`` and
``op_wake`` (the latter refuses a wake with no refit since a level-2 sleep).

Every reply carries ``memory``: the bytes held per region, the host copy, the state, the refit's
tensors and bytes received, and on a GPU this process's ``torch.cuda.memory_reserved``.

``--fake-cuda`` (the CPU smoke run): the recording fake of the CUDA layer (``tests/rehearsal/fake_cuda.py``)
replaces ``torch.cuda`` in this process, so that the server's GPU-only code runs on the CPU.

    python bench/engine_standin.py --fd N --device cuda --weights-bytes W --kv-bytes K --runtime-bytes R
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "fastrl" / "rollout" / "engine_server.py"
REGIONS = ("runtime", "weights", "kv_cache")


class StandInWorker:
    """vLLM's worker as the IPC refit meets it (``rpc_rank``, ``reload_weights``, ``model_runner``)."""

    def __init__(self, llm: "StandInLLM") -> None:
        self.llm = llm
        self.rpc_rank = 0
        self.model_runner = types.SimpleNamespace(get_model=lambda: types.SimpleNamespace())  # no output layer to repack

    def reload_weights(self, weights_iterator=None, **_) -> None:
        self.llm.load(weights_iterator)


class StandInLLM:
    """vLLM's ``LLM`` as the engine server drives it for sleep, wake and refit, holding real memory.

    Args:
        device: where the regions live (``cuda`` on the check machine, ``cpu`` in the smoke run).
        sizes: bytes of ``runtime``, ``weights`` and ``kv_cache`` (each at least 1).
    """

    def __init__(self, device: str, sizes: dict[str, int]) -> None:
        import torch

        self.device = torch.device(device)
        self.sizes = {tag: max(1, int(sizes[tag])) for tag in REGIONS}
        self.held: dict = {tag: None for tag in REGIONS}
        self.host_weights = None
        self.weights_valid = False
        self.calls: list[tuple] = []
        self.received_tensors = self.received_bytes = 0
        self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: None)
        self.worker = StandInWorker(self)

    # ---- memory ------------------------------------------------------------------------------

    def _claim(self, tag: str) -> None:
        import torch

        if self.held[tag] is None:
            self.held[tag] = torch.empty(self.sizes[tag], dtype=torch.uint8, device=self.device)

    def _release(self, *tags: str) -> None:
        import torch

        for tag in tags:
            self.held[tag] = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def start(self) -> None:
        """vLLM's start-up: the whole share claimed (runtime, weights, KV cache)."""
        self.calls.append(("start",))
        for tag in REGIONS:
            self._claim(tag)
        self.weights_valid = True  # vLLM loads the model directory's weights at start-up

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        if level not in (1, 2):
            raise ValueError(f"sleep level {level}: the stand-in models vLLM's levels 1 and 2")
        if level == 1 and self.held["weights"] is not None:
            self.host_weights = self.held["weights"].cpu()  # vLLM level 1 backs the weights up in host memory
        if level == 2:
            self.host_weights, self.weights_valid = None, False
        self._release("weights", "kv_cache")

    def wake_up(self, tags=None) -> None:
        tags = list(tags or ("weights", "kv_cache"))
        self.calls.append(("wake_up", tuple(tags)))
        for tag in tags:
            if tag not in ("weights", "kv_cache"):
                raise ValueError(f"wake_up tag {tag!r}: vLLM knows 'weights' and 'kv_cache'")
            self._claim(tag)
            if tag == "weights" and self.host_weights is not None:
                self.held["weights"].copy_(self.host_weights.to(self.device))
                self.host_weights = None

    def load(self, weights_iterator) -> None:
        """Copy each tensor's bytes into the weights region, in order (wrapping around)."""
        import torch

        region = self.held["weights"]
        if region is None:
            raise RuntimeError("reload_weights into sleeping weights (wake_up(tags=['weights']) first)")
        size, offset = region.numel(), self.received_bytes
        for _, tensor in weights_iterator:
            flat = tensor.detach().reshape(-1).view(torch.uint8)
            pos, n = 0, flat.numel()
            while pos < n:
                start = (offset + pos) % size
                take = min(n - pos, size - start)
                region[start : start + take].copy_(flat[pos : pos + take])
                pos += take
            offset += n
            self.received_tensors += 1
        self.received_bytes = offset
        self.weights_valid = True

    # ---- what the engine server calls -----------------------------------------------------------

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        call = getattr(self.worker, method) if isinstance(method, str) else (lambda *a, **k: method(self.worker, *a, **k))
        return [call(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> None:
        pass

    def state(self) -> str:
        held = {tag for tag in REGIONS if self.held[tag] is not None}
        if "runtime" not in held:
            return "not started"
        if {"weights", "kv_cache"} <= held:
            return "awake: weights + KV"
        if "weights" in held:
            return "weights only"
        return "asleep (level 1: weights in host memory)" if self.host_weights is not None else "asleep (level 2)"

    def memory(self) -> dict:
        import torch

        held = {tag: 0 if t is None else int(t.numel()) for tag, t in self.held.items()}
        out = {
            "held_bytes": held, "claimed_bytes": sum(held.values()), "state": self.state(),
            "host_weights_bytes": 0 if self.host_weights is None else int(self.host_weights.numel()),
            "received_tensors": self.received_tensors, "received_bytes": self.received_bytes,
            "weights_valid": self.weights_valid,
        }
        if self.device.type == "cuda":
            out["reserved_bytes"] = int(torch.cuda.memory_reserved())
        return out


def load_server():
    """``fastrl/rollout/engine_server.py`` loaded by path, as the engine process runs it."""
    spec = importlib.util.spec_from_file_location("fastrl_engine_server_standin", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Patcher:
    """The part of pytest's ``monkeypatch`` that ``FakeCuda.install`` uses (for the life of this process)."""

    @staticmethod
    def setattr(target, name, value) -> None:
        setattr(target, name, value)

    @staticmethod
    def setenv(name, value) -> None:
        os.environ[name] = value

    @staticmethod
    def delenv(name, raising=True) -> None:
        os.environ.pop(name, None)


def serve(fd: int, llm: StandInLLM) -> None:
    """Answer the trainer's requests on the socket ``fd`` until ``shutdown``."""
    module = load_server()
    wire = module.wire
    server = module.Server.__new__(module.Server)
    server.llm, server.sleep_enabled = llm, True
    server.asleep, server.weights_awake = False, True
    server.engine_workers = 1
    server._maps, server.received, server.weight_version = {}, {}, 0
    sock = socket.socket(fileno=fd)
    ops = {
        "start": lambda req: llm.start() or {},
        "load_weights_ipc": server.op_load_weights_ipc,
        "sleep": server.op_sleep,  # level 2
        "wake": server.op_wake,  # the KV cache back, after a refit
        "sleep_level1": lambda req: llm.sleep(level=1) or {},
        "wake_all": lambda req: llm.wake_up() or {},
        "memory": lambda req: {},
    }
    while True:
        req = wire.recv_message(sock)
        op = req["op"]
        if op == "shutdown":
            wire.send_message(sock, {"ok": True, "calls": llm.calls})
            return
        try:
            if op not in ops:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, **ops[op](req)}
        except Exception as error:  # noqa: BLE001 -- the trainer records it in the phase's row
            reply = wire.error_reply(error)
        try:
            reply["memory"] = llm.memory()
        except Exception as error:  # noqa: BLE001
            reply["memory"] = {"error": f"{type(error).__name__}: {error}"}
        wire.send_message(sock, reply)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fd", type=int, required=True, help="the socket to the trainer")
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--weights-bytes", type=int, required=True)
    p.add_argument("--kv-bytes", type=int, required=True)
    p.add_argument("--runtime-bytes", type=int, required=True)
    p.add_argument("--fake-cuda", action="store_true", help="CPU smoke: tests/rehearsal's recording fake of torch.cuda")
    args = p.parse_args(argv)
    import torch

    if args.fake_cuda:
        from tests.rehearsal.fake_cuda import FakeCuda

        FakeCuda(device_count=1).install(_Patcher())
    elif args.device == "cuda":
        torch.cuda.set_device(0)
    sizes = {"weights": args.weights_bytes, "kv_cache": args.kv_bytes, "runtime": args.runtime_bytes}
    serve(args.fd, StandInLLM(args.device, sizes))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
