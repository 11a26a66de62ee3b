"""The whole run: :class:`RunConfig` (one section per concern, cross-section validation, derived
settings) and :func:`field_docs` (dotted key -> documentation of every leaf field).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastrl.config.algorithm import (
    MISMATCH_TOLERANCE_AUTO,
    VERIFY_REFIT_TOLERANCE_AUTO,
    AdaptiveSamplingConfig,
    AlgorithmConfig,
    PruningConfig,
    RolloutConfig,
)
from fastrl.config.fields import _check, doc, section
from fastrl.config.model import ModelConfig, ParallelConfig, PrecisionConfig
from fastrl.config.nested import build_from_nested
from fastrl.config.training import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    OptimizerConfig,
    RewardConfig,
    StageConfig,
    TrainerConfig,
    WarmStartConfig,
)

__all__ = ["RunConfig", "field_docs"]


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
        _check_no_empty_strings(self)
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
            self.rollout.mismatch_tolerance != "auto" or self.precision.mode in MISMATCH_TOLERANCE_AUTO,
            f"rollout.mismatch_tolerance='auto' has no bound for precision.mode={self.precision.mode!r}; "
            f"set a number (or none)",
        )
        _check(
            self.adaptive_sampling.period != "stage" or self.stage.end_period_at_stage_end,
            "adaptive_sampling.period='stage' needs stage.end_period_at_stage_end=true",
        )
        _check(
            self.trainer.test_every == 0 or self.data.test_size > 0,
            f"trainer.test_every={self.trainer.test_every} evaluates the held-out test split, but data.test_size is 0; "
            "set data.test_size (the questions to evaluate)",
        )
        _check(
            not (self.trainer.old_log_probs == "engine" and self.logprobs_before_pruning),
            "trainer.old_log_probs='engine' takes the engine's log-probs for the rows of later updates, but "
            "trainer.logprobs_before_pruning / algorithm.kl_in_reward compute the trainer's old log-probs on the full "
            "batch before the advantages anyway: set trainer.old_log_probs=auto (or recompute)",
        )
        _check(
            not (self.pruning.drop_uniform_groups and self.pruning.zero_adv_kl == "sample")
            or (alg.use_kl_loss and alg.kl_coef > 0),
            "pruning.zero_adv_kl='sample' keeps uniform-group rollouts for the KL loss, but there is none "
            f"(algorithm.use_kl_loss={alg.use_kl_loss}, kl_coef={alg.kl_coef}): use pruning.zero_adv_kl='drop'",
        )
        mb = self.trainer.mini_batch_prompts
        _check(
            self.rollout.prompts_per_step % mb == 0,
            f"rollout.prompts_per_step ({self.rollout.prompts_per_step}) must be divisible by "
            f"trainer.mini_batch_prompts ({mb})",
        )
        if self.trainer.micro_batch_tokens > 0:  # a token budget needs unequal micro-batches
            _check(
                not self.equal_micro_batches,
                f"trainer.micro_batch_tokens={self.trainer.micro_batch_tokens} needs pruning.refill_to=free and "
                f"parallel.pipeline_model_parallel_size=1 (got {self.pruning.refill_to!r} and "
                f"{self.parallel.pipeline_model_parallel_size}): micro-batches are cut by parallel.micro_batch_size "
                "rows otherwise; set trainer.micro_batch_tokens=0",
            )
        if self.precision.mode == "fp8" and self.precision.fp8_recipe == "delayed":
            self._check_equal_fp8_forwards()
        # The launcher's world size is checked again at start-up (Trainer); without
        # parallel.world_size the smallest one (TP x PP processes, dp_size 1) is checked here: a
        # micro-batch that does not divide the mini-batch there divides it at no world size.
        if self.parallel.world_size is not None:
            self.check_layout(self.parallel.world_size)
        else:
            world = self.parallel.model_parallel_size
            self.check_layout(
                world, note=f" (at world size {world}, the smallest for this TP x PP; parallel.world_size is not set)"
            )
        if alg.overlong_shaping:
            _check(
                alg.overlong_cache_length <= self.rollout.max_response_length,
                f"algorithm.overlong_cache_length ({alg.overlong_cache_length}) must be <= "
                f"rollout.max_response_length ({self.rollout.max_response_length}) with algorithm.overlong_shaping=true",
            )
        if self.algorithm.dynamic_sampling:
            _check(
                self.algorithm.advantage_estimator != "rloo" or n >= 2,
                "DAPO dynamic sampling needs n >= 2",
            )

    def _check_equal_fp8_forwards(self) -> None:
        """FP8 delayed scaling all-reduces the amax over the data-parallel (x tensor-parallel) group
        at the end of every FP8 forward (Transformer Engine's ``fp8_autocast`` with megatron's amax
        reduction group), so every DP rank must run the same number of micro-batches in each pass;
        a rank with one more waits in that all-reduce forever. Refused: the settings that give DP
        ranks different micro-batch counts."""
        why = (
            "precision.fp8_recipe='delayed' all-reduces the FP8 amax over the data-parallel ranks in every forward, "
            "so every DP rank must run the same number of micro-batches"
        )
        _check(
            self.trainer.micro_batch_tokens == 0,
            f"{why}; trainer.micro_batch_tokens={self.trainer.micro_batch_tokens} cuts each rank's rows by its own "
            "token count (a hang in that all-reduce): set trainer.micro_batch_tokens=0, or precision.fp8_recipe=tensorwise",
        )
        uneven = [
            name for name, on in (
                ("algorithm.dynamic_sampling", self.algorithm.dynamic_sampling),
                ("pruning.method='greso'", self.pruning.method == "greso"),
            ) if on
        ]
        _check(
            not (self.logprobs_before_pruning and uneven),
            f"{why}; old/reference log-probs on the full batch (trainer.logprobs_before_pruning or "
            f"algorithm.kl_in_reward) with {' and '.join(uneven)} run on each rank's own number of rows (a hang in "
            "that all-reduce): compute them after pruning (trainer.logprobs_before_pruning=false, "
            "algorithm.kl_in_reward=false), or use precision.fp8_recipe=tensorwise",
        )

    def check_layout(self, world_size: int, *, note: str = "") -> None:
        """Validate the update geometry for ``world_size`` processes: when the config is built
        (``parallel.world_size``, or TP x PP processes when it is not set) and at start-up (the
        launcher's). ``note`` is appended to the message.

        Raises:
            ConfigError: the mini-batch in rollouts is not divisible by dp_size x micro_batch_size
                (the micro-batch does not divide the per-rank mini-batch).
        """
        dp, mbs = self.parallel.dp_size(world_size), self.parallel.micro_batch_size
        mb, n = self.trainer.mini_batch_prompts, self.rollout.n
        rollouts = mb * n
        _check(
            rollouts % (dp * mbs) == 0,
            f"the mini-batch of {mb} prompts x n={n} = {rollouts} rollouts is not divisible by "
            f"dp_size ({dp}) x parallel.micro_batch_size ({mbs}) = {dp * mbs}{note}",
        )

    # ---- derived settings the trainer documents in its log ----------------------------------

    @property
    def equal_micro_batches(self) -> bool:
        """Whether every micro-batch must hold ``parallel.micro_batch_size`` rollouts: always in the
        mini-batch geometry (``pruning.refill_to='mini_batch'``), and with pipeline parallelism
        (fixed activation shapes between stages)."""
        return self.pruning.refill_to != "free" or self.parallel.pipeline_model_parallel_size > 1

    @property
    def run_dir(self) -> Path:
        """The run directory: ``logging.output_dir / (logging.run_name or recipe)``."""
        return Path(self.logging.output_dir) / (self.logging.run_name or self.recipe)

    @property
    def logprobs_before_pruning(self) -> bool:
        """Whether old/reference log-probs must be computed on the full batch before pruning.

        Spec section 1 step 8: the faster order (log-probs after pruning) is valid only when
        nothing before the advantage needs them, i.e. KL is a loss term and not in the reward.
        """
        return self.trainer.logprobs_before_pruning or self.algorithm.kl_in_reward

    @property
    def on_policy_first_update(self) -> bool:
        """Whether the step's first optimizer update takes the detached log-probs of its own forward
        pass as its rows' old log-probs (``trainer.old_log_probs`` auto or engine, and the old
        log-probs are not needed before the advantages: :attr:`logprobs_before_pruning`)."""
        return self.trainer.old_log_probs != "recompute" and not self.logprobs_before_pruning

    @property
    def mismatch_tolerance(self) -> float | None:
        """The per-step engine/trainer mismatch guard's bound (``rollout.mismatch_tolerance``, with
        'auto' resolved by ``precision.mode``: :data:`~fastrl.config.algorithm.MISMATCH_TOLERANCE_AUTO`);
        None: the guard is off."""
        tol = self.rollout.mismatch_tolerance
        if tol == "auto":
            return MISMATCH_TOLERANCE_AUTO[self.precision.mode]
        return None if tol is None else float(tol)

    @property
    def verify_refit_tolerance(self) -> float:
        """The refit probe's bound (``rollout.verify_refit_tolerance``, with 'auto' resolved by
        ``precision.mode``: :data:`~fastrl.config.algorithm.VERIFY_REFIT_TOLERANCE_AUTO`)."""
        tol = self.rollout.verify_refit_tolerance
        return VERIFY_REFIT_TOLERANCE_AUTO[self.precision.mode] if tol == "auto" else float(tol)

    def update_multiple(self, dp_size: int, n: int | None = None) -> int:
        """Kept-rollout multiple for Phase-2 refill (spec 2.3).

        The reference uses the actor mini-batch in rollouts (``mini_batch_prompts x n``); this
        project also requires divisibility by ``dp_size x micro_batch_size`` so every DP rank gets
        whole micro-batches. Returns the least common multiple of the two.
        """
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
        return build_from_nested(cls, data, source=source)


def _check_no_empty_strings(obj: Any, prefix: str = "") -> None:
    """Refuse an empty (or blank) string in any string field: a path or a name, never meaningful
    empty (``""`` as a path is the working directory); optional fields take none instead."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_no_empty_strings(value, f"{prefix}{f.name}.")
        elif isinstance(value, str):
            _check(value.strip() != "", f"{prefix}{f.name}={value!r} is empty (an optional field takes none)")


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
