"""Config dataclasses: documentation, defaults, cross-field validation messages."""

import dataclasses
import re
import typing

import pytest

from fastrl import config as cfg
from fastrl.config import ConfigError, RunConfig, field_docs
from fastrl.config import model as config_model


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
    assert typing.get_args(hints["method"]) == (
        "none", "fastrl", "fastrl_unbiased", "cppo", "random", "advantage_only", "pods", "zero_adv_skip", "greso",
        "matched_random", "matched_top_abs", "matched_pods", "budget_stratified",
    )
    assert typing.get_args(hints["refill_to"]) == ("free", "mini_batch")
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


def test_fp8_without_transformer_engine_is_refused_before_training(monkeypatch):
    # The config itself is machine-independent (--dry-run plans FP8 recipes on a laptop); the
    # machine check before training refuses FP8 where Transformer Engine is missing.
    monkeypatch.setattr(config_model, "transformer_engine_available", lambda: False)
    fp8 = cfg.PrecisionConfig(mode="fp8")
    with pytest.raises(ConfigError, match="Transformer Engine, which is not importable"):
        cfg.check_machine_supports(fp8)
    cfg.check_machine_supports(cfg.PrecisionConfig(mode="bf16"))  # bf16 never needs it
    monkeypatch.setattr(config_model, "transformer_engine_available", lambda: True)
    cfg.check_machine_supports(fp8)


def test_fp8_known_bad_combination():
    with pytest.raises(ConfigError, match="mxfp8.*hybrid"):
        cfg.PrecisionConfig(mode="fp8", fp8_recipe="mxfp8", fp8_format="hybrid")
    ok = cfg.PrecisionConfig(mode="fp8", fp8_recipe="mxfp8", fp8_format="e4m3")
    assert ok.params_dtype == "bfloat16"


@pytest.mark.parametrize(
    ("layers", "available"),
    [
        (None, False),  # no transformer_engine package at all (hidden where one is installed)
        ("raise OSError('libcudart.so.12: cannot open shared object file')", False),  # core without its torch extension
        ("", True),  # core and transformer_engine.pytorch both import
    ],
    ids=["absent", "core_without_layers", "installed"],
)
def test_transformer_engine_availability_needs_the_pytorch_layers(tmp_path, monkeypatch, layers, available):
    # Fake transformer_engine packages on sys.path. Breakage caught: a check that only looks for the
    # core package (find_spec alone) calls the broken install available, so fp8 would be accepted
    # here and fail at the first TE layer on the cluster.
    import sys

    for name in ("transformer_engine", "transformer_engine.pytorch"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    if layers is not None:
        package = tmp_path / "transformer_engine"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "pytorch.py").write_text(layers + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
    else:  # absent, also on a GPU node that has it: find_spec gives None for a None entry
        monkeypatch.setitem(sys.modules, "transformer_engine", None)
    assert cfg.transformer_engine_available() is available
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        sys.modules.pop(name, None)


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


# ---- holes found by fuzzing the overrides (tests/unit/test_config_fuzz.py) and by reading ----------

_HOLES = [
    # (recipe, overrides, message naming the key and the value)
    ("easyvqa_tiny_fastrl_grpo_cpu", ["parallel.world_size=0"], "parallel.world_size must be >= 1 (or none: the launcher's), got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["parallel.world_size=-2"], "parallel.world_size must be >= 1"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["parallel.micro_batch_size=48"],
     "128 rollouts is not divisible by dp_size (1) x parallel.micro_batch_size (48) = 48 (at world size 1"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["parallel.tensor_model_parallel_size=2", "parallel.micro_batch_size=3"],
     "dp_size (1) x parallel.micro_batch_size (3) = 3 (at world size 2, the smallest for this TP x PP"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.lr=nan"], "optimizer.lr=nan is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.lr=inf"], "optimizer.lr=inf is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.lr=0"], "optimizer.lr must be > 0, got 0.0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.lr=-1e-5"], "optimizer.lr must be > 0, got -1e-05"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.weight_decay=-1"], "optimizer.weight_decay must be >= 0, got -1.0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.adam_beta2=1"], "optimizer.adam_beta2 must be in [0, 1), got 1.0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["optimizer.lr_warmup_steps=-1"], "optimizer.lr_warmup_steps must be >= 0, got -1"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["rollout.top_k=-2"], "rollout.top_k must be >= 1, or -1 / 0 for off, got -2"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["rollout.val_n=0"], "rollout.val_n must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["rollout.val_temperature=-0.5"], "rollout.val_temperature must be >= 0, got -0.5"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["rollout.temperature=inf"], "rollout.temperature=inf is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["rollout.max_prompt_length=0"], "rollout.max_prompt_length must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.tiny_num_attention_heads=0"], "model.tiny_num_attention_heads must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.tiny_num_key_value_heads=0"], "model.tiny_num_key_value_heads must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.tiny_hidden_size=48"], "= 12 must be a multiple of 8"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.tiny_vision_hidden_size=48"], "model.tiny_vision_hidden_size (48) must be a multiple of 32"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.seed=18446744073709551616"], "model.seed=18446744073709551616 must be a seed in [0, 2**32 - 1]"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["data.shuffle_seed=-1"], "data.shuffle_seed=-1 must be a seed"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["trainer.torch_threads=0"], "trainer.torch_threads must be in [1, 4096], got 0"),
    # found by the config fuzz: torch.set_num_threads overflowed at start-up
    ("easyvqa_tiny_fastrl_grpo_cpu", ["trainer.torch_threads=1180591620717411303424"], "trainer.torch_threads must be in [1, 4096]"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["algorithm.gspo_clip_low=-0.1"], "algorithm.gspo_clip_low must be in [0, 1), got -0.1"),
    ("easyvqa_tiny_dapo_cpu", ["rollout.max_response_length=4"],
     "algorithm.overlong_cache_length (8) must be <= rollout.max_response_length (4)"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.timeout_s=inf"], "reward.timeout_s=inf is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.accuracy_threshold=nan"], "reward.accuracy_threshold=nan is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.max_invalid_fraction=1.5"], "reward.max_invalid_fraction must be in [0, 1], got 1.5"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.max_invalid_steps=0"], "reward.max_invalid_steps must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.name=gео3k"], "reward.name='gео3k': unknown reward"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["reward.name=/no/such/file.py:grade"], "reward.name='/no/such/file.py:grade': custom reward file"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["data.template=no_such_template"], "data.template='no_such_template': unknown prompt template"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["checkpoint.dir="], "checkpoint.dir='' is empty"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["model.megatron_checkpoint= "], "model.megatron_checkpoint=' ' is empty"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["stage.time_limit_s=nan"], "stage.time_limit_s=nan is not a finite number"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["stage.max_steps=0"], "stage.max_steps must be >= 1 or none, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["warm_start.batch_size=0"], "warm_start.batch_size must be >= 1, got 0"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["data.max_train_samples=0"], "data.max_train_samples must be >= 1 or none, got 0"),
    ("easyvqa_tiny_fastrl_refill_grpo_cpu", ["trainer.micro_batch_tokens=512"],
     "trainer.micro_batch_tokens=512 needs pruning.refill_to=free and parallel.pipeline_model_parallel_size=1 "
     "(got 'mini_batch' and 1)"),
    ("easyvqa_tiny_fastrl_grpo_cpu", ["trainer.micro_batch_tokens=512", "parallel.pipeline_model_parallel_size=2"],
     "(got 'free' and 2)"),
]


