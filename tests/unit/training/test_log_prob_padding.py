"""The old / reference passes compute the tokens of their rows, not of the batch's longest row
(issue 47, item 3): the zero-weight rows that fill a pass's last micro-batch are copies of the
shortest row, and the passes' padded share is a metric."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch

from fastrl.config import ParallelConfig, RunConfig
from fastrl.models import logprobs as lp_ops
from fastrl.training import update_phase
from fastrl.training.geometry import step_geometry
from fastrl.training.rollout_batch import padding_rows, to_policy_batch
from tests.unit.training.test_fp8_shapes import scored_rollouts


class _Actor:
    temperature = 1.0
    sequence_multiple = 1
    policy = types.SimpleNamespace(chunks=[])


def _batch():
    """Five rollouts of 11, 4, 9, 6 and 7 tokens (prompt + response), in that order."""
    scored = scored_rollouts([3, 2], [[8, 1, 6], [4, 5]])
    return to_policy_batch(scored, range(5), pad_token_id=0)


def test_padding_rows_copy_the_shortest_row():
    # catches: padding rows copied from row 0 (the longest row after the passes' sort)
    batch = _batch()
    assert batch.lengths.tolist() == [11, 4, 9, 6, 7]
    pad = padding_rows(batch, 2)
    assert pad.lengths.tolist() == [4, 4] and torch.equal(pad.input_ids, batch.input_ids[[1, 1]])
    assert not pad.response_mask.any()


def test_the_last_micro_batch_runs_at_its_own_rows_length(monkeypatch):
    # catches: padding rows copied from row 0 (the last micro-batch then runs at 11 tokens, not 4),
    # and a padded share counted without the padding rows or over the wrong cut
    shapes: list[list[int]] = []

    def recording(chunks, batch, *, micro_batch_size, sequence_multiple, **kw):
        micro = lp_ops.fit_micro_batches(list(batch.micro_batches(micro_batch_size)), sequence_multiple)
        shapes.append([mb.seq_length for mb in micro])
        return torch.full(batch.input_ids.shape, -0.5)

    monkeypatch.setattr(update_phase.lp_ops, "compute_log_probs", recording)
    batch = _batch()
    geometry = step_geometry(RunConfig(parallel=ParallelConfig(micro_batch_size=2)), 1, 2)
    out, metrics = update_phase.add_log_probs(
        batch, _Actor(), types.SimpleNamespace(chunks=[]), geometry=geometry, phase=lambda name: contextlib.nullcontext(),
    )
    # sorted 11, 9 | 7, 6 | 4 + a copy of the 4-token row: the micro-batches run at 11, 7 and 4
    assert shapes == [[11, 7, 4], [11, 7, 4]]  # reference pass, then old-policy pass
    real, computed = 37, 2 * 11 + 2 * 7 + 2 * 4
    assert metrics["actor/log_prob_padding_fraction"] == 1.0 - real / computed
    assert out.old_log_probs.shape == (5, batch.seq_length)


def test_no_padding_share_without_a_pass(monkeypatch):
    # catches: a share reported from a pass that did not run (engine old log-probs, no reference)
    monkeypatch.setattr(update_phase.lp_ops, "compute_log_probs", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    batch = _batch()
    geometry = step_geometry(RunConfig(parallel=ParallelConfig(micro_batch_size=2)), 1, 2)
    _, metrics = update_phase.add_log_probs(
        batch, _Actor(), None, geometry=geometry, phase=lambda name: contextlib.nullcontext(), engine_old=True,
    )
    assert metrics["actor/log_prob_padding_fraction"] == 0.0


def test_the_update_reports_its_real_tokens_and_padded_share():
    # catches: actor/update_tokens counted over the padded micro-batches, or over every pass
    # (ppo_epochs=2), or a padded share from the batch's longest row instead of each micro-batch's
    from fastrl.config import AlgorithmConfig

    batch = _batch()
    cfg = RunConfig(parallel=ParallelConfig(micro_batch_size=2), algorithm=AlgorithmConfig(ppo_epochs=2))
    plan = step_geometry(cfg, 1, 2).plan_update(batch.lengths, step=1)
    batch = batch.select(plan.row_order)

    class Actor(_Actor):
        micro_batch_size = 2

        def update(self, part, **kw):
            return {"actor/loss": 0.0}

    m = update_phase.update_policy(batch, Actor(), plan, scheduler=None)
    cuts = [list(c) if c is not None else [2, 2, 1] for c in plan.micro_batches]
    lens = batch.lengths.tolist()
    computed, start = 0, 0
    for size in (c for cut in cuts for c in cut):
        computed += size * max(lens[start:start + size])
        start += size
    assert m["actor/update_tokens"] == 37.0
    assert m["actor/padding_fraction"] == pytest.approx(1.0 - 37 / computed) and computed < 5 * 11


def test_computed_tokens_round_to_the_sequence_multiple_and_take_the_fixed_shape_under_pp(monkeypatch):
    # catches: computed tokens counted without the FP8 / sequence-parallel multiple, trimmed
    # micro-batches counted under pipeline parallelism (one fixed [T, micro_batch_size] shape), or a
    # cut that does not cover the batch accepted there
    scored = scored_rollouts([3, 2], [[8, 1, 6], [4, 5]])
    batch = to_policy_batch(scored, range(5), pad_token_id=0, pad_to_multiple=4)  # lengths 11, 4, 9, 6, 7; T 12
    assert batch.seq_length == 12
    micro = lp_ops.fit_micro_batches([batch.select(range(0, 2)), batch.select(range(2, 4)), batch.select([4])], 4)
    assert update_phase.computed_tokens(batch, [2, 2, 1], 4) == sum(len(mb) * mb.seq_length for mb in micro) == 56
    assert update_phase.computed_tokens(batch, [2, 2, 1], 1) == 2 * 11 + 2 * 9 + 7
    monkeypatch.setattr(update_phase.collectives, "pipeline_size", lambda: 2)
    assert update_phase.computed_tokens(batch, [2, 2, 1], 4) == 5 * 12
    with pytest.raises(ValueError, match="do not split a batch of 5"):  # a cut that is not the batch's
        update_phase.computed_tokens(batch, [2, 2], 4)


def test_padded_shares_are_summed_over_data_parallel_ranks(monkeypatch):
    # catches: a padded share or update_tokens of this rank alone (another rank's 100 real of 300
    # computed tokens left out)
    other = torch.tensor([100.0, 300.0], dtype=torch.float64)
    monkeypatch.setattr(update_phase.collectives, "all_reduce_sum_dp", lambda t: t + other)
    monkeypatch.setattr(update_phase.lp_ops, "compute_log_probs", lambda chunks, batch, **kw: torch.full(batch.input_ids.shape, -0.5))
    batch = _batch()
    cfg = RunConfig(parallel=ParallelConfig(micro_batch_size=2))
    geometry = step_geometry(cfg, 1, 2)
    _, metrics = update_phase.add_log_probs(batch, _Actor(), None, geometry=geometry, phase=lambda name: contextlib.nullcontext())
    assert metrics["actor/log_prob_padding_fraction"] == 1.0 - (37 + 100) / (2 * 11 + 2 * 7 + 2 * 4 + 300)
    plan = geometry.plan_update(batch.lengths, step=1)

    class Actor(_Actor):
        micro_batch_size = 2

        def update(self, part, **kw):
            return {}

    m = update_phase.update_policy(batch.select(plan.row_order), Actor(), plan, scheduler=None)
    # this rank: micro-batches 11, 9 | 7, 6 | 4 run at 22 + 14 + 4 = 40 tokens
    assert m["actor/update_tokens"] == 137.0 and m["actor/padding_fraction"] == 1.0 - 137 / 340
