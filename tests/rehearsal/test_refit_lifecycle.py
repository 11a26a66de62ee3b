"""GPU rehearsal of the engine's life cycle on a GPU node (issue 29, items 1, 3, 4, 5, 10).

The CUDA layer is :class:`FakeCuda`; GPU tensors are CPU tensors typed ``cuda:0``
(:func:`cuda_typed`); ``reduce_tensor`` is :class:`FakeReduceTensor`; the engine is the harness of
``tests/rehearsal/harness.py`` (the real engine server around a :class:`RecordingLLM`, its client
talking to it in process).
Each test says which broken build it catches.
"""

from __future__ import annotations

import types

import pytest
import torch

from fastrl.distributed import collectives
from fastrl.rollout import engine_client, engine_factory, refit_checks, refit_transport
from fastrl.rollout.engine_process import EngineError
from fastrl.training import update_phase
from tests.rehearsal.fake_cuda import FakeCuda, FakeReduceTensor
from tests.rehearsal.harness import WEIGHTS, exporter, gpu_engine, gpu_pack, server_module, stub_actor

# ---- item 1: the CUDA IPC refit gets GPU tensors -------------------------------------------------


def test_cuda_ipc_refit_exports_on_the_gpu_and_the_engine_rebuilds_cuda_handles(monkeypatch):
    # Breakage caught: export_hf_weights(policy) with its default cpu=True on a GPU rank: the bucket
    # is a CPU buffer, reduce_tensor gives a 3-argument CPU handle and the engine's args[6] = ...
    # raised IndexError ("EngineError: load_weights_ipc failed") at the first refit.
    cuda = FakeCuda(device_count=1).install(monkeypatch)
    reduce = FakeReduceTensor()
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", reduce)
    gpu_pack(monkeypatch)
    exported: list = []
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter(exported))
    client, server, llm = gpu_engine(monkeypatch)
    update_phase.refit(client, stub_actor())
    assert exported == [False]  # the export stays on the GPU for CUDA IPC
    assert reduce.devices == ["cuda", "cuda", "cuda"]  # one handle per (1-byte) bucket, all CUDA
    assert ("stream_synchronize",) in cuda.calls
    for name, t in WEIGHTS:
        assert torch.equal(llm.loaded[name], t)


def test_the_engine_refuses_a_cpu_handle_by_name(monkeypatch):
    # Breakage caught: an engine that indexes the handle's arguments blindly (IndexError with no
    # hint), or a transport that hands a CPU buffer to reduce_tensor.
    FakeCuda(device_count=1).install(monkeypatch)
    module = server_module(monkeypatch)
    from torch.multiprocessing.reductions import reduce_tensor

    with pytest.raises(ValueError, match="IPC handle of a CUDA tensor.*CPU buffer"):
        module.check_cuda_handle(reduce_tensor(torch.zeros(4, dtype=torch.uint8)))
    transport = refit_transport.CudaIpcTransport(1)
    with pytest.raises(ValueError, match="not a GPU; export the weights on the GPU"):
        transport.send(iter(WEIGHTS), request=lambda r: r, wait=lambda h: None)


# ---- items 4, 5, 10: sleep level 2, wake per phase, a picklable payload ----------------------------


