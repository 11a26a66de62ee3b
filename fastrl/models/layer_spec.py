"""The one place that chooses the transformer layer implementation and FP8 settings.

Two layer specs exist in megatron-core: the Transformer Engine (TE) spec (GPU; fused kernels and the
only path to FP8 GEMMs) and the local spec (plain torch modules; CPU and GPUs without TE). FP8 is a
property of the TE layers configured through megatron-core's ``fp8*`` TransformerConfig fields; with
the local spec those fields are silently ignored by megatron-core, so an FP8 request without TE is
refused here with an error rather than trained in bf16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from fastrl.config import ConfigError, PrecisionConfig, transformer_engine_available

LayerImpl = Literal["transformer_engine", "local"]


@dataclass(frozen=True)
class LayerChoice:
    """The layer implementation and the TransformerConfig fields that go with it."""

    impl: LayerImpl
    spec: Callable[..., Any]
    """A megatron-bridge layer-spec function ``spec(provider) -> ModuleSpec``."""
    config_overrides: dict[str, Any]
    """TransformerConfig fields: dtype flags and, for FP8, megatron-core's fp8 settings."""


def fp8_settings(precision: PrecisionConfig) -> dict[str, Any]:
    """megatron-core TransformerConfig FP8 fields for ``precision`` (empty unless mode='fp8').

    Fields: ``fp8`` ('e4m3' | 'hybrid'), ``fp8_recipe`` ('delayed' | 'tensorwise' | 'mxfp8' |
    'blockwise'), and for the delayed recipe ``fp8_margin``, ``fp8_amax_history_len``,
    ``fp8_amax_compute_algo``.

    Raises:
        ConfigError: mxfp8 with the hybrid format (MXFP8 scales are e4m3 blocks).
    """
    if precision.mode != "fp8":
        return {}
    if precision.fp8_recipe == "mxfp8" and precision.fp8_format == "hybrid":
        raise ConfigError(
            "precision.fp8_recipe='mxfp8' does not support precision.fp8_format='hybrid'; "
            "set precision.fp8_format=e4m3"
        )
    settings: dict[str, Any] = {"fp8": precision.fp8_format, "fp8_recipe": precision.fp8_recipe}
    if precision.fp8_recipe == "delayed":
        settings.update(
            fp8_margin=precision.fp8_margin,
            fp8_amax_history_len=precision.fp8_amax_history_len,
            fp8_amax_compute_algo=precision.fp8_amax_compute_algo,
        )
    return settings


def dtype_settings(precision: PrecisionConfig) -> dict[str, Any]:
    """TransformerConfig dtype fields: bf16 parameters and compute for bf16/fp8, else fp32."""
    import torch

    if precision.mode == "fp32":
        return {"bf16": False, "fp16": False, "params_dtype": torch.float32, "pipeline_dtype": torch.float32}
    return {"bf16": True, "fp16": False, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}


def choose_layers(
    precision: PrecisionConfig, *, sequence_parallel: bool = False, te_available: bool | None = None
) -> LayerChoice:
    """Pick the layer spec and its config fields for ``precision``.

    The TE spec is used whenever Transformer Engine's PyTorch layers import (GPU clusters), the
    local spec otherwise: TE not installed, or installed without a working torch extension
    (:func:`fastrl.compat.megatron_bridge.hide_unusable_transformer_engine`, which
    :func:`fastrl.compat.import_auto_bridge` runs first). ``te_available`` overrides the detection (tests).

    Raises:
        ConfigError: FP8 requested but Transformer Engine is not usable (not installed, or its
            torch extension does not import: the message names which), sequence parallelism
            without Transformer Engine (megatron-core's local spec uses torch norms, which do not
            support it), or an unsupported FP8 combination (see :func:`fp8_settings`).
    """
    from fastrl import compat
    from fastrl.compat.megatron_bridge import transformer_engine_unusable_reason

    compat.import_auto_bridge()
    from megatron.bridge.models.gpt_provider import local_layer_spec, transformer_engine_layer_spec

    have_te = transformer_engine_available() if te_available is None else te_available
    unusable = transformer_engine_unusable_reason()
    why = (f"installed, but its PyTorch layers do not import ({unusable}); build its torch extension: "
           "requirements/gpu-trainer-te.txt" if unusable else
           "not installed; install requirements/gpu-trainer.txt and gpu-trainer-te.txt on a CUDA machine")
    if precision.mode == "fp8" and not have_te:
        raise ConfigError(
            f"precision.mode='fp8' (format {precision.fp8_format!r}, recipe {precision.fp8_recipe!r}) "
            f"needs NVIDIA Transformer Engine layers, and Transformer Engine is {why}; or set precision.mode=bf16"
        )
    if sequence_parallel and not have_te:
        raise ConfigError(
            "parallel.sequence_parallel=true needs Transformer Engine layers (megatron-core's local "
            f"layer spec uses torch norms without sequence-parallel support), and Transformer Engine is {why}; "
            "or set parallel.sequence_parallel=false"
        )
    overrides = {**dtype_settings(precision), **fp8_settings(precision)}
    if have_te:
        return LayerChoice("transformer_engine", transformer_engine_layer_spec, overrides)
    return LayerChoice("local", local_layer_spec, overrides)
