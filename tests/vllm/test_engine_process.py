"""The vLLM engine as its own process (fastrl/rollout/engine_client.py + engine_server.py), for real.

The trainer side runs here (main environment); the engine runs in .venv-vllm (built by
tools/setup_vllm_cpu.sh when missing). A tiny text-only Qwen2 model; the Hugging Face model of this
environment is the reference for every log-prob.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from fastrl.config import ModelConfig
from fastrl.models.tiny import build_tiny_hf_model_dir, build_tiny_text_model_dir
from fastrl.rollout.engine import PromptInputs, RolloutPrompt, SamplingParams, StaleWeightsError
from fastrl.rollout.engine_client import EngineProcessClient
from fastrl.rollout.engine_process import EngineError
from fastrl.rollout.hf_engine import teacher_forced_logprobs
from fastrl.training.refit_verify import RefitVerificationError, verify_refit

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = ["what is 2 plus 3?", "is there a red circle?", "name the blue shape.", "what color is it?"]
# a scheduler step of 512 tokens: two of test_seeded_prompts_over_one_steps_budget's ~200-token prompts
LLM_KWARGS = dict(max_model_len=256, kv_cache_memory_bytes=64 * 2**20, enforce_eager=True, dtype="float32",
                  max_num_batched_tokens=512)
BOUND_S = 20.0  # engine_timeout_s of these tests: a dead or hung engine is reported within it


def _vllm_python() -> Path:
    import subprocess

    subprocess.run(["bash", str(REPO / "tools" / "setup_vllm_cpu.sh")], check=True, cwd=REPO)
    return REPO / ".venv-vllm" / "bin" / "python"


def _client(model_dir, **kw) -> EngineProcessClient:
    kw.setdefault("timeout_s", 180.0)
    return EngineProcessClient(model_dir, python=_vllm_python(), seed=0, llm_kwargs=LLM_KWARGS,
                               env={"OMP_NUM_THREADS": "1"}, bucket_bytes=2**20, **kw)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine_process")
    model_dir = build_tiny_text_model_dir(root / "tiny_text", ModelConfig())
    client = _client(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    weights = load_file(model_dir / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    perturbed = {k: (v + 0.5 * torch.randn(v.shape, generator=gen) if k in ("lm_head.weight", "model.layers.1.mlp.down_proj.weight") else v)
                 for k, v in weights.items()}
    prompts = [RolloutPrompt(client.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                                  add_generation_prompt=True)) for q in QUESTIONS]
    yield {"client": client, "model": model, "weights": weights, "perturbed": perturbed, "prompts": prompts,
           "model_dir": model_dir}
    client.shutdown()


def _hf_logprobs(model, rollouts, pad):
    return teacher_forced_logprobs(model, [rollouts.prompt_inputs[i] for i in rollouts.prompt_index],
                                   rollouts.response_token_ids, pad_token_id=pad)


def _hf_probe(model):
    def f(probe):
        return teacher_forced_logprobs(
            model, [PromptInputs(input_ids=s[:st]) for s, st in zip(probe.sequences, probe.starts)],
            [s[st:] for s, st in zip(probe.sequences, probe.starts)], pad_token_id=0)
    return f


SAMPLE = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=10, seed=5)
GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=10)


def _lose_refits(client, monkeypatch) -> None:
    """Test double of a refit that never reaches the engine: the stream is consumed (and its group
    sums recorded) but nothing is sent, nor the new weight version."""
    monkeypatch.setattr(client, "_transfer", lambda named_tensors: (sum(1 for _ in named_tensors), 0))


def _drop_refits(client, monkeypatch) -> None:
    """Test double of a refit whose weights are dropped on the way: the stream is consumed (and its
    group sums recorded), no bucket is sent, but the engine is told the new weight version."""

    def drop(named_tensors):
        count = sum(1 for _ in named_tensors)
        client._call({"op": "set_weight_version", "version": client.weight_version + 1})
        return count, 0

    monkeypatch.setattr(client, "_transfer", drop)


def test_generate_refit_and_verify(setup, monkeypatch):
    c, model = setup["client"], setup["model"]
    out = c.generate(setup["prompts"], [2, 0, 3, 1], SAMPLE)
    assert out.n_per_prompt == [2, 0, 3, 1] and len(out) == 6
    assert out.prompt_index == [0, 0, 2, 2, 2, 3]
    for a, b in zip(out.logprobs, _hf_logprobs(model, out, c.pad_token_id)):
        assert (a - b).abs().max().item() <= 1e-4
    assert not set(torch.cat(out.response_token_ids).tolist()) & set(c.suppressed_ids)
    # the first refit (same weights) passes verification
    c.verify_every = 1
    c.update_weights(setup["weights"].items())
    assert c.verify_due
    m = verify_refit(c, _hf_probe(model), tolerance=1e-4)
    assert m["refit_verify/abs_diff_mean"] <= 1e-5
    greedy_before = c.generate(setup["prompts"], 1, GREEDY)

    # refit to perturbed weights: the engine now follows the perturbed model
    count = c.update_weights(setup["perturbed"].items())
    assert count == len(setup["weights"])
    assert c.refit_metrics["refit/bytes"] == sum(t.numel() * 4 for t in setup["weights"].values())
    assert c.refit_metrics["refit/mb_per_s"] > 0
    after = c.generate(setup["prompts"], 1, GREEDY, weight_version=c.weight_version)  # the engine is current
    assert c.health()["weight_version"] == c.weight_version == 2
    assert [t.tolist() for t in after.response_token_ids] != [t.tolist() for t in greedy_before.response_token_ids]
    perturbed_model = AutoModelForCausalLM.from_pretrained(setup["model_dir"], dtype=torch.float32).eval()
    perturbed_model.load_state_dict(setup["perturbed"])
    for a, b in zip(after.logprobs, _hf_logprobs(perturbed_model, after, c.pad_token_id)):
        assert (a - b).abs().max().item() <= 1e-4
    verify_refit(c, _hf_probe(perturbed_model), tolerance=1e-4)

    # (d) a refit that never reaches the engine leaves it stale: the verification names the lost
    # refit from the engine's own weight version, before any probe (issue 45, item 7)
    with monkeypatch.context() as lost:
        _lose_refits(c, lost)
        c.update_weights(setup["weights"].items())
        with pytest.raises(RefitVerificationError, match=r"after refit 3: refit 3 did not reach the engine: it holds weight version 2"):
            verify_refit(c, _hf_probe(model), tolerance=1e-3)
        # ... and the engine process refuses a generate request carrying the trainer's version (issue 33,
        # item 3; catches the build where the request carries no version or the engine does not check
        # it: it generated from the stale weights)
        assert c.health()["weight_version"] == 2 and c.weight_version == 3
        with pytest.raises(StaleWeightsError, match=r"vLLM engine process \(pid \d+\) holds weight version 2 but the "
                                                    r"trainer asked to generate with policy version 3"):
            c.generate(setup["prompts"], 1, GREEDY, weight_version=c.weight_version)
        c.health()  # a refusal, not an engine failure: still running, nothing restarted
    c.update_weights(setup["weights"].items())
    verify_refit(c, _hf_probe(model), tolerance=1e-4)
    c.generate(setup["prompts"], 1, GREEDY, weight_version=c.weight_version)
    # weights dropped on the way, the version delivered: the probe runs and names the group
    with monkeypatch.context() as dropped:
        _drop_refits(c, dropped)
        c.update_weights(setup["perturbed"].items())
        with pytest.raises(RefitVerificationError, match=r"largest mismatching parameter group: (lm_head|model\.layers\.1)"):
            verify_refit(c, _hf_probe(perturbed_model), tolerance=1e-3)
    c.update_weights(setup["weights"].items())
    verify_refit(c, _hf_probe(model), tolerance=1e-4)


def test_sampling_tokenization_and_stop_tokens(setup):
    """Seeded sampling is reproducible and follows the group sizes of each call; the engine tokenizes
    prompts as this environment does and returns the texts it would decode; a stop token ends a
    response and is kept as its last token (moved here from the in-process engine's checks)."""
    c, model = setup["client"], setup["model"]
    c.update_weights(setup["weights"].items())
    first = c.generate(setup["prompts"], [2, 0, 3, 1], SAMPLE)
    again = c.generate(setup["prompts"], [2, 0, 3, 1], SAMPLE)
    assert [t.tolist() for t in first.response_token_ids] == [t.tolist() for t in again.response_token_ids]
    for i, prompt in enumerate(setup["prompts"]):
        expected = c.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        assert first.prompt_inputs[i].input_ids.tolist() == expected  # from vLLM, or here for n = 0
    assert first.response_texts == [c.tokenizer.decode(t, skip_special_tokens=True) for t in first.response_token_ids]
    other = c.generate(setup["prompts"], [1, 4, 1, 2], SAMPLE)
    assert other.n_per_prompt == [1, 4, 1, 2] and other.prompt_index == [0, 1, 1, 1, 1, 2, 3, 3]
    for tokens, reason in zip(other.response_token_ids, other.finish_reasons):
        assert 1 <= len(tokens) <= SAMPLE.max_tokens
        assert reason == ("stop" if int(tokens[-1]) in c.default_stop_token_ids else "length")
    for a, b in zip(other.logprobs, _hf_logprobs(model, other, c.pad_token_id)):
        assert (a - b).abs().max().item() <= 1e-4
    greedy = c.generate(setup["prompts"], 1, GREEDY)
    stop = int(greedy.response_token_ids[0][3])  # the 4th greedy token of the first prompt
    cut = greedy.response_token_ids[0].tolist().index(stop)
    stopped = c.generate(setup["prompts"], 1, SamplingParams(**{**GREEDY.__dict__, "stop_token_ids": (stop,)}))
    assert stopped.response_token_ids[0].tolist() == greedy.response_token_ids[0].tolist()[: cut + 1]
    assert stopped.finish_reasons[0] == "stop"
    for tokens, reason in zip(stopped.response_token_ids, stopped.finish_reasons):
        assert (stop in tokens.tolist()) == (reason == "stop")
    with pytest.raises(ValueError, match="temperature=0.7"):
        c.generate(setup["prompts"], 1, SamplingParams(**{**SAMPLE.__dict__, "temperature": 0.7}))


def test_tempered_sampling_reports_log_probs_at_the_engines_temperature(setup):
    """An engine started for rollouts at temperature 0.7 (``logprobs_mode="processed_logprobs"``):
    each sampled token's log-prob is ``log softmax(logits / 0.7)`` over the tokens sampling may
    produce, as the engine_client docstring states -- on this untrained model the suppressed tokens
    carry real mass, so the renormalization is visible and checked. Greedy calls stay allowed; other
    temperatures and top-p are refused. Breakage caught: raw (temperature 1) log-probs, or the
    full-vocabulary value the docstring says this is not."""
    c = _client(setup["model_dir"], sampling_temperature=0.7)
    try:
        tempered = SamplingParams(**{**SAMPLE.__dict__, "temperature": 0.7})
        out = c.generate(setup["prompts"], 2, tempered)
        model = setup["model"]
        suppressed = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        suppressed[c.suppressed_ids] = True
        far_from_full = 0.0
        for r, (tokens, lps) in enumerate(zip(out.response_token_ids, out.logprobs)):
            prompt = out.prompt_inputs[out.prompt_index[r]].input_ids.reshape(-1)
            with torch.no_grad():
                logits = model(torch.cat([prompt, tokens])[None]).logits[0, len(prompt) - 1:-1].float() / 0.7
            expected = logits.masked_fill(suppressed, float("-inf")).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
            full = logits.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
            assert (lps - expected).abs().max().item() <= 1e-4, (lps, expected)
            far_from_full = max(far_from_full, (lps - full).abs().max().item())
        assert far_from_full > 1e-3  # the suppressed mass is not negligible here: the test can tell them apart
        assert all(len(t) >= 1 for t in c.generate(setup["prompts"], 1, GREEDY).response_token_ids)
        with pytest.raises(ValueError, match="temperature=1.0 would make"):
            c.generate(setup["prompts"], 1, SAMPLE)
        with pytest.raises(ValueError, match="top_p=0.9"):
            c.generate(setup["prompts"], 1, SamplingParams(**{**tempered.__dict__, "top_p": 0.9}))
    finally:
        c.shutdown()


def test_seeded_prompts_over_one_steps_budget(setup):
    """Seeded sampling of prompts whose tokens exceed one scheduler step's budget (512 here; vLLM's
    CPU default is 4096, which 8 prompts x n=8 of 82 tokens exceed): vLLM 0.32 split a prefill
    over steps and, rewinding the seeded generator of the split request, raised "CPU Generator
    does not use offset"; the server keeps every prefill whole (engine_settings.whole_prefills)."""
    c = setup["client"]
    c.update_weights(setup["weights"].items())
    prompts = []
    for q in QUESTIONS:
        words = []
        while len(c.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]) < 200:
            words.append(q)
        prompts.append(RolloutPrompt(" ".join(words)))
    sizes = [len(c.tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert sum(sizes) > 512 and max(sizes) + SAMPLE.max_tokens <= 256, sizes
    first = c.generate(prompts, [2, 1, 2, 1], SAMPLE)
    again = c.generate(prompts, [2, 1, 2, 1], SAMPLE)
    assert [len(p.input_ids) for p in first.prompt_inputs] == sizes
    assert first.prompt_index == [0, 0, 1, 2, 2, 3]
    assert [t.tolist() for t in first.response_token_ids] == [t.tolist() for t in again.response_token_ids]
    for a, b in zip(first.logprobs, _hf_logprobs(setup["model"], first, c.pad_token_id)):
        assert (a - b).abs().max().item() <= 1e-4


def test_killed_engine_is_reported_then_restarted(setup):
    c = setup["client"]
    c.update_weights(setup["perturbed"].items())
    expected = c.generate(setup["prompts"], 1, GREEDY)
    os.kill(c.proc.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineError) as err:
        c.generate(setup["prompts"], 1, GREEDY)
    assert time.monotonic() - start < BOUND_S
    message = str(err.value)
    assert "\n" not in message and "killed by signal 9" in message and c.name in message and "log tail" in message
    # restart-and-retry: the perturbed weights are replayed into the new engine
    c.restart_retries = 1
    os.kill(c.proc.pid, signal.SIGKILL) if c.proc.poll() is None else None
    again = c.generate(setup["prompts"], 1, GREEDY, weight_version=c.weight_version)  # the replay restores the version
    assert [t.tolist() for t in again.response_token_ids] == [t.tolist() for t in expected.response_token_ids]
    assert c.health()["weight_version"] == c.weight_version


def test_hung_engine_is_reported_within_the_bound(setup):
    c = setup["client"]
    c.timeout_s = 3.0
    os.kill(c.proc.pid, signal.SIGSTOP)  # alive but never answering
    start = time.monotonic()
    with pytest.raises(EngineError, match="did not answer 'health' within rollout.engine_timeout_s=3 s"):
        c.health()
    assert time.monotonic() - start < BOUND_S
    assert c.proc.poll() is not None  # killed, no orphan


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_engine_dies_with_a_killed_parent(setup, tmp_path):
    """A trainer killed with SIGKILL (no clean-up) takes its engine along, even while the engine is
    still starting (before the socket could tell it): prctl(PR_SET_PDEATHSIG) + the watchdog."""
    import json
    import subprocess
    import sys

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"model": str(setup["model_dir"]), "tokenizer": str(setup["model_dir"] / "tokenizer"),
                                "seed": 0, "suppressed_token_ids": [], "stop_token_ids": [0], "logprobs_mode": "raw_logprobs", "llm_kwargs": LLM_KWARGS}))
    code = (
        "import os, socket, subprocess, sys, time\n"
        "a, b = socket.socketpair()\n"
        f"p = subprocess.Popen([{str(_vllm_python())!r}, {str(REPO / 'fastrl/rollout/engine_server.py')!r}, '--fd', "
        f"str(b.fileno()), '--spec', {str(spec)!r}, '--parent-pid', str(os.getpid())], pass_fds=(b.fileno(),), "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(parent.stdout.readline())
        time.sleep(1.0)
        assert _alive(pid)
        parent.kill()  # SIGKILL: no clean-up in the parent; the engine is still importing vLLM
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the engine outlived its parent"
    finally:
        parent.kill()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


VL_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{q}<|im_end|>\n<|im_start|>assistant\n"


def test_torchvision_needs_the_engine_environments_shim():
    # The blocker the shim (tools/engine_env/_fastrl_torchvision_cpu.py) works around: PyPI's
    # torchvision wheel (a CUDA build) does not import beside the CPU torch. When this test fails,
    # torchvision imports on its own: remove the shim and this test.
    import subprocess

    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_BeforeTorchvision']; "
            "import torchvision")
    proc = subprocess.run([str(_vllm_python()), "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "operator torchvision::nms does not exist" in proc.stderr, proc.stderr[-2000:]


def test_vision_language_model_generates_with_images_and_follows_refits(tmp_path):
    # The product's own combination (issue 29, item 4): the tiny Qwen2.5-VL generating with images
    # through vLLM's own multimodal path in the engine process, its log-probs against the Hugging
    # Face model's on the same pixels, then a refit of the language model and of the vision tower.
    # Breakage caught: an engine that ignores the images (the log-probs of an image-conditioned
    # model differ), a refit that misses the vision tower's weights, pixel bounds that differ
    # between the engine's processor and the trainer's (the patches would differ).
    from PIL import Image
    from transformers import Qwen2_5_VLForConditionalGeneration

    vl_dir = build_tiny_hf_model_dir(tmp_path / "tiny_vl", ModelConfig())
    c = _client(vl_dir, min_pixels=56 * 56, max_pixels=112 * 112)
    try:
        images = [Image.new("RGB", (84, 84), color) for color in ((200, 30, 30), (30, 30, 200), (30, 200, 30))]
        prompts = [RolloutPrompt(VL_PROMPT.format(q=q), (img,)) for q, img in zip(QUESTIONS, images)]
        prompts.append(RolloutPrompt(VL_PROMPT.replace("<|vision_start|><|image_pad|><|vision_end|>", "").format(q="hi")))
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(vl_dir, dtype=torch.float32).eval()
        out = c.generate(prompts, 2, SAMPLE)
        assert len(out) == 8 and out.prompt_inputs[0].pixel_values is not None
        assert out.prompt_inputs[3].pixel_values is None
        for a, b in zip(out.logprobs, _hf_logprobs(model, out, c.pad_token_id)):
            assert (a - b).abs().max().item() <= 1e-4
        # the same prompt text with another image: other log-probs (the engine reads the image)
        swapped = c.generate([RolloutPrompt(prompts[0].text, (images[1],))], 1, GREEDY)
        first = c.generate([prompts[0]], 1, GREEDY)
        assert not torch.equal(swapped.logprobs[0], first.logprobs[0][: len(swapped.logprobs[0])]) or \
            swapped.response_token_ids[0].tolist() != first.response_token_ids[0].tolist()
        # refit: perturb a language weight and a vision-tower weight; the engine follows both
        weights = load_file(vl_dir / "model.safetensors")
        gen = torch.Generator().manual_seed(3)
        names = [n for n in weights if n.startswith("visual.blocks.0.mlp")][:1] + ["lm_head.weight"]
        perturbed = {k: (v + 0.5 * torch.randn(v.shape, generator=gen) if k in names else v) for k, v in weights.items()}
        c.update_weights(perturbed.items())
        model.load_state_dict(_hf_state_dict_names(model, perturbed))
        after = c.generate(prompts[:3], 1, GREEDY, weight_version=c.weight_version)
        for a, b in zip(after.logprobs, _hf_logprobs(model, after, c.pad_token_id)):
            assert (a - b).abs().max().item() <= 1e-4
    finally:
        c.shutdown()


def _hf_state_dict_names(model, on_disk: dict) -> dict:
    """The on-disk (checkpoint) names mapped to this transformers version's module names
    (``model.language_model.*``, ``model.visual.*``, ``lm_head.*``)."""
    keys = set(model.state_dict())
    out = {}
    for name, t in on_disk.items():
        for candidate in (name, name.replace("model.", "model.language_model.", 1), "model." + name):
            if candidate in keys:
                out[candidate] = t
                break
        else:
            raise KeyError(f"{name} has no module in {type(model).__name__}")
    return out