def test_generating_rank_sleeps_level_2_and_refit_wakes_weights_only(monkeypatch):
    # Breakage caught: sleep level 1 (15.4 GiB of weights copied to pinned host memory and back each
    # step, then overwritten by the refit); a refit that wakes the KV cache too. (What crosses to
    # the workers of an engine with TP > 1: the next test.)
    from fastrl.rollout.engine import SamplingParams
    from fastrl.training import generation

    FakeCuda(device_count=1).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch)
    monkeypatch.setattr(server, "op_generate", lambda req: llm.generate() or {"outputs": [], "time_s": 0.0},
                        raising=False)  # RecordingLLM.generate refuses a sleeping engine or discarded weights
    monkeypatch.setattr(client, "generate", lambda *a, **k: client._call({"op": "generate"}), raising=False)
    monkeypatch.setattr(SamplingParams, "for_training", classmethod(lambda cls, ro, seed: None))
    prompts = types.SimpleNamespace(prompt_of=lambda r: r)
    ro = types.SimpleNamespace(seed=0)
    for _ in range(2):  # step 1 (engine as started: awake), step 2 (after a refit)
        generation.generate(client, prompts, [(0, "p")], 1, rollout=ro, seed=1, dp_rank=0)
        generation.sleep_engine(client)  # what the step does after its last generation round
        update_phase.refit(client, stub_actor())
    # step 3 with one DAPO extra round: both rounds generate before the one sleep of the step
    generation.generate(client, prompts, [(0, "p")], 1, rollout=ro, seed=1, dp_rank=0)
    generation.generate(client, prompts, [(0, "p")], 1, rollout=ro, seed=1, dp_rank=0)
    generation.sleep_engine(client)
    names = [n for n, _ in WEIGHTS]
    refit_calls = [("reload_weights", [n]) for n in names]
    assert llm.calls == [
        ("generate",), ("sleep", 2),
        ("wake_up", ("weights",)), *refit_calls,
        ("wake_up", ("kv_cache",)), ("reset_prefix_cache",), ("generate",), ("sleep", 2),
        ("wake_up", ("weights",)), *refit_calls,
        ("wake_up", ("kv_cache",)), ("reset_prefix_cache",), ("generate",), ("generate",), ("sleep", 2),
    ]


def test_a_resumed_stage_sleeps_its_fresh_engine_before_the_resume_refit(monkeypatch):
    # A resumed Slurm stage (or model.megatron_checkpoint): the engine starts awake (weights + KV
    # cache) beside the loaded optimizer state. Breakage caught: refitting into the awake engine
    # and sleeping only after the first generation (the whole engine share held through the resume,
    # 89.7 GiB on the 7B layout's TP-rank GPUs), or sleeping after the refit (level 2 discards the
    # weights just loaded).
    from fastrl.rollout.engine import SamplingParams
    from fastrl.training import generation, loop

    cuda = FakeCuda(device_count=1).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch)
    monkeypatch.setattr(server, "op_generate", lambda req: llm.generate() or {"outputs": [], "time_s": 0.0},
                        raising=False)  # RecordingLLM.generate refuses a sleeping engine or discarded weights
    monkeypatch.setattr(client, "generate", lambda *a, **k: client._call({"op": "generate"}), raising=False)
    monkeypatch.setattr(SamplingParams, "for_training", classmethod(lambda cls, ro, seed: None))
    actor = stub_actor()
    run = types.SimpleNamespace(engine=client, actor=actor,
                                ctx=types.SimpleNamespace(device=torch.device("cuda", 0), is_logging_rank=False))
    io = types.SimpleNamespace(resume=lambda state, actor_: "checkpoints/step_00000002")
    assert loop.resume(run, types.SimpleNamespace(), io) == "checkpoints/step_00000002"
    assert ("empty_cache",) in cuda.calls  # the load's cached blocks are given back first
    generation.generate(client, types.SimpleNamespace(prompt_of=lambda r: r), [(0, "p")], 1,
                        rollout=types.SimpleNamespace(seed=0), seed=1, dp_rank=0)
    assert llm.calls == [
        ("sleep", 2), ("wake_up", ("weights",)), *[("reload_weights", [n]) for n, _ in WEIGHTS],
        ("wake_up", ("kv_cache",)), ("reset_prefix_cache",), ("generate",),
    ]


