"""Config sections around the RL step: data, reward, optimizer, supervised warm start, training
length, checkpoints, logging and the Slurm stage of a chained run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fastrl.config.fields import _check, _check_finite, _check_seed, doc

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "LoggingConfig",
    "OptimizerConfig",
    "RewardConfig",
    "StageConfig",
    "TrainerConfig",
    "WarmStartConfig",
]


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
    test_path: str | None = doc(
        None, "Held-out test split file (not used by easy_vqa, whose test split is its own); read only when data.test_size > 0."
    )
    template: str = doc(
        "easy_vqa_thinking",
        "Prompt template: a name under fastrl/data/templates/ (without .jinja) or a path to a .jinja file.",
    )
    image_size: int = doc(56, "easy_vqa: images are resized to this square size (pixels).")
    min_pixels: int = doc(56 * 56, "Qwen2.5-VL image processor: lower bound on pixels per image.")
    max_pixels: int = doc(1024 * 28 * 28, "Qwen2.5-VL image processor: upper bound on pixels per image.")
    val_size: int = doc(
        2000,
        "Validation questions used: the first N of the validation split (easy_vqa: at most its 2,000; "
        "every choice of setting is made on these).",
    )
    test_size: int = doc(
        0,
        "Held-out test questions evaluated on the final policy when the run completes, every "
        "trainer.test_every steps when set, and by trainer.val_only: the first N of the test split, "
        "logged as test/* (kind 'test'); 0: none. easy_vqa: up to 7,673 "
        "questions disjoint from the validation ones; a split with fewer is an error.",
    )
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
        _check(self.image_size >= 1, f"data.image_size must be >= 1, got {self.image_size}")
        _check(self.min_pixels >= 1, f"data.min_pixels must be >= 1, got {self.min_pixels}")
        _check(
            self.min_pixels <= self.max_pixels,
            f"data.min_pixels ({self.min_pixels}) must be <= data.max_pixels ({self.max_pixels})",
        )
        _check(self.val_size >= 1, f"data.val_size must be >= 1, got {self.val_size}")
        _check(
            self.dataset != "easy_vqa" or self.val_size <= 2000,
            f"data.val_size={self.val_size}: easy_vqa's validation split holds 2000 questions (the package's "
            "other 7,673 test questions are the held-out test split: data.test_size)",
        )
        _check(self.test_size >= 0, f"data.test_size must be >= 0, got {self.test_size}")
        _check(
            self.test_size == 0 or self.dataset == "easy_vqa" or bool(self.test_path),
            f"data.test_size={self.test_size} needs data.test_path (dataset {self.dataset!r})",
        )
        _check(
            self.max_train_samples is None or self.max_train_samples >= 1,
            f"data.max_train_samples must be >= 1 or none, got {self.max_train_samples}",
        )
        _check_seed(self.shuffle_seed, "data.shuffle_seed")

    @property
    def prompt_image_size(self) -> int | None:
        """Square size (pixels) images are resized to before the processor: ``image_size`` for
        easy_vqa, None (the processor's min/max_pixels alone) for every other dataset."""
        return self.image_size if self.dataset == "easy_vqa" else None


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
    max_invalid_fraction: float = doc(
        0.5,
        "Stop the run with an error when more than this fraction of a step's rewards are invalid "
        "(grader error, timeout or crash) for reward.max_invalid_steps consecutive steps; the "
        "fraction is logged every step as reward/invalid_fraction. 1: never stop on the fraction "
        "(a run whose every reward was invalid still fails at its end).",
    )
    max_invalid_steps: int = doc(
        3, "Consecutive steps over reward.max_invalid_fraction that stop the run (see there)."
    )

    def __post_init__(self) -> None:
        _check_finite(self, "reward")
        _check(self.num_workers >= 1, f"reward.num_workers must be >= 1, got {self.num_workers}")
        _check(self.timeout_s > 0, f"reward.timeout_s must be > 0, got {self.timeout_s}")
        _check(
            0 < self.accuracy_threshold <= 1,
            f"reward.accuracy_threshold must be in (0, 1], got {self.accuracy_threshold}",
        )
        _check(
            0 <= self.max_invalid_fraction <= 1,
            f"reward.max_invalid_fraction must be in [0, 1], got {self.max_invalid_fraction}",
        )
        _check(self.max_invalid_steps >= 1, f"reward.max_invalid_steps must be >= 1, got {self.max_invalid_steps}")


@dataclass(kw_only=True, frozen=True)
class OptimizerConfig:
    """Actor optimizer (megatron-core Adam) and learning-rate schedule."""

    lr: float = doc(1e-6, "Peak learning rate.")
    min_lr: float = doc(
        0.0,
        "Final learning rate of a decaying schedule, reached at the end of the last step in every "
        "update geometry (the schedule is set on the RL step, fastrl.training.geometry.lr_positions).",
    )
    weight_decay: float = doc(1e-2, "Decoupled weight decay (AdamW).")
    adam_beta1: float = doc(0.9, "Adam beta1.")
    adam_beta2: float = doc(0.999, "Adam beta2.")
    adam_eps: float = doc(1e-8, "Adam epsilon.")
    clip_grad: float = doc(1.0, "Global gradient-norm clipping (0: off).")
    lr_warmup_steps: int = doc(
        0,
        "Linear warm-up, in schedule units: optimizer updates of an unpruned step, U = ppo_epochs x "
        "prompts_per_step / mini_batch_prompts per RL step (a step making fewer updates still "
        "advances the schedule by U). Capped at the run's steps x U - 1.",
    )
    lr_decay_style: Literal["constant", "linear", "cosine"] = doc("constant", "Schedule after warm-up.")

    def __post_init__(self) -> None:
        _check_finite(self, "optimizer")
        _check(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        _check(
            0 <= self.min_lr <= self.lr,
            f"optimizer.min_lr must be in [0, optimizer.lr={self.lr}], got {self.min_lr}",
        )
        _check(self.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("adam_beta1", "adam_beta2"):
            _check(0 <= getattr(self, name) < 1, f"optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
        _check(self.adam_eps > 0, f"optimizer.adam_eps must be > 0, got {self.adam_eps}")
        _check(self.clip_grad >= 0, f"optimizer.clip_grad must be >= 0, got {self.clip_grad}")
        _check(self.lr_warmup_steps >= 0, f"optimizer.lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")


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

    def __post_init__(self) -> None:
        _check_finite(self, "warm_start")
        for name in ("vision_warmup_steps", "sft_steps"):
            _check(getattr(self, name) >= 0, f"warm_start.{name} must be >= 0, got {getattr(self, name)}")
        _check(self.batch_size >= 1, f"warm_start.batch_size must be >= 1, got {self.batch_size}")
        _check(self.lr > 0, f"warm_start.lr must be > 0, got {self.lr}")
        _check(self.aux_loss_weight >= 0, f"warm_start.aux_loss_weight must be >= 0, got {self.aux_loss_weight}")


@dataclass(kw_only=True, frozen=True)
class TrainerConfig:
    """Length of training, update geometry and validation."""

    epochs: int = doc(1, "Epochs over the training prompts.")
    max_steps: int | None = doc(None, "Stop after this many steps (None: epochs decide).")
    max_train_time_s: float | None = doc(
        None,
        "Also stop, as a completed run (final validation, checkpoint, test evaluation, FINISHED), after "
        "the first step at which the training time (time/train_elapsed: the sum of step times, "
        "validation, evaluation and checkpoints excluded) reaches this many seconds; None: no time "
        "stop. The step count (max_steps / epochs) stays the schedule's horizon (LR decay, ARS's "
        "progress): set it above the steps the budget allows. For comparisons at equal training time.",
    )
    mini_batch_prompts: int = doc(
        32,
        "Prompts per policy-update mini-batch (EasyR1's global_batch_size). The kept rollouts are "
        "refilled to a multiple of this x n (reference) and of dp_size x micro_batch_size.",
    )
    micro_batch_tokens: int = doc(
        0,
        "Token budget of an update micro-batch with pruning.refill_to=free (verl use_dynamic_bsz): "
        "each rank's update share is cut into consecutive micro-batches of at most this many real "
        "tokens (prompt + response; a longer rollout gets its own): the fewest such, cut where the "
        "padded tokens are fewest (none padded beyond a greedy fill's largest). 0: micro-batches of "
        "parallel.micro_batch_size rollouts (the last may be shorter). The loss is normalized by "
        "the global token count, so the gradient does not depend on the cut. Refused with pipeline "
        "parallelism or pruning.refill_to=mini_batch (both need equal micro-batches).",
    )
    val_every: int = doc(20, "Validate every K steps (0: only at the end).")
    test_every: int = doc(
        0,
        "Also evaluate the held-out test split (data.test_size questions) every K steps (0: once, when "
        "the run completes): curves that are reported, such as time to an accuracy, then come from "
        "questions no choice looked at. Never decides a checkpoint.",
    )
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
    old_log_probs: Literal["auto", "recompute", "engine"] = doc(
        "auto",
        "Where the PPO ratio's old-policy log-probs come from. auto: the step's first optimizer "
        "update is on-policy (the engine generated its rows with the weights being updated), so its "
        "rows take the detached log-probs of the update's own forward pass (exact; no old-policy "
        "pass for them), and the trainer's old-policy pass runs only over the rows of the step's "
        "later updates; with trainer.logprobs_before_pruning or algorithm.kl_in_reward the old "
        "log-probs are needed before the advantages, and the pass runs on every row. recompute: the "
        "old-policy pass on every row. engine: as auto, but the later updates' rows take the rollout "
        "engine's log-probs instead of a trainer pass (no old-policy pass at all; biased by the "
        "engine/trainer numerics, docs/algorithm.md, 'Old-policy log-probs'; refused with "
        "log-probs before pruning).",
    )
    group_by_length: bool = doc(
        True,
        "Sort each optimizer update's rows by length (longest first) before cutting them into "
        "micro-batches, and the old / reference passes' rows likewise (results put back in order), so "
        "a micro-batch of short rows does not compute on one long row's padding. Exact: every update "
        "keeps its rows and the loss is a token sum over its global token count. False: the rows in "
        "the order pruning left them (the ablation; actor/padding_fraction reports the difference).",
    )
    seed: int = doc(1, "Global seed (data order, dropout, sampling unless overridden).")
    torch_threads: int = doc(2, "torch intra-op threads per process on CPU.")
    max_skipped_updates: int = doc(
        3,
        "An optimizer update whose loss or gradient is not finite (NaN / inf) is skipped, as megatron-LM "
        "skips an overflowing iteration (actor/update_skipped, actor/skipped_updates_total); the run stops "
        "with an error naming the step when this many updates in a row were skipped (1: at the first).",
    )

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, f"trainer.epochs must be >= 1, got {self.epochs}")
        _check(
            self.max_steps is None or self.max_steps >= 1, f"trainer.max_steps must be >= 1 or none, got {self.max_steps}"
        )
        _check(self.mini_batch_prompts >= 1, f"trainer.mini_batch_prompts must be >= 1, got {self.mini_batch_prompts}")
        _check(self.micro_batch_tokens >= 0, f"trainer.micro_batch_tokens must be >= 0, got {self.micro_batch_tokens}")
        _check(self.val_every >= 0, f"trainer.val_every must be >= 0, got {self.val_every}")
        _check(self.test_every >= 0, f"trainer.test_every must be >= 0, got {self.test_every}")
        _check(
            self.max_train_time_s is None or (math.isfinite(self.max_train_time_s) and self.max_train_time_s > 0),
            f"trainer.max_train_time_s must be a finite number > 0 or none, got {self.max_train_time_s}",
        )
        _check_seed(self.seed, "trainer.seed")
        _check(1 <= self.torch_threads <= 4096, f"trainer.torch_threads must be in [1, 4096], got {self.torch_threads}")
        _check(self.max_skipped_updates >= 1, f"trainer.max_skipped_updates must be >= 1, got {self.max_skipped_updates}")


@dataclass(kw_only=True, frozen=True)
class CheckpointConfig:
    """Distributed checkpoints of the actor and the exact train state."""

    dir: str | None = doc(None, "Checkpoint directory (default: <run_dir>/checkpoints).")
    save_every: int = doc(0, "Save every K steps (0: only at the end and on a stop signal).")
    keep_last: int = doc(2, "Complete checkpoints kept (best is kept in addition).")
    save_at_train_s: tuple[float, ...] = doc(
        (),
        "Training times (seconds of time/train_elapsed, increasing) at which to keep a checkpoint: one "
        "after the first step whose training time reaches each, e.g. [600,1200,1800]. Kept for good "
        "(keep_last does not delete them), to be evaluated after training (bench/eval_checkpoints.py) "
        "so that evaluation never runs on the training clock.",
    )
    save_at_steps: tuple[int, ...] = doc(
        (), "Steps (increasing, >= 1) after which to keep a checkpoint for good, as save_at_train_s."
    )
    resume: str = doc("auto", "'auto': the newest complete checkpoint if any; 'none'; or a directory.")
    save_optimizer: bool = doc(True, "Include optimizer state (needed for exact resume; tools/drop_optimizer.py removes it from kept checkpoints afterwards).")
    optimizer_format: Literal["fully_reshardable", "dp_reshardable"] = doc(
        "fully_reshardable",
        "DistributedOptimizer state layout in the checkpoint (megatron-core sharding types): "
        "'fully_reshardable' is stored per parameter in model space (gathered onto every DP rank "
        "while saving) and resumes at any TP/PP/DP layout; 'dp_reshardable' stores each rank's flat "
        "buffer shard (no gather, less memory at save) and resumes only at the same TP/PP sizes.",
    )
    fully_parallel_save: bool = doc(
        True,
        "Spread the writing of replicated tensors over the data-parallel ranks (megatron-core's "
        "FullyParallelSaveStrategyWrapper over the DP group, Megatron-LM's --ckpt-fully-parallel-save, "
        "on by default there too); false: the first DP rank writes every replicated tensor (at TP1 PP1 "
        "the model and the gathered fully_reshardable optimizer state). The files load either way.",
    )
    allow_changed: tuple[str, ...] = doc(
        (),
        "Resume although these config keys changed since the checkpoint was written: dotted keys "
        "(data.train_path) or section prefixes (data), e.g. checkpoint.allow_changed=[data,rollout.n]; "
        "data.fingerprint names the training records' content digest. Without it, a change that "
        "would silently make another run (data.*, rollout.*, algorithm.*, pruning.*, "
        "parallel.micro_batch_size, ...) is refused; logging / stage / optimizer / schedule / "
        "layout changes are always accepted (README, 'Checkpoints and exact resume').",
    )

    def __post_init__(self) -> None:
        _check(self.keep_last >= 1, "checkpoint.keep_last must be >= 1")
        _check(self.save_every >= 0, "checkpoint.save_every must be >= 0")
        times = list(self.save_at_train_s)
        _check(
            all(math.isfinite(t) and t > 0 for t in times) and times == sorted(set(times)),
            f"checkpoint.save_at_train_s must be finite seconds > 0 in increasing order, got {times}",
        )
        steps = list(self.save_at_steps)
        _check(
            all(isinstance(k, int) and k >= 1 for k in steps) and steps == sorted(set(steps)),
            f"checkpoint.save_at_steps must be steps >= 1 in increasing order, got {steps}",
        )
        _check(
            all(isinstance(k, str) and k.strip() for k in self.allow_changed),
            f"checkpoint.allow_changed entries must be config keys or sections, got {list(self.allow_changed)}",
        )


@dataclass(kw_only=True, frozen=True)
class LoggingConfig:
    """Metrics and console output."""

    output_dir: str = doc("runs", "Runs are written under this directory.")
    run_name: str | None = doc(None, "Run directory name (default: the recipe name).")
    tensorboard: bool = doc(True, "Write TensorBoard events when tensorboard is installed.")
    wandb_project: str | None = doc(None, "Weights & Biases project (None: off).")
    progress_bar: bool = doc(True, "Progress bar on rank 0.")
    plots: bool = doc(
        True, "At the end of a run or stage, draw the run's metrics to <run dir>/plots/*.png "
        "(fastrl/training/plots.py; tools/plot_run.py draws them later from metrics.jsonl)."
    )
    log_every: int = doc(1, "Print a metrics line every K steps.")
    rollouts_every: int = doc(
        0, "Write every rollout of every K-th step (prompt, response text and token ids, reward, advantage, "
        "kept or pruned) to <run dir>/rollouts/dp<rank>.jsonl (0: never); bench/prune_text.py reads them."
    )

    def __post_init__(self) -> None:
        _check(self.log_every >= 1, f"logging.log_every must be >= 1, got {self.log_every}")
        _check(self.rollouts_every >= 0, f"logging.rollouts_every must be >= 0, got {self.rollouts_every}")


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

    def __post_init__(self) -> None:
        _check_finite(self, "stage")
        _check(self.max_steps is None or self.max_steps >= 1, f"stage.max_steps must be >= 1 or none, got {self.max_steps}")
        _check(
            self.time_limit_s is None or self.time_limit_s > 0,
            f"stage.time_limit_s must be > 0 or none, got {self.time_limit_s}",
        )
