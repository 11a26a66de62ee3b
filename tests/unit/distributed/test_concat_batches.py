"""Concatenating re-partitioned rollouts of different sequence lengths."""

from __future__ import annotations

import torch

from fastrl.batch import PolicyBatch
from fastrl.distributed.dp_pruning import concat_batches


def _batch(n: int, t: int, start: int) -> PolicyBatch:
    ids = torch.arange(start, start + n * t).reshape(n, t)
    ones = torch.ones(n, t, dtype=torch.bool)
    return PolicyBatch(
        input_ids=ids, attention_mask=ones, response_mask=ones,
        advantages=torch.arange(n, dtype=torch.float32), old_log_probs=-ids.float(),
    )  # fmt: skip


def test_rows_are_kept_in_order_and_right_padded():
    out = concat_batches([_batch(1, 2, 1), _batch(2, 3, 10)])
    assert out.input_ids.tolist() == [[1, 2, 0], [10, 11, 12], [13, 14, 15]]
    assert out.attention_mask.tolist()[0] == [True, True, False]
    assert out.old_log_probs.tolist()[0] == [-1.0, -2.0, 0.0]
    assert out.advantages.tolist() == [0.0, 0.0, 1.0]
    assert out.lengths.tolist() == [2, 3, 3]