def test_a_tp_engine_opens_the_ipc_bucket_in_each_worker_and_no_cuda_tensor_is_pickled(monkeypatch):
    # The 32B / 72B recipes' engine (TP8; two workers here). Breakage caught: the engine opening the
    # bucket itself and handing its views to collective_rpc: vLLM's multiproc executor pickles them,
    # and torch pickles a CUDA tensor by copying its whole storage (the bucket) to the host and back
    # onto cuda:0 in every worker (per 32B layer bucket ~10.7 GB pickled, ~86 GB allocated on the
    # trainer's GPU: out of memory at the first refit). Also a payload that cannot be pickled.
    cuda = FakeCuda(device_count=2).install(monkeypatch)
    reduce = FakeReduceTensor()
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", reduce)
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch, engine_tp=2, verify_every=1)  # a verified refit: sums too
    monkeypatch.setattr("fastrl.training.refit_verify.verify_refit", lambda *a, **k: {})
    update_phase.refit(client, stub_actor())
    assert llm.pickled_cuda_tensors == 0
    assert [w.reloaded for w in llm.workers] == [len(WEIGHTS)] * 2  # every worker loaded every tensor
    for name, t in WEIGHTS:
        assert torch.equal(llm.loaded[name], t)
    assert cuda.calls.count(("synchronize",)) == 2 * len(WEIGHTS)  # each worker waits for its copies (1-tensor buckets)
    # one handle per worker and bucket, each opened by its own worker only: torch frees the trainer's
    # bucket when every handle's counter is back to 0, and a handle opened by two workers ends at -1
    # (the bucket never freed: 2 GiB left on an H200 after a 2 GiB refit into two workers)
    assert len(reduce.handles) == 2 * len(WEIGHTS)
    opened = [w.opened for w in llm.workers]
    assert opened[0] == reduce.handles[0::2] and opened[1] == reduce.handles[1::2]
    assert set(server.received) == {n for n, _ in WEIGHTS}
    assert server.received["model.layers.0.mlp.up_proj.weight"] == pytest.approx(float((WEIGHTS[0][1] ** 2).sum()))


@pytest.mark.parametrize("handles", [1, 3])
def test_not_one_handle_per_engine_worker_is_refused_by_name(monkeypatch, handles):
    # Breakage caught: a transport built for another worker count than the engine's: with fewer
    # handles worker 1 indexes past them (IndexError with no hint) or shares one (its bucket never
    # freed); with more, a handle no worker opens keeps its bucket allocated on the trainer's GPU.
    FakeCuda(device_count=2).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch, engine_tp=2)
    client.transport = refit_transport.make_transport("cuda_ipc", 1, consumers=handles)
    with pytest.raises(EngineError, match=rf"got {handles} CUDA IPC handle.*engine of 2 worker.*one per engine worker"):
        update_phase.refit(client, stub_actor())
    assert [w.opened for w in llm.workers] == [[], []]  # refused before any worker opened a handle


def test_the_worker_function_is_self_contained(monkeypatch):
    # vLLM cloudpickles reload_ipc_bucket by value (the engine server is the engine's __main__) into
    # worker processes that can import torch and vllm only. Breakage caught: the function (or a
    # helper it calls) reaching a module global such as the by-path-loaded wire module, which the
    # workers cannot import: the first TP > 1 refit would fail to unpickle.
    import inspect

    module = server_module(monkeypatch)
    seen, todo = set(), [module.reload_ipc_bucket, module.repack_output_layer]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for name, value in inspect.getclosurevars(f).globals.items():
            if callable(value):
                assert getattr(value, "__module__", None) == module.__name__, (f.__name__, name)
                todo.append(value)
            else:
                assert isinstance(value, (int, float, str)), (f.__name__, name, type(value))
    assert {f.__name__ for f in seen} == {"reload_ipc_bucket", "bucket_views", "square_sums", "repack_output_layer"}


