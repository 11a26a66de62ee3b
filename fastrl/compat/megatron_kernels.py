"""A fused kernel the model provider turns on that comes from a separately compiled CUDA extension.

Written against megatron-core 0.16.1 and megatron-bridge 0.3.1. megatron-bridge's
``GPTModelProvider`` (the provider FastRL builds every policy from) sets
``masked_softmax_fusion=True`` (megatron-core's own ``TransformerConfig`` default is False), and
the local (non-Transformer-Engine) attention's ``FusedScaleMaskSoftmax`` then imports
``scaled_masked_softmax_cuda`` (and its causal / unmasked siblings) for every fp16 / bf16 attention
whose shapes fit the kernel. Those modules are built by Apex or megatron's ``fused_kernels`` and are
not part of the ``megatron-core`` wheel, so on a CUDA machine without them the first bf16 forward of
the local layer spec raises ``ModuleNotFoundError: No module named 'scaled_masked_softmax_cuda'``
(seen on an H200 with the wheel alone). The Transformer Engine layer spec never reaches this softmax.

:func:`cuda_kernel_overrides` turns the fusion off exactly when an extension is missing; megatron
then computes the same softmax in plain torch (its own path for shapes the kernel does not cover).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

#: The compiled extensions ``megatron.core.fusions.fused_softmax`` imports (causal, masked, unmasked).
SOFTMAX_EXTENSIONS = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda", "scaled_softmax_cuda")


def missing_softmax_extensions(find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[str]:
    """The names of :data:`SOFTMAX_EXTENSIONS` that cannot be imported here."""
    return [name for name in SOFTMAX_EXTENSIONS if find_spec(name) is None]


def cuda_kernel_overrides(find_spec: Callable[[str], Any] = importlib.util.find_spec) -> dict[str, Any]:
    """TransformerConfig fields to set on CUDA: ``masked_softmax_fusion=False`` when any fused-softmax
    extension is missing (logged once per call, naming them), else nothing."""
    missing = missing_softmax_extensions(find_spec)
    if not missing:
        return {}
    log.info(
        "masked_softmax_fusion off: the compiled extension(s) %s are not installed (Apex / megatron "
        "fused_kernels); the local layer spec computes the attention softmax in torch", ", ".join(missing)
    )
    return {"masked_softmax_fusion": False}
