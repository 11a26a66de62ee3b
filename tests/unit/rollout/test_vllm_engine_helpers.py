"""Parts of the vLLM engine (the engine process) that need no vLLM: import isolation, refit bucketing,
the choice of the refit transport, and the engine server's sleep / refit logic on a recording
stand-in for ``vllm.LLM``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastrl.rollout import engine_client, engine_factory, engine_process
from fastrl.rollout.engine_wire import weight_group
from fastrl.rollout.refit_transport import (
    CudaIpcTransport,
    SharedMemoryTransport,
    group_buckets,
    make_transport,
    transport_for_device,
)
from tests.rehearsal.fake_cuda import RecordingLLM

SERVER = engine_process.SERVER


def test_importing_fastrl_and_the_vllm_engine_modules_does_not_import_vllm():
    code = (
        "import sys, fastrl, fastrl.rollout, fastrl.rollout.hf_engine, fastrl.rollout.engine_factory, "
        "fastrl.rollout.refit_checks, fastrl.rollout.refit_transport; print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_weight_groups_are_transformer_blocks_or_modules():
    assert weight_group("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert weight_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert weight_group("visual.blocks.0.attn.qkv.bias") == "visual.blocks.0"
    assert weight_group("lm_head.weight") == "lm_head"
    assert weight_group("visual.merger.mlp.0.weight") == "visual.merger.mlp.0"


def test_buckets_never_split_a_layer_and_respect_the_size_bound():
    names = [f"model.layers.{i}.{p}.weight" for i in range(3) for p in ("self_attn.q_proj", "self_attn.k_proj", "mlp.up_proj")]
    items = [("model.embed_tokens.weight", torch.zeros(100))] + [(n, torch.zeros(100)) for n in names]
    items.append(("lm_head.weight", torch.zeros(100)))
    # 400 bytes per tensor; a bucket closes at the first group boundary once it holds >= 1,000 bytes
    buckets = list(group_buckets(items, 1000))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in items]
    seen: list[str] = []
    for bucket in buckets:
        here = {weight_group(n) for n, _ in bucket}
        assert not here & set(seen)
        seen.extend(here)
    assert [len(b) for b in buckets] == [4, 3, 3, 1]  # embed + layer 0 | layer 1 | layer 2 | lm_head
    assert len(list(group_buckets(items, 10**9))) == 1


def test_the_transport_is_chosen_by_the_device():
    assert transport_for_device("cpu") == transport_for_device(None) == "shm"
    assert transport_for_device("cuda:1") == transport_for_device(torch.device("cuda", 0)) == "cuda_ipc"
    shm = make_transport("shm", 64)
    try:
        assert isinstance(shm, SharedMemoryTransport) and shm.replayable
    finally:
        shm.close()
    ipc = make_transport("cuda_ipc", 64)
    assert isinstance(ipc, CudaIpcTransport) and not ipc.replayable and ipc.replay_requests() == []
    with pytest.raises(ValueError, match="'nccl'"):
        make_transport("nccl", 64)


def test_engine_client_from_config_picks_the_transport_and_gpus_by_device(monkeypatch):
    """The one place a transport is chosen: the rank's device (CPU: shared memory; a GPU: CUDA IPC,
    the engine seeing only that GPU)."""
    import dataclasses

    from recipes import get_recipe

    seen = []

    def record(policy_dir, **kwargs):
        seen.append(kwargs)

    monkeypatch.setattr(engine_factory, "EngineProcessClient", record)
    cfg = get_recipe("qwen2_tiny_text_fastrl_grpo_vllm_cpu")
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine_tensor_parallel_size=2))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    engine_factory.engine_client_from_config(cfg, "/models/x", "cpu")
    engine_factory.engine_client_from_config(cfg, "/models/x", torch.device("cuda", 1))
    cpu, gpu = seen
    assert cpu["transport"] == "shm" and "CUDA_VISIBLE_DEVICES" not in cpu["env"]
    assert cpu["llm_kwargs"]["enforce_eager"] and "enable_sleep_mode" not in cpu["llm_kwargs"]
    assert gpu["transport"] == "cuda_ipc" and gpu["env"]["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert gpu["llm_kwargs"]["enable_sleep_mode"] == cfg.rollout.sleep_between_steps


def test_engine_sees_only_its_ranks_gpus():
    assert engine_process.physical_gpus(3, 1, None) == ["3"]
    assert engine_process.physical_gpus(1, 2, "4,5,6,7") == ["5", "6"]
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        engine_process.physical_gpus(3, 2, "0,1,2,3")


# ---- the engine server's logic, without vLLM ------------------------------------------------------


@pytest.fixture()
def server_module(monkeypatch):
    """``engine_server.py`` loaded by path, as the engine environment runs it (its import-time
    environment settings are undone after the test)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    spec = importlib.util.spec_from_file_location("fastrl_engine_server_under_test", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _server(module, llm, *, sleep_enabled=True):
    server = module.Server.__new__(module.Server)  # no vLLM: only the sleep/refit logic
    server.llm, server.sleep_enabled = llm, sleep_enabled
    server.asleep, server.weights_awake = False, True
    server.engine_workers = 1
    server._maps, server.received, server.weight_version = {}, {}, 0
    server.spec = {"model": str(Path(__file__).parent)}  # a model directory without weight files
    return server


WEIGHTS = [("model.layers.0.mlp.up_proj.weight", torch.arange(6.0).reshape(2, 3)),
           ("lm_head.weight", torch.ones(4, dtype=torch.bfloat16))]


def _via_shared_memory(server) -> int:
    """The client's transport writes the buckets, the server loads them."""
    transport = SharedMemoryTransport(2**20)
    try:
        return transport.send(iter(WEIGHTS), request=lambda req: getattr(server, f"op_{req['op']}")(req), wait=lambda h: None)[0]
    finally:
        transport.close()


def test_refit_while_asleep_wakes_weights_first_and_kv_cache_later(server_module):
    llm = RecordingLLM()
    server = _server(server_module, llm)
    server.op_sleep({})
    server.op_sleep({})  # idempotent
    assert _via_shared_memory(server) == 2
    server.op_wake({})
    server.op_wake({})  # idempotent
    assert llm.calls == [
        ("sleep", 2),  # weights and KV cache discarded: the refit reloads the weights
        ("wake_up", ("weights",)),
        ("reload_weights", ["model.layers.0.mlp.up_proj.weight", "lm_head.weight"]),
        ("wake_up", ("kv_cache",)),
        ("reset_prefix_cache",),
    ]
    assert llm.encoder_cache_resets == 1  # after the reload: no image embedding of the old weights survives
    for name, tensor in WEIGHTS:
        assert torch.equal(llm.loaded[name], tensor)
        assert server.received[name] == pytest.approx(float(tensor.double().square().sum()))
    assert server.op_group_sums({})["sums"] == {"model.layers.0": 55.0, "lm_head": 4.0}


def test_refit_awake_resets_the_prefix_cache_and_sleep_mode_off_is_a_no_op(server_module):
    llm = RecordingLLM()
    server = _server(server_module, llm, sleep_enabled=False)
    server.op_sleep({})
    _via_shared_memory(server)
    server.op_wake({})
    assert llm.calls == [("reload_weights", [n for n, _ in WEIGHTS]), ("reset_prefix_cache",)]


def test_cuda_ipc_transport_packs_buckets_the_server_reloads(server_module, monkeypatch):
    """The CUDA IPC transport's bucketing, frozen tensors and request, on CPU tensors: the IPC handle
    itself (``reduce_tensor`` of a CUDA buffer, rebuilt in the engine) needs a GPU and is replaced
    by the buffer here; the server reloads from views of it as it does from the rebuilt buffer."""
    import torch.multiprocessing.reductions as reductions

    from fastrl.rollout import refit_transport
    from tests.rehearsal.fake_cuda import FakeCuda, cuda_typed

    monkeypatch.setattr(reductions, "reduce_tensor", lambda buffer: buffer.clone())
    FakeCuda(device_count=1).install(monkeypatch)
    real_pack = refit_transport.pack_flat
    monkeypatch.setattr(refit_transport, "pack_flat", lambda bucket: (cuda_typed(real_pack(bucket)[0]), real_pack(bucket)[1]))
    llm = RecordingLLM()
    server = _server(server_module, llm)
    transport = CudaIpcTransport(1, skip_after_first=lambda n: n.startswith("model.layers.0."))
    requests = []

    def request(req):
        requests.append(req["op"])
        (handle,) = req["handles"]  # one engine worker: one handle
        return server._reload([(handle, req["entries"])])

    assert transport.send(iter(WEIGHTS), request, wait=lambda h: None) == (2, 24 + 8)
    assert requests == ["load_weights_ipc", "load_weights_ipc"]  # one per bucket (1-byte buckets)
    for name, tensor in WEIGHTS:
        assert torch.equal(llm.loaded[name], tensor)
    llm.loaded.clear()
    assert transport.send(iter(WEIGHTS), request, wait=lambda h: None) == (1, 8)  # frozen: sent once
    assert list(llm.loaded) == ["lm_head.weight"]


def test_a_vision_language_model_without_torchvision_is_refused_by_name(server_module, monkeypatch, tmp_path):
    # An engine environment without torchvision (a cluster's vLLM environment built without it):
    # one start-up line naming the architecture and what to install, not vLLM's import traceback.
    import importlib.util as iu
    import json
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2_5_VLForConditionalGeneration"]}))
    reply = server_module.check_environment({"model": str(tmp_path)})
    assert reply["kind"] == "architecture"
    assert "cannot load Qwen2_5_VLForConditionalGeneration" in reply["error"] and "install torchvision" in reply["error"]
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert server_module.check_environment({"model": str(tmp_path)}) is None


def test_cpu_engines_prefill_each_prompt_in_one_step(server_module):
    # Breakage caught: a budget below max_model_len (vLLM refuses it without chunked prefill), a
    # budget that ignores the tensor-parallel workers, or chunked prefill left on (the seeded
    # request's split prefill raised "CPU Generator does not use offset": tests/vllm).
    whole = server_module.whole_prefills
    assert whole({"max_model_len": 264}) == {"max_model_len": 264, "enable_chunked_prefill": False,
                                             "max_num_batched_tokens": 4096}
    assert whole({"max_model_len": 264, "tensor_parallel_size": 2})["max_num_batched_tokens"] == 8192
    assert whole({"max_model_len": 8200})["max_num_batched_tokens"] == 8200
    assert whole({"max_model_len": 256, "max_num_batched_tokens": 512})["max_num_batched_tokens"] == 512
    with pytest.raises(ValueError, match="enable_chunked_prefill=True"):
        whole({"max_model_len": 256, "enable_chunked_prefill": True})


@pytest.fixture(scope="module")
def eos_is_pad_dir(tmp_path_factory):
    """A tiny text model whose only stop token is its pad token (SmolLM2's shape: <|im_end|> is both)."""
    import json

    from fastrl.config import ModelConfig
    from fastrl.models.tiny import build_tiny_text_model_dir

    d = build_tiny_text_model_dir(tmp_path_factory.mktemp("eos_is_pad") / "m", ModelConfig())
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(d / "tokenizer" if (d / "tokenizer").is_dir() else d).pad_token_id
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": pad}))
    return d, pad


@pytest.mark.parametrize("temperature,mode", [(1.0, "raw_logprobs"), (0.0, "raw_logprobs"), (0.5, "processed_logprobs")])
def test_engine_client_sends_samplable_stop_tokens_and_the_log_prob_mode(eos_is_pad_dir, monkeypatch, temperature, mode):
    # What the client hands the engine process, without starting it. Breakage caught: the client not
    # passing its stop tokens to suppressed_token_ids (the pad rule then suppresses the only stop token,
    # as it did for SmolLM2), or the temperature -> logprobs_mode choice inverted.
    d, pad = eos_is_pad_dir

    def fake_start(self):
        self.info = {"default_stop_token_ids": self._spec["stop_token_ids"]}

    monkeypatch.setattr(engine_client.EngineProcessClient, "_start", fake_start)
    c = engine_client.EngineProcessClient(d, python=sys.executable, sampling_temperature=temperature)
    try:
        assert c._spec["stop_token_ids"] == [pad] and pad not in c.suppressed_ids
        assert pad not in c._spec["suppressed_token_ids"]
        assert c._spec["logprobs_mode"] == mode
    finally:
        c._closed = True
        c.transport.close()


def test_hf_engine_keeps_the_only_stop_token_samplable(eos_is_pad_dir):
    from fastrl.config import RolloutConfig
    from fastrl.rollout.hf_engine import HFRolloutEngine

    d, pad = eos_is_pad_dir
    engine = HFRolloutEngine.from_pretrained(d, RolloutConfig(seed=0))
    assert engine.default_stop_token_ids == (pad,) and pad not in engine.suppressed_ids


def test_engine_client_refuses_more_suppressed_ids_than_a_vllm_request_carries(eos_is_pad_dir, monkeypatch, tmp_path):
    """A model whose config vocab_size exceeds its tokenizer by more than vLLM's V2 runner accepts
    in one request's ``logit_bias`` is refused before the engine starts, naming the count.

    catches: ``check_suppression_size`` not called (the engine would start and its GPU runner
    refuse the first generate; the CPU runner, V1, has no limit, so no CPU run shows it)."""
    import json
    import shutil

    d = tmp_path / "wide"
    shutil.copytree(eos_is_pad_dir[0], d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1100}))
    started = []
    monkeypatch.setattr(engine_client.EngineProcessClient, "_start", lambda self: started.append(1))
    with pytest.raises(engine_process.EngineStartError, match=r"token ids to suppress .* > 1024, the most logit_bias"):
        engine_client.EngineProcessClient(d, python=sys.executable)
    assert not started


