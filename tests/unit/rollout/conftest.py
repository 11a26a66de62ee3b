"""Fixtures of the rollout tests: the tiny Qwen2.5-VL model and real easy-vqa prompts."""

from __future__ import annotations

import pytest
from easy_vqa import get_train_image_paths, get_train_questions
from PIL import Image

from fastrl.config import ModelConfig, RolloutConfig
from fastrl.data.prompts import load_template
from fastrl.models.tiny import build_tiny_hf_model_dir
from fastrl.rollout.engine import RolloutPrompt
from fastrl.rollout.hf_engine import HFRolloutEngine


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory):
    return build_tiny_hf_model_dir(tmp_path_factory.mktemp("rollout") / "tiny_vl", ModelConfig())


@pytest.fixture()
def engine(tiny_vl_dir):
    """A fresh engine per test (tests change its weights)."""
    return HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(seed=5))


@pytest.fixture(scope="session")
def easy_vqa_prompts(tiny_vl_dir):
    """Six real easy-vqa questions with their images, formatted by the recipe's template."""
    from fastrl.models.tiny import load_processor

    processor = load_processor(tiny_vl_dir)
    template = load_template("easy_vqa_thinking")
    questions, _, image_ids = get_train_questions()
    paths = get_train_image_paths()
    prompts = []
    for i in range(6):
        text = template.render(problem=questions[i], num_images=1, metadata={})
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(RolloutPrompt(prompt, (Image.open(paths[image_ids[i]]).convert("RGB"),)))
    return prompts