def test_a_verified_refit_gives_the_export_back_before_the_kv_cache_wakes(monkeypatch):
    # Breakage caught: the trainer's caching allocator keeping the export's gathered tensors and
    # buckets reserved while the engine wakes its KV cache for the probe (or for the next step's
    # generation): the engine cannot reclaim another process's cache.
    cuda = FakeCuda(device_count=1).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch, verify_every=1)
    monkeypatch.setattr("fastrl.training.refit_verify.verify_refit", lambda *a, **k: {})
    real_empty = cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: llm.calls.append(("empty_cache",)) or real_empty())
    client._call({"op": "sleep"})
    update_phase.refit(client, stub_actor())
    order = [c[0] if c[0] != "wake_up" else c for c in llm.calls]
    assert order.index("empty_cache") > max(i for i, c in enumerate(order) if c == "reload_weights")
    assert order.index("empty_cache") < order.index(("wake_up", ("kv_cache",)))


@pytest.mark.parametrize("side", ["trainer", "engine"])
def test_refit_sums_of_squares_never_copy_a_whole_tensor_to_float64(monkeypatch, side):
    # Breakage caught (item 10 / review): torch.linalg.vector_norm(t, dtype=torch.float64) of a
    # whole tensor, which materialises a float64 copy (4 GiB for the 7B embedding and output layer)
    # on the GPU during the refit, on both sides. Chunked (chunk lowered to 4 elements here).
    from torch.overrides import TorchFunctionMode

    module = server_module(monkeypatch)
    if side == "trainer":
        monkeypatch.setattr(refit_checks, "SQUARE_SUM_CHUNK", 4)
        total = float(refit_checks.square_sum(torch.arange(10.0).reshape(2, 5)))
    else:
        monkeypatch.setattr(module, "SQUARE_SUM_CHUNK", 4)
    widest: list[int] = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            if isinstance(out, torch.Tensor) and out.dtype == torch.float64 and inputs:
                widest.append(max(a.numel() for a in inputs))
            return out

    with Record():
        if side == "trainer":
            total = float(refit_checks.square_sum(torch.arange(10.0).reshape(2, 5)))
        else:
            total = module.square_sums([torch.arange(10.0).reshape(2, 5)])[0]
    assert total == 285.0  # 0^2 + ... + 9^2
    assert widest and max(widest) <= 4


def test_a_wake_after_a_level_2_sleep_without_a_refit_is_refused(monkeypatch):
    # Level 2 discards the weights; vLLM's wake_up reallocates them but fills nothing. Breakage
    # caught: a generation round that sleeps after itself (DAPO's extra round then woke into empty
    # weights), a validation that sleeps before the next step's generation, or a server that wakes
    # everything silently.
    FakeCuda(device_count=1).install(monkeypatch)
    client, server, llm = gpu_engine(monkeypatch)
    client._call({"op": "sleep"})
    with pytest.raises(RuntimeError, match="wake without a refit since the last sleep"):
        client._call({"op": "wake"})
    assert llm.calls == [("sleep", 2)]  # nothing was woken


def test_refit_sums_only_on_verified_refits(monkeypatch):
    # Breakage caught (item 10): a float64 sum of squares of every exported tensor on every refit
    # (on the CPU, on every rank); only the refits that the probe verifies need the per-group sums.
    FakeCuda(device_count=1).install(monkeypatch)
    monkeypatch.setattr("torch.multiprocessing.reductions.reduce_tensor", FakeReduceTensor())
    gpu_pack(monkeypatch)
    monkeypatch.setattr(update_phase, "export_hf_weights", exporter([]))
    client, server, llm = gpu_engine(monkeypatch, verify_every=3)
    client.verify_every = 3
    monkeypatch.setattr("fastrl.training.refit_verify.verify_refit", lambda *a, **k: {})
    norms: list = []  # one entry per tensor whose sum of squares was computed, on either side
    trainer_sum, engine_globals = refit_checks.square_sum, type(server)._reload.__globals__
    engine_sums = engine_globals["square_sums"]
    monkeypatch.setattr(engine_client, "square_sum", lambda t: norms.append(1) or trainer_sum(t))
    monkeypatch.setitem(engine_globals, "square_sums", lambda ts: norms.extend([1] * len(ts)) or engine_sums(ts))
    counts = []
    for _ in range(3):
        before = len(norms)
        update_phase.refit(client, stub_actor())
        counts.append(len(norms) - before)
    n = len(WEIGHTS)
    assert counts == [2 * n, 0, 2 * n]  # trainer + engine on refits 1 and 3 (verified), none on 2
    assert set(client.last_group_sums) == {"model.layers.0", "model.layers.1", "lm_head"}


