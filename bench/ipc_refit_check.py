#!/usr/bin/env python
"""The CUDA IPC refit on a real GPU, trainer and engine in separate processes, without vLLM.

The trainer side is FastRL's own :class:`fastrl.rollout.refit_transport.CudaIpcTransport` (flat
bucket, ``reduce_tensor`` handle, one ``load_weights_ipc`` request per bucket over the engine wire).
The engine side is a separate interpreter running the engine server's own code
(``fastrl/rollout/engine_server.py`` loaded by path: ``Server.op_load_weights_ipc`` ->
``collective_rpc(reload_ipc_bucket, args=...)``) around a stand-in for vLLM's ``LLM`` whose workers
keep what ``reload_weights`` gives them: one worker in the engine process (vLLM's uni-process
executor, ``tensor_parallel_size=1``), or two worker processes that receive the callable
cloudpickled and its arguments pickled (vLLM's multiproc executor, ``tensor_parallel_size=2``; here
both workers share the one GPU). vLLM itself is not installed on the check machine.

Checks, per worker count, over two refits (the second with changed weights, so a reused allocator
block or a stale handle cache shows):

- every tensor arrives bit-exact in every worker (a position-weighted byte checksum);
- the sums of squares the engine reports for what arrived equal the trainer's
  (:func:`fastrl.rollout.refit_checks.square_sum`) to 1e-9 relative;
- the trainer's allocated GPU memory after the refit is back at its baseline (within 1 MiB);
- the refit's bandwidth (GB/s, bucket copies and handle round trips included), timed after one
  round trip to the engine (its processes started and imported; the first refit still includes
  the workers' first opening of the buckets and the stand-in's first allocation of its copies).

Writes ``ipc_refit.jsonl`` (one row per worker count) and prints a table; exit 0 when every check
passed. Needs CUDA (exit 2 without it).

    python bench/ipc_refit_check.py --gib 2 --bucket-mib 256 --out runs/ipc_refit
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "fastrl" / "rollout" / "engine_server.py"


def checksum(tensor) -> int:
    """Position-weighted sum of a tensor's bytes (int64, computed on its device): equal only when
    every byte is in its place."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 251 + 1
    return int((flat * weights).sum().item())


# ----------------------------------------------------------------------------- engine side


def _load_server():
    spec = importlib.util.spec_from_file_location("fastrl_engine_server_check", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StandInWorker:
    """What a vLLM worker's ``reload_weights`` does for this check: copy each tensor into its own."""

    def __init__(self, rpc_rank: int) -> None:
        self.rpc_rank = rpc_rank  # its index in the executor, as vLLM's WorkerWrapperBase has it
        self.params: dict = {}

    def reload_weights(self, weights_iterator) -> None:
        for name, tensor in weights_iterator:
            if name in self.params and self.params[name].shape == tensor.shape:
                self.params[name].copy_(tensor)
            else:
                self.params[name] = tensor.clone()

    def dump(self) -> dict:
        return {name: checksum(t) for name, t in self.params.items()}


def _worker_main(conn, rank: int) -> None:
    """A worker process of the two-worker engine: runs cloudpickled callables on its worker."""
    import cloudpickle
    import torch

    torch.cuda.set_device(0)
    worker = StandInWorker(rank)
    while True:
        message = conn.recv()
        if message is None:
            return
        method, args = cloudpickle.loads(message)
        try:
            conn.send(("ok", worker.dump() if method == "dump" else method(worker, *args)))
        except BaseException as error:  # noqa: BLE001 -- sent back to the engine process
            conn.send(("error", f"{type(error).__name__}: {error}"))


class StandInLLM:
    """vLLM's ``LLM`` as the engine server uses it for a refit: ``collective_rpc`` and two resets."""

    def __init__(self, workers: int) -> None:
        from types import SimpleNamespace

        self.llm_engine = SimpleNamespace(reset_encoder_cache=lambda: None)
        self.workers = workers
        if workers == 1:
            self.worker = StandInWorker(0)
            return
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, rank), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def reset_prefix_cache(self) -> None:
        pass

    def collective_rpc(self, method, args=(), kwargs=None):
        if kwargs:
            raise ValueError("the IPC refit passes positional args only")
        if self.workers == 1:
            return [self.worker.dump() if method == "dump" else method(self.worker, *args)]
        import cloudpickle

        payload = cloudpickle.dumps((method, args))  # as vLLM's multiproc executor sends a callable
        for conn in self.conns:
            conn.send(payload)
        replies = [conn.recv() for conn in self.conns]
        errors = [r[1] for r in replies if r[0] != "ok"]
        if errors:
            raise RuntimeError(f"worker: {errors[0]}")
        return [r[1] for r in replies]

    def close(self) -> None:
        if self.workers > 1:
            for conn in self.conns:
                conn.send(None)
            for proc in self.procs:
                proc.join(timeout=30)


