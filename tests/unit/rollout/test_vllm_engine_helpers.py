"""Parts of the vLLM engine that need no vLLM: import isolation and refit bucketing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fastrl.rollout.vllm_engine import group_buckets as _buckets
from fastrl.rollout.vllm_engine import weight_group


def test_importing_fastrl_and_the_vllm_engine_module_does_not_import_vllm():
    code = (
        "import sys, fastrl, fastrl.rollout, fastrl.rollout.hf_engine, fastrl.rollout.vllm_engine; "
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_weight_groups_are_transformer_blocks_or_modules():
    assert weight_group("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert weight_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert weight_group("visual.blocks.0.attn.qkv.bias") == "visual.blocks.0"
    assert weight_group("lm_head.weight") == "lm_head"
    assert weight_group("visual.merger.mlp.0.weight") == "visual.merger.mlp.0"


def test_buckets_never_split_a_layer_and_respect_the_size_bound():
    names = [f"model.layers.{i}.{p}.weight" for i in range(3) for p in ("self_attn.q_proj", "self_attn.k_proj", "mlp.up_proj")]
    items = [("model.embed_tokens.weight", torch.zeros(100))] + [(n, torch.zeros(100)) for n in names]
    items.append(("lm_head.weight", torch.zeros(100)))
    # 400 bytes per tensor; a bucket closes at the first group boundary once it holds >= 1,000 bytes
    buckets = list(_buckets(items, 1000))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in items]
    for bucket in buckets:
        groups = [weight_group(n) for n, _ in bucket]
        assert all(sum(1 for x in groups if x == g) == groups.count(g) for g in groups)
    seen: list[str] = []
    for bucket in buckets:
        here = {weight_group(n) for n, _ in bucket}
        assert not here & set(seen)
        seen.extend(here)
    assert [len(b) for b in buckets] == [4, 3, 3, 1]  # embed + layer 0 | layer 1 | layer 2 | lm_head
    assert len(list(_buckets(items, 10**9))) == 1


def test_buckets_refuse_a_layer_split_across_the_stream():
    items = [
        ("model.layers.0.self_attn.q_proj.weight", torch.zeros(10)),
        ("model.layers.1.self_attn.q_proj.weight", torch.zeros(10)),
        ("model.layers.0.self_attn.k_proj.weight", torch.zeros(10)),
    ]
    with pytest.raises(ValueError, match="model.layers.0"):
        list(_buckets(items, 1))


class _RecordingLLM:
    """Records the calls the engine makes on ``vllm.LLM`` (sleep mode is GPU-only in vLLM)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method, kwargs):
        self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def _engine_with(llm, *, sleep_enabled=True):
    from fastrl.rollout.vllm_engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)  # no vLLM: only the sleep/refit logic
    engine.llm, engine.sleep_enabled, engine.refit_bucket_bytes = llm, sleep_enabled, 2**20
    engine._asleep, engine._weights_awake, engine._prefix_cache_stale = False, True, False
    engine.weight_version = 0
    return engine


def test_refit_while_asleep_wakes_weights_first_and_kv_cache_later(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    llm = _RecordingLLM()
    engine = _engine_with(llm)
    engine.sleep()
    engine.sleep()  # idempotent
    weights = [("model.layers.0.mlp.up_proj.weight", torch.zeros(2)), ("lm_head.weight", torch.zeros(2))]
    assert engine.update_weights(iter(weights)) == 2
    engine.wake()
    engine.wake()  # idempotent
    assert llm.calls == [
        ("sleep", 1),
        ("wake_up", ("weights",)),
        ("reload_weights", ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]),
        ("wake_up", ("kv_cache",)),
        ("reset_prefix_cache",),
    ]
    assert engine.weight_version == 1


def test_sleep_wake_without_refit_and_without_sleep_mode():
    llm = _RecordingLLM()
    engine = _engine_with(llm)
    engine.sleep()
    engine.wake()
    assert llm.calls == [("sleep", 1), ("wake_up", None)]
    off = _RecordingLLM()
    engine = _engine_with(off, sleep_enabled=False)
    engine.sleep()
    engine.wake()
    assert off.calls == []


def test_from_pretrained_maps_the_rollout_section(monkeypatch):
    from fastrl.config import RolloutConfig
    from fastrl.rollout.vllm_engine import VLLMRolloutEngine

    seen = {}

    def fake_init(self, model_path, **kwargs):
        seen.update(kwargs, model_path=model_path)

    monkeypatch.setattr(VLLMRolloutEngine, "__init__", fake_init)
    rollout = RolloutConfig(engine="vllm", engine_tensor_parallel_size=2, gpu_memory_utilization=0.4, seed=9,
                            sleep_between_steps=False, suppress_special_tokens=True)
    VLLMRolloutEngine.from_pretrained("/models/x", rollout, max_model_len=1024)
    assert seen == {
        "model_path": "/models/x", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4, "seed": 9,
        "enable_sleep_mode": False, "suppress_special_tokens": True, "max_model_len": 1024,
    }
