"""Micro-batches at their own length: ``PolicyBatch.trimmed`` and ``fit_micro_batches``."""

import pytest
import torch

from fastrl.batch import PolicyBatch
from fastrl.distributed import collectives
from fastrl.models.logprobs import fit_micro_batches


def _batch(lengths: list[int], t: int = 20) -> PolicyBatch:
    n = len(lengths)
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    resp = torch.zeros(n, t, dtype=torch.bool)
    for i, length in enumerate(lengths):
        ids[i, :length] = torch.arange(1, length + 1)
        attn[i, :length] = True
        resp[i, 2:length] = True
    lp = torch.where(resp, -torch.rand(n, t), torch.zeros(()))
    return PolicyBatch(
        input_ids=ids, attention_mask=attn, response_mask=resp, group_ids=torch.arange(n),
        advantages=torch.randn(n), engine_log_probs=lp, old_log_probs=lp * 2,
    )


def test_trimmed_drops_only_padding_columns_and_cuts_every_token_tensor():
    batch = _batch([5, 9, 3])
    cut = batch.trimmed()
    assert cut.seq_length == 9
    for name in ("input_ids", "attention_mask", "response_mask", "engine_log_probs", "old_log_probs"):
        assert torch.equal(getattr(cut, name), getattr(batch, name)[:, :9]), name
        assert not getattr(batch, name)[:, 9:].any(), name  # what was cut held nothing
    assert torch.equal(cut.advantages, batch.advantages) and torch.equal(cut.group_ids, batch.group_ids)
    assert batch.seq_length == 20  # the batch itself is unchanged


def test_trimmed_rounds_up_to_the_multiple_and_never_grows():
    batch = _batch([5, 9, 3])
    assert batch.trimmed(16).seq_length == 16
    assert batch.trimmed(8).seq_length == 16
    assert batch.trimmed(32) is batch  # 32 > T = 20: nothing to cut
    full = _batch([20, 4])
    assert full.trimmed() is full  # a row uses every column
    with pytest.raises(ValueError, match="multiple must be >= 1"):
        batch.trimmed(0)


def test_fit_micro_batches_cuts_each_to_its_own_rows(monkeypatch):
    batch = _batch([3, 4, 12, 7])
    parts = list(batch.micro_batches(2))
    assert [mb.seq_length for mb in fit_micro_batches(parts, 1)] == [4, 12]
    assert [mb.seq_length for mb in fit_micro_batches(parts, 16)] == [16, 16]  # FP8: 16 | T, capped at T=20
    assert fit_micro_batches(parts, None) is parts  # no multiple given: the batch's T
    # pipeline parallelism: megatron's stages exchange one fixed shape, so nothing is cut
    monkeypatch.setattr(collectives, "pipeline_size", lambda: 2)
    assert [mb.seq_length for mb in fit_micro_batches(parts, 1)] == [20, 20]
