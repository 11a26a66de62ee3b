"""Issue 33, item 3: the per-step engine/trainer mismatch guard, its config field, and the weight
version every generate request carries (the in-process Hugging Face engine; the engine process:
tests/vllm/test_engine_process.py; whole runs: tests/functional/test_stale_refit_guard.py)."""

from __future__ import annotations

import pytest
import torch

from fastrl.config import ConfigError, ModelConfig, PrecisionConfig, RolloutConfig, RunConfig
from fastrl.config.algorithm import MISMATCH_TOLERANCE_AUTO
from fastrl.config.nested import build_from_nested
from fastrl.models.tiny import build_tiny_text_model_dir
from fastrl.rollout.engine import RolloutPrompt, SamplingParams, StaleWeightsError
from fastrl.rollout.engine_wire import stale_weights_message
from fastrl.rollout.hf_engine import HFRolloutEngine
from fastrl.training.refit_verify import RolloutMismatchError, check_rollout_mismatch


def test_auto_tolerance_follows_the_precision():
    # Catches a build without per-precision defaults (one bound for all precisions, or none).
    assert RunConfig().rollout.mismatch_tolerance == "auto"
    assert RunConfig().mismatch_tolerance == 1e-4
    assert RunConfig(precision=PrecisionConfig(mode="bf16")).mismatch_tolerance == 5e-2
    assert MISMATCH_TOLERANCE_AUTO["fp8"] == 1e-1 and MISMATCH_TOLERANCE_AUTO["fp32"] < MISMATCH_TOLERANCE_AUTO["bf16"]
    assert RunConfig(rollout=RolloutConfig(mismatch_tolerance=3e-3)).mismatch_tolerance == 3e-3
    assert RunConfig(rollout=RolloutConfig(mismatch_tolerance=None)).mismatch_tolerance is None


def test_tolerance_is_typed_and_validated_at_build():
    # Catches an unvalidated field (a 0 or negative bound would stop every run; a typo would be ignored).
    parse = lambda v: build_from_nested(RunConfig, {"rollout": {"mismatch_tolerance": v}}, source="overrides")  # noqa: E731
    assert parse("1e-3").rollout.mismatch_tolerance == 1e-3
    assert parse("auto").rollout.mismatch_tolerance == "auto"
    assert parse("none").rollout.mismatch_tolerance is None
    for bad in ("0", "-1e-3", "nan", "inf", "tight"):
        with pytest.raises(ConfigError, match="mismatch_tolerance"):
            parse(bad)
    with pytest.raises(ConfigError, match="mismatch_tolerance"):
        RolloutConfig(mismatch_tolerance=True)


def test_guard_passes_healthy_steps_and_stops_a_stale_one():
    # Catches the build of issue 33, where the measured mismatch was logged and nobody read it.
    check_rollout_mismatch({"mismatch/abs_diff_mean": 2.2e-7}, tolerance=1e-4, step=3)  # healthy fp32
    check_rollout_mismatch({"mismatch/abs_diff_mean": 0.134}, tolerance=None, step=3)  # guard off
    with pytest.raises(RolloutMismatchError) as err:
        check_rollout_mismatch({"mismatch/abs_diff_mean": 0.134, "mismatch/abs_diff_max": 2.5}, tolerance=1e-4, step=7)
    text = str(err.value)
    assert text.startswith("step 7: ") and "mismatch/abs_diff_mean = 0.134 > rollout.mismatch_tolerance = 0.0001" in text
    assert "before its policy update" in text and "rollout.verify_refit_every=1" in text
    with pytest.raises(RolloutMismatchError):  # a nan mismatch is no pass
        check_rollout_mismatch({"mismatch/abs_diff_mean": float("nan")}, tolerance=1e-4, step=1)


def test_stale_weights_message_is_shared_by_every_engine():
    assert stale_weights_message("e", 3, None) is None and stale_weights_message("e", 3, 3) is None
    assert stale_weights_message("e", 4, 3) is None  # ahead is not stale
    assert "e holds weight version 2 but the trainer asked to generate with policy version 3" in stale_weights_message("e", 2, 3)


@pytest.fixture(scope="module")
def text_engine_dir(tmp_path_factory):
    small = ModelConfig(tiny_hidden_size=64, tiny_num_layers=1, tiny_intermediate_size=128)
    return build_tiny_text_model_dir(tmp_path_factory.mktemp("guard") / "tiny_text", small)


def test_hf_engine_refuses_a_request_ahead_of_its_weights(text_engine_dir):
    # Catches the build where generate() takes no weight version: an engine one refit behind the
    # trainer (its update_weights never ran) generated from stale weights without a word.
    engine = HFRolloutEngine.from_pretrained(text_engine_dir, RolloutConfig(seed=1))
    prompt = [RolloutPrompt(text="hello")]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=2, seed=3)
    assert len(engine.generate(prompt, 2, sampling, weight_version=0)) == 2
    with pytest.raises(StaleWeightsError, match="holds weight version 0 but the trainer asked to generate with policy version 1"):
        engine.generate(prompt, 2, sampling, weight_version=1)
    engine.update_weights((n, p.detach().clone()) for n, p in engine.model.named_parameters())
    assert engine.weight_version == 1
    assert len(engine.generate(prompt, 2, sampling, weight_version=1)) == 2
    assert torch.is_tensor(engine.generate(prompt, 1, sampling).response_token_ids[0])  # None: unchecked
