"""GPU rehearsal of the branches a GPU run takes outside the engine's life cycle: the start-up memory
check on the device's own memory, the CUDA generator's state, where NCCL collectives put their
tensors, the backend choice, phase timing around asynchronous kernels, and the engine's refusals
when CUDA cannot start or a restart cannot replay its weights.

The CUDA layer is :class:`FakeCuda` (``torch.cuda`` replaced at its lowest level); each test says
which broken build it catches.
"""

from __future__ import annotations

import json
import logging
import types

import pytest
import torch

from fastrl.checkpoint import actor_state
from fastrl.config import ConfigError
from fastrl.distributed import collectives
from fastrl.distributed.parallel_state import ParallelContext
from fastrl.rollout.engine_process import EngineError
from fastrl.training import parts
from recipes import get_recipe
from tests.rehearsal.fake_cuda import FakeCuda, FakeReduceTensor, cuda_typed
from tests.rehearsal.harness import WEIGHTS, gpu_engine, gpu_pack, server_module

R7B = "qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"
GIB = 2**30

#: config.json of Qwen/Qwen2.5-VL-7B-Instruct on the hub (the fields the memory plan's counts need)
HF_7B = {
    "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def _context(cfg, rank: int = 0, gpu: int = 0) -> ParallelContext:
    """Rank ``rank`` of the recipe's layout on ``cuda:<gpu>``."""
    p = cfg.parallel
    world = p.world_size
    return ParallelContext(
        backend="nccl", rank=rank, world_size=world, tp_size=p.tensor_model_parallel_size,
        pp_size=p.pipeline_model_parallel_size, dp_size=p.dp_size(world), tp_rank=0, pp_rank=0, dp_rank=0,
        dp_group=None, device=torch.device("cuda", gpu),
    )


@pytest.fixture()
def policy_dir_7b(tmp_path):
    path = tmp_path / "Qwen2.5-VL-7B-Instruct"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(HF_7B))
    return path


# ---- the start-up memory check -------------------------------------------------------------------


@pytest.mark.parametrize(("device_gib", "planned_gib"), [(79.6, 79.6), (140.4, 79.6)])
def test_start_up_plans_on_the_smaller_of_the_device_and_the_recipe(monkeypatch, caplog, policy_dir_7b,
                                                                    device_gib, planned_gib):
    # Breakage caught: the check ignoring the device's memory (an H200 would plan on 140 GiB for a
    # recipe sized for 80 GiB, or a 40 GiB device pass: next test), asking about another device than
    # the rank's own (here cuda:5, every other GPU 10 GiB), or no plan logged before the models.
    sizes = [10 * GIB] * 8
    sizes[5] = int(device_gib * GIB)
    cuda = FakeCuda(device_count=8, total_bytes=sizes).install(monkeypatch)
    torch.cuda.set_device(5)
    cfg = get_recipe(R7B)
    with caplog.at_level(logging.INFO, logger="fastrl.memory"):
        parts._check_memory(cfg, _context(cfg, gpu=5), policy_dir_7b)
    assert cuda.calls == [("set_device", 5), ("get_device_properties", 5)]
    logged = [r.getMessage() for r in caplog.records if r.name == "fastrl.memory"]
    assert len(logged) == 1
    assert logged[0].startswith(f"memory plan ({policy_dir_7b}, TP2 PP1 DP4, {planned_gib:.1f} GiB per GPU): ")
    assert ": fits\n" in logged[0] and "resumed stage      generating" in logged[0]


def test_start_up_refuses_a_device_too_small_and_only_rank_0_logs(monkeypatch, caplog, policy_dir_7b):
    # Breakage caught: a 40 GiB device accepted because the plan used the recipe's 79.6 GiB instead
    # of the smaller device (the run would die of out-of-memory in its first generation); every
    # rank logging the plan (eight copies of a 25-line table per node).
    FakeCuda(device_count=8, total_bytes=40 * GIB).install(monkeypatch)
    cfg = get_recipe(R7B)
    with pytest.raises(ConfigError, match=r"40\.0 GiB per GPU.*DOES NOT FIT"):
        parts._check_memory(cfg, _context(cfg), policy_dir_7b)
    FakeCuda(device_count=8, total_bytes=int(79.6 * GIB)).install(monkeypatch)
    with caplog.at_level(logging.INFO, logger="fastrl.memory"):
        for rank in (3, 0):
            parts._check_memory(cfg, _context(cfg, rank=rank), policy_dir_7b)
    logged = [r.getMessage() for r in caplog.records if r.name == "fastrl.memory"]
    assert len(logged) == 1 and "79.6 GiB per GPU" in logged[0]  # rank 0's, not rank 3's


