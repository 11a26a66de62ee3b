"""A DAPO step with fewer kept rollouts than dp_size x micro_batch_size: pad with zero-weight rows
instead of failing (issue 19, item 3)."""

import pytest
import torch

from fastrl.algorithms.losses import loss_denominator, ppo_clip_loss
from fastrl.batch import PolicyBatch
from fastrl.distributed.dp_pruning import LocalPruningInputs, dp_global_prune
from fastrl.training.geometry import fit_to_micro_batches, mini_batch_sizes, trim_to_multiple
from fastrl.training.prune_phase import PruneOutcome, repartition_kept
from fastrl.training.pruner import keep_all
from fastrl.training.rollout_batch import padding_rows

GIDS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
ADV = torch.tensor([0.9, -0.3, 0.3, -0.9, 1.5, -0.5, -0.5, -0.5])


def test_fit_pads_a_batch_shorter_than_one_micro_batch_per_rank():
    # the case: 20 rollouts left, dp_size x micro_batch_size = 32 -> 12 padding rows
    r = keep_all(torch.arange(5).repeat_interleave(4), torch.ones(20, dtype=torch.long))
    with pytest.raises(ValueError, match="only 20 rollouts are left"):
        trim_to_multiple(r, torch.ones(20), torch.arange(5).repeat_interleave(4), 32)  # what crashed
    same, dropped, padding = fit_to_micro_batches(r, torch.ones(20), torch.arange(5).repeat_interleave(4), 32)
    assert (dropped, padding) == (0, 12) and same.num_padding == 12 and torch.equal(same.keep, r.keep)
    assert mini_batch_sizes(20 + padding, 32, 32) == [32]


def test_fit_trims_as_before_when_at_least_one_micro_batch_per_rank():
    r = keep_all(GIDS, torch.ones(8, dtype=torch.long))
    trimmed, dropped, padding = fit_to_micro_batches(r, ADV, GIDS, 3)
    assert (dropped, padding) == (2, 0) and trimmed.num_padding == 0
    assert trimmed.indices.tolist() == [0, 3, 4, 5, 6, 7]  # |a| = 0.3 dropped, latest first
    assert fit_to_micro_batches(r, ADV, GIDS, 8)[1:] == (0, 0)
    with pytest.raises(ValueError, match=">= 1"):
        fit_to_micro_batches(r, ADV, GIDS, 0)


def _batch(n: int = 3) -> PolicyBatch:
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 9, 0, 0], [5, 6, 7, 7, 7]])[:n]
    attn = ids != 0
    resp = attn.clone()
    resp[:, :2] = False
    return PolicyBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp,
        advantages=torch.tensor([1.0, -1.0, 0.5])[:n], old_log_probs=torch.full((n, 5), -0.5),
    )


def test_padding_rows_carry_no_loss_weight():
    batch = _batch()
    pad = padding_rows(batch, 2)
    assert len(pad) == 2 and torch.equal(pad.input_ids, batch.input_ids[[1, 1]])  # the shortest row
    assert torch.equal(pad.attention_mask, batch.attention_mask[[1, 1]])  # an ordinary forward pass
    assert not pad.response_mask.any() and pad.advantages.tolist() == [0.0, 0.0]
    assert loss_denominator(pad.response_mask, "token-mean") == 0
    assert loss_denominator(pad.response_mask, "seq-mean-token-mean") == 0
    # the loss of real + padding rows equals the loss of the real rows alone
    logp = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))
    full = PolicyBatch(
        input_ids=torch.cat([batch.input_ids, pad.input_ids]), attention_mask=torch.cat([batch.attention_mask, pad.attention_mask]),
        response_mask=torch.cat([batch.response_mask, pad.response_mask]),
    )
    for mode in ("token-mean", "seq-mean-token-mean"):
        den = loss_denominator(batch.response_mask, mode)
        old = torch.full((5, 5), -0.5)
        adv = torch.cat([batch.advantages, pad.advantages])
        clip = dict(global_denominator=den, clip_low=0.2, clip_high=0.3, agg_mode=mode)
        a, _ = ppo_clip_loss(logp, old, adv, full.response_mask, **clip)
        b, _ = ppo_clip_loss(logp[:3], old[:3], batch.advantages, batch.response_mask, **clip)
        assert float(a) == pytest.approx(float(b), abs=1e-7)
    with pytest.raises(ValueError, match="padding rows"):
        padding_rows(batch, 0)


def test_repartition_appends_padding_rows_single_rank():
    batch = _batch()
    gids = torch.tensor([0, 0, 0])
    local = LocalPruningInputs(group_ids=gids, advantages=batch.advantages, lengths=batch.lengths,
                               response_lengths=torch.ones(3, dtype=torch.long), responses=[torch.tensor([1])] * 3)
    inputs, result = dp_global_prune(local, lambda g: keep_all(g.group_ids, g.response_lengths), dp_size=1)
    out, m = repartition_kept(batch, PruneOutcome(inputs=inputs, keep=result.keep, kept_per_group=result.kept_per_group, padding=5))
    assert len(out) == 8 and m["prune/kept_rows_this_rank"] == 8.0
    assert torch.equal(out.input_ids[:3], batch.input_ids)
    assert out.response_mask[:3].equal(batch.response_mask) and not out.response_mask[3:].any()
    assert out.advantages.tolist() == [1.0, -1.0, 0.5, 0, 0, 0, 0, 0]
