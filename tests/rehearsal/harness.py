"""The engine harness of the GPU rehearsal: the real engine server (``engine_server.py``, loaded by
path as the engine process loads it) around a :class:`RecordingLLM`, and a GPU client
(:class:`EngineProcessClient` with the CUDA IPC transport) that talks to it in process instead of
over its socket."""

from __future__ import annotations

import importlib.util
import types

import torch

from fastrl.rollout import engine_process, refit_transport
from fastrl.rollout.engine_client import EngineProcessClient
from fastrl.rollout.engine_process import EngineError
from tests.rehearsal.fake_cuda import RecordingLLM, cuda_typed

WEIGHTS = [("model.layers.0.mlp.up_proj.weight", torch.arange(6.0).reshape(2, 3)),
           ("model.layers.1.mlp.up_proj.weight", torch.ones(2, 2)),
           ("lm_head.weight", torch.full((4,), 2.0))]


def server_module(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    spec = importlib.util.spec_from_file_location("fastrl_engine_server_rehearsal", engine_process.SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_engine(monkeypatch, *, verify_every: int = 0, engine_tp: int = 1):
    """A GPU client (CUDA IPC transport, sleep mode) wired to a real server around a RecordingLLM
    (an engine of ``engine_tp`` tensor-parallel workers)."""
    module = server_module(monkeypatch)
    llm = RecordingLLM(tensor_parallel_size=engine_tp)
    server = module.Server.__new__(module.Server)
    server.llm, server.sleep_enabled = llm, True
    server.asleep, server.weights_awake = False, True  # vLLM starts with weights and KV cache
    server.engine_workers = engine_tp
    server._maps, server.received, server.weight_version = {}, {}, 0
    client = EngineProcessClient.__new__(EngineProcessClient)
    client.name, client.weight_version, client.verify_every, client.verify_tolerance = "engine", 0, verify_every, 1.0
    client.refit_metrics, client.last_group_sums = {}, {}
    client.restart_retries, client._closed = 0, False
    client.transport = refit_transport.make_transport(
        refit_transport.transport_for_device(torch.device("cuda", 0)), 1, consumers=engine_tp)
    replies: list = []

    def call(req):
        reply = {"ok": True, **getattr(server, f"op_{req['op']}")(req)}
        return reply

    def send(req):
        try:
            replies.append(call(req))
        except Exception as err:  # noqa: BLE001 - as the server's loop reports it
            replies.append({"ok": False, "error": f"{type(err).__name__}: {err}"})

    def wait_ok(op):
        reply = replies.pop(0)
        if not reply.get("ok"):
            raise EngineError(f"{client.name}: {op} failed: {reply.get('error')}")

    client._send, client._wait_ok, client._call = send, wait_ok, call
    return client, server, llm


def exporter(record: list):
    """``export_hf_weights`` of a policy on a GPU: tensors on ``cuda:0`` unless asked for the CPU."""

    def export(policy, *, cpu=True):
        record.append(cpu)
        for name, t in WEIGHTS:
            yield name, (t.clone() if cpu else cuda_typed(t.clone()))

    return export


def gpu_pack(monkeypatch):
    """``pack_flat`` keeps its buffer on the tensors' (fake) device."""
    real = refit_transport.pack_flat

    def pack(bucket):
        buffer, entries = real([(n, torch.Tensor(t)) for n, t in bucket])
        return (cuda_typed(buffer) if bucket[0][1].device.type == "cuda" else buffer), entries

    monkeypatch.setattr(refit_transport, "pack_flat", pack)


def stub_actor():
    return types.SimpleNamespace(policy=object(), policy_version=0)
