"""The engine-process pieces that need no vLLM: wire framing, refit buckets in shared memory, the
start-up errors of a missing or broken engine environment, refit verification's decision."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import torch

from fastrl.config import ConfigError, ModelConfig, RolloutConfig
from fastrl.rollout import engine_wire as wire
from fastrl.rollout.engine_client import EngineProcessClient
from fastrl.rollout.engine_factory import frozen_vision_weight
from fastrl.rollout.engine_process import EngineStartError
from fastrl.rollout.refit_transport import SharedMemoryTransport, group_buckets
from fastrl.training.refit_verify import RefitProbe, RefitVerificationError, largest_group_difference, verify_refit


def test_wire_round_trip():
    a, b = socket.socketpair()
    msg = {"op": "generate", "prompts": ["x" * 100_000], "sizes": [3]}
    wire.send_message(a, msg)
    assert wire.recv_message(b) == msg
    a.close()
    with pytest.raises(wire.WireClosed):
        wire.recv_message(b)
    assert wire.error_reply(ValueError("bad\nthing"))["error"] == "ValueError: bad thing"


def test_weight_groups():
    assert wire.weight_group("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert wire.weight_group("visual.blocks.0.mlp.fc1.weight") == "visual.blocks.0"
    assert wire.weight_group("lm_head.weight") == "lm_head"
    assert frozen_vision_weight("visual.blocks.0.attn.qkv.weight") and frozen_vision_weight("model.visual.patch_embed.proj.weight")
    assert not frozen_vision_weight("visual.merger.mlp.0.weight") and not frozen_vision_weight("model.layers.0.mlp.up_proj.weight")


def _stream():
    for layer in range(3):
        for p in ("q", "k"):
            yield f"model.layers.{layer}.{p}.weight", torch.full((4, 4), float(layer))
    yield "lm_head.weight", torch.ones(2, 4, dtype=torch.bfloat16)


def test_buckets_never_split_a_layer():
    buckets = list(group_buckets(_stream(), max_bytes=64))
    assert [len(b) for b in buckets] == [2, 2, 2, 1]
    assert len(list(group_buckets(_stream(), max_bytes=10**9))) == 1
    bad = [("model.layers.0.q.weight", torch.ones(1)), ("model.layers.1.q.weight", torch.ones(1)),
           ("model.layers.0.k.weight", torch.ones(1))]
    with pytest.raises(ValueError, match="consecutively"):
        list(group_buckets(bad, 1))


def _read(path: str, entries):
    data = Path(path).read_bytes()
    return {name: torch.frombuffer(bytearray(data[off : off + n]), dtype=getattr(torch, dt)).reshape(shape)
            for name, dt, shape, off, n in entries}


def test_shared_memory_transport_round_trip_and_frozen_tensors():
    t = SharedMemoryTransport(64, skip_after_first=lambda n: n.startswith("model.layers.0."))
    got: dict[str, torch.Tensor] = {}

    def load(request):
        assert request["op"] == "load_weights"
        for path, entries in request["buckets"]:
            got.update(_read(path, entries))
        return "h"

    count, nbytes = t.send(_stream(), load, lambda h: None)
    assert count == 7 and nbytes == 6 * 64 + 16
    for name, tensor in _stream():
        assert torch.equal(got[name], tensor)
    got.clear()
    count, _ = t.send(((n, v + 1) for n, v in _stream()), load, lambda h: None)
    assert count == 5 and not any(n.startswith("model.layers.0.") for n in got)  # frozen: sent once
    replay = {}
    (request,) = t.replay_requests()
    for path, entries in request["buckets"]:
        replay.update(_read(path, entries))
    assert torch.equal(replay["model.layers.0.q.weight"], torch.zeros(4, 4))  # first refit's
    assert torch.equal(replay["model.layers.2.q.weight"], torch.full((4, 4), 3.0))  # latest
    directory = t.dir
    t.close()
    assert not directory.exists()


def test_missing_engine_environment_names_interpreter_and_install_command(tmp_path):
    with pytest.raises(EngineStartError, match=r"/nonexistent/bin/python does not exist.*bash tools/setup_vllm_cpu.sh"):
        EngineProcessClient(tmp_path, python="/nonexistent/bin/python")


def test_broken_engine_environment_is_a_start_up_error(tmp_path):
    pytest.importorskip("transformers")
    from fastrl.models.tiny import build_tiny_text_model_dir

    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("this environment has vLLM")
    model_dir = build_tiny_text_model_dir(tmp_path / "m", ModelConfig())
    with pytest.raises(EngineStartError, match=r"import vllm failed in .*bash tools/setup_vllm_cpu.sh"):
        EngineProcessClient(model_dir, python=sys.executable, timeout_s=60)


class _FakeEngine:
    def __init__(self, engine_lp, held, loaded=3):
        self.engine_lp, self.weight_version, self.loaded = engine_lp, 3, loaded
        self.last_group_sums = {"model.layers.0": 10.0, "lm_head": 5.0}
        self.held = held
        self.scored = 0

    def score(self, sequences, starts):
        self.scored += 1
        return self.engine_lp

    def group_sums(self):
        return self.held

    def loaded_weight_version(self):
        return self.loaded


def test_verify_refit_passes_and_names_the_stale_group():
    probe = RefitProbe([torch.arange(6)], [2])
    trainer = [torch.tensor([-1.0, -2.0, -3.0, -4.0])]
    ok = _FakeEngine([trainer[0] + 1e-6], {"model.layers.0": 10.0, "lm_head": 5.0})
    assert verify_refit(ok, lambda p: trainer, tolerance=1e-4, probe=probe)["refit_verify/abs_diff_mean"] < 1e-5
    stale = _FakeEngine([trainer[0] + 0.1], {"model.layers.0": 10.0, "lm_head": 4.0})
    with pytest.raises(RefitVerificationError, match="after refit 3.*largest mismatching parameter group: lm_head"):
        verify_refit(stale, lambda p: trainer, tolerance=1e-3, probe=probe)
    assert largest_group_difference({"a": 1.0, "b": 2.0}, {"a": 1.0}) == ("b", float("inf"))


def test_verification_names_the_lost_refit_before_the_numerics_probe():
    """Issue 45, item 7. The engine loaded refit 2 (its own count), the trainer sent 3: the weight
    sums it was last sent match what it holds and the probe differs, which the probe alone blamed on
    "the engine's numerics or weight-name mapping". catches: the probe run before (or without) the
    engine's loaded-version check."""
    probe = RefitProbe([torch.arange(6)], [2])
    trainer = [torch.tensor([-1.0, -2.0, -3.0, -4.0])]
    lost = _FakeEngine([trainer[0] + 0.1], {"model.layers.0": 10.0, "lm_head": 5.0}, loaded=2)
    with pytest.raises(RefitVerificationError) as err:
        verify_refit(lost, lambda p: trainer, tolerance=1e-3, probe=probe)
    text = str(err.value)
    assert text.startswith("refit verification after refit 3: refit 3 did not reach the engine: it holds weight version 2")
    assert "numerics" not in text and lost.scored == 0  # the probe never ran against the older weights
    lost.loaded = 0
    with pytest.raises(RefitVerificationError, match=r"refits 1 to 3 \(at least refit 1\) did not reach the engine"):
        verify_refit(lost, lambda p: trainer, tolerance=1e-3, probe=probe)


