"""Run in the engine environment (``.venv-vllm``) by ``test_sampling_requests.py``: the sampling
requests the real engine server builds, through vLLM 0.32's own request handling of both model
runners, on CPU.

Usage: ``<engine python> tests/vllm/request_checks.py SPEC_JSON OUT_JSON``

``SPEC_JSON`` is the spec the trainer's ``EngineProcessClient`` hands its engine. The server
(``fastrl/rollout/engine_server.py``, loaded by path as the engine process loads it) is built by its
own ``__init__`` around a stand-in for ``vllm.LLM`` whose ``generate`` keeps the
``SamplingParams`` objects ``Server.op_generate`` makes (three requests: sampling at T=1, at T=0.5,
greedy). Each of them then goes through:

* the V1 runner (vLLM's choice without a Triton GPU driver: the CPU machines):
  ``SamplingParams.verify`` (the front end's check), ``InputBatch.add_request`` and
  ``Sampler.apply_logits_processors`` of ``vllm/v1`` over a row of logits;
* the V2 runner (``vllm/v1/worker/gpu``, vLLM's choice on every CUDA machine): ``Sampler.add_request``
  (every per-request check: ``LogitBiasState``, ``PenaltiesState``, ``BadWordsState``, the sampling and
  log-prob states), ``apply_staged_writes`` and each logits processor's ``apply`` over a row of
  logits. Its Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``), on CPU tensors;
  buffers that vLLM pins for a GPU (UVA) take vLLM's own non-pinned fallback.

``OUT_JSON``: per request, the token ids each runner masked to -inf (or the error it raised), and
the limits vLLM declares.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import importlib.util  # noqa: E402
import json  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import vllm.triton_utils  # noqa: E402

# vLLM disables Triton without a GPU driver (placeholders whose kernels cannot be launched); its V2
# sampler modules take `triton` / `tl` from here at import, so the interpreter's go in first.
vllm.triton_utils.triton, vllm.triton_utils.tl = triton, tl
import vllm.v1.worker.gpu.buffer_utils as buffer_utils  # noqa: E402

buffer_utils.is_uva_available = lambda: False  # vLLM's NonUvaBuffer: its fallback without pinned memory

import vllm  # noqa: E402
from vllm.v1.sample.logits_processor import build_logitsprocs  # noqa: E402
from vllm.v1.sample.sampler import Sampler as V1Sampler  # noqa: E402
from vllm.v1.worker.gpu.sample import logit_bias as v2_logit_bias  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext  # noqa: E402
from vllm.v1.worker.gpu.sample.sampler import Sampler as V2Sampler  # noqa: E402
from vllm.v1.worker.gpu.states import RequestState  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

SERVER = Path(__file__).resolve().parents[2] / "fastrl" / "rollout" / "engine_server.py"
SAMPLINGS = {
    "sample_t1": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 8, "stop_token_ids": None},
    "sample_t0.5": {"temperature": 0.5, "top_p": 1.0, "top_k": 0, "max_tokens": 8, "stop_token_ids": None},
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 8, "stop_token_ids": None},
}


class KeepingLLM:
    """``vllm.LLM`` as far as ``Server.__init__`` and ``op_generate`` use it: keeps the requests."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.params: list = []

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [method(None, *args, **(kwargs or {}))]  # one worker, as the uniprocess executor

    def generate(self, requests, sampling_params=None, use_tqdm=False):
        self.params.extend(sampling_params)
        return []


def server_params(spec: dict) -> dict[str, list]:
    vllm.LLM = KeepingLLM  # Server.__init__ imports it from vllm when it runs
    module_spec = importlib.util.spec_from_file_location("fastrl_engine_server_checks", SERVER)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    server = module.Server(spec)
    out = {}
    for label, sampling in SAMPLINGS.items():
        server.llm.params.clear()
        sizes = [1, 1] if sampling["temperature"] == 0 else [2, 1]  # vLLM: greedy requests have n = 1
        server.op_generate({"weight_version": 0, "sampling": sampling, "sizes": sizes, "seeds": [11, 12],
                            "prompts": ["a", "b"]})
        out[label] = list(server.llm.params)
    return out


def masked(row: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.isneginf(row).nonzero().flatten()]


def v1_masks(params: list, vocab: int) -> list[list[int]]:
    model_config = types.SimpleNamespace(get_vocab_size=lambda: vocab, max_logprobs=20, is_diffusion=False)
    n = len(params)
    config = types.SimpleNamespace(speculative_config=None, scheduler_config=types.SimpleNamespace(max_num_seqs=n))
    batch = InputBatch(max_num_reqs=n, max_model_len=64, max_num_batched_tokens=64, device=torch.device("cpu"),
                       vocab_size=vocab, block_sizes=[16], max_num_blocks_per_req=[4],
                       logitsprocs=build_logitsprocs(config, torch.device("cpu"), False, False))
    for i, p in enumerate(params):
        p.verify(model_config, None, None, None)
        batch.add_request(CachedRequestState(
            req_id=str(i), prompt_token_ids=[1, 2, 3], mm_features=[], sampling_params=p, generator=None,
            block_ids=([0],), num_computed_tokens=0, output_token_ids=[]))
    batch.refresh_metadata()
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
    out = V1Sampler().apply_logits_processors(logits, batch.sampling_metadata, False)
    return [masked(row) for row in out]


def v2_masks(params: list, vocab: int, logprobs_mode: str) -> list[list[int]]:
    n, cpu = len(params), torch.device("cpu")
    states = RequestState(max_num_reqs=n, max_model_len=64, max_num_batched_tokens=64, num_speculative_steps=0,
                          vocab_size=vocab, device=cpu)
    sampler = V2Sampler(types.SimpleNamespace(reasoning_config=None), n, vocab, cpu, states,
                        logprobs_mode=logprobs_mode)
    for i, p in enumerate(params):
        sampler.add_request(i, p)  # raises what the V2 runner refuses
    sampler.apply_staged_writes()
    rows = torch.arange(n, dtype=torch.int32)
    ctx = LogitsContext(expanded_idx_mapping=rows, idx_mapping=rows, idx_mapping_np=np.arange(n),
                        expanded_local_pos=torch.zeros(n, dtype=torch.int32), input_ids=torch.zeros(n, dtype=torch.int32),
                        pos=torch.zeros(n, dtype=torch.int64), seq_lens_upper_bound_np=np.ones(n, dtype=np.int64))
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
    for processor in sampler.logits_processors:
        logits = processor.apply(logits, ctx)
    return [masked(row) for row in logits]


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    vocab = int(spec["vocab_size"])
    result: dict = {"limits": {"MAX_NUM_ALLOWED_TOKEN_IDS": v2_logit_bias.MAX_NUM_ALLOWED_TOKEN_IDS,
                               "MAX_NUM_LOGIT_BIAS_TOKENS": v2_logit_bias.MAX_NUM_LOGIT_BIAS_TOKENS},
                    "requests": {}}
    import logging

    reload_log = "vllm.model_executor.model_loader.reload.layerwise"
    importlib.import_module(reload_log)  # the module whose logger the server quiets exists in this vLLM
    requests = server_params(spec)
    result["reload_log_level"] = logging.getLogger(reload_log).level
    for label, params in requests.items():
        entry: dict = {}
        for runner, run in (("v1", lambda p: v1_masks(p, vocab)),
                            ("v2", lambda p: v2_masks(p, vocab, spec["logprobs_mode"]))):
            try:
                entry[runner] = run(params)
            except Exception as err:  # noqa: BLE001 - reported to the test, which names it
                entry[runner] = f"{type(err).__name__}: {err}"
        result["requests"][label] = entry
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
