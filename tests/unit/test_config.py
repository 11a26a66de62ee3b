"""Config dataclasses: documentation, defaults, cross-field validation messages."""

import dataclasses
import typing

import pytest

from fastrl import config as cfg
from fastrl.config import model as config_model
from fastrl.config import ConfigError, RunConfig, field_docs


def _sections():
    return [f.default_factory for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(f.default_factory)]


def test_every_field_is_documented_and_keyword_only():
    docs = field_docs()
    assert len(docs) > 80
    undocumented = [k for k, v in docs.items() if len(v.strip()) < 8]
    assert undocumented == []
    for section in _sections():
        with pytest.raises(TypeError):
            section(1)  # positional arguments are refused


def test_choices_are_literals():
    hints = typing.get_type_hints(cfg.PruningConfig)
    assert typing.get_args(hints["method"]) == ("none", "fastrl", "cppo", "random", "advantage_only")
    assert typing.get_args(typing.get_type_hints(cfg.PrecisionConfig)["fp8_recipe"]) == (
        "delayed", "tensorwise", "mxfp8", "blockwise",
    )


def test_default_config_builds_and_round_trips_through_dict():
    config = RunConfig()
    again = RunConfig.from_dict(config.to_dict())
    assert again == config


def test_dp_size_is_derived():
    p = cfg.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, world_size=16)
    assert p.dp_size() == 4
    assert p.dp_size(8) == 2
    with pytest.raises(ConfigError, match=r"world size \(6\) must be divisible by tensor_model_parallel_size \(2\) x pipeline_model_parallel_size \(2\)"):
        p.dp_size(6)


def test_global_batch_not_divisible_by_dp_times_micro_batch():
    with pytest.raises(ConfigError) as err:
        RunConfig(
            parallel=cfg.ParallelConfig(world_size=3, micro_batch_size=2),
            rollout=cfg.RolloutConfig(n=8, prompts_per_step=32),
            trainer=cfg.TrainerConfig(mini_batch_prompts=16),
        )
    message = str(err.value)
    assert "128 rollouts" in message and "dp_size (3)" in message and "micro_batch_size (2)" in message


def test_group_relative_estimator_needs_two_responses():
    with pytest.raises(ConfigError, match=r"rollout.n=1 .*'grpo' is group-relative"):
        RunConfig(rollout=cfg.RolloutConfig(n=1), adaptive_sampling=cfg.AdaptiveSamplingConfig(enabled=False))


def test_fp8_without_transformer_engine_is_refused(monkeypatch):
    monkeypatch.setattr(config_model, "transformer_engine_available", lambda: False)
    with pytest.raises(ConfigError, match="Transformer Engine, which is not importable"):
        cfg.PrecisionConfig(mode="fp8")
    # bf16 never needs it
    assert cfg.PrecisionConfig(mode="bf16").params_dtype == "bfloat16"


def test_fp8_known_bad_combination(monkeypatch):
    monkeypatch.setattr(config_model, "transformer_engine_available", lambda: True)
    with pytest.raises(ConfigError, match="mxfp8.*hybrid"):
        cfg.PrecisionConfig(mode="fp8", fp8_recipe="mxfp8", fp8_format="hybrid")
    ok = cfg.PrecisionConfig(mode="fp8", fp8_recipe="mxfp8", fp8_format="e4m3")
    assert ok.params_dtype == "bfloat16"


def test_transformer_engine_is_not_importable_on_this_machine():
    # CPU machines cannot import Transformer Engine; the check must say so rather than pretend.
    import importlib.util

    assert cfg.transformer_engine_available() == (importlib.util.find_spec("transformer_engine") is not None)


def test_gspo_needs_sequence_aggregation():
    with pytest.raises(ConfigError, match="seq_mean_token_mean"):
        cfg.AlgorithmConfig(loss_type="gspo", loss_agg="token_mean")


def test_kl_in_two_places_refused_and_forces_early_logprobs():
    with pytest.raises(ConfigError, match="choose one place for KL"):
        cfg.AlgorithmConfig(use_kl_loss=True, kl_in_reward=True)
    config = RunConfig(algorithm=cfg.AlgorithmConfig(use_kl_loss=False, kl_in_reward=True))
    assert config.logprobs_before_pruning is True
    assert RunConfig().logprobs_before_pruning is False


def test_update_multiple_is_lcm_of_mini_batch_and_dp_geometry():
    config = RunConfig(
        rollout=cfg.RolloutConfig(n=8, prompts_per_step=256),
        trainer=cfg.TrainerConfig(mini_batch_prompts=128),
        parallel=cfg.ParallelConfig(micro_batch_size=4),
    )
    assert config.update_multiple(dp_size=4) == 1024
    assert config.update_multiple(dp_size=3) == 3072
    assert config.update_multiple(dp_size=4, n=6) == 768


def test_hf_source_needs_path():
    with pytest.raises(ConfigError, match="model.hf_path"):
        cfg.ModelConfig(source="hf")