def test_start_up_without_counts_says_so(monkeypatch, caplog, tmp_path):
    # Breakage caught: a model directory whose config.json lacks the counts crashing the start-up
    # (the plan is a check, not a requirement) or passing without a word.
    FakeCuda(device_count=8).install(monkeypatch)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    cfg = get_recipe(R7B)
    with caplog.at_level(logging.INFO, logger="fastrl.memory"):
        parts._check_memory(cfg, _context(cfg), tmp_path)
    assert [r.getMessage() for r in caplog.records if r.name == "fastrl.memory"] == [f"memory plan: no counts in {tmp_path}"]


# ---- the CUDA generator in checkpoints ----------------------------------------------------------


def test_the_cuda_generator_state_is_saved_and_restored(monkeypatch, tmp_path):
    # Breakage caught: a GPU run's checkpoint without the CUDA generator's state (dropout and any
    # sampling on the GPU then differ after a resume), or a resume that does not put it back.
    cuda = FakeCuda(device_count=1).install(monkeypatch)
    cuda.rng_state = torch.arange(16, dtype=torch.uint8)
    path = tmp_path / "rng.pt"
    torch.save(actor_state.rng_state(), path)
    cuda.rng_state = torch.zeros(16, dtype=torch.uint8)  # the generator moves on
    actor_state.set_rng_state(torch.load(path, weights_only=False))
    assert torch.equal(cuda.rng_state, torch.arange(16, dtype=torch.uint8))
    assert cuda.calls == [("get_rng_state",), ("set_rng_state",)]


def test_a_cpu_checkpoint_resumes_on_a_gpu_without_touching_its_generator(monkeypatch):
    # Breakage caught: restoring a CUDA state that a CPU run never saved (KeyError at resume).
    cuda = FakeCuda(device_count=1).install(monkeypatch)
    state = actor_state.rng_state()
    del state["cuda"]
    actor_state.set_rng_state(state)
    assert cuda.calls == [("get_rng_state",)]


# ---- NCCL collectives take their tensors on the current GPU --------------------------------------


def test_nccl_collectives_move_tensors_to_the_current_gpu(monkeypatch):
    # Breakage caught: a CPU tensor handed to an NCCL collective ("No backend type associated with
    # device type cpu"), or the tensor sent to cuda:0 when this rank's GPU is another.
    FakeCuda(device_count=8).install(monkeypatch)
    torch.cuda.set_device(5)
    group = object()
    monkeypatch.setattr(collectives.dist, "get_backend", lambda g: "nccl" if g is group else "gloo")
    assert collectives.comm_device(group, torch.device("cpu")) == torch.device("cuda", 5)
    assert collectives.comm_device(object(), torch.device("cpu")) == torch.device("cpu")  # gloo: where it is
    assert collectives.comm_device(None, torch.device("cpu")) == torch.device("cpu")


def test_auto_backend_is_nccl_where_cuda_is_available(monkeypatch):
    # Breakage caught: parallel.backend=auto starting gloo on a GPU node (every collective through
    # host memory) or NCCL without one.
    from fastrl.distributed.parallel_state import resolve_backend

    FakeCuda(device_count=8).install(monkeypatch)
    assert resolve_backend("auto") == "nccl"
    FakeCuda(device_count=0).install(monkeypatch)
    assert resolve_backend("auto") == "gloo"


# ---- phase times on a GPU -------------------------------------------------------------------------


def test_phase_times_wait_for_the_gpu_before_each_reading_of_the_clock(monkeypatch):
    # Breakage caught: a GPU rank's timer that never synchronizes (kernels still queued at the end
    # of "update" would be charged to whatever phase synchronizes next), one that reads the clock
    # before waiting, a sync at one end only, or a CPU rank calling into CUDA.
    from fastrl.training import timers

    cuda = FakeCuda(device_count=1).install(monkeypatch)
    clock = iter(range(100))
    monkeypatch.setattr(timers, "time", types.SimpleNamespace(
        perf_counter=lambda: cuda.calls.append(("clock",)) or float(next(clock))))
    timer = timers.PhaseTimer.for_device(torch.device("cuda", 0))
    with timer.phase("update"):
        cuda.calls.append(("kernel",))
    assert cuda.calls == [("synchronize",), ("clock",), ("kernel",), ("synchronize",), ("clock",)]
    assert timer.pop() == {"update": 1.0, "step": 1.0}
    cuda.calls.clear()
    cpu_timer = timers.PhaseTimer.for_device(torch.device("cpu"))
    with cpu_timer.phase("update"):
        pass
    assert cuda.calls == [("clock",), ("clock",)]