def test_engine_config_fields_are_checked():
    RolloutConfig(engine="vllm", verify_refit_every=0)
    for bad in (dict(engine_timeout_s=0), dict(engine_restart_retries=-1), dict(verify_refit_every=-1),
                dict(verify_refit_tolerance=0), dict(refit_bucket_mb=0)):
        with pytest.raises(ConfigError):
            RolloutConfig(**bad)


def test_vllm_engine_without_an_interpreter_is_refused_naming_the_setting():
    """vLLM always runs in its own process: no interpreter is a config error, not another engine."""
    RolloutConfig(engine="hf", engine_python=None)
    with pytest.raises(ConfigError, match=r"rollout.engine='vllm' .* needs rollout.engine_python.*got None"):
        RolloutConfig(engine="vllm", engine_python=None)


def test_pack_flat_round_trips_every_dtype_and_shape():
    """The flat bucket of the CUDA IPC transport (packed the same way on any device): each tensor at
    the next 256-byte boundary."""
    from fastrl.rollout.refit_transport import pack_flat

    bucket = [("a.weight", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
              ("a.bias", torch.tensor([1.5, -2.0], dtype=torch.bfloat16)),
              ("b.weight", torch.arange(12, dtype=torch.float32).reshape(3, 4).t())]  # not contiguous
    buffer, entries = pack_flat(bucket)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 512 + 48
    assert [(e[0], e[1], e[2], e[3], e[4]) for e in entries] == [
        ("a.weight", "float32", (2, 3), 0, 24), ("a.bias", "bfloat16", (2,), 256, 4), ("b.weight", "float32", (4, 3), 512, 48)]
    for (name, dtype, shape, offset, nbytes), (_, t) in zip(entries, bucket):
        view = buffer[offset : offset + nbytes].view(getattr(torch, dtype)).reshape(shape)
        assert torch.equal(view, t), name


@pytest.mark.parametrize("packer", ["pack_flat", "bucket_file"])
def test_a_wide_dtype_after_an_odd_length_narrow_one_is_viewable_by_the_engine(packer, tmp_path):
    """Back to back, an fp32 tensor after 3,003 bf16 values sat at byte 6,006, which the engine's
    ``bucket_views`` cannot view as fp32 (torch: offset must be divisible by 4; seen on an H200)."""
    from fastrl.rollout import engine_process, refit_transport

    spec = importlib.util.spec_from_file_location("fastrl_engine_server_align", engine_process.SERVER)
    server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(server)
    bucket = [("q.bias", torch.randn(1001, 3).to(torch.bfloat16)), ("norm.weight", torch.randn(7)),
              ("positions", torch.arange(5, dtype=torch.int64)), ("scale", torch.randn(3).to(torch.float16))]
    if packer == "pack_flat":
        buffer, entries = refit_transport.pack_flat(bucket)
    else:
        f = refit_transport._BucketFile(tmp_path / "bucket.bin")
        assert f.write(bucket) == 6006 + 28 + 40 + 6  # the tensors' bytes, padding not counted
        buffer, entries = torch.frombuffer(f.mm, dtype=torch.uint8), f.entries
    assert all(offset % refit_transport.ALIGN == 0 for _, _, _, offset, _ in entries)
    views = server.bucket_views([(buffer, entries)])
    for (name, view), (_, t) in zip(views, bucket):
        assert view.dtype == t.dtype and torch.equal(view, t), name
    if packer == "bucket_file":
        f.close()


def test_the_client_builds_its_ipc_transport_with_one_handle_per_engine_worker(tmp_path, monkeypatch):
    # Breakage caught: the transport built for one consumer whatever the engine's tensor-parallel
    # size: a TP8 engine (the 32B / 72B recipes) would be refused at the first refit (or, with one
    # shared handle, keep every bucket of every refit on the trainer's GPU).
    from fastrl.models.tiny import build_tiny_text_model_dir
    from fastrl.rollout import engine_client

    made = []

    class _Made(Exception):
        pass

    def record(name, bucket_bytes, **kwargs):
        made.append((name, kwargs["consumers"]))
        raise _Made

    monkeypatch.setattr(engine_client, "make_transport", record)
    model_dir = build_tiny_text_model_dir(tmp_path / "m", ModelConfig())
    for tp in (1, 8):
        with pytest.raises(_Made):
            EngineProcessClient(model_dir, python=sys.executable, transport="cuda_ipc", llm_kwargs={"tensor_parallel_size": tp})
    assert made == [("cuda_ipc", 1), ("cuda_ipc", 8)]
