"""distributed_session: initialize, yield the context, always tear down; MPI_Finalize on a clean exit only."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from fastrl.config import ParallelConfig
from fastrl.distributed import session, world


@pytest.fixture()
def single_process(monkeypatch):
    """The env:// variables of one process, restored afterwards; MPI_Finalize calls recorded."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    finalized = []
    monkeypatch.setattr(session, "finalize_mpi", lambda: finalized.append(True))
    return finalized


def test_session_yields_the_context_and_tears_down(single_process):
    with session.distributed_session(ParallelConfig(backend="gloo"), seed=3) as ctx:
        assert dist.is_initialized() and world.launched_world_size() == 1
        assert (ctx.rank, ctx.world_size, ctx.tp_size, ctx.pp_size, ctx.dp_size) == (0, 1, 1, 1, 1)
        assert world.rank() == 0
    assert not dist.is_initialized()
    assert single_process == [True]


def test_an_error_in_the_block_tears_down_without_mpi_finalize(single_process):
    with pytest.raises(ValueError, match="inside"):
        with session.distributed_session(ParallelConfig(backend="gloo"), seed=3):
            raise ValueError("inside the block")
    assert not dist.is_initialized()
    assert single_process == []  # a failing rank must exit without waiting for the others
