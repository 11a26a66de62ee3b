"""megatron-core 0.16.x on CPU: the one place that adapts its CUDA assumptions.

Written against megatron-core 0.16.1 (torch 2.13 CPU build). megatron-core hard-codes the GPU in many
call sites. On a machine without CUDA (tests and CPU runs on the gloo backend) :func:`apply` makes
megatron-core's modules use the CPU instead. It is called (through
:func:`fastrl.compat.apply_cpu_patches`) by :func:`fastrl.distributed.parallel_state.initialize`
only when the backend is gloo and no GPU is used; on GPU (NCCL) nothing here runs and megatron-core
is used unmodified.

Patched behaviours (each has its own test in ``tests/unit/compat/test_megatron_cpu.py``, which also
shows the unpatched failure):

1. ``device="cuda"`` / ``torch.cuda.current_device()`` / ``pin_memory=True`` in tensor factories
   called from megatron-core modules (schedules, p2p communication, tensor-parallel mappings,
   optimizer, grad clipping, causal masks, ...) and megatron-bridge's weight conversion create CPU
   tensors. Done by giving every loaded ``megatron.core`` / ``megatron.bridge`` module a ``torch``
   whose factories and ``torch.cuda`` namespace resolve the CUDA device to the CPU
   (:class:`_CpuTorch`); the real ``torch`` module is not modified.
2. ``torch.cuda`` calls seen by those modules: ``current_device()`` is the CPU device,
   ``synchronize()`` / ``empty_cache()`` do nothing, streams are no-op stand-ins (the CPU runs
   sequentially), RNG state functions act on the CPU generator.
3. The CUDA RNG tracker (``tensor_parallel/random.py``): its states live on the CPU generator, so
   ``get_cuda_rng_tracker().fork()`` gives the tensor-parallel dropout/initialization streams.
4. Type-string checks for ``torch.cuda.FloatTensor`` / ``HalfTensor`` / ``BFloat16Tensor`` in the
   mixed-precision optimizer, the DistributedOptimizer and grad clipping accept CPU tensors.
5. ``Tensor.cuda()`` returns the tensor itself (megatron-core's LanguageModule moves the last
   pipeline stage's copy of tied word embeddings with it). This is the one patch on torch itself;
   on a machine without CUDA the original could only raise.

Every replacement keeps the upstream function as ``__wrapped__`` (the tests call it to show the
failure the patch avoids). Model configs must additionally be built with
``use_cpu_initialization=True`` and every fusion off; :func:`cpu_transformer_overrides` lists those
settings (the model provider applies them). :func:`dist_checkpointing` extends the patch to the
checkpoint strategy modules, which megatron imports late.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from typing import Any, Callable, Iterator

import torch

_APPLIED = False

# megatron-core modules loaded before patching, so that the patch reaches them (any megatron.core
# module already imported at apply() time is patched as well).
_MODULES = (
    "megatron.core.parallel_state",
    "megatron.core.utils",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.tensor_parallel.data",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.transformer.utils",
    "megatron.core.transformer.module",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
)

# Packages whose modules get the CPU view of torch: megatron-core and megatron-bridge (its weight
# conversion moves tensors to ``torch.cuda.current_device()``).
_PATCHED_PACKAGES = ("megatron.core", "megatron.bridge")

_FACTORIES = (
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn",
    "randint", "empty_strided", "eye", "linspace",
)  # fmt: skip

CPU = torch.device("cpu")


def _to_cpu_device(device: Any) -> Any:
    """The CPU device for any CUDA device spec (``"cuda"``, ``"cuda:0"``, an index, a device)."""
    if device is None:
        return None
    if isinstance(device, int):
        return CPU
    if isinstance(device, str) and device.startswith("cuda"):
        return CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return CPU
    return device


def _cpu_factory(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return fn(*args, **kwargs)

    return wrapper


class _CpuCuda:
    """``torch.cuda`` as megatron-core modules see it on CPU (behaviours 2 and 3)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        return CPU

    @staticmethod
    def synchronize(*args: Any, **kwargs: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    class Stream:
        """CUDA streams are sequential CPU execution: waiting and synchronizing do nothing."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def wait_stream(self, other: Any) -> None:
            return None

        def wait_event(self, event: Any) -> None:
            return None

        def synchronize(self) -> None:
            return None

    @staticmethod
    def current_stream(*args: Any, **kwargs: Any) -> "_CpuCuda.Stream":
        return _CpuCuda.Stream()

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    class random:  # noqa: N801 - mirrors torch.cuda.random
        @staticmethod
        def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
            return torch.get_rng_state()


class _CpuTorch:
    """The ``torch`` module as megatron-core modules see it on CPU (behaviour 1).

    Attribute access falls through to the real ``torch``; tensor factories map CUDA devices to
    the CPU and ``torch.cuda`` is :class:`_CpuCuda`.
    """

    def __init__(self) -> None:
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_CPU_TORCH = _CpuTorch()


@contextlib.contextmanager
def _cuda_type_strings() -> Iterator[None]:
    """``Tensor.type()`` reports CPU float tensors with their CUDA names (behaviour 4)."""
    original = torch.Tensor.type

    def cuda_named_type(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if not args and not kwargs and isinstance(name, str) and name.startswith("torch.") and not name.startswith("torch.cuda."):
            return "torch.cuda." + name[len("torch.") :]
        return name

    torch.Tensor.type = cuda_named_type  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type = original  # type: ignore[method-assign]


def _with_cuda_type_strings(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _cuda_type_strings():
            return fn(*args, **kwargs)

    wrapper.__fastrl_cpu_compat__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch_type_checks() -> None:
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    targets = [
        (optimizer.Float16OptimizerWithFloat16Params, "__init__"),
        (distrib_optimizer.DistributedOptimizer, "_build_model_and_main_param_groups"),
        (distrib_optimizer.DistributedOptimizer, "_get_model_and_main_params_data_float16"),
        (clip_grads, "clip_grad_by_total_norm_fp32"),
    ]
    for owner, name in targets:
        fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if fn is None:
            continue
        is_static = isinstance(fn, staticmethod)
        inner = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        if getattr(inner, "__fastrl_cpu_compat__", False):
            continue
        wrapped = _with_cuda_type_strings(inner)
        if is_static:
            wrapped = staticmethod(wrapped)
        elif isinstance(fn, classmethod):
            wrapped = classmethod(wrapped)
        setattr(owner, name, wrapped)
    # Modules that imported the function by name keep the original; rebind them too.
    for mod_name in ("megatron.core.optimizer.optimizer", "megatron.core.optimizer"):
        mod = sys.modules.get(mod_name)
        if mod is not None and hasattr(mod, "clip_grad_by_total_norm_fp32"):
            mod.clip_grad_by_total_norm_fp32 = clip_grads.clip_grad_by_total_norm_fp32


def _patch_rng() -> None:
    from megatron.core.tensor_parallel import random as tp_random

    def get_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        return torch.get_rng_state()

    def set_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    get_state.__wrapped__ = tp_random._get_cuda_rng_state  # type: ignore[attr-defined]
    set_state.__wrapped__ = tp_random._set_cuda_rng_state  # type: ignore[attr-defined]
    tp_random._get_cuda_rng_state = get_state
    tp_random._set_cuda_rng_state = set_state


def _patch_tensor_cuda() -> None:
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
        return self

    cuda.__wrapped__ = torch.Tensor.cuda  # type: ignore[attr-defined]
    torch.Tensor.cuda = cuda


def _patch_module_torch() -> list[str]:
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith(_PATCHED_PACKAGES) and getattr(module, "torch", None) is torch:
            module.torch = _CPU_TORCH
            patched.append(name)
    return patched


def apply() -> None:
    """Adapt megatron-core to CPU tensors (idempotent). Call only when no GPU is used.

    Modules of megatron-core imported after this call are not patched; :func:`apply` imports the
    ones FastRL uses first, and calling it again patches any loaded since.

    Raises:
        RuntimeError: CUDA is available (the GPU path must run megatron-core unmodified).
    """
    global _APPLIED
    if torch.cuda.is_available():
        raise RuntimeError(
            "fastrl.compat.apply_cpu_patches() is for CPU-only runs, but CUDA is available; "
            "use parallel.backend=nccl (or auto) on GPU machines"
        )
    for name in _MODULES:
        importlib.import_module(name)
    _patch_module_torch()
    if not _APPLIED:
        _patch_rng()
        _patch_type_checks()
        _patch_tensor_cuda()
    _APPLIED = True


def applied() -> bool:
    """Whether :func:`apply` has run in this process."""
    return _APPLIED


# Checkpoint modules megatron imports only when a checkpoint is saved or loaded.
_CHECKPOINT_MODULES = (
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.torch",
    "megatron.core.dist_checkpointing.strategies.async_utils",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.serialization",
)


def dist_checkpointing() -> Any:
    """megatron-core's ``dist_checkpointing`` module, with the CPU patch reaching its strategy
    modules when :func:`apply` has run (a no-op import otherwise, e.g. on GPU)."""
    from megatron.core import dist_checkpointing as module

    if _APPLIED:
        for name in _CHECKPOINT_MODULES:
            importlib.import_module(name)
        apply()
    return module


def cpu_transformer_overrides() -> dict[str, Any]:
    """TransformerConfig fields a megatron-core model needs on CPU (no fused CUDA kernels)."""
    return {
        "use_cpu_initialization": True,
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "cross_entropy_loss_fusion": False,
    }
