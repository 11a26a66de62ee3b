"""Which Hugging Face directory describes a trainer checkpoint's model when ``convert_checkpoint.py
export`` gets no ``--hf`` (issue 45, item 5): the tiny model of the run's own ``model.architecture``."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from fastrl.checkpoint.layout import TRAIN_STATE
from fastrl.checkpoint.resolve import ResolvedCheckpoint
from fastrl.config import ModelConfig
from fastrl.models.hf_dirs import ConversionError, model_template_dir
from fastrl.models.tiny import tiny_model_settings
from recipes.registry import get_recipe

TEXT_RECIPE = "qwen2_tiny_text_fastrl_grpo_vllm_cpu"


def _trainer_checkpoint(tmp_path, config: dict) -> ResolvedCheckpoint:
    path = tmp_path / "step_00000001"
    path.mkdir(parents=True)
    torch.save({"config": config, "step": 1}, path / TRAIN_STATE)
    return ResolvedCheckpoint(path=path, kind="trainer", step=1)


def test_text_recipe_rebuilds_its_own_qwen2_model(tmp_path):
    """catches: model_template_dir building the tiny Qwen2.5-VL whatever model.architecture says
    (the export then died with a raw KeyError: "visual.patch_embed.proj.weight ..."), or a qwen2
    model built with other settings than the run's (another stamp key: another vocabulary or sizes)."""
    cfg = get_recipe(TEXT_RECIPE)
    checkpoint = _trainer_checkpoint(tmp_path, cfg.to_dict())
    template = model_template_dir(checkpoint, hf=None, scratch=tmp_path / "scratch")
    config = json.loads((template / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["num_hidden_layers"] == cfg.model.tiny_num_layers and config["hidden_size"] == cfg.model.tiny_hidden_size
    stamp = json.loads((template / "fastrl_tiny_model.json").read_text())
    assert stamp["key"] == tiny_model_settings(cfg.model, architecture="qwen2").key()  # the run's own model


def test_vision_language_recipe_still_rebuilds_qwen25vl(tmp_path):
    """catches: the architecture switch sending the default (and pre-field) tiny runs to the text model."""
    config = get_recipe("easyvqa_tiny_fastrl_grpo_cpu").to_dict()
    config["model"].pop("architecture")  # a checkpoint written before model.architecture existed
    template = model_template_dir(_trainer_checkpoint(tmp_path, config), hf=None, scratch=tmp_path / "scratch")
    assert json.loads((template / "config.json").read_text())["model_type"] == "qwen2_5_vl"


def test_tiny_model_of_another_architecture_is_refused_in_one_line(tmp_path):
    """catches: an unknown tiny architecture silently rebuilt as one of the known ones (or a raw
    TypeError / KeyError from the ModelConfig of a config it cannot describe)."""
    config = get_recipe(TEXT_RECIPE).to_dict()
    config["model"] = {**config["model"], "architecture": "llama"}
    with pytest.raises(ConversionError, match=r"model.architecture='llama'.*pass --hf") as err:
        model_template_dir(_trainer_checkpoint(tmp_path, config), hf=None, scratch=tmp_path / "scratch")
    assert "\n" not in str(err.value)
    config["model"] = {**asdict(replace(ModelConfig(), architecture="qwen2")), "tiny_num_layers": 0}
    with pytest.raises(ConversionError, match=r"tiny_num_layers.*pass --hf"):
        model_template_dir(_trainer_checkpoint(tmp_path / "b", config), hf=None, scratch=tmp_path / "scratch")