# ---- item 5: engines only on generating ranks -----------------------------------------------------


class _Recorder:
    def __init__(self, policy_dir, **kwargs):
        self.kwargs = kwargs
        self.tokenizer, self.pad_token_id, self.suppressed_ids = "tok", 7, [1]
        self.verify_every, self.verify_tolerance = kwargs["verify_every"], kwargs["verify_tolerance"]
        self.verify_due = False


@pytest.mark.parametrize(("visible", "count"), [("0,1,2,3,4,5,6,7", 8), (None, 1)])
def test_only_the_model_parallel_source_builds_an_engine_seeing_its_tp_groups_gpus(monkeypatch, visible, count):
    # 32B recipe: trainer TP8 PP2, engine TP8, one node's 8 ranks per stage. Breakage caught: every
    # rank building an engine (local ranks 1-7: physical_gpus raised ValueError, "needs GPUs 1..8");
    # a TP8 engine that sees only its own rank's GPU under --gpus-per-task=1.
    from fastrl.training import parts
    from fastrl.training.engine_placement import EnginelessPeer, build_rank_engine
    from recipes.registry import get_recipe

    cfg = get_recipe("qwen25vl_32b_fastrl_grpo_geo3k_h100_bf16")
    assert cfg.rollout.engine_tensor_parallel_size == 8
    monkeypatch.setattr(engine_factory, "EngineProcessClient", _Recorder)
    group = 16
    physical = [str(r % 8) for r in range(group)]
    box: list = []
    built = {}
    for rank in range(group):  # ranks of one model-parallel group, the source first (as the broadcast orders them)
        FakeCuda(device_count=count, visible=visible if visible else physical[rank]).install(monkeypatch)
        device = torch.device("cuda", rank % 8 if count == 8 else 0)
        monkeypatch.setattr(collectives, "model_parallel_size", lambda: group)
        monkeypatch.setattr(collectives, "is_model_parallel_source", lambda r=rank: r == 0)
        monkeypatch.setattr(collectives, "all_gather_objects_model_parallel",
                            lambda mine: [("node0" if r < 8 else "node1", physical[r]) for r in range(group)])
        monkeypatch.setattr(collectives, "broadcast_object_model_parallel",
                            lambda obj, r=rank: box.append(obj) or obj if r == 0 else box[0])
        built[rank] = build_rank_engine(cfg, device, lambda gpus, d=device: parts._build_engine(cfg, "/m", d, gpus))
    assert isinstance(built[0], _Recorder)
    assert built[0].kwargs["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert all(isinstance(built[r], EnginelessPeer) for r in range(1, group))
    peer = built[5]
    assert (peer.tokenizer, peer.pad_token_id, peer.export_to_cpu) == ("tok", 7, False)
    assert peer.update_weights(iter(WEIGHTS)) == len(WEIGHTS) and peer.weight_version == 1
    peer.sleep(), peer.wake()  # no engine: nothing to do


@pytest.mark.parametrize(("count", "refused"), [(8, False), (1, True)])
def test_a_tp_engine_confined_to_one_gpu_is_refused_at_start_up(monkeypatch, count, refused):
    # Breakage caught: under --gpus-per-task=1 with a device cgroup the engine process, a child of
    # the source rank's task, can open only that task's GPU although CUDA_VISIBLE_DEVICES names the
    # eight of its model-parallel group; vLLM's TP workers then failed deep inside their start-up.
    # The count runs in a child process, as the engine's own CUDA must stay unstarted before vLLM
    # forks its workers: here that child sees the recording fake through the same torch.cuda call.
    module = server_module(monkeypatch)
    FakeCuda(device_count=count, visible="0,1,2,3,4,5,6,7").install(monkeypatch)
    reply = module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 8}}, count=torch.cuda.device_count)
    if not refused:
        assert reply is None
        return
    assert not reply["ok"] and "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 but sees 1" in reply["error"]
    assert "--gpus-per-node=G --ntasks-per-node=G" in reply["error"]
    assert module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 1}}) is None  # one GPU: its own