def test_engine_server_suppresses_by_a_minus_infinity_logit_bias(server_module):
    """The server's suppression is a -inf ``logit_bias`` per suppressed id (None when there is none).

    catches: a finite bias (vLLM's OpenAI path clamps to -100: the token keeps a little mass and
    processed log-probs change), or an empty dict instead of None."""
    import math

    bias = server_module.suppression_bias([3, 7])
    assert bias == {3: -math.inf, 7: -math.inf}
    assert server_module.suppression_bias([]) is None


def test_engine_keeps_the_layerwise_reload_log_to_errors(server_module):
    """vLLM's layerwise reload warns once per module a bucket does not carry (per bucket, per
    refit): the server sets that logger to ERROR in its process and, through ``collective_rpc``,
    in every worker.

    catches: the engine log growing by a line per module per bucket (about 0.7 GB over 200 7B steps)."""
    import logging

    from tests.rehearsal.fake_cuda import RecordingLLM

    name = server_module.RELOAD_LOGGER
    assert name == "vllm.model_executor.model_loader.reload.layerwise"
    logging.getLogger(name).setLevel(logging.NOTSET)
    llm = RecordingLLM(tensor_parallel_size=2)
    assert llm.collective_rpc(server_module.quiet_reload_log) == [name, name]
    assert logging.getLogger(name).level == logging.ERROR
