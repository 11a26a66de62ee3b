"""One test per behaviour that fastrl.distributed.cpu_compat adapts in megatron-core on CPU."""

from __future__ import annotations

import pytest
import torch

from fastrl.distributed import cpu_compat


@pytest.fixture(scope="module", autouse=True)
def applied():
    cpu_compat.apply()
    assert cpu_compat.applied()


def test_cuda_tensor_factories_in_megatron_modules_make_cpu_tensors():
    from megatron.core.transformer.utils import get_default_causal_mask

    mask = get_default_causal_mask(3)  # megatron writes torch.ones(..., device="cuda")
    assert mask.device.type == "cpu"
    assert mask.tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    from megatron.core.pipeline_parallel import schedules

    assert schedules.torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert schedules.torch.tensor([1.0], device=0, pin_memory=True).device.type == "cpu"


def test_real_torch_is_left_alone():
    assert torch.zeros is not cpu_compat._CPU_TORCH.zeros
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")


def test_tensor_cuda_stays_on_the_cpu():
    t = torch.arange(3.0)
    assert t.cuda() is t and t.data.cuda(non_blocking=True).device.type == "cpu"


def test_torch_cuda_calls_resolve_to_the_cpu():
    from megatron.core.tensor_parallel import mappings

    cuda = mappings.torch.cuda
    assert cuda.current_device() == torch.device("cpu")
    assert cuda.synchronize() is None and cuda.empty_cache() is None
    stream = cuda.Stream()
    stream.wait_stream(cuda.current_stream())
    with cuda.stream(stream):
        pass
    assert cuda.is_available() is False  # everything else falls through to the real torch.cuda


def test_rng_tracker_forks_reproducible_streams_on_the_cpu_generator():
    from megatron.core import tensor_parallel

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
    with cpu_compat._cuda_type_strings():
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


def test_cpu_overrides_turn_every_fusion_off():
    overrides = cpu_compat.cpu_transformer_overrides()
    assert overrides["use_cpu_initialization"] is True
    assert all(v is False for k, v in overrides.items() if "fusion" in k or k == "persist_layer_norm")


def test_apply_refuses_to_run_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="CPU-only"):
        cpu_compat.apply()