def test_the_engine_counts_its_gpus_in_a_child_process(monkeypatch):
    # Breakage caught: counting with torch.cuda in the engine process starts the CUDA driver there,
    # and vLLM's forked TP workers then cannot use CUDA. The real count, on this CPU machine: 0 GPUs,
    # from a child (this process's torch.cuda, replaced by the fake, is not asked).
    module = server_module(monkeypatch)
    FakeCuda(device_count=8).install(monkeypatch)
    assert module.visible_gpu_count() == 0  # in this process the fake would say 8
    reply = module.check_gpus({"llm_kwargs": {"tensor_parallel_size": 2}})
    assert "but sees 0" in reply["error"]


# ---- item 3: the trainer gives its cached memory back before the refit ---------------------------


def test_step_empties_the_cuda_cache_after_the_update_before_the_refit(monkeypatch):
    # Breakage caught: no torch.cuda.empty_cache() anywhere: the trainer's caching allocator keeps
    # the update's activation peak reserved and the engine cannot wake into it.
    from fastrl.training import step as step_module

    cuda = FakeCuda(device_count=1).install(monkeypatch)
    order: list = cuda.calls
    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(), ctx=types.SimpleNamespace(device=torch.device("cuda", 0)),
        timer=types.SimpleNamespace(phase=lambda name: _Phase(order, name)),
    )

    class _Stop(Exception):
        pass

    def fake_refit(engine, actor):
        order.append(("refit",))
        raise _Stop

    monkeypatch.setattr(step_module, "refit", fake_refit)
    monkeypatch.setattr(step_module, "update_policy", lambda *a, **k: order.append(("update",)) or {})
    _run_step_tail(step_module, run, monkeypatch, _Stop)
    assert order[-3:] == [("update",), ("empty_cache",), ("refit",)]
    cpu = FakeCuda(device_count=0)
    monkeypatch.setattr(torch.cuda, "empty_cache", cpu.empty_cache)
    update_phase.release_cached_memory(torch.device("cpu"))
    assert cpu.calls == []  # the CPU path calls nothing


