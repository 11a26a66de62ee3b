"""The rehearsal's fakes refuse what the real libraries refuse (tests/rehearsal/fake_cuda.py).

A fake that accepts more than its library lets a broken order pass every rehearsal: these
contracts pin what vLLM's sleep mode and torch's caching allocator do not allow.
"""

from __future__ import annotations

import pytest
import torch

from tests.rehearsal.fake_cuda import FakeCuda, RecordingLLM

WEIGHTS = [("model.layers.0.mlp.up_proj.weight", torch.ones(2, 2))]


def _reload(llm: RecordingLLM) -> None:
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": WEIGHTS})


def test_recording_llm_refuses_a_generate_while_asleep_or_from_discarded_weights():
    """vLLM sleep mode: after ``sleep(level=2)`` the KV cache and the weights are gone; waking the
    weights allocates them unfilled. The fake generates only with both awake and the weights
    reloaded since the level-2 sleep.

    catches: the earlier fake, which had no generate of its own (the lifecycle tests recorded a
    generate in any state), or one that forgets that level 2 discards the weights."""
    llm = RecordingLLM()
    llm.generate()  # vLLM starts with weights and KV cache
    llm.sleep(level=2)
    with pytest.raises(RuntimeError, match="generate while asleep"):
        llm.generate()
    llm.wake_up(tags=["weights"])
    with pytest.raises(RuntimeError, match="KV cache awake: False"):
        llm.generate()
    llm.wake_up(tags=["kv_cache"])
    with pytest.raises(RuntimeError, match="level-2 sleep discarded"):
        llm.generate()
    _reload(llm)
    llm.generate()
    assert llm.calls.count(("generate",)) == 2


def test_recording_llm_refuses_a_reload_into_sleeping_weights():
    """catches: a refit that reloads before waking the weights (vLLM's CuMem pool has no memory
    behind them), accepted by a fake that copies anywhere."""
    llm = RecordingLLM(tensor_parallel_size=2)
    llm.sleep(level=2)
    with pytest.raises(RuntimeError, match="reload_weights into sleeping weights"):
        _reload(llm)
    llm.wake_up(tags=["weights"])
    _reload(llm)
    assert llm.weights_valid and all(w.reloaded == 1 for w in llm.workers)


def test_fake_cuda_keeps_what_empty_cache_cannot_return():
    """torch's caching allocator releases whole segments only: cached blocks that share a segment
    with a live tensor stay reserved after ``empty_cache`` (and the device's free memory says so).

    catches: a fake allocator that frees perfectly whatever was fragmented (reserved == allocated
    after every empty_cache), under which a plan's allocator-cache column could never be wrong."""
    cuda = FakeCuda(device_count=1, total_bytes=80 * 2**30, fragmented_bytes=2**30)
    cuda.allocated, cuda.reserved = 10 * 2**30, 20 * 2**30
    cuda.empty_cache()
    assert cuda.memory_reserved() == 11 * 2**30
    assert cuda.mem_get_info() == (69 * 2**30, 80 * 2**30)
    perfect = FakeCuda(device_count=1)
    perfect.allocated, perfect.reserved = 10 * 2**30, 20 * 2**30
    perfect.empty_cache()
    assert perfect.memory_reserved() == 10 * 2**30  # the default: a perfect release
