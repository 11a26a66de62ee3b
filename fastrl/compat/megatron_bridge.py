"""megatron-bridge 0.3.x: importing it without Transformer Engine / triton, and two of its bugs.

Written against megatron-bridge 0.3.1 (with megatron-core 0.16.1). Patched behaviours, each tested
in ``tests/unit/compat/test_megatron_bridge.py`` (which also shows the unpatched behaviour):

0. Transformer Engine installed but unusable (a GPU node where ``gpu-trainer.txt`` installed TE's
   core but its PyTorch extension was never built: no nvcc / C++20 there). ``import
   transformer_engine`` then succeeds (TE 2.11 only warns) and ``import transformer_engine.pytorch``
   raises ``FileNotFoundError: Could not find shared object file for Transformer Engine torch lib.``,
   which megatron-core 0.16.1's ``try: ... except ImportError`` guards do not catch: ``import
   megatron.core`` itself fails. :func:`hide_unusable_transformer_engine` probes the real import
   once and, when it fails with any error, makes ``transformer_engine`` absent for the process
   (``sys.modules`` entry None: every later import raises ``ImportError``, which megatron-core and
   :func:`fastrl.config.transformer_engine_available` read as "no TE"), logging one line with the
   error. Called before megatron-core is first imported (``fastrl.distributed.parallel_state.initialize``)
   and by :func:`import_auto_bridge`.
1. Import without Transformer Engine (CPU; not on GPU clusters with TE). megatron-bridge imports
   Transformer Engine unconditionally (two LoRA modules) and, through its Mamba provider,
   megatron-core's triton kernels. Neither is used by FastRL's dense models. Where those packages
   are missing, :func:`import_auto_bridge` installs a stand-in for each only for the duration of the
   import, and checks afterwards that no megatron-core module concluded that Transformer Engine is
   available. Where the packages exist nothing is stood in.
2. Scrambled row-parallel shards (everywhere; visible on gloo). Row-parallel weight shards are
   scattered from non-contiguous ``torch.chunk`` views, which gloo sends scrambled (at TP=2 the model
   silently computes garbage). :func:`import_auto_bridge` makes every shard contiguous before the
   scatter.
3. ``mrope_section`` (everywhere). The Qwen2.5-VL provider keeps its default ``[16, 24, 24]``
   instead of the Hugging Face config's ``rope_scaling.mrope_section``;
   :func:`set_mrope_section` copies it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types
from typing import Any

logger = logging.getLogger("fastrl.compat")

_TE = "transformer_engine"
#: Why Transformer Engine, installed, was made absent for this process (None: it was not).
_TE_UNUSABLE: str | None = None
_TRITON_KERNELS = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"

# megatron-core modules that decide HAVE_TE at import time: imported before any stand-in exists.
_TE_SENSITIVE = (
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.models.gpt.moe_module_specs",
    "megatron.core.models.gpt.experimental_attention_variant_module_specs",
    "megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.transformer_block",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.multi_latent_attention",
    "megatron.core.transformer.multi_token_prediction",
    "megatron.core.post_training.modelopt.layers",
    "megatron.core.post_training.modelopt.gpt.model_specs",
    "megatron.core.extensions.transformer_engine_spec_provider",
    "megatron.core.models.vision.clip_vit_model",
    "megatron.core.models.multimodal.llava_model",
)


class _Unavailable:
    """Class stand-in: any use of it is an error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{type(self).__name__} needs NVIDIA Transformer Engine, which is not installed")


def _standin_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__fastrl_standin__ = True  # type: ignore[attr-defined]

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (_Unavailable,), {})

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def _te_standins() -> dict[str, types.ModuleType]:
    root = _standin_module(_TE)
    pytorch = _standin_module(f"{_TE}.pytorch")
    ops = _standin_module(f"{_TE}.pytorch.ops")
    root.pytorch, pytorch.ops = pytorch, ops  # type: ignore[attr-defined]
    return {_TE: root, f"{_TE}.pytorch": pytorch, f"{_TE}.pytorch.ops": ops}


