"""data.min_pixels / data.max_pixels reach the image processor of both engines (the trainer's prompt
inputs come from it), and each rank's engine is placed on its own device."""

from __future__ import annotations

import os

import pytest
import torch
from PIL import Image

from fastrl.config import RolloutConfig
from fastrl.data.images import image_token_count, set_pixel_bounds
from fastrl.rollout.engine import RolloutPrompt
from fastrl.rollout.hf_engine import HFRolloutEngine, prepare_prompt_inputs
from fastrl.rollout.vllm_engine import (
    VLLMRolloutEngine,
    engine_visible_devices,
    physical_gpus,
    with_pixel_bounds,
)

PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what color<|im_end|>\n<|im_start|>assistant\n"
SETTINGS = {"wide": (56 * 56, 1024 * 28 * 28), "narrow": (56 * 56, 112 * 112)}


def image_tokens(inputs, image_token_id: int) -> int:
    return int((inputs.input_ids == image_token_id).sum())


def vllm_side_inputs(model_dir, prompt, min_pixels, max_pixels):
    """What the vLLM engine hands the trainer for an image prompt (its Hugging Face processor path),
    without starting vLLM (not installed in this environment)."""
    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)
    engine.model_path, engine._processor = model_dir, None
    engine.min_pixels, engine.max_pixels = min_pixels, max_pixels
    return engine._prompt_inputs([prompt], {})[0]


def test_pixel_bounds_reach_both_engines_image_processors(tiny_vl_dir):
    image = Image.new("RGB", (280, 280), (10, 200, 30))
    prompt = RolloutPrompt(PROMPT, (image,))
    counts = {}
    for name, (lo, hi) in SETTINGS.items():
        engine = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(), min_pixels=lo, max_pixels=hi)
        token = engine.model.config.image_token_id
        hf = prepare_prompt_inputs(engine.processor, prompt)
        vl = vllm_side_inputs(tiny_vl_dir, prompt, lo, hi)
        assert image_tokens(hf, token) == image_tokens(vl, token)  # same preprocessing on both sides
        torch.testing.assert_close(hf.pixel_values, vl.pixel_values)
        assert image_tokens(hf, token) == image_token_count(280, 280, min_pixels=lo, max_pixels=hi)
        counts[name] = image_tokens(hf, token)
    # 280 x 280 fits the wide bounds (10 x 10 merged tokens); the narrow ones shrink it to 112 x 112
    assert counts == {"wide": 100, "narrow": 16}
    # an engine on the directory's own bounds (the CPU recipes: the tiny directory is built with them)
    default = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig())
    assert image_tokens(prepare_prompt_inputs(default.processor, prompt), default.model.config.image_token_id) == 100


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


def test_vllm_engine_sees_only_its_ranks_gpus(monkeypatch):
    assert physical_gpus(3, 1, None) == ["3"]
    assert physical_gpus(1, 2, "4,5,6,7") == ["5", "6"]
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        physical_gpus(3, 2, "0,1,2,3")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with engine_visible_devices("cuda:2"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"  # what vLLM's engine-core process inherits
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with engine_visible_devices(torch.device("cuda", 1)):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with engine_visible_devices("cpu"):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with pytest.raises(RuntimeError, match="in-process vLLM engine"):
        with engine_visible_devices("cuda:1"):
            pass
