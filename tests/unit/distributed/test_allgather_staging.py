"""fastrl.distributed.allgather_staging on a one-rank gloo group: both all-gather forms run (also for a
group of one rank), their outputs are checked, the time budget skips the sizes that would start late."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from fastrl.distributed.allgather_staging import gather_staging, staging_probe


@pytest.fixture()
def gloo_world():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_both_forms_gather_the_shard_and_the_budget_skips_late_sizes(gloo_world):
    """Every size within the budget is gathered both ways and checked (no memory counters off CUDA);
    with no budget left every size is skipped, named as such.

    catches: the budget test inverted (``>`` -> ``<``: every size skipped within the budget;
    tools/mutants.toml ``allgather-staging-budget-inverted``)."""
    rows = staging_probe(torch.device("cpu"), (4096, 65536), budget_s=60.0)
    assert [r["shard_bytes"] for r in rows] == [4096, 65536]
    for r in rows:
        assert (r["status"], r["backend"], r["world_size"]) == ("ok", "gloo", 1), r
        assert r["list_extra_bytes"] is None and r["flat_extra_bytes"] is None and r["seconds"] >= 0
    skipped = staging_probe(torch.device("cpu"), (4096,), budget_s=-1.0)
    assert skipped[0]["status"].startswith("skipped") and "list_extra_bytes" not in skipped[0]


def test_a_wrong_gather_is_reported(gloo_world, monkeypatch):
    """A gather that leaves an output unfilled is a WRONG row, not ok.

    catches: the outputs never compared with the shard (``same`` always true; tools/mutants.toml
    ``allgather-staging-unchecked``)."""
    monkeypatch.setattr(dist, "all_gather_into_tensor", lambda out, shard, group=None: out.zero_())
    assert gather_staging(4096, torch.device("cpu"))["status"].startswith("WRONG")
