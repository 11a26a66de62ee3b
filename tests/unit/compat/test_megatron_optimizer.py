"""fastrl.compat.megatron_optimizer: torch Adam's per-parameter ``step`` with megatron-core 0.16's
DistributedOptimizer checkpoints.

megatron's own loading code runs on a stand-in optimizer object that carries just the state it reads
(one parameter, one bucket), so the upstream failure shows without a process group; the exact-resume
functional test checks the whole save / resume.
"""

from __future__ import annotations

import types

import pytest
import torch

from fastrl.compat.megatron_optimizer import (
    adam_steps,
    ensure_optimizer_state,
    restore_adam_steps,
    torch_adam_step_tolerated,
)

N = 4


def test_written_for_megatron_core_0_16_without_apex_or_te():
    import megatron.core
    from megatron.core.optimizer import distrib_optimizer

    assert megatron.core.__version__.startswith("0.16"), "re-check fastrl/compat/megatron_optimizer.py"
    if not distrib_optimizer.HAVE_APEX_OR_TE:  # the shims matter only with torch's Adam
        assert distrib_optimizer.Adam is torch.optim.Adam


def _distributed_optimizer(*, stepped: bool = True):
    """megatron's DistributedOptimizer loading methods over one torch AdamW parameter."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer, Range

    class OneParameter:
        _get_main_param_and_optimizer_states = DistributedOptimizer._get_main_param_and_optimizer_states
        _set_main_param_and_optimizer_states = DistributedOptimizer._set_main_param_and_optimizer_states
        load_parameter_state_from_fully_reshardable = DistributedOptimizer.load_parameter_state_from_fully_reshardable
        _init_optimizer_states_with_dummy_values = DistributedOptimizer._init_optimizer_states_with_dummy_values

    model_param = torch.nn.Parameter(torch.zeros(N))
    main_param = torch.nn.Parameter(torch.zeros(N))
    opt = OneParameter()
    opt.optimizer = torch.optim.AdamW([main_param], lr=0.1)
    opt.config = types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False)
    opt.model_param_group_index_map = {model_param: (0, 0)}
    opt.gbuf_ranges = [{torch.float32: [{"param_map": {model_param: {"param": Range(0, N)}}}]}]
    opt.buffers = [types.SimpleNamespace(param_index_map={model_param: (0, N, 0)})]
    if stepped:
        main_param.grad = torch.ones(N)
        opt.optimizer.step()
    return opt, main_param


def _fully_reshardable_checkpoint() -> list[dict[str, torch.Tensor]]:
    """What megatron stores per parameter in the ``fully_reshardable`` format: no ``step``."""
    return [{"fp32_param": torch.full((N,), 5.0), "exp_avg": torch.full((N,), 6.0), "exp_avg_sq": torch.full((N,), 7.0)}]


def test_fully_reshardable_loader_fails_on_torch_adams_step_and_the_shim_loads_it():
    opt, main_param = _distributed_optimizer()
    assert "step" in opt.optimizer.state[main_param]  # torch's Adam: a per-parameter step
    with pytest.raises(KeyError, match="step"):
        opt.load_parameter_state_from_fully_reshardable(_fully_reshardable_checkpoint())

    opt, main_param = _distributed_optimizer()
    with torch.no_grad(), torch_adam_step_tolerated(opt):
        opt.load_parameter_state_from_fully_reshardable(_fully_reshardable_checkpoint())
    assert "_set_main_param_and_optimizer_states" not in vars(opt)  # the shim is gone after the block
    state = opt.optimizer.state[main_param]
    assert torch.equal(main_param.detach(), torch.full((N,), 5.0))
    assert torch.equal(state["exp_avg"], torch.full((N,), 6.0)) and torch.equal(state["exp_avg_sq"], torch.full((N,), 7.0))
    assert float(state["step"]) == 1.0  # not restored by megatron: the placeholder's count


def test_restore_adam_steps_sets_the_saved_count_in_separate_tensors():
    opt, main_param = _distributed_optimizer()
    second = torch.nn.Parameter(torch.zeros(2))
    opt.optimizer.add_param_group({"params": [second]})
    second.grad = torch.ones(2)
    opt.optimizer.step()
    assert adam_steps(opt) == [2.0, 1.0]
    restore_adam_steps(opt, 7)
    assert adam_steps(opt) == [7.0, 7.0]
    steps = [s["step"] for s in opt.optimizer.state.values()]
    assert steps[0] is not steps[1]  # torch's Adam increments each; a shared tensor would count twice


def test_restore_adam_steps_leaves_a_fused_adams_per_parameter_state_alone():
    # Transformer Engine's / Apex's FusedAdam keep the step per group, and TE's state_dict() fails
    # on any per-parameter key but exp_avg, exp_avg_sq and master_param. Breakage caught: a
    # "step" added to every state with exp_avg (KeyError: 'step' at the first save after a resume).
    fused_like = types.SimpleNamespace(optimizer=types.SimpleNamespace(state={
        "p0": {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)},
        "p1": {"exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3), "master_param": torch.zeros(3)},
    }))
    restore_adam_steps(fused_like, 7)
    assert all("step" not in s for s in fused_like.optimizer.state.values())
    assert adam_steps(fused_like) == []


def test_ensure_optimizer_state_gives_a_fresh_optimizer_placeholders():
    opt, main_param = _distributed_optimizer(stepped=False)
    assert len(opt.optimizer.state) == 0  # created lazily by the first step: nothing to load into
    ensure_optimizer_state(opt)
    assert set(opt.optimizer.state[main_param]) >= {"step", "exp_avg", "exp_avg_sq"}

    chained = types.SimpleNamespace(chained_optimizers=[types.SimpleNamespace(
        optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]), config=None,
        init_state_fn=lambda o, config: [o.state[p].update(exp_avg=torch.zeros(2)) for g in o.param_groups for p in g["params"]],
    )])  # fmt: skip
    ensure_optimizer_state(chained)
    assert [len(o.optimizer.state) for o in chained.chained_optimizers] == [1]
