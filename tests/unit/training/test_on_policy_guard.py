"""The mismatch guard of the on-policy first update (trainer.old_log_probs auto / engine) measures
the rows whose old log-probs are the trainer's."""

from __future__ import annotations

import types

import pytest
import torch

from fastrl.batch import PolicyBatch
from fastrl.training.geometry import UpdatePlan
from fastrl.training.update_phase import update_policy


def _actor(captured_shift: float):
    calls: list[str] = []

    def on_policy(batch, micro_sizes=None, *, dp_size):
        calls.append(f"first dp={dp_size}" if dp_size != 1 else "first")
        return {"actor/loss": 0.1}, batch.engine_log_probs + captured_shift * batch.response_mask

    return types.SimpleNamespace(
        micro_batch_size=2, sequence_multiple=1, forward_backward_on_policy=on_policy,
        step=lambda **k: calls.append("step") or {"actor/update_skipped": 0.0},
        update=lambda part, *, dp_size, **k: calls.append(f"later dp={dp_size}" if dp_size != 1 else "later") or {"actor/loss": 0.1},
    ), calls


def _batch(rows: int = 4) -> PolicyBatch:
    mask = torch.zeros(rows, 3, dtype=torch.bool)
    mask[:, 1:] = True
    engine = -torch.ones(rows, 3) * mask
    old = torch.cat([torch.full((2, 3), float("nan")), engine[2:].clone()])  # engine mode: later rows = engine's
    return PolicyBatch(
        input_ids=torch.ones(rows, 3, dtype=torch.long), attention_mask=torch.ones(rows, 3, dtype=torch.bool),
        response_mask=mask, advantages=torch.ones(rows), engine_log_probs=engine, old_log_probs=old,
    )


@pytest.mark.parametrize(("engine_old", "expected"), [(True, 0.2), (False, 0.1)])
def test_the_guard_sees_the_trainer_rows_before_the_first_step(engine_old, expected):
    """catches: in engine mode the mismatch averaged over every row (the later rows' old log-probs are
    the engine's own, exactly 0 apart: a 4-update step would dilute the stale-weights guard 4x);
    the guard called after the first optimizer step."""
    actor, calls = _actor(0.2)
    seen = []
    plan = UpdatePlan(row_order=(0, 1, 2, 3), update_rows=(2, 2), micro_batches=((2,), (2,)), passes=1, lr_positions=(1, 2), dp_size=1)
    update_policy(_batch(), actor, plan, scheduler=None, on_policy_rows=2, engine_old=engine_old,
                  guard=lambda m: seen.append((m["mismatch/abs_diff_mean"], list(calls))))
    assert seen[0][0] == pytest.approx(expected)
    assert seen[0][1] == ["first"]  # measured after the first forward, before its optimizer step
    assert calls == ["first", "step", "later"]


def test_the_actor_takes_the_plans_dp_size():
    """The actor undoes megatron's average over the DP ranks with the step geometry's DP size, which
    the update plan carries (no second reading of the process group).

    catches: ``update_policy`` handing the actor another DP size than the plan's (``dp_size=1``
    instead of ``plan.dp_size`` in ``fastrl/training/update_phase.py``)."""
    actor, calls = _actor(0.0)
    plan = UpdatePlan(row_order=(0, 1, 2, 3), update_rows=(2, 2), micro_batches=((2,), (2,)), passes=1, lr_positions=(1, 2), dp_size=4)
    update_policy(_batch(), actor, plan, scheduler=None, on_policy_rows=2)
    assert calls == ["first dp=4", "step", "later dp=4"]
