"""One test per behaviour that fastrl.compat.megatron_cpu adapts in megatron-core on CPU.

Each test shows the unpatched upstream failure (the original function or the real ``torch`` put back
for the call) and that the patched call works: a megatron-core upgrade that no longer needs a patch
fails here and asks for the patch's removal.
"""

from __future__ import annotations

import pytest
import torch

from fastrl import compat
from fastrl.compat import megatron_cpu

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU patches never run where CUDA is available")

# What the CPU build of torch raises for anything CUDA.
NO_CUDA = (AssertionError, RuntimeError)


@pytest.fixture(scope="module", autouse=True)
def applied():
    compat.apply_cpu_patches()
    assert compat.cpu_patches_applied() and megatron_cpu.applied()


def test_written_for_megatron_core_0_16():
    import megatron.core

    assert megatron.core.__version__.startswith("0.16"), "re-check every patch of fastrl/compat/megatron_cpu.py"


def test_cuda_tensor_factories_in_megatron_modules_make_cpu_tensors(monkeypatch):
    from megatron.core.transformer import utils
    from megatron.core.transformer.utils import get_default_causal_mask

    with monkeypatch.context() as unpatched:
        unpatched.setattr(utils, "torch", torch)
        with pytest.raises(NO_CUDA):
            get_default_causal_mask(3)
    mask = get_default_causal_mask(3)  # megatron writes torch.ones(..., device="cuda")
    assert mask.device.type == "cpu"
    assert mask.tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    from megatron.core.pipeline_parallel import schedules

    assert schedules.torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert schedules.torch.tensor([1.0], device=0, pin_memory=True).device.type == "cpu"


def test_real_torch_is_left_alone():
    assert torch.zeros is not megatron_cpu._CPU_TORCH.zeros
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")


def test_tensor_cuda_stays_on_the_cpu():
    t = torch.arange(3.0)
    with pytest.raises(NO_CUDA):
        torch.Tensor.cuda.__wrapped__(t)
    assert t.cuda() is t and t.data.cuda(non_blocking=True).device.type == "cpu"


def test_torch_cuda_calls_resolve_to_the_cpu(monkeypatch):
    from megatron.core import utils
    from megatron.core.tensor_parallel import mappings

    with monkeypatch.context() as unpatched:  # megatron's buffers: torch.empty(..., device=torch.cuda.current_device())
        unpatched.setattr(utils, "torch", torch)
        with pytest.raises(NO_CUDA):
            utils.GlobalMemoryBuffer().get_tensor((2,), torch.float32, "fastrl-test")
    assert utils.GlobalMemoryBuffer().get_tensor((2,), torch.float32, "fastrl-test").device.type == "cpu"

    cuda = mappings.torch.cuda
    assert cuda.current_device() == torch.device("cpu")
    assert cuda.synchronize() is None and cuda.empty_cache() is None
    stream = cuda.Stream()
    stream.wait_stream(cuda.current_stream())
    with cuda.stream(stream):
        pass
    assert cuda.is_available() is False  # everything else falls through to the real torch.cuda


def test_rng_tracker_forks_reproducible_streams_on_the_cpu_generator(monkeypatch):
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as tp_random

    with monkeypatch.context() as unpatched:
        unpatched.setattr(tp_random, "torch", torch)
        with pytest.raises(NO_CUDA):
            tp_random._get_cuda_rng_state.__wrapped__()

    def fresh_tracker():
        tracker = tensor_parallel.get_cuda_rng_tracker()
        tracker.reset()
        tracker.add("fastrl-test", 123)  # what model_parallel_cuda_manual_seed does per stream
        return tracker

    tracker = fresh_tracker()
    torch.manual_seed(0)
    with tracker.fork("fastrl-test"):
        a = torch.rand(3)
    after_fork = torch.rand(1)
    torch.manual_seed(0)
    plain = torch.rand(1)
    assert torch.equal(after_fork, plain)  # the default stream is restored after the fork
    with tracker.fork("fastrl-test"):
        b = torch.rand(3)
    assert not torch.equal(a, b)  # the tracker's stream advanced
    with fresh_tracker().fork("fastrl-test"):
        assert torch.equal(torch.rand(3), a)  # same seed, same stream
    tensor_parallel.get_cuda_rng_tracker().reset()


def test_optimizer_type_string_checks_accept_cpu_tensors():
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    x = torch.zeros(2)
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    with pytest.raises(AssertionError):  # assert param.grad.type() == 'torch.cuda.FloatTensor'
        clip_grads.clip_grad_by_total_norm_fp32.__wrapped__([param], max_norm=1.0, total_norm=2.0)
    clip_grads.clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=2.0)
    assert torch.allclose(param.grad, torch.full((2,), 0.5), atol=1e-5)
    with megatron_cpu._cuda_type_strings():
        assert x.type() == "torch.cuda.FloatTensor"
        assert x.bfloat16().type() == "torch.cuda.BFloat16Tensor"
        assert x.type(torch.float64).dtype == torch.float64  # conversions are untouched
    assert x.type() == "torch.FloatTensor"
    for fn in (
        optimizer.Float16OptimizerWithFloat16Params.__init__,
        distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups,
        clip_grads.clip_grad_by_total_norm_fp32,
    ):
        assert getattr(fn, "__fastrl_cpu_compat__", False), fn


def test_checkpoint_modules_imported_late_get_the_cpu_view():
    import sys

    # megatron's async checkpoint utilities allocate with torch.cuda.current_device(); unpatched:
    with pytest.raises(NO_CUDA):
        torch.tensor([1], dtype=torch.int, device=torch.cuda.current_device())
    module = compat.dist_checkpointing()
    assert module.__name__ == "megatron.core.dist_checkpointing" and hasattr(module, "load")
    for name in megatron_cpu._CHECKPOINT_MODULES:
        assert getattr(sys.modules[name], "torch", megatron_cpu._CPU_TORCH) is megatron_cpu._CPU_TORCH, name
    from megatron.core.dist_checkpointing.strategies import async_utils

    cuda = async_utils.torch.cuda
    assert async_utils.torch.tensor([1], dtype=torch.int, device=cuda.current_device()).device.type == "cpu"


def test_cpu_overrides_turn_every_fusion_off():
    overrides = compat.cpu_transformer_overrides()
    assert overrides["use_cpu_initialization"] is True
    assert all(v is False for k, v in overrides.items() if "fusion" in k or k == "persist_layer_norm")


def test_apply_refuses_to_run_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CPU-only"):
        compat.apply_cpu_patches()
