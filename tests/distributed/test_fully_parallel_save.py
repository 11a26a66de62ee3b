"""checkpoint.fully_parallel_save: megatron-core's FullyParallelSaveStrategyWrapper over the DP group
spreads the writing of ``actor/`` over the data-parallel ranks, and what it writes loads to the same
weights and optimizer state as the default strategy's files (two gloo processes, DP=2, TP1 PP1).

Breakage caught: the wrapper not applied (at DP=2 with TP1 every tensor is replicated, so DP rank 1
writes almost nothing: the byte shares fail), or applied in a way that loses or mixes up shards (the
loaded weights and optimizer state differ from the trained ones / from the default save's).
"""

from __future__ import annotations

import pytest
import torch
from checkpoint_workers import fully_parallel_save_worker
from launcher import run_distributed

pytestmark = [pytest.mark.distributed]


def test_the_save_is_spread_over_dp_ranks_and_loads_as_the_default_one(qwen2_path, tmp_path):
    ranks = run_distributed(fully_parallel_save_worker, 2, qwen2_path, tmp_path)
    spread = [r["bytes"]["spread"] for r in ranks]
    rank0 = [r["bytes"]["rank0"] for r in ranks]
    # the default strategy: DP rank 0 writes the replicated model and the gathered optimizer state
    assert rank0[1] < 0.05 * sum(rank0), rank0
    # spread: each rank writes a share (the greedy split of megatron-core balances bytes, not exactly)
    assert min(spread) > 0.25 * sum(spread), spread
    assert sum(spread) == pytest.approx(sum(rank0), rel=0.05)
    for r in ranks:
        for save in ("spread", "rank0"):
            assert r[save]["weights"].keys() == r["trained"].keys()
            for name, w in r["trained"].items():
                torch.testing.assert_close(r[save]["weights"][name], w, rtol=0, atol=0)
        a, b = r["spread"]["optimizer"], r["rank0"]["optimizer"]
        assert a.keys() == b.keys() and any(isinstance(v, torch.Tensor) and v.abs().sum() > 0 for v in a.values())
        for key, value in a.items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(value, b[key], rtol=0, atol=0, msg=lambda m, key=key: f"{key}: {m}")
            else:
                assert value == b[key], key
