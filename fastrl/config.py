"""Typed run configuration: keyword-only dataclasses, one section per concern.

A run is described by one :class:`RunConfig`. Recipes (``recipes/``) are functions returning one;
the command line applies dotted ``key.path=value`` overrides (:mod:`fastrl.cli`). Every field
carries its documentation in ``field(metadata={"doc": ...})`` (``python -m fastrl.train
--recipe NAME --describe`` prints it). Cross-field validation happens when a config is built and
raises :class:`ConfigError` naming the values involved.

Only this module defines defaults; nothing else repeats them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value, or a combination of values, that cannot run."""


def doc(default: Any, text: str, **kwargs: Any) -> Any:
    """A dataclass field with a default value and its documentation string."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": text}, **kwargs)
    return field(default=default, metadata={"doc": text}, **kwargs)


def section(cls: type, text: str) -> Any:
    """A nested config section built from its own defaults."""
    return field(default_factory=cls, metadata={"doc": text})


def transformer_engine_available() -> bool:
    """True when NVIDIA Transformer Engine can be imported (never on CPU-only machines)."""
    return importlib.util.find_spec("transformer_engine") is not None


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The policy architecture and where its initial weights come from."""

    source: Literal["tiny", "hf"] = doc(
        "tiny",
        "'tiny': build the small random Qwen2.5-VL-architecture model described by the tiny_* "
        "fields (CPU runs and tests); 'hf': a Hugging Face config or checkpoint directory in hf_path.",
    )
    hf_path: str | None = doc(
        None, "Hugging Face checkpoint (or config-only) directory; required when source='hf'."
    )
    architecture: Literal["qwen2_5_vl", "qwen2", "llama"] = doc(
        "qwen2_5_vl", "Model family. Text-only families go through the same megatron-bridge path."
    )
    megatron_checkpoint: str | None = doc(
        None,
        "Initial actor weights from a megatron distributed checkpoint made by "
        "tools/convert_checkpoint.py import (skips the HF conversion at start-up).",
    )
    tiny_hidden_size: int = doc(256, "Tiny model: language-model hidden size.")
    tiny_num_layers: int = doc(4, "Tiny model: language-model transformer layers.")
    tiny_num_attention_heads: int = doc(4, "Tiny model: attention heads (query).")
    tiny_num_key_value_heads: int = doc(2, "Tiny model: key/value heads (grouped-query attention).")
    tiny_intermediate_size: int = doc(512, "Tiny model: MLP intermediate size.")
    tiny_vision_depth: int = doc(2, "Tiny model: vision transformer blocks.")
    tiny_vision_hidden_size: int = doc(128, "Tiny model: vision transformer hidden size.")
    freeze_vision_tower: bool = doc(False, "Keep the vision tower (not the merger) frozen during RL.")
    seed: int = doc(1234, "Seed of the random initialization (tiny model) and of megatron's RNG tracker.")

    def __post_init__(self) -> None:
        _check(
            self.source != "hf" or bool(self.hf_path),
            "model.source='hf' needs model.hf_path (a Hugging Face checkpoint or config directory)",
        )
        _check(
            self.source != "tiny" or self.architecture == "qwen2_5_vl",
            f"model.source='tiny' builds a Qwen2.5-VL-architecture model, "
            f"but model.architecture={self.architecture!r}; use source='hf' for text-only models",
        )
        _check(
            self.tiny_hidden_size % self.tiny_num_attention_heads == 0,
            f"model.tiny_hidden_size ({self.tiny_hidden_size}) must be divisible by "
            f"model.tiny_num_attention_heads ({self.tiny_num_attention_heads})",
        )
        _check(
            self.tiny_num_attention_heads % self.tiny_num_key_value_heads == 0,
            f"model.tiny_num_attention_heads ({self.tiny_num_attention_heads}) must be divisible by "
            f"model.tiny_num_key_value_heads ({self.tiny_num_key_value_heads})",
        )