def _triton_kernel_standin() -> types.ModuleType:
    module = types.ModuleType(_TRITON_KERNELS)
    module.__fastrl_standin__ = True  # type: ignore[attr-defined]

    def unavailable(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("megatron-core's triton inference kernels need the triton package")

    for name in ("tensor_get_slice_after", "tensor_masked_update", "tensor_merge"):
        setattr(module, name, unavailable)
    return module


def _have(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def hide_unusable_transformer_engine() -> str | None:
    """Make an installed Transformer Engine whose PyTorch layers cannot be imported absent for this
    process, with one warning line; return why (``"FileNotFoundError: ..."``), or None when TE is
    not installed or imports. Idempotent: the probe (a real ``import transformer_engine.pytorch``,
    which imports torch) runs once per process.

    Without this a TE core install without its torch extension stops every megatron import with
    ``FileNotFoundError`` (see the module docstring, patch 0). After it, the ``_bf16`` recipes run on
    megatron-core's local layers (:func:`fastrl.models.layer_spec.choose_layers`), and FP8 and
    sequence parallelism are refused there, naming this reason.
    """
    global _TE_UNUSABLE
    if _TE_UNUSABLE is not None or not _have(_TE):
        return _TE_UNUSABLE
    try:
        importlib.import_module(f"{_TE}.pytorch")
        return None
    except Exception as err:  # noqa: BLE001 - FileNotFoundError (extension not built), OSError (CUDA libs), ...
        reason = f"{type(err).__name__}: {err}".splitlines()[0]
    for name in [n for n in sys.modules if n == _TE or n.startswith(f"{_TE}.")]:
        del sys.modules[name]
    sys.modules[_TE] = None  # type: ignore[assignment]  # `import transformer_engine` now raises ImportError
    _TE_UNUSABLE = reason
    logger.warning(
        "Transformer Engine is installed but its PyTorch layers do not import (%s): running without it "
        "(bf16 on megatron-core's local layers; FP8 and sequence parallelism refused); build its torch "
        "extension to use it: requirements/gpu-trainer-te.txt", reason)
    return reason


def transformer_engine_unusable_reason() -> str | None:
    """What :func:`hide_unusable_transformer_engine` found (None: it hid nothing)."""
    return _TE_UNUSABLE


def _make_scatter_contiguous() -> None:
    from megatron.bridge.models.conversion.param_mapping import MegatronParamMapping

    original = MegatronParamMapping.scatter_to_tp_ranks
    if getattr(original, "__fastrl_contiguous__", False):
        return

    def scatter_to_tp_ranks(self: Any, splits: Any, *args: Any, **kwargs: Any) -> Any:
        if splits:
            splits = [s.contiguous() for s in splits]
        return original(self, splits, *args, **kwargs)

    scatter_to_tp_ranks.__fastrl_contiguous__ = True  # type: ignore[attr-defined]
    scatter_to_tp_ranks.__wrapped__ = original  # type: ignore[attr-defined]
    MegatronParamMapping.scatter_to_tp_ranks = scatter_to_tp_ranks


def import_auto_bridge() -> type:
    """``megatron.bridge.AutoBridge``, importable with or without Transformer Engine / triton.

    Raises:
        RuntimeError: a megatron-core module imported while a stand-in was present believes
            Transformer Engine is available (a newer megatron version moved its checks).
    """
    if "megatron.bridge" in sys.modules:
        _make_scatter_contiguous()
        return sys.modules["megatron.bridge"].AutoBridge
    hide_unusable_transformer_engine()
    standins: dict[str, types.ModuleType] = {}
    if not _have(_TE):
        for name in _TE_SENSITIVE:
            importlib.import_module(name)
        standins.update(_te_standins())
    if not _have("triton"):
        standins[_TRITON_KERNELS] = _triton_kernel_standin()
    before = set(sys.modules)
    sys.modules.update(standins)
    try:
        from megatron.bridge import AutoBridge
    finally:
        for name, module in standins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
        if _TE_UNUSABLE is not None:
            sys.modules[_TE] = None  # type: ignore[assignment]  # absent again, as hidden
    if _TE in standins:
        wrong = sorted(
            name
            for name in set(sys.modules) - before
            if name.startswith("megatron.core") and getattr(sys.modules[name], "HAVE_TE", False) is True
        )
        if wrong:
            raise RuntimeError(
                f"megatron-core modules {wrong} were imported while the Transformer Engine stand-in "
                f"was present and now believe TE is installed; add them to "
                f"fastrl.compat.megatron_bridge._TE_SENSITIVE"
            )
    _make_scatter_contiguous()
    return AutoBridge


def set_mrope_section(provider: Any, hf_config: Any) -> None:
    """Copy ``rope_scaling.mrope_section`` of a Qwen2.5-VL Hugging Face config onto the provider.

    megatron-bridge 0.3.1's ``Qwen25VLBridge.provider_bridge`` leaves the provider's default
    ``[16, 24, 24]`` (right for head_dim 128 only), so a model with another head dimension would
    split its rotary dimensions wrongly.

    Raises:
        ValueError: the config has no ``rope_scaling.mrope_section``.
    """
    text_config = getattr(hf_config, "text_config", hf_config)
    rope_scaling = getattr(text_config, "rope_scaling", None) or getattr(hf_config, "rope_scaling", None) or {}
    section = rope_scaling.get("mrope_section")
    if section is None:
        raise ValueError("the Qwen2.5-VL config has no rope_scaling.mrope_section; cannot build mrope")
    provider.mrope_section = list(section)