def engine_main(fd: int, workers: int) -> None:
    """The engine process: the real server's IPC operation around :class:`StandInLLM`."""
    import torch

    module = _load_server()
    wire = module.wire
    torch.cuda.set_device(0)
    server = module.Server.__new__(module.Server)
    server.llm, server.sleep_enabled = StandInLLM(workers), False
    server.asleep, server.weights_awake = False, True
    server.engine_workers = workers
    server._maps, server.received, server.weight_version = {}, {}, 0
    sock = socket.socket(fileno=fd)
    try:
        while True:
            req = wire.recv_message(sock)
            op = req["op"]
            try:
                if op == "load_weights_ipc":
                    reply = {"ok": True, **server.op_load_weights_ipc(req)}
                elif op == "dump":
                    reply = {"ok": True, "workers": server.llm.collective_rpc("dump"), "received": dict(server.received)}
                elif op == "shutdown":
                    wire.send_message(sock, {"ok": True})
                    return
                else:
                    reply = wire.error_reply(f"unknown op {op!r}")
            except Exception as error:  # noqa: BLE001 -- the trainer side reports it
                reply = wire.error_reply(error)
            wire.send_message(sock, reply)
    finally:
        server.llm.close()


# ----------------------------------------------------------------------------- trainer side


def make_weights(total_bytes: int, seed: int):
    """Named CUDA tensors like a model's: bf16 matrices of 32 MiB, an fp32 norm vector and an
    odd-sized bf16 tensor per layer (so bucket offsets are not all round), until ``total_bytes``."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    weights, size, layer = [], 0, 0
    while size < total_bytes:
        for name, shape, dtype in (
            (f"model.layers.{layer}.mlp.up_proj.weight", (4096, 4096), torch.bfloat16),
            (f"model.layers.{layer}.input_layernorm.weight", (4096,), torch.float32),
            (f"model.layers.{layer}.self_attn.q_proj.bias", (1001, 3), torch.bfloat16),
        ):
            t = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
            weights.append((name, t))
            size += t.numel() * t.element_size()
        layer += 1
    return weights, size


def refit_once(transport, sock, wire, weights) -> tuple[int, int, float]:
    import torch

    def request(req):
        wire.send_message(sock, req)

    def wait(_):
        reply = wire.recv_message(sock)
        if not reply.get("ok"):
            raise RuntimeError(f"engine: {reply.get('error')}")
        return reply

    torch.cuda.synchronize()
    start = time.perf_counter()
    count, nbytes = transport.send(iter(weights), request, wait)
    torch.cuda.synchronize()
    return count, nbytes, time.perf_counter() - start


def check_workers(workers: int, args) -> dict:
    import torch

    from fastrl.rollout import engine_wire as wire
    from fastrl.rollout.refit_checks import square_sum
    from fastrl.rollout.refit_transport import CudaIpcTransport

    parent_sock, child_sock = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--engine", "--fd", str(child_sock.fileno()), "--workers", str(workers)],
        pass_fds=(child_sock.fileno(),),
        cwd=REPO,
    )
    child_sock.close()
    row: dict = {"workers": workers, "problems": []}
    try:
        # one round trip first: the engine process (and its worker processes) started and imported,
        # so that the first refit's time is the transport's and the workers' first opening
        start = time.perf_counter()
        wire.send_message(parent_sock, {"op": "dump"})
        if not wire.recv_message(parent_sock).get("ok"):
            raise RuntimeError("engine: the start-up round trip failed")
        row["engine_start_s"] = time.perf_counter() - start
        bucket_bytes = int(args.bucket_mib * 2**20)
        transport = CudaIpcTransport(bucket_bytes, consumers=workers)
        for refit in (1, 2):
            weights, size = make_weights(int(args.gib * 2**30), seed=refit)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            count, nbytes, seconds = refit_once(transport, parent_sock, wire, weights)
            after = torch.cuda.memory_allocated()
            torch.cuda.ipc_collect()
            collected = torch.cuda.memory_allocated()
            wire.send_message(parent_sock, {"op": "dump"})
            dump = wire.recv_message(parent_sock)
            if not dump.get("ok"):
                raise RuntimeError(f"engine: {dump.get('error')}")
            expected = {name: checksum(t) for name, t in weights}
            for w, got in enumerate(dump["workers"]):
                wrong = [n for n in expected if got.get(n) != expected[n]]
                if wrong:
                    row["problems"].append(f"refit {refit}: worker {w}: {len(wrong)} tensors differ, e.g. {wrong[0]}")
            trainer_sums = {n: float(square_sum(t)) for n, t in weights}
            sums_wrong = [n for n, s in trainer_sums.items() if abs(dump["received"].get(n, -1.0) - s) > 1e-9 * max(1.0, s)]
            if sums_wrong:
                row["problems"].append(f"refit {refit}: {len(sums_wrong)} sums of squares differ, e.g. {sums_wrong[0]}")
            if count != len(weights) or nbytes != size:
                row["problems"].append(f"refit {refit}: sent {count} tensors / {nbytes} bytes of {len(weights)} / {size}")
            if after - base > 2**20:
                row["problems"].append(
                    f"refit {refit}: trainer GPU memory {(after - base) / 2**20:.0f} MiB above its baseline after the refit "
                    f"(every bucket should be freed once the engine replied; buckets of {args.bucket_mib:g} MiB)"
                )
            row[f"refit{refit}"] = {
                "tensors": count,
                "bytes": nbytes,
                "seconds": seconds,
                "gb_per_s": nbytes / seconds / 1e9,
                "trainer_mib_above_baseline": (after - base) / 2**20,
                "trainer_mib_above_baseline_after_ipc_collect": (collected - base) / 2**20,
            }
            del weights
        wire.send_message(parent_sock, {"op": "shutdown"})
        wire.recv_message(parent_sock)
        proc.wait(timeout=60)
    except Exception as error:  # noqa: BLE001 -- a row with its error
        row["problems"].append(f"{type(error).__name__}: {error}")
        proc.kill()
    finally:
        parent_sock.close()
    row["status"] = "ok" if not row["problems"] else "FAILED"
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0, help="weights per refit (GiB)")
    p.add_argument("--bucket-mib", type=float, default=256.0, help="refit bucket (MiB)")
    p.add_argument("--workers", default="1,2", help="engine worker counts to check")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "ipc_refit")
    p.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine:
        engine_main(args.fd, int(args.workers))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("ipc_refit_check: needs CUDA (a CUDA IPC handle exists only for GPU memory)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        row = check_workers(workers, args)
        rows.append(row)
        with (args.out / "ipc_refit.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"CUDA IPC refit, {args.gib:g} GiB per refit in {args.bucket_mib:g} MiB buckets, {torch.cuda.get_device_name(0)}")
    print("| engine workers | status | refit 1 GB/s | refit 2 GB/s | trainer MiB above baseline (1, 2) | problems |")
    print("| ---: | --- | ---: | ---: | --- | --- |")
    for r in rows:
        r1, r2 = r.get("refit1", {}), r.get("refit2", {})
        print(
            f"| {r['workers']} | {r['status']} | {r1.get('gb_per_s', float('nan')):.1f} | {r2.get('gb_per_s', float('nan')):.1f} "
            f"| {r1.get('trainer_mib_above_baseline', float('nan')):.0f}, {r2.get('trainer_mib_above_baseline', float('nan')):.0f} "
            f"| {'; '.join(r['problems'])} |"
        )
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
