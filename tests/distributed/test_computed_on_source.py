"""One rank computes, the group receives (``collectives.computed_on_source``, the protocol of every
such exchange: the rollouts, the engine's start, the refit probe, rank 0's downloads and publishing):
the function runs on the source alone, its result reaches every rank, and its exception is raised
on every rank instead of leaving the others waiting."""

from __future__ import annotations

import pytest
from launcher import run_distributed
from world_workers import computed_on_source_worker

pytestmark = pytest.mark.distributed


def test_only_the_source_computes_and_every_rank_gets_its_result_or_its_error():
    """catches: the function run on every rank (``is_source=True`` for all: rank 0 runs it and keeps
    its own value); the source's exception not sent (``broadcast(None)``: rank 0 returns None and
    trains on); an exception pickle cannot rebuild sent as it is (rank 0 fails to unpickle it with
    a TypeError instead of raising the source's error)."""
    peer, source = run_distributed(computed_on_source_worker, 2, 1)  # the source is rank 1
    assert peer["ran"] == [] and source["ran"] == ["value", "fails", "unpicklable"]
    assert peer["value"] == source["value"] == {"from": 1, "payload": [1, 1, 1]}
    assert source["fails"] == ("ValueError", "no tokens on rank 1", [])  # its own error, unchanged
    assert peer["fails"] == ("ValueError", "no tokens on rank 1", ["raised by the fails case on global rank 1"])
    assert source["unpicklable"] == ("KeywordOnlyError", "bad detail rank 1", [])
    assert peer["unpicklable"] == (
        "RuntimeError", "KeywordOnlyError raised by the unpicklable case on global rank 1: bad detail rank 1", [])
    assert peer["after"] == source["after"] == [0, 1]  # the group's next collective lines up