@dataclass(kw_only=True, frozen=True)
class ParallelConfig:
    """Tensor / pipeline / data parallel layout of the actor (megatron-core parallel state)."""

    tensor_model_parallel_size: int = doc(1, "Tensor-parallel size (TP).")
    pipeline_model_parallel_size: int = doc(1, "Pipeline-parallel size (PP), 1F1B schedule.")
    world_size: int | None = doc(
        None,
        "Expected number of processes (GPUs). None: taken from the launcher (torchrun, srun, mpirun) "
        "at start-up. Data-parallel size dp = world_size / (TP x PP).",
    )
    micro_batch_size: int = doc(1, "Rollouts per micro-batch per data-parallel rank.")
    sequence_parallel: bool = doc(False, "Megatron sequence parallelism (needs TP > 1).")
    use_distributed_optimizer: bool = doc(
        True, "Shard optimizer state across data-parallel ranks (megatron DistributedOptimizer)."
    )
    backend: Literal["auto", "nccl", "gloo"] = doc(
        "auto", "torch.distributed backend; 'auto' is NCCL with GPUs and gloo on CPU."
    )

    @property
    def model_parallel_size(self) -> int:
        """TP x PP: processes holding one replica of the model."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def dp_size(self, world_size: int | None = None) -> int:
        """Data-parallel size for ``world_size`` processes (default: the configured one).

        Raises:
            ConfigError: world size unknown or not divisible by TP x PP.
        """
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise ConfigError(
                "parallel.world_size is not set; pass the launcher's world size to dp_size()"
            )
        _check(
            world % self.model_parallel_size == 0,
            f"world size ({world}) must be divisible by tensor_model_parallel_size "
            f"({self.tensor_model_parallel_size}) x pipeline_model_parallel_size "
            f"({self.pipeline_model_parallel_size})",
        )
        return world // self.model_parallel_size

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size"):
            _check(getattr(self, name) >= 1, f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.world_size is not None:
            self.dp_size()
        _check(
            not self.sequence_parallel or self.tensor_model_parallel_size > 1,
            "parallel.sequence_parallel=true needs tensor_model_parallel_size > 1",
        )


@dataclass(kw_only=True, frozen=True)
class PrecisionConfig:
    """Numeric precision of the actor: parameters, compute, and FP8 through Transformer Engine."""

    mode: Literal["fp32", "bf16", "fp8"] = doc(
        "fp32",
        "fp32: everything in fp32. bf16: bf16 parameters and compute, fp32 master weights and "
        "optimizer state (megatron mixed precision). fp8: bf16 as above plus FP8 GEMMs through "
        "Transformer Engine layers (GPU only; refused when Transformer Engine is missing).",
    )
    fp8_format: Literal["e4m3", "hybrid"] = doc(
        "hybrid", "FP8 format: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients)."
    )
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = doc(
        "delayed", "FP8 scaling recipe, as megatron-core 0.16 names them."
    )
    fp8_amax_history_len: int = doc(1024, "Delayed scaling: amax history length (steps).")
    fp8_amax_compute_algo: Literal["max", "most_recent"] = doc(
        "max", "Delayed scaling: how the scale is derived from the amax history."
    )
    fp8_margin: int = doc(0, "Delayed scaling: margin (powers of two) of the FP8 scale.")

    @property
    def params_dtype(self) -> str:
        """'float32' or 'bfloat16': dtype of model parameters."""
        return "float32" if self.mode == "fp32" else "bfloat16"

    def __post_init__(self) -> None:
        if self.mode != "fp8":
            return
        _check(
            not (self.fp8_recipe == "mxfp8" and self.fp8_format == "hybrid"),
            "precision.fp8_recipe='mxfp8' does not support precision.fp8_format='hybrid' "
            "(MXFP8 uses e4m3 block scales); set precision.fp8_format=e4m3",
        )
        _check(
            transformer_engine_available(),
            "precision.mode='fp8' needs NVIDIA Transformer Engine, which is not importable here; "
            "install requirements/gpu.txt on a CUDA machine, or choose precision.mode=bf16. "
            "FastRL never falls back to bf16 silently when FP8 was requested.",
        )


@dataclass(kw_only=True, frozen=True)
class RolloutConfig:
    """Generation of the rollout groups."""

    engine: Literal["hf", "vllm"] = doc(
        "hf",
        "Rollout engine: 'hf' is the in-process Hugging Face engine (CPU, tests); 'vllm' the "
        "colocated vLLM engine for GPU clusters (requirements/gpu.txt).",
    )
    n: int = doc(8, "Responses per prompt (group size); the adaptive sampler's n_max.")
    prompts_per_step: int = doc(32, "Prompts per training step (global, over all DP ranks).")
    temperature: float = doc(1.0, "Sampling temperature of training rollouts.")
    top_p: float = doc(1.0, "Nucleus sampling threshold of training rollouts.")
    top_k: int = doc(-1, "Top-k sampling of training rollouts (-1: off).")
    max_prompt_length: int = doc(512, "Longest prompt in tokens (image tokens included); longer prompts are filtered at load.")
    max_response_length: int = doc(64, "Most tokens generated per response.")
    val_temperature: float = doc(0.0, "Validation decoding temperature (0: greedy).")
    val_n: int = doc(1, "Responses per validation question (pass@k with k = val_n).")
    engine_tensor_parallel_size: int = doc(1, "vLLM: tensor parallel size inside the engine.")
    gpu_memory_utilization: float = doc(0.6, "vLLM: fraction of GPU memory for weights and KV cache.")
    sleep_between_steps: bool = doc(
        True, "vLLM: release the engine's GPU memory during training (sleep/wake)."
    )
    suppress_special_tokens: bool = doc(
        True,
        "Never sample image/video/vision-start/end, bos or pad tokens (a sampled image placeholder "
        "breaks the next forward pass).",
    )
    keep_rollout_budget_constant: bool = doc(
        False,
        "When the adaptive sampler lowers n, raise prompts per step to keep prompts x n constant "
        "(beyond the paper; off reproduces it).",
    )
    seed: int = doc(0, "Seed of rollout sampling.")

    def __post_init__(self) -> None:
        _check(self.n >= 1, f"rollout.n must be >= 1, got {self.n}")
        _check(self.prompts_per_step >= 1, f"rollout.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        _check(self.temperature >= 0, f"rollout.temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"rollout.top_p must be in (0, 1], got {self.top_p}")
        _check(self.max_response_length >= 1, "rollout.max_response_length must be >= 1")
        _check(0 < self.gpu_memory_utilization <= 1, "rollout.gpu_memory_utilization must be in (0, 1]")


@dataclass(kw_only=True, frozen=True)
class AlgorithmConfig:
    """Advantage estimator, policy loss and KL (spec section 4)."""

    name: Literal["grpo", "dapo", "gspo"] = doc("grpo", "Base algorithm (for logs and defaults of recipes).")
    advantage_estimator: Literal["grpo", "drgrpo", "rloo"] = doc(
        "grpo", "grpo: (r - mean) / (std + eps) per group; drgrpo: r - mean; rloo: leave-one-out baseline."
    )
    std_unbiased: bool = doc(True, "GRPO: unbiased (N-1) standard deviation.")
    adv_eps: float = doc(1e-6, "GRPO: epsilon added to the group standard deviation.")
    loss_type: Literal["ppo", "gspo", "gspo_token"] = doc(
        "ppo", "Policy loss: per-token PPO clipped surrogate, or GSPO (sequence ratio) / GSPO-token."
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = doc(
        "token_mean", "Loss aggregation over the mini-batch (denominator reduced once over DP)."
    )
    clip_low: float = doc(0.2, "PPO: lower clip range (ratio >= 1 - clip_low).")
    clip_high: float = doc(0.3, "PPO: upper clip range (ratio <= 1 + clip_high); DAPO clip-higher.")
    dual_clip_c: float | None = doc(3.0, "Dual clip constant c (> 1) for negative advantages; None: off.")
    gspo_clip_low: float = doc(3e-4, "GSPO: lower clip of the sequence ratio.")
    gspo_clip_high: float = doc(4e-4, "GSPO: upper clip of the sequence ratio.")
    use_kl_loss: bool = doc(True, "KL to the reference policy as a loss term.")
    kl_in_reward: bool = doc(
        False,
        "Fold KL into the reward instead (then old/reference log-probs must be computed before "
        "pruning, on the full batch).",
    )
    kl_coef: float = doc(0.01, "KL coefficient.")
    kl_estimator: Literal["k1", "k2", "low_var_kl"] = doc("low_var_kl", "KL estimator (k3 = low_var_kl).")
    dynamic_sampling: bool = doc(
        False, "DAPO: drop groups whose accuracy is all 0 or all 1 and sample more prompts."
    )
    max_dynamic_sampling_rounds: int = doc(
        3, "DAPO: extra generation rounds at most; when exhausted, train on what was collected (warned)."
    )
    overlong_shaping: bool = doc(False, "DAPO: soft overlong punishment of long responses.")
    overlong_cache_length: int = doc(16, "DAPO: L_cache of the overlong punishment, in tokens.")
    ppo_epochs: int = doc(1, "Passes of policy updates over each step's batch.")
    tis_cap: float | None = doc(
        2.0,
        "Truncated importance sampling of the engine/trainer log-prob mismatch: cap of the ratio "
        "exp(logp_old - logp_engine); None: no correction.",
    )
    tis_level: Literal["token", "sequence"] = doc("token", "Truncated IS per token or per sequence.")

    @property
    def group_relative(self) -> bool:
        """True for estimators that compare responses within a group (need n >= 2)."""
        return self.advantage_estimator in ("grpo", "drgrpo", "rloo")

    def __post_init__(self) -> None:
        _check(0 <= self.clip_low < 1, f"algorithm.clip_low must be in [0, 1), got {self.clip_low}")
        _check(self.clip_high >= 0, f"algorithm.clip_high must be >= 0, got {self.clip_high}")
        _check(
            self.dual_clip_c is None or self.dual_clip_c > 1,
            f"algorithm.dual_clip_c must be > 1 or None, got {self.dual_clip_c}",
        )
        _check(
            not (self.use_kl_loss and self.kl_in_reward),
            "algorithm.use_kl_loss and algorithm.kl_in_reward are both true; choose one place for KL",
        )
        _check(self.kl_coef >= 0, f"algorithm.kl_coef must be >= 0, got {self.kl_coef}")
        _check(
            self.loss_type == "ppo" or self.loss_agg == "seq_mean_token_mean",
            f"algorithm.loss_type={self.loss_type!r} aggregates per sequence; "
            f"set algorithm.loss_agg=seq_mean_token_mean (got {self.loss_agg!r})",
        )
        _check(self.max_dynamic_sampling_rounds >= 0, "algorithm.max_dynamic_sampling_rounds must be >= 0")
        _check(self.ppo_epochs >= 1, "algorithm.ppo_epochs must be >= 1")
        _check(self.tis_cap is None or self.tis_cap >= 1, "algorithm.tis_cap must be >= 1 or None")


@dataclass(kw_only=True, frozen=True)
class PruningConfig:
    """Rollout pruning after advantage estimation (MDAP and baselines; spec section 2)."""

    method: Literal["none", "fastrl", "cppo", "random", "advantage_only"] = doc(
        "fastrl",
        "none: train on every rollout; fastrl: MDAP (advantage buckets + Jaccard diversity); "
        "cppo: top-k |advantage| per group; random: random subset; advantage_only: one random "
        "rollout per advantage bucket.",
    )
    semantics: Literal["reference", "paper"] = doc(
        "reference", "MDAP semantics: the released reference code (default) or the paper's text."
    )
    similarity_threshold: float = doc(0.2, "MDAP: Jaccard similarity threshold (paper tau = 1 - this).")
    ngram: int = doc(1, "MDAP: token n-gram size of the Jaccard sets.")
    adv_tolerance: float = doc(1e-4, "MDAP 'paper' semantics: advantage bucket tolerance.")
    refill: Literal["round_robin", "global_abs_adv"] = doc(
        "round_robin", "Phase-2 refill order up to the update geometry's multiple."
    )
    similarity_mode: Literal["exact", "minhash"] = doc(
        "exact",
        "exact: DP ranks exchange response token ids; minhash: a MinHash signature per rollout "
        "(approximate, a few hundred bytes per rollout).",
    )
    minhash_num_perm: int = doc(
        128, "MinHash sketch size (bins, a power of two in [16, 4096]); 2 bytes per bin per rollout."
    )
    keep_ratio: float = doc(0.5, "cppo / random: fraction of each group kept.")
    allow_padding: bool = doc(
        False,
        "When too few pruned rollouts exist to refill to a multiple, pad instead of failing.",
    )
    seed: int = doc(0, "Seed of the random and advantage-only pruners.")
    weighting: Literal["none", "bucket_size"] = doc(
        "none",
        "none: kept rollouts train with weight 1 (paper and reference); bucket_size: each kept "
        "rollout's advantage is scaled by (members / kept) of its advantage bucket, normalized to "
        "mean 1, so every bucket weighs what it did before pruning (beyond the paper; see "
        "fastrl/algorithms/prune_weights.py).",
    )

    def __post_init__(self) -> None:
        _check(0 <= self.similarity_threshold <= 1, "pruning.similarity_threshold must be in [0, 1]")
        _check(self.ngram >= 1, f"pruning.ngram must be >= 1, got {self.ngram}")
        _check(0 < self.keep_ratio <= 1, f"pruning.keep_ratio must be in (0, 1], got {self.keep_ratio}")
        _check(
            16 <= self.minhash_num_perm <= 4096 and self.minhash_num_perm & (self.minhash_num_perm - 1) == 0,
            f"pruning.minhash_num_perm must be a power of two in [16, 4096], got {self.minhash_num_perm}",
        )


@dataclass(kw_only=True, frozen=True)
class AdaptiveSamplingConfig:
    """Adaptive rollout sampling (ARS, spec section 3): the group size shrinks from pruning history."""

    enabled: bool = doc(True, "Re-decide the group size n at period boundaries.")
    period: Literal["epoch", "steps", "stage"] = doc(
        "epoch", "Period boundary: every epoch (paper), every period_steps steps, or each Slurm stage end."
    )
    period_steps: int = doc(50, "Steps per period when period='steps'.")
    n_min: int = doc(2, "Smallest group size (a group needs two members).")

    def __post_init__(self) -> None:
        _check(self.n_min >= 2, f"adaptive_sampling.n_min must be >= 2, got {self.n_min}")
        _check(self.period_steps >= 1, "adaptive_sampling.period_steps must be >= 1")


@dataclass(kw_only=True, frozen=True)
class DataConfig:
    """Training and validation data."""

    dataset: Literal["easy_vqa", "geometry3k", "geoqa8k", "math", "canonical"] = doc(
        "easy_vqa",
        "easy_vqa: embedded data from the easy-vqa package; geometry3k / geoqa8k / math: Hugging "
        "Face parquet (or jsonl) files in train_path / val_path; canonical: files written by "
        "tools/prepare_data.py.",
    )
    train_path: str | None = doc(None, "Training split file (not used by easy_vqa).")
    val_path: str | None = doc(None, "Validation split file (not used by easy_vqa).")
    template: str = doc(
        "easy_vqa_thinking",
        "Prompt template: a name under recipes/templates/ (without .jinja) or a path to a .jinja file.",
    )
    image_size: int = doc(56, "easy_vqa: images are resized to this square size (pixels).")
    min_pixels: int = doc(56 * 56, "Qwen2.5-VL image processor: lower bound on pixels per image.")
    max_pixels: int = doc(1024 * 28 * 28, "Qwen2.5-VL image processor: upper bound on pixels per image.")
    val_size: int = doc(2000, "Validation questions used (from the held-out split).")
    max_train_samples: int | None = doc(None, "Use at most this many training questions.")
    on_bad_row: Literal["error", "skip"] = doc(
        "error", "A corrupt row: fail at start-up naming file, row and reason, or skip and count it."
    )
    cache_dir: str | None = doc(None, "Where converted data is cached (default ~/.cache/fastrl).")
    shuffle_seed: int = doc(0, "Seed of the epoch shuffling of prompts.")

    def __post_init__(self) -> None:
        _check(
            self.dataset in ("easy_vqa",) or bool(self.train_path),
            f"data.dataset={self.dataset!r} needs data.train_path (and data.val_path)",
        )
        _check(self.min_pixels <= self.max_pixels, "data.min_pixels must be <= data.max_pixels")
        _check(self.val_size >= 1, "data.val_size must be >= 1")


@dataclass(kw_only=True, frozen=True)
class RewardConfig:
    """Reward function and grading workers."""

    name: str = doc(
        "easy_vqa",
        "Reward function: geo3k, geoqa8k, math, easy_vqa, easy_vqa_strict, or 'path.py:function' for "
        "a custom one (called as fn(response, ground_truth)).",
    )
    num_workers: int = doc(2, "Grading worker threads.")
    timeout_s: float = doc(10.0, "Per-response grading timeout; a timeout marks the reward invalid.")
    accuracy_threshold: float = doc(
        0.5, "Accuracy at or above this counts as correct (accuracy metrics, DAPO filtering)."
    )

    def __post_init__(self) -> None:
        _check(self.num_workers >= 1, "reward.num_workers must be >= 1")
        _check(self.timeout_s > 0, "reward.timeout_s must be > 0")


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """Actor optimizer (megatron-core Adam) and learning-rate schedule."""

    lr: float = doc(1e-6, "Peak learning rate.")
    min_lr: float = doc(0.0, "Final learning rate of a decaying schedule.")
    weight_decay: float = doc(1e-2, "Decoupled weight decay (AdamW).")
    adam_beta1: float = doc(0.9, "Adam beta1.")
    adam_beta2: float = doc(0.999, "Adam beta2.")
    adam_eps: float = doc(1e-8, "Adam epsilon.")
    clip_grad: float = doc(1.0, "Global gradient-norm clipping (0: off).")
    lr_warmup_steps: int = doc(0, "Linear warm-up, in optimizer steps.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = doc("constant", "Schedule after warm-up.")

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        _check(0 <= self.min_lr <= self.lr, "optimizer.min_lr must be in [0, optimizer.lr]")
        _check(self.clip_grad >= 0, "optimizer.clip_grad must be >= 0")


@dataclass(kw_only=True, frozen=True)
class WarmStartConfig:
    """Supervised warm start before RL (the tiny CPU policy starts from random weights)."""

    enabled: bool = doc(False, "Run (or reuse from cache) a supervised warm start before RL.")
    vision_warmup_steps: int = doc(
        150, "Steps that train the vision tower and merger through linear attribute heads first."
    )
    sft_steps: int = doc(25, "Supervised fine-tuning steps on formatted answers.")
    batch_size: int = doc(64, "Warm-start batch size (samples).")
    lr: float = doc(1e-3, "Warm-start learning rate.")
    aux_loss_weight: float = doc(0.3, "Weight of the attribute-head loss kept on during SFT.")
    cache: bool = doc(True, "Reuse a cached warm start with the same settings.")


@dataclass(kw_only=True, frozen=True)
class TrainerConfig:
    """Length of training, update geometry and validation."""

    epochs: int = doc(1, "Epochs over the training prompts.")
    max_steps: int | None = doc(None, "Stop after this many steps (None: epochs decide).")
    mini_batch_prompts: int = doc(
        32,
        "Prompts per policy-update mini-batch (EasyR1's global_batch_size). The kept rollouts are "
        "refilled to a multiple of this x n (reference) and of dp_size x micro_batch_size.",
    )
    val_every: int = doc(20, "Validate every K steps (0: only at the end).")
    val_before_train: bool = doc(True, "Validate the starting policy.")
    val_only: bool = doc(
        False,
        "Validate the starting policy (after the warm start, or the checkpoint being resumed) and "
        "exit: no training step, no checkpoint written.",
    )
    logprobs_before_pruning: bool = doc(
        False,
        "Compute old/reference log-probs on the full batch before pruning. Forced on when KL is "
        "folded into the reward; otherwise the faster after-pruning path is used.",
    )
    seed: int = doc(1, "Global seed (data order, dropout, sampling unless overridden).")
    torch_threads: int = doc(2, "torch intra-op threads per process on CPU.")

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, "trainer.epochs must be >= 1")
        _check(self.max_steps is None or self.max_steps >= 1, "trainer.max_steps must be >= 1")
        _check(self.mini_batch_prompts >= 1, "trainer.mini_batch_prompts must be >= 1")
        _check(self.val_every >= 0, "trainer.val_every must be >= 0")


@dataclass(kw_only=True, frozen=True)
class CheckpointConfig:
    """Distributed checkpoints of the actor and the exact train state."""

    dir: str | None = doc(None, "Checkpoint directory (default: <run_dir>/checkpoints).")
    save_every: int = doc(0, "Save every K steps (0: only at the end and on a stop signal).")
    keep_last: int = doc(2, "Complete checkpoints kept (best is kept in addition).")
    resume: str = doc("auto", "'auto': the newest complete checkpoint if any; 'none'; or a directory.")
    save_optimizer: bool = doc(True, "Include optimizer state (needed for exact resume).")
    optimizer_format: Literal["fully_reshardable", "dp_reshardable"] = doc(
        "fully_reshardable",
        "DistributedOptimizer state layout in the checkpoint (megatron-core sharding types): "
        "'fully_reshardable' is stored per parameter in model space (gathered on DP rank 0 while "
        "saving) and resumes at any TP/PP/DP layout; 'dp_reshardable' stores each rank's flat "
        "buffer shard (no gather, less memory at save) and resumes only at the same TP/PP sizes.",
    )

    def __post_init__(self) -> None:
        _check(self.keep_last >= 1, "checkpoint.keep_last must be >= 1")
        _check(self.save_every >= 0, "checkpoint.save_every must be >= 0")


@dataclass(kw_only=True, frozen=True)
class LoggingConfig:
    """Metrics and console output."""

    output_dir: str = doc("runs", "Runs are written under this directory.")
    run_name: str | None = doc(None, "Run directory name (default: the recipe name).")
    tensorboard: bool = doc(True, "Write TensorBoard events when tensorboard is installed.")
    wandb_project: str | None = doc(None, "Weights & Biases project (None: off).")
    progress_bar: bool = doc(True, "Progress bar on rank 0.")
    log_every: int = doc(1, "Print a metrics line every K steps.")


@dataclass(kw_only=True, frozen=True)
class StageConfig:
    """One Slurm stage of a chained run (slurm/submit.sh)."""

    max_steps: int | None = doc(None, "Steps this stage trains at most (None: until the run ends).")
    time_limit_s: float | None = doc(
        None, "Stop (save and exit 0) before this many seconds of wall time in this stage."
    )
    end_period_at_stage_end: bool = doc(
        True, "With adaptive_sampling.period='stage': end the ARS period when the stage ends."
    )
    exit_signal: Literal["USR1", "TERM"] = doc("USR1", "Signal that asks for save-and-exit.")


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """Everything one FastRL run needs."""

    recipe: str = doc("custom", "Name of the recipe this config was built from.")
    model: ModelConfig = section(ModelConfig, "Policy architecture and initial weights.")
    parallel: ParallelConfig = section(ParallelConfig, "TP / PP / DP layout.")
    precision: PrecisionConfig = section(PrecisionConfig, "fp32 / bf16 / fp8.")
    rollout: RolloutConfig = section(RolloutConfig, "Rollout generation.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "Advantages, loss, KL.")
    pruning: PruningConfig = section(PruningConfig, "MDAP and baseline pruners.")
    adaptive_sampling: AdaptiveSamplingConfig = section(AdaptiveSamplingConfig, "ARS.")
    data: DataConfig = section(DataConfig, "Datasets.")
    reward: RewardConfig = section(RewardConfig, "Reward function.")
    optimizer: OptimizerConfig = section(OptimizerConfig, "Optimizer and LR schedule.")
    warm_start: WarmStartConfig = section(WarmStartConfig, "Supervised warm start.")
    trainer: TrainerConfig = section(TrainerConfig, "Training length and update geometry.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "Checkpoints.")
    logging: LoggingConfig = section(LoggingConfig, "Metrics and console.")
    stage: StageConfig = section(StageConfig, "Slurm stage.")

    def __post_init__(self) -> None:
        n, alg = self.rollout.n, self.algorithm
        _check(
            not alg.group_relative or n >= 2,
            f"rollout.n={n} but algorithm.advantage_estimator={alg.advantage_estimator!r} is "
            f"group-relative and needs at least 2 responses per prompt",
        )
        _check(
            not self.adaptive_sampling.enabled or self.adaptive_sampling.n_min <= n,
            f"adaptive_sampling.n_min ({self.adaptive_sampling.n_min}) must be <= rollout.n ({n})",
        )
        _check(
            self.adaptive_sampling.period != "stage" or self.stage.end_period_at_stage_end,
            "adaptive_sampling.period='stage' needs stage.end_period_at_stage_end=true",
        )
        mb = self.trainer.mini_batch_prompts
        _check(
            self.rollout.prompts_per_step % mb == 0,
            f"rollout.prompts_per_step ({self.rollout.prompts_per_step}) must be divisible by "
            f"trainer.mini_batch_prompts ({mb})",
        )
        if self.parallel.world_size is not None:
            self.check_layout(self.parallel.world_size)
        if self.algorithm.dynamic_sampling:
            _check(
                self.algorithm.advantage_estimator != "rloo" or n >= 2,
                "DAPO dynamic sampling needs n >= 2",
            )

    def check_layout(self, world_size: int) -> None:
        """Validate the update geometry for ``world_size`` processes (the launcher's, at start-up).

        Raises:
            ConfigError: the mini-batch in rollouts is not divisible by dp_size x micro_batch_size.
        """
        dp, mbs = self.parallel.dp_size(world_size), self.parallel.micro_batch_size
        mb, n = self.trainer.mini_batch_prompts, self.rollout.n
        rollouts = mb * n
        _check(
            rollouts % (dp * mbs) == 0,
            f"the mini-batch of {mb} prompts x n={n} = {rollouts} rollouts is not divisible by "
            f"dp_size ({dp}) x parallel.micro_batch_size ({mbs}) = {dp * mbs}",
        )

    # ---- derived settings the trainer documents in its log ----------------------------------

    @property
    def logprobs_before_pruning(self) -> bool:
        """Whether old/reference log-probs must be computed on the full batch before pruning.

        Spec section 1 step 8: the faster order (log-probs after pruning) is valid only when
        nothing before the advantage needs them, i.e. KL is a loss term and not in the reward.
        """
        return self.trainer.logprobs_before_pruning or self.algorithm.kl_in_reward

    def update_multiple(self, dp_size: int, n: int | None = None) -> int:
        """Kept-rollout multiple for Phase-2 refill (spec 2.3).

        The reference uses the actor mini-batch in rollouts (``mini_batch_prompts x n``); this
        project also requires divisibility by ``dp_size x micro_batch_size`` so every DP rank gets
        whole micro-batches. Returns the least common multiple of the two.
        """
        import math

        group = self.rollout.n if n is None else n
        return math.lcm(self.trainer.mini_batch_prompts * group, dp_size * self.parallel.micro_batch_size)

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (JSON-serializable) of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> "RunConfig":
        """Build (and validate) a config from a nested dict, e.g. one stored in a checkpoint.

        Raises:
            ConfigError: an unknown key (with the closest known key) or an invalid value.
        """
        from fastrl.cli import build_from_nested  # local: cli depends on this module

        return build_from_nested(cls, data, source=source)


def field_docs(cls: type = RunConfig, prefix: str = "") -> dict[str, str]:
    """Dotted key -> documentation of every leaf field under ``cls``."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            out.update(field_docs(f.default_factory, key + "."))
        else:
            out[key] = f.metadata.get("doc", "")
    return out
