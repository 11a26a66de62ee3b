"""megatron-bridge imports without Transformer Engine / triton, and its TP scatter is contiguous."""

from __future__ import annotations

import sys
import types

import torch

from fastrl.models.bridge_compat import import_auto_bridge


def test_import_leaves_no_stand_in_and_megatron_sees_no_transformer_engine():
    auto_bridge = import_auto_bridge()
    assert auto_bridge.__name__ == "AutoBridge"
    assert not any(name == "transformer_engine" or name.startswith("transformer_engine.") for name in sys.modules)
    assert not any(vars(m).get("__fastrl_standin__") for m in list(sys.modules.values()) if m is not None)
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer import attention

    assert gpt_layer_specs.HAVE_TE is False and attention.HAVE_TE is False


def test_row_parallel_shards_are_made_contiguous_before_the_scatter():
    import_auto_bridge()
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    full = torch.arange(24.0).reshape(4, 6)
    shard = torch.chunk(full, 2, dim=1)[0]  # a row-parallel split: a non-contiguous view
    assert not shard.is_contiguous()
    single_rank = types.SimpleNamespace(tp_size=1)  # the TP=1 path returns the split itself
    out = MegatronParamMapping.scatter_to_tp_ranks(single_rank, [shard], shard.shape, torch.float32, torch.device("cpu"))
    assert out.is_contiguous()
    assert torch.equal(out, shard)
