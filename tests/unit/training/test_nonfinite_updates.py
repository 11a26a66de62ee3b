"""A non-finite loss or gradient skips the optimizer update (fastrl/training/actor.py::Actor.step),
counted over the run; the run stops when updates keep being skipped (fastrl/training/loop.py)."""

from __future__ import annotations

import math
import types

import pytest
import torch

from fastrl.training.actor import Actor
from fastrl.training.loop import NonFiniteUpdatesError, count_skipped_updates, stop_if_updates_keep_failing


class _Optimizer:
    def __init__(self):
        self.steps = 0
        self.param_groups = [{"lr": 1e-3}]

    def step(self):
        self.steps += 1
        return True, 0.5, None


class _Scheduler:
    def __init__(self):
        self.num_steps = 0

    def step(self, increment):
        self.num_steps += increment


def _actor(grad: float) -> Actor:
    chunk = torch.nn.Linear(2, 2)
    for p in chunk.parameters():
        p.main_grad = torch.full_like(p, grad)  # megatron DDP keeps the reduced gradient here
    actor = Actor.__new__(Actor)  # the step's collaborators only: no megatron model
    actor.policy = types.SimpleNamespace(chunks=[chunk])
    actor.optimizer = _Optimizer()
    return actor


@pytest.mark.parametrize(("loss", "grad"), [(float("nan"), 0.1), (float("inf"), 0.1), (0.3, float("nan")), (0.3, float("inf"))])
def test_a_non_finite_loss_or_gradient_skips_the_update(loss, grad):
    """catches: Actor.step calling megatron's optimizer.step() whatever the loss and gradients (on
    CPU fp32 it reports ok=True with inf gradients: the NaN update was applied and checkpointed)."""
    actor, scheduler = _actor(grad), _Scheduler()
    m = actor.step(scheduler=scheduler, loss=loss)
    assert m["actor/update_skipped"] == 1.0 and math.isnan(m["actor/grad_norm"])
    assert actor.optimizer.steps == 0 and scheduler.num_steps == 0  # weights, moments, schedule unchanged
    assert actor.skipped_in_a_row == 1
    actor.step(scheduler=scheduler, loss=loss)
    assert actor.skipped_in_a_row == 2


def test_the_ddp_grad_buffers_are_checked():
    """catches: only per-parameter gradients checked (megatron DDP keeps them in its grad buffers)."""
    actor = _actor(0.1)
    chunk = actor.policy.chunks[0]
    chunk.buffers = [types.SimpleNamespace(grad_data=torch.tensor([0.1, float("inf")]))]  # as megatron's DDP sets it
    assert actor.step(scheduler=_Scheduler(), loss=0.3)["actor/update_skipped"] == 1.0 and actor.optimizer.steps == 0


def test_a_finite_update_is_applied_and_resets_the_run_of_skips():
    actor, scheduler = _actor(0.1), _Scheduler()
    actor.skipped_in_a_row = 2
    m = actor.step(scheduler=scheduler, loss=0.3)
    assert m["actor/update_skipped"] == 0.0 and m["actor/grad_norm"] == 0.5
    assert actor.optimizer.steps == 1 and scheduler.num_steps == 1 and actor.skipped_in_a_row == 0


def _run(in_a_row: int, limit: int = 3):
    cfg = types.SimpleNamespace(trainer=types.SimpleNamespace(max_skipped_updates=limit))
    ctx = types.SimpleNamespace(is_logging_rank=True)
    return types.SimpleNamespace(cfg=cfg, ctx=ctx, actor=types.SimpleNamespace(skipped_in_a_row=in_a_row))


def test_skipped_updates_are_counted_over_the_run(caplog):
    """catches: the running count (actor/skipped_updates_total) not adding the step's skipped updates."""
    state = types.SimpleNamespace(step=4, skipped_updates=1)
    with caplog.at_level("WARNING", logger="fastrl.trainer"):
        out = count_skipped_updates(_run(2), state, {"actor/update_skipped": 0.5, "actor/updates": 4.0, "actor/loss": float("nan")})
    assert out == {"actor/skipped_updates_total": 3.0} and state.skipped_updates == 3
    assert "step 4: 2 of 4 optimizer update(s) skipped" in caplog.text
    assert count_skipped_updates(_run(0), state, {"actor/update_skipped": 0.0, "actor/updates": 4.0}) == {"actor/skipped_updates_total": 3.0}


def test_the_run_stops_naming_the_step_when_skips_persist():
    """catches: a run that goes on skipping every update (or the limit off by one)."""
    state = types.SimpleNamespace(step=7)
    stop_if_updates_keep_failing(_run(2), state, {"actor/loss": float("nan")})  # below the limit: goes on
    with pytest.raises(NonFiniteUpdatesError, match=r"^step 7: the last 3 optimizer updates were skipped .*max_skipped_updates=3"):
        stop_if_updates_keep_failing(_run(3), state, {"actor/loss": float("nan")})


def test_update_checks_the_loss_of_its_forward_backward():
    """catches: Actor.update not handing the mini-batch loss to step (a NaN loss with finite gradients applied)."""
    actor = _actor(0.1)
    actor.forward_backward = lambda batch, micro_sizes=None, *, dp_size: {"actor/loss": float("nan")}
    m = actor.update(None, dp_size=1, scheduler=_Scheduler())
    assert m["actor/update_skipped"] == 1.0 and math.isnan(m["actor/loss"]) and actor.optimizer.steps == 0


def test_the_on_policy_first_update_checks_its_loss_too():
    """The step's first update (trainer.old_log_probs=auto) runs forward_backward_on_policy and then
    Actor.step itself (the mismatch guard sits between them).

    catches: update_policy's on-policy branch calling ``actor.step`` without the loss (a NaN loss
    with finite gradients applied)."""
    from fastrl.batch import PolicyBatch
    from fastrl.training.geometry import UpdatePlan
    from fastrl.training.update_phase import update_policy

    actor = _actor(0.1)
    actor.sequence_multiple = 1
    actor.forward_backward_on_policy = lambda batch, micro_sizes=None, *, dp_size: (
        {"actor/loss": float("nan")}, torch.zeros(len(batch), batch.seq_length)
    )
    mask = torch.tensor([[False, True, True], [False, True, False]])
    batch = PolicyBatch(
        input_ids=torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.bool), response_mask=mask,
        advantages=torch.tensor([1.0, -1.0]), engine_log_probs=torch.zeros(2, 3),
        old_log_probs=torch.full((2, 3), float("nan")),
    )
    plan = UpdatePlan(row_order=(0, 1), update_rows=(2,), micro_batches=((2,),), passes=1, lr_positions=(1,), dp_size=1)
    m = update_policy(batch, actor, plan, scheduler=_Scheduler(), on_policy_rows=2)
    assert m["actor/update_skipped"] == 1.0 and actor.optimizer.steps == 0
