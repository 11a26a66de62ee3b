"""The values a step passes between its phases are immutable and typed (issue 32, item 2): a phase
returns a new value and leaves its input as it was; rollouts before and after the advantages are
different types."""

from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest
import torch

from fastrl.batch import ROW_TENSORS
from fastrl.config import AlgorithmConfig, ParallelConfig, RunConfig
from fastrl.training import update_phase
from fastrl.training.geometry import step_geometry
from fastrl.training.rollout_batch import AdvantagedRollouts, ScoredRollouts, select_scored, to_policy_batch
from fastrl.training.scoring import compute_advantages
from fastrl.training.update_phase import add_log_probs
from tests.unit.training.test_fp8_shapes import scored_rollouts


def _scored() -> ScoredRollouts:
    adv = scored_rollouts([3, 4], [[2, 3], [1, 2]])
    return ScoredRollouts(
        adv.rollouts, group_ids=adv.group_ids, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), accuracy=adv.accuracy,
        valid=adv.valid, formatted=adv.formatted,
    )


def test_policy_batch_is_frozen_and_with_tensors_returns_a_new_batch():
    batch = to_policy_batch(_scored(), range(4), pad_token_id=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.advantages = torch.zeros(4)  # type: ignore[misc]
    assert not hasattr(batch, "tensors")  # named fields, no string-keyed dict to write into
    old = torch.zeros(4, batch.seq_length)
    out = batch.with_tensors(old_log_probs=old)
    assert out is not batch and batch.old_log_probs is None and out.old_log_probs is old
    assert list(out.row_tensors()) == ["group_ids", "engine_log_probs", "old_log_probs"]
    assert set(ROW_TENSORS) >= set(out.row_tensors())
    with pytest.raises(TypeError, match="no per-rollout tensor"):
        batch.with_tensors(input_ids=batch.input_ids)
    with pytest.raises(ValueError, match=r"old_log_probs has shape \(4, 2\)"):
        batch.with_tensors(old_log_probs=torch.zeros(4, 2))  # per-token tensors are [N, T]


def test_advantages_make_another_type_and_leave_the_scores_alone():
    scored = _scored()
    advantaged, _ = compute_advantages(scored, AlgorithmConfig(), step=1)
    assert type(scored) is ScoredRollouts and not hasattr(scored, "advantages")
    assert isinstance(advantaged, AdvantagedRollouts) and advantaged.advantages.dtype == torch.float32
    assert advantaged.rollouts is scored.rollouts and torch.equal(advantaged.rewards, scored.rewards)
    with pytest.raises(dataclasses.FrozenInstanceError):
        advantaged.advantages = torch.zeros(4)  # type: ignore[misc]
    # the policy batch carries advantages exactly when the rollouts have them
    assert to_policy_batch(scored, range(4), pad_token_id=0).advantages is None
    assert torch.equal(to_policy_batch(advantaged, [2, 0], pad_token_id=0).advantages, advantaged.advantages[[2, 0]])
    picked = select_scored(advantaged, [2, 3])
    assert isinstance(picked, AdvantagedRollouts) and torch.equal(picked.advantages, advantaged.advantages[2:])
    assert type(select_scored(scored, [2, 3])) is ScoredRollouts
    with pytest.raises(ValueError, match="advantages of shape"):
        scored.with_advantages(torch.zeros(3))


class _Actor:
    temperature = 1.0
    sequence_multiple = None
    policy = types.SimpleNamespace(chunks=[])


def test_add_log_probs_returns_a_new_batch(monkeypatch):
    monkeypatch.setattr(
        update_phase.lp_ops, "compute_log_probs", lambda chunks, batch, **kw: torch.full(batch.input_ids.shape, -0.5)
    )
    batch = to_policy_batch(_scored(), range(4), pad_token_id=0)
    before = batch.row_tensors()
    geometry = step_geometry(RunConfig(parallel=ParallelConfig(micro_batch_size=2)), 1, 2)
    out, metrics = add_log_probs(batch, _Actor(), None, geometry=geometry, phase=lambda name: contextlib.nullcontext())
    assert out is not batch and batch.row_tensors().keys() == before.keys()  # the input is unchanged
    assert out.old_log_probs.shape == (4, batch.seq_length) and out.ref_log_probs is None
    assert out.engine_log_probs is batch.engine_log_probs and metrics
