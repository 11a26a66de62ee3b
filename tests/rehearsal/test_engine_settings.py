"""GPU rehearsal: the settings the engine process of a GPU recipe is started with, recorded instead
of starting vLLM (issue 29, item 2: the refit probe's bound per precision)."""

from __future__ import annotations

import pytest
import torch

from fastrl.rollout import engine_factory
from recipes.registry import get_recipe
from tests.rehearsal.fake_cuda import FakeCuda


class _Recorder:
    def __init__(self, policy_dir, **kwargs):
        self.policy_dir, self.kwargs = policy_dir, kwargs


@pytest.mark.parametrize(
    ("recipe", "tolerance"),
    [
        ("qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16", 5e-2),
        ("qwen25vl_7b_fastrl_grpo_geo3k_h100_fp8", 1e-1),
    ],
)
def test_gpu_recipes_verify_refits_at_their_precisions_bound(monkeypatch, recipe, tolerance):
    # A bf16 vLLM engine against a bf16 / FP8 megatron actor at another TP differs by rounding alone by
    # more than 1e-3. Breakage caught: the fp32 bound (1e-3) on every GPU recipe, which stopped the
    # 7B run with RefitVerificationError at its first check.
    FakeCuda(device_count=8, visible="0,1,2,3,4,5,6,7").install(monkeypatch)
    monkeypatch.setattr(engine_factory, "EngineProcessClient", _Recorder)
    cfg = get_recipe(recipe)
    assert cfg.rollout.verify_refit_tolerance == "auto"
    client = engine_factory.engine_client_from_config(cfg, "/models/qwen", torch.device("cuda", 3))
    assert client.kwargs["verify_tolerance"] == tolerance
    assert client.kwargs["llm_kwargs"]["dtype"] == "bfloat16"
    assert client.kwargs["env"]["CUDA_VISIBLE_DEVICES"] == "3"  # this rank's GPU only


def test_fp32_keeps_its_tight_bound_and_a_number_is_taken_as_given():
    from fastrl.cli import apply_overrides

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    assert cfg.verify_refit_tolerance == 1e-3
    assert apply_overrides(cfg, ["rollout.verify_refit_tolerance=2e-2"]).verify_refit_tolerance == 2e-2


def test_frozen_vision_weights_are_sent_every_refit_when_the_engine_sleeps_at_level_2(monkeypatch):
    # Level 2 discards every weight between steps. Breakage caught: the frozen vision tower sent on
    # the first refit only, then lost at the first sleep (the text-only probe does not see it).
    from fastrl.cli import apply_overrides

    FakeCuda(device_count=8, visible="0,1,2,3,4,5,6,7").install(monkeypatch)
    monkeypatch.setattr(engine_factory, "EngineProcessClient", _Recorder)
    cfg = apply_overrides(get_recipe("qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"), ["model.freeze_vision_tower=true"])
    sleeping = engine_factory.engine_client_from_config(cfg, "/models/qwen", torch.device("cuda", 0))
    assert sleeping.kwargs["skip_after_first"] is None
    awake = engine_factory.engine_client_from_config(
        apply_overrides(cfg, ["rollout.sleep_between_steps=false"]), "/models/qwen", torch.device("cuda", 0))
    assert awake.kwargs["skip_after_first"] is engine_factory.frozen_vision_weight
