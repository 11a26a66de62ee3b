"""Parts of the vLLM engine that need no vLLM: import isolation and refit bucketing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fastrl.rollout.vllm_engine import _buckets, weight_group


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
