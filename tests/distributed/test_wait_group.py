"""The model-parallel wait group (``fastrl.distributed.parallel_state.build_model_parallel_wait_group``):
a gloo copy of each megatron-core model-parallel group, on which the peers wait while the group's
first rank works alone, before the broadcast (on a GPU cluster the broadcast is NCCL, which would
spin on each peer GPU and be aborted by NCCL's watchdog after the collective timeout). Built here
on gloo, four processes, TP2 x DP2 (two model-parallel groups)."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from rollout_workers import wait_group_worker

pytestmark = pytest.mark.distributed


def test_peers_wait_on_a_gloo_copy_of_their_model_parallel_group():
    # Breakage caught: wait groups built in different orders on different ranks (a hang), a wait
    # group that is not the rank's own model-parallel group (a peer released by another group's
    # source), a broadcast that skips the barrier.
    results = run_distributed(wait_group_worker, 4, 2, 1)
    for r in results:
        assert r["wait_ranks"] == r["mp_ranks"] and len(r["mp_ranks"]) == 2 and r["wait_backend"] == "gloo"
        assert r["barriers_on_wait"] == 1
        source_rank = min(r["mp_ranks"])
        assert r["got"] == {"from": source_rank}
        if not r["source"]:
            assert r["waited"] >= 0.9  # held at the barrier while its source worked alone
    assert sorted(tuple(r["mp_ranks"]) for r in results) == [(0, 1), (0, 1), (2, 3), (2, 3)]
