"""GPU rehearsal: which CUDA device each rank selects at start-up, under the two ways Slurm hands
out GPUs (issue 29, item 6). The CUDA layer is :class:`FakeCuda`; the NCCL process group is not
created (the recorder stops the start-up right after the device is chosen)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from fastrl.config import ParallelConfig
from fastrl.distributed import parallel_state
from fastrl.distributed.parallel_state import cuda_device_index
from tests.rehearsal.fake_cuda import FakeCuda


class _Stop(Exception):
    pass


def _start(monkeypatch, cuda: FakeCuda, local_rank: int) -> list:
    """``parallel_state.initialize`` with the NCCL backend up to ``init_process_group`` (recorded)."""
    cuda.install(monkeypatch)
    inits: list = []

    def record_init(backend=None, **kwargs):
        inits.append(backend)
        raise _Stop

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", record_init)
    monkeypatch.setenv("RANK", str(local_rank))
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    with pytest.raises(_Stop):
        parallel_state.initialize(ParallelConfig(backend="nccl"), seed=1)
    return inits


def test_per_task_binding_selects_the_one_visible_gpu(monkeypatch):
    # srun --gpus-per-task=1 (README step 5): local rank 3 sees one GPU, physical GPU 3.
    # Breakage caught: torch.cuda.set_device(LOCAL_RANK), which CUDA refuses with "invalid device ordinal".
    cuda = FakeCuda(device_count=1, visible="3")
    assert _start(monkeypatch, cuda, local_rank=3) == ["nccl"]
    assert cuda.calls == [("set_device", 0)]


def test_node_wide_visibility_selects_the_local_rank(monkeypatch):
    # --gpus-per-node=8 --ntasks-per-node=8: every task sees the 8 GPUs; rank 5 takes GPU 5.
    # Breakage caught: a fix that always picks device 0 (every rank on one GPU).
    cuda = FakeCuda(device_count=8, visible="0,1,2,3,4,5,6,7")
    assert _start(monkeypatch, cuda, local_rank=5) == ["nccl"]
    assert cuda.calls == [("set_device", 5)]


def test_neither_layout_is_refused_with_what_to_do(monkeypatch):
    cuda = FakeCuda(device_count=2, visible="4,5")
    cuda.install(monkeypatch)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(RuntimeError, match=r"local rank 3 sees 2 GPUs \(CUDA_VISIBLE_DEVICES='4,5'\).*--gpus-per-task=1"):
        parallel_state.initialize(ParallelConfig(backend="nccl"), seed=1)
    assert cuda.calls == []


def test_cuda_device_index_cases():
    assert cuda_device_index(0, 1, "7") == 0
    assert cuda_device_index(6, 8, None) == 6
    assert cuda_device_index(6, 1, "6") == 0
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        cuda_device_index(0, 0, "")
