"""Every patch FastRL applies to an upstream package, and the entry points that apply them.

One module per upstream concern; each module's docstring names the upstream version it was written
against and the behaviour it works around, and ``tests/unit/compat/`` has a test per patch that fails
when the upstream behaviour changes (the patch is no longer needed) or the patch stops working.

Index: patch -- upstream it was written for -- behaviour worked around -- where it applies.

- ``megatron_cpu.apply`` -- megatron-core 0.16.1 -- CUDA hard-codes (``device="cuda"``,
  ``torch.cuda.*``, the CUDA RNG tracker, ``torch.cuda.FloatTensor`` type checks, ``Tensor.cuda()``)
  -- CPU only (gloo without CUDA; it refuses to run when CUDA is available).
- ``megatron_cpu.cpu_transformer_overrides`` -- megatron-core 0.16.1 -- fused CUDA kernels and GPU
  initialization in TransformerConfig -- CPU only.
- ``megatron_kernels.cuda_kernel_overrides`` -- megatron-core 0.16.1 / megatron-bridge 0.3.1 --
  the bridge's provider sets ``masked_softmax_fusion=True``, whose softmax imports compiled
  extensions (Apex / ``fused_kernels``) the megatron-core wheel lacks -- CUDA, where they are missing.
- ``megatron_cpu.dist_checkpointing`` -- megatron-core 0.16.1 -- checkpoint strategy modules, imported
  late, escape the CPU patch -- CPU only (a plain import on GPU).
- ``megatron_bridge.hide_unusable_transformer_engine`` -- megatron-core 0.16.1 / Transformer Engine
  2.11 -- TE's core installed without its torch extension: ``FileNotFoundError`` from
  ``transformer_engine.pytorch`` escapes megatron-core's ``except ImportError`` -- wherever TE is
  installed and its PyTorch layers do not import (one warning line; the run goes on without TE).
- ``megatron_bridge.import_auto_bridge`` (stand-ins) -- megatron-bridge 0.3.1 -- unconditional
  ``transformer_engine`` / triton imports -- only where TE / triton are missing (CPU).
- ``megatron_bridge`` contiguous scatter -- megatron-bridge 0.3.1 -- row-parallel shards scattered
  from non-contiguous views arrive scrambled on gloo at TP >= 2 -- everywhere (applied on import).
- ``megatron_bridge.set_mrope_section`` -- megatron-bridge 0.3.1 -- the Qwen2.5-VL provider ignores
  the config's ``mrope_section`` -- everywhere.
- ``megatron_optimizer`` -- megatron-core 0.16.1 -- torch Adam's per-parameter ``step``: ``KeyError``
  in the ``fully_reshardable`` loader, count not restored by either format -- whenever torch's Adam
  is used (no Apex / Transformer Engine), CPU and GPU.
- ``bridge_export.use_weight_names`` -- megatron-bridge 0.3.1 -- export reads weight names from the
  source directory's files (``FileNotFoundError`` without them) -- every export of an imported
  checkpoint, CPU and GPU.
- ``upstream_warnings.filter_benign_upstream_warnings`` -- megatron-core 0.16.1, megatron-bridge
  0.3.1, transformers 4.57, torch 2.13 -- about 30 known-benign upstream warning lines (fallbacks for
  the absent Transformer Engine / Apex, deprecations inside upstream calls) burying the trainer's
  own -- filtered by issuing module and message (the list and each reason in the module), never a
  FastRL warning; the trainer's start-up (``fastrl.training.run.run``), CPU and GPU.

Entry points (importing this package imports neither torch nor megatron):

- :func:`apply_cpu_patches`: called by :func:`fastrl.distributed.parallel_state.initialize` on gloo
  without CUDA;
- :func:`hide_unusable_transformer_engine`: called by
  :func:`fastrl.distributed.parallel_state.initialize` before megatron-core is first imported;
- :func:`import_auto_bridge`: called before anything of megatron-bridge is imported (the model
  provider, the layer choice);
- :func:`dist_checkpointing`: how checkpoint save / load / conversion get megatron's
  ``dist_checkpointing``;
- :func:`cpu_transformer_overrides`, :func:`cuda_kernel_overrides`, :func:`set_mrope_section`: applied
  by the model provider;
- ``fastrl.compat.megatron_optimizer`` (``adam_steps``, ``ensure_optimizer_state``,
  ``torch_adam_step_tolerated``, ``restore_adam_steps``): used by checkpoint save / resume;
- ``fastrl.compat.bridge_export.use_weight_names``: used by checkpoint export.
"""

from __future__ import annotations

from typing import Any


def apply_cpu_patches() -> None:
    """Adapt megatron-core to CPU tensors (idempotent; see :mod:`fastrl.compat.megatron_cpu`).

    Raises:
        RuntimeError: CUDA is available (the GPU path runs megatron-core unmodified).
    """
    from fastrl.compat import megatron_cpu

    megatron_cpu.apply()


def cpu_patches_applied() -> bool:
    """Whether :func:`apply_cpu_patches` has run in this process."""
    from fastrl.compat import megatron_cpu

    return megatron_cpu.applied()


def cpu_transformer_overrides() -> dict[str, Any]:
    """TransformerConfig fields a megatron-core model needs on CPU (no fused CUDA kernels)."""
    from fastrl.compat import megatron_cpu

    return megatron_cpu.cpu_transformer_overrides()


def cuda_kernel_overrides() -> dict[str, Any]:
    """TransformerConfig fields to set on CUDA for fused kernels whose compiled extension is missing."""
    from fastrl.compat import megatron_kernels

    return megatron_kernels.cuda_kernel_overrides()


def dist_checkpointing() -> Any:
    """megatron-core's ``dist_checkpointing`` module (with the CPU patch reaching it when active)."""
    from fastrl.compat import megatron_cpu

    return megatron_cpu.dist_checkpointing()


def hide_unusable_transformer_engine() -> str | None:
    """Make an installed Transformer Engine whose PyTorch layers do not import absent for this
    process (one warning line); the reason, or None (see
    :func:`fastrl.compat.megatron_bridge.hide_unusable_transformer_engine`)."""
    from fastrl.compat import megatron_bridge

    return megatron_bridge.hide_unusable_transformer_engine()


def import_auto_bridge() -> type:
    """``megatron.bridge.AutoBridge``, importable without Transformer Engine / triton, with the
    contiguous TP scatter; when the CPU patches are active they are extended to the megatron
    modules the import loaded.

    Raises:
        RuntimeError: see :func:`fastrl.compat.megatron_bridge.import_auto_bridge`.
    """
    from fastrl.compat import megatron_bridge, megatron_cpu

    auto_bridge = megatron_bridge.import_auto_bridge()
    if megatron_cpu.applied():
        megatron_cpu.apply()
    return auto_bridge


def set_mrope_section(provider: Any, hf_config: Any) -> None:
    """Copy a Qwen2.5-VL config's ``mrope_section`` onto the megatron-bridge provider.

    Raises:
        ValueError: the config has no ``rope_scaling.mrope_section``.
    """
    from fastrl.compat import megatron_bridge

    megatron_bridge.set_mrope_section(provider, hf_config)
