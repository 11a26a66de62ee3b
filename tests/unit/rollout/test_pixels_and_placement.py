"""data.min_pixels / data.max_pixels reach the image processor of both engines (the trainer's prompt
inputs come from it), and each rank's HF engine is placed on its own device (the vLLM engine's GPUs:
test_vllm_engine_helpers.py)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from PIL import Image

from fastrl.config import RolloutConfig
from fastrl.data.images import image_token_count, set_pixel_bounds
from fastrl.rollout.engine import RolloutPrompt
from fastrl.rollout.engine_client import EngineProcessClient, with_pixel_bounds
from fastrl.rollout.engine_factory import engine_client_from_config
from fastrl.rollout.hf_engine import HFRolloutEngine, prepare_prompt_inputs

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what color<|im_end|>\n<|im_start|>assistant\n"
SETTINGS = {"wide": (56 * 56, 1024 * 28 * 28), "narrow": (56 * 56, 112 * 112)}


def image_tokens(inputs, image_token_id: int) -> int:
    return int((inputs.input_ids == image_token_id).sum())


@pytest.fixture()
def unstarted_engine_process(monkeypatch):
    """:class:`EngineProcessClient` without its vLLM child (not installed in this environment): the
    start-up only records the spec the child would get."""

    def fake_start(self):
        self.info = {"default_stop_token_ids": [0]}

    monkeypatch.setattr(EngineProcessClient, "_start", fake_start)


def vllm_process_client(model_dir, min_pixels, max_pixels):
    """The vLLM engine of a run with ``data.min_pixels`` / ``data.max_pixels`` as the trainer builds
    it (``rollout.engine='vllm'``, on the CPU)."""
    from recipes import DEFAULT_RECIPE, get_recipe

    cfg = get_recipe(DEFAULT_RECIPE)
    cfg = dataclasses.replace(
        cfg, rollout=dataclasses.replace(cfg.rollout, engine="vllm", engine_python=sys.executable),
        data=dataclasses.replace(cfg.data, min_pixels=min_pixels, max_pixels=max_pixels),
    )
    return engine_client_from_config(cfg, model_dir, torch.device("cpu"))


def test_pixel_bounds_reach_both_engines_image_processors(tiny_vl_dir, unstarted_engine_process):
    """data.min_pixels / max_pixels reach the HF engine's processor, and on the vLLM process path both
    the engine process's processor (``mm_processor_kwargs`` in its spec) and the processor that builds
    the trainer's prompt inputs."""
    image = Image.new("RGB", (280, 280), (10, 200, 30))
    prompt = RolloutPrompt(PROMPT, (image,))
    counts = {}
    for name, (lo, hi) in SETTINGS.items():
        engine = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(), min_pixels=lo, max_pixels=hi)
        token = engine.model.config.image_token_id
        hf = prepare_prompt_inputs(engine.processor, prompt)
        client = vllm_process_client(tiny_vl_dir, lo, hi)
        try:
            assert client._spec["llm_kwargs"]["mm_processor_kwargs"] == {"min_pixels": lo, "max_pixels": hi}
            vl = client._prompt_inputs([prompt], {})[0]
        finally:
            client.shutdown()
        assert image_tokens(hf, token) == image_tokens(vl, token)  # same preprocessing on both sides
        torch.testing.assert_close(hf.pixel_values, vl.pixel_values)
        assert image_tokens(hf, token) == image_token_count(280, 280, min_pixels=lo, max_pixels=hi)
        counts[name] = image_tokens(hf, token)
    # 280 x 280 fits the wide bounds (10 x 10 merged tokens); the narrow ones shrink it to 112 x 112
    assert counts == {"wide": 100, "narrow": 16}
    # an engine on the directory's own bounds (the CPU recipes: the tiny directory is built with them)
    default = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig())
    assert image_tokens(prepare_prompt_inputs(default.processor, prompt), default.model.config.image_token_id) == 100


def test_text_only_engine_process_gets_no_pixel_bounds(tmp_path, unstarted_engine_process):
    from fastrl.config import ModelConfig
    from fastrl.models.tiny import build_tiny_text_model_dir

    client = vllm_process_client(build_tiny_text_model_dir(tmp_path / "text", ModelConfig()), 3136, 50176)
    try:
        assert "mm_processor_kwargs" not in client._spec["llm_kwargs"]  # no image processor to give them to
    finally:
        client.shutdown()


def test_set_pixel_bounds_keeps_a_bound_given_as_none(tiny_vl_dir):
    from fastrl.models.tiny import load_processor

    ip = load_processor(tiny_vl_dir).image_processor
    before = ip.max_pixels
    set_pixel_bounds(ip, 28 * 28, None)
    assert (ip.min_pixels, ip.max_pixels) == (28 * 28, before)
    assert ip.size["shortest_edge"] == 28 * 28 and ip.size["longest_edge"] == before
    with pytest.raises(ValueError, match="min_pixels"):
        set_pixel_bounds(ip, 10**9, None)


def test_vllm_arguments_carry_the_pixel_bounds():
    assert with_pixel_bounds({"model": "m"}, None, None) == {"model": "m"}
    out = with_pixel_bounds({"model": "m"}, 3136, 50176)
    assert out["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 50176}
    given = with_pixel_bounds({"mm_processor_kwargs": {"max_pixels": 1}}, 3136, 50176)
    assert given["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 1}


def test_hf_engine_runs_on_the_device_it_is_given(tiny_vl_dir):
    engine = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(), device=torch.device("cpu"))
    assert engine.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in engine.model.parameters())