class _Phase:
    def __init__(self, order, name):
        self.order, self.name = order, name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _run_step_tail(step_module, run, monkeypatch, stop):
    """``train_step`` with every phase before the update replaced by a stand-in (the update, the
    cache release and the refit are what is recorded)."""
    import dataclasses

    batch = types.SimpleNamespace(lengths=[], select=lambda order: batch)
    scored = types.SimpleNamespace()
    outcome = types.SimpleNamespace(kept_per_group={})
    monkeypatch.setattr(step_module, "group_size", lambda cfg, ars: 2)
    monkeypatch.setattr(step_module, "prompts_this_step", lambda ro, n: 1)
    monkeypatch.setattr(step_module, "generate", lambda *a, **k: None)
    monkeypatch.setattr(step_module, "sleep_engine", lambda engine: None)
    monkeypatch.setattr(step_module, "score", lambda *a, **k: (scored, {}))
    monkeypatch.setattr(step_module, "_check_epochs", lambda *a: {})
    monkeypatch.setattr(step_module, "dynamic_sampling", lambda s, **k: (s, {}))
    monkeypatch.setattr(step_module, "compute_advantages", lambda s, alg, **k: (s, {}))
    monkeypatch.setattr(step_module, "to_policy_batch", lambda *a, **k: batch)
    monkeypatch.setattr(step_module, "sequence_multiple", lambda *a: 1)
    monkeypatch.setattr(step_module, "prune", lambda *a, **k: (outcome, {}))
    monkeypatch.setattr(step_module, "repartition_kept", lambda b, o: (b, {}))
    monkeypatch.setattr(step_module, "add_log_probs", lambda b, *a, **k: run.ctx.__dict__.setdefault("lp", 1) and (b, {}))
    monkeypatch.setattr(step_module, "check_rollout_mismatch", lambda *a, **k: None)
    plan = types.SimpleNamespace(row_order=(), update_rows=(0,))
    monkeypatch.setattr(step_module, "step_geometry", lambda *a: types.SimpleNamespace(dp_size=1, plan_update=lambda *a, **k: plan))
    cfg = types.SimpleNamespace(
        rollout=types.SimpleNamespace(mismatch_tolerance=1.0), parallel=types.SimpleNamespace(micro_batch_size=1),
        trainer=types.SimpleNamespace(epochs=1, micro_batch_tokens=0, old_log_probs="auto", group_by_length=True),
        precision=types.SimpleNamespace(mode="bf16"), on_policy_first_update=True,
        algorithm=types.SimpleNamespace(), pruning=types.SimpleNamespace(seed=0), logprobs_before_pruning=False,
        logging=types.SimpleNamespace(rollouts_every=0),
        mismatch_tolerance=1.0,
    )
    run.cfg = cfg
    run.ctx.dp_size, run.ctx.dp_rank, run.ctx.is_logging_rank = 1, 0, True
    run.prompts = types.SimpleNamespace(next_batch=lambda *a, **k: types.SimpleNamespace(items=[], epochs_completed=0,
                                                                                       __len__=lambda: 0))
    run.engine = types.SimpleNamespace(pad_token_id=0)
    run.actor = types.SimpleNamespace(policy_version=0)
    run.reference = None
    run.scorer = None
    state = types.SimpleNamespace(ars=None, sampler=types.SimpleNamespace(epochs_drawn=0.0), total_steps=3,
                                  scheduler=None, prompt_skipper=None, reward_health=types.SimpleNamespace(end_step=lambda *a, **k: {}))
    monkeypatch.setattr(step_module, "len", lambda x: 0, raising=False)
    del dataclasses
    with pytest.raises(stop):
        step_module.train_step(run, state, 1)


def test_the_engine_reads_model_sums_only_for_weights_no_refit_sent(monkeypatch, tmp_path):
    # Breakage caught (review): the engine reading and summing the whole checkpoint at start-up
    # (145 GB for 72B, inside engine_startup_timeout_s, on every Slurm stage) although the first
    # refit, which is always verified, sends every weight.
    import safetensors
    import safetensors.torch

    module = server_module(monkeypatch)
    safetensors.torch.save_file({"model.layers.0.w": torch.full((2, 2), 2.0), "model.layers.1.w": torch.ones(3)},
                                str(tmp_path / "model.safetensors"))
    read: list[str] = []
    real_open = safetensors.safe_open

    class Counting:
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    server = module.Server.__new__(module.Server)
    server.spec, server.received = {"model": str(tmp_path)}, {}
    assert server.op_group_sums({})["sums"] == {"model.layers.0": 16.0, "model.layers.1": 3.0}  # before any refit
    server.received = {"model.layers.0.w": 4.0}  # a refit sent layer 0 only: layer 1 read from the directory
    read.clear()
    assert server.op_group_sums({})["sums"] == {"model.layers.0": 4.0, "model.layers.1": 3.0} and read == ["model.layers.1.w"]
    server.received = {"model.layers.0.w": 4.0, "model.layers.1.w": 1.0}  # every weight refit: nothing read
    read.clear()
    assert server.op_group_sums({})["sums"] == {"model.layers.0": 4.0, "model.layers.1": 1.0} and read == []