@pytest.mark.parametrize("recipe, overrides, message", _HOLES, ids=[" ".join(h[1]) for h in _HOLES])
def test_holes_are_refused(recipe, overrides, message):
    from fastrl.train import resolve_config

    with pytest.raises(ConfigError) as err:
        resolve_config(recipe, overrides)
    assert message in str(err.value)


def test_layout_is_checked_at_build_without_a_world_size():
    # 16 prompts x n=8 = 128 rollouts: micro-batch 48 divides it at no world size.
    with pytest.raises(ConfigError, match="parallel.world_size is not set"):
        RunConfig(parallel=cfg.ParallelConfig(micro_batch_size=48), trainer=cfg.TrainerConfig(mini_batch_prompts=16),
                  rollout=cfg.RolloutConfig(n=8, prompts_per_step=32))  # fmt: skip
    # ... while one that fits some world size builds; the launcher's is checked at start-up.
    config = RunConfig(parallel=cfg.ParallelConfig(micro_batch_size=64), trainer=cfg.TrainerConfig(mini_batch_prompts=16),
                       rollout=cfg.RolloutConfig(n=8, prompts_per_step=32))  # fmt: skip
    with pytest.raises(ConfigError, match=r"dp_size \(4\) x parallel.micro_batch_size \(64\)"):
        config.check_layout(4)


def test_every_float_field_refuses_nan_and_inf():
    from fastrl.cli import apply_overrides

    floats = [k for k, a in _leaf_annotations(RunConfig).items() if a in (float, float | None)]
    assert "optimizer.lr" in floats and "stage.time_limit_s" in floats
    for key in floats:
        for value in ("nan", "inf", "-inf"):
            with pytest.raises(ConfigError, match=re.escape(key)):
                apply_overrides(RunConfig(), [f"{key}={value}"])


def _leaf_annotations(cls, prefix=""):
    out = {}
    for f in dataclasses.fields(cls):
        annotation = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(annotation):
            out.update(_leaf_annotations(annotation, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = annotation
    return out


def test_reward_health_defaults_are_documented():
    docs = field_docs()
    assert RunConfig().reward.max_invalid_fraction == 0.5 and RunConfig().reward.max_invalid_steps == 3
    assert "reward/invalid_fraction" in docs["reward.max_invalid_fraction"]


def test_vllm_engine_refuses_sampling_its_log_probs_cannot_describe():
    # the vLLM engine's log-probs have one temperature, fixed when it starts (engine_client docstring):
    # at a temperature other than 1 they come after vLLM's processing, which top-p / top-k truncate
    vllm = dict(engine="vllm", engine_python="python")
    assert cfg.RolloutConfig(**vllm, temperature=0.5).temperature == 0.5
    assert cfg.RolloutConfig(**vllm, temperature=1.0, top_p=0.9).top_p == 0.9  # raw log-probs, not truncated
    assert cfg.RolloutConfig(engine="hf", temperature=0.5, top_p=0.9, val_temperature=0.3).top_p == 0.9
    with pytest.raises(ValueError, match=r"temperature=0.5 reports .* top_p=0.9"):
        cfg.RolloutConfig(**vllm, temperature=0.5, top_p=0.9)
    with pytest.raises(ValueError, match="top_k=20"):
        cfg.RolloutConfig(**vllm, temperature=0.5, top_k=20)
    with pytest.raises(ValueError, match=r"val_temperature=0.3 is neither"):
        cfg.RolloutConfig(**vllm, temperature=0.5, val_temperature=0.3)
    assert cfg.RolloutConfig(**vllm, temperature=0.5, val_temperature=0.5).val_temperature == 0.5
    assert cfg.RolloutConfig(**vllm, temperature=0.0, val_temperature=1.0).val_temperature == 1.0  # engine at 1
    with pytest.raises(ValueError, match=r"use 0 \(greedy\) or 1.0"):
        cfg.RolloutConfig(**vllm, temperature=0.0, val_temperature=0.5)
