"""A stand-in for vLLM in the engine process of the unit tests (``PYTHONPATH`` of the engine only):
what ``fastrl/rollout/engine_server.py`` calls at start-up and for a refit, nothing more.

``LLM`` logs at start-up the two ``ERROR`` lines vLLM 0.32 logs for FastRL's tiny models (its
``repo_utils`` parses the tokenizer directory's missing ``config.json``, then goes on), as the real
engine log of ``qwen2_tiny_text_fastrl_grpo_vllm_cpu`` has them, and records every reloaded tensor;
with ``FAKE_VLLM_DUMP`` set it saves the weights it holds to that file after each reload.
"""

from __future__ import annotations

import os
import types

__version__ = "0.0.fake"

BENIGN_START_UP_LINES = (
    "(MainProcess pid={pid}) ERROR 12-07 08:29:54 [repo_utils.py:126] Error parsing config for {tok}: Unrecognized "
    "model in {tok}. Should have a `model_type` key in its config.json., retrying 1 of 2",
    "(MainProcess pid={pid}) ERROR 12-07 08:29:56 [repo_utils.py:124] Error parsing config for {tok}: Unrecognized "
    "model in {tok}. Should have a `model_type` key in its config.json.",
)


class LLM:
    def __init__(self, **kwargs):
        for line in BENIGN_START_UP_LINES:
            print(line.format(pid=os.getpid(), tok=kwargs.get("tokenizer")), flush=True)
        self.loaded = {}
        self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: None)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if method != "reload_weights":
            return [False]  # repack_output_layer: no packed output layer here
        for name, tensor in kwargs["weights_iterator"]:
            self.loaded[name] = tensor.clone()
        dump = os.environ.get("FAKE_VLLM_DUMP")
        if dump:
            import torch

            torch.save(self.loaded, dump + ".tmp")
            os.replace(dump + ".tmp", dump)
        return [None]

    def reset_prefix_cache(self):
        pass