# ---- the engine's refusals -----------------------------------------------------------------------


def test_a_cuda_ipc_engine_restarts_before_its_first_refit_and_is_refused_after_it(monkeypatch):
    # Breakage caught: a restarted engine serving the model directory's weights after refits, when
    # the CUDA IPC transport (which keeps no copy of the weights) has nothing to replay; or every
    # restart refused on CUDA IPC, also before any refit, when the model directory is the truth.
    FakeCuda(device_count=1).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    client, _server, llm = gpu_engine(monkeypatch)
    life: list = []
    client._kill, client._start = (lambda: life.append("kill")), (lambda: life.append("start"))
    client.restart()
    assert life == ["kill", "start"]  # nothing to replay: the model directory's weights
    client.update_weights((name, cuda_typed(t.clone())) for name, t in WEIGHTS)
    assert client.weight_version == 1 and set(llm.loaded) == {name for name, _ in WEIGHTS}
    with pytest.raises(EngineError, match="cannot restart: the CUDA IPC refit keeps no copy of the current weights"):
        client.restart()
    assert life == ["kill", "start"]  # the running engine is left as it was


#: torch's warning when the CUDA driver cannot start (c10/cuda/CUDAFunctions.cpp); its count is then 0
DRIVER_WARNING = ("CUDA initialization: CUDA driver initialization failed, you might not have a CUDA gpu. "
                  "(Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")


def _child_torch(monkeypatch, tmp_path, *, count: int, warning: str | None) -> None:
    """The engine's GPU count runs ``GPU_COUNT_CODE`` in a child interpreter: there ``import torch``
    finds this stand-in first (``PYTHONPATH``), whose ``torch.cuda.device_count()`` behaves as
    torch's does on such a node: ``count``, after ``warning`` when given."""
    (tmp_path / "torch.py").write_text(
        "import types, warnings\n"
        "def _count():\n"
        f"    if {warning!r} is not None:\n"
        f"        warnings.warn({warning!r}, UserWarning)\n"
        f"    return {count}\n"
        "cuda = types.SimpleNamespace(device_count=_count)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_an_engine_whose_cuda_cannot_start_is_refused_with_the_cause(monkeypatch, tmp_path):
    # Breakage caught: a driver that cannot start counted as 0 GPUs without a word (torch's count
    # does not raise; it warns): the refusal then said "sees 0" and blamed the launcher's GPU binding
    # instead of naming the driver.
    module = server_module(monkeypatch)
    _child_torch(monkeypatch, tmp_path, count=0, warning=DRIVER_WARNING)
    with pytest.raises(RuntimeError, match="failed: CUDA initialization: CUDA driver initialization failed"):
        module.visible_gpu_count()
    reply = module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 2}})
    assert not reply["ok"] and reply["kind"] == "environment"
    assert "cannot start CUDA (RuntimeError: counting the GPUs in a child process (" in reply["error"]
    assert "failed: CUDA initialization: CUDA driver initialization failed" in reply["error"]


def test_an_engine_counts_what_the_child_sees(monkeypatch, tmp_path):
    # Breakage caught: the count taken from anything but the child's torch.cuda.device_count() (a
    # node whose binding shows the engine 1 of its 8 GPUs must be refused; one showing 8 must pass).
    module = server_module(monkeypatch)
    _child_torch(monkeypatch, tmp_path, count=1, warning=None)
    assert module.visible_gpu_count() == 1
    assert "but sees 1" in module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 8}})["error"]
    _child_torch(monkeypatch, tmp_path, count=8, warning=None)
    assert module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 8}}) is None


def test_fake_cuda_records_only_what_the_branch_called(monkeypatch):
    # The fake itself: queries record nothing, calls that act on a device (or ask about one by
    # index) record it, and an index outside the visible devices fails as CUDA does.
    cuda = FakeCuda(device_count=2, total_bytes=8 * GIB).install(monkeypatch)
    assert torch.cuda.is_available() and torch.cuda.device_count() == 2 and cuda.calls == []
    assert torch.cuda.get_device_properties(torch.device("cuda", 1)).total_memory == 8 * GIB
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(2)
    assert cuda.calls == [("get_device_properties", 1), ("set_device", 2)]
    assert isinstance(torch.cuda.get_device_properties(0), types.SimpleNamespace)
