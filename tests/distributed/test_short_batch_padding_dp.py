"""A kept batch shorter than dp_size x micro_batch_size (a short DAPO step) is padded with
zero-weight rows so that every DP rank gets the same whole number of rows (issue 19, item 3)."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from padding_workers import padded_repartition_worker

pytestmark = pytest.mark.distributed


def test_padding_over_two_dp_ranks():
    # 6 real rollouts held 4 + 2, dp_size x micro_batch_size = 2 x 4 = 8: 2 padding rows
    results = run_distributed(padded_repartition_worker, 2, [4, 2], 2)
    assert [len(r["input_ids"]) for r in results] == [4, 4]
    real, pads = [], 0
    for r in results:
        for ids, mask, adv in zip(r["input_ids"], r["response_mask"], r["advantages"]):
            if mask.any():
                real.append((tuple(ids[ids != 0].tolist()), float(adv)))
            else:
                pads += 1
                assert float(adv) == 0.0
    assert pads == 2
    all_ids, all_adv = results[0]["all_input_ids"], results[0]["all_advantages"]
    want = sorted((tuple(row[row != 0].tolist()), float(a)) for row, a in zip(all_ids, all_adv))
    assert sorted(real) == want  # every real rollout exactly once, with its advantage
