"""fastrl.compat.megatron_kernels: the fused softmax's compiled extensions, and the override when they are missing.

The upstream test shows the failure the override avoids: megatron-core's fused softmax, with
``masked_softmax_fusion=True`` (what megatron-bridge's GPT provider sets), imports ``scaled_masked_softmax_cuda`` for a bf16 attention of
kernel-sized shapes and raises where the extension is not installed (as on an H200 with the
megatron-core wheel alone). A megatron-core that stops importing it fails that test.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from fastrl import compat
from fastrl.compat import megatron_kernels


def _softmax(fusion: bool):
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    return FusedScaleMaskSoftmax(
        input_in_fp16=False, input_in_bf16=True, attn_mask_type=AttnMaskType.causal,
        scaled_masked_softmax_fusion=fusion, mask_func=attention_mask_func, softmax_in_fp32=True, scale=None,
    )


@pytest.mark.skipif(
    importlib.util.find_spec("scaled_masked_softmax_cuda") is not None, reason="the compiled extension is installed here"
)
def test_the_default_fusion_imports_an_extension_the_wheel_lacks_and_the_override_avoids_it():
    b, heads, sq, sk = 2, 4, 32, 32  # kernel-sized: 16 < sk <= 4096, multiples of 4
    with pytest.raises(ModuleNotFoundError, match="scaled_masked_softmax_cuda"):
        _softmax(fusion=True).is_kernel_available(None, b, heads, sq, sk)

    overrides = compat.cuda_kernel_overrides()
    assert overrides == {"masked_softmax_fusion": False}
    assert _softmax(fusion=overrides["masked_softmax_fusion"]).is_kernel_available(None, b, heads, sq, sk) is False
    scores = torch.randn(b, heads, sq, sk).to(torch.bfloat16)
    causal = torch.ones(1, 1, sq, sk, dtype=torch.bool).triu(1)  # given, so no CUDA default mask is built
    probs = _softmax(fusion=False)(scores, causal).float()
    assert torch.allclose(probs.sum(-1), torch.ones(b, heads, sq), atol=1e-2)
    assert probs[..., 0, 1:].abs().max() == 0  # causal: the first query sees only the first key


def test_no_override_when_every_extension_is_installed_and_each_missing_one_is_named():
    installed = lambda name: object()  # noqa: E731 -- a find_spec that finds everything
    assert megatron_kernels.cuda_kernel_overrides(find_spec=installed) == {}
    only_causal = lambda name: object() if name == "scaled_upper_triang_masked_softmax_cuda" else None  # noqa: E731
    assert megatron_kernels.missing_softmax_extensions(only_causal) == ["scaled_masked_softmax_cuda", "scaled_softmax_cuda"]
    assert megatron_kernels.cuda_kernel_overrides(find_spec=only_causal) == {"masked_softmax_fusion": False}


def test_the_provider_applies_the_override_on_cuda_and_the_cpu_settings_without_it(monkeypatch):
    from types import SimpleNamespace

    from fastrl.config import ParallelConfig
    from fastrl.models import provider as provider_module

    layers = SimpleNamespace(spec="spec", config_overrides={})
    for cuda, expected in ((True, {"masked_softmax_fusion": False}), (False, compat.cpu_transformer_overrides())):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(megatron_kernels, "missing_softmax_extensions", lambda find_spec=None: ["scaled_masked_softmax_cuda"])
        target = SimpleNamespace(masked_softmax_fusion=True, use_cpu_initialization=False)
        provider_module._configure_provider(
            target, None, parallel=ParallelConfig(), layers=layers, is_vision_language=False, seed=0
        )
        assert {k: getattr(target, k) for k in expected} == expected
        assert target.use_cpu_initialization is (not cuda)
