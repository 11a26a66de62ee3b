"""Typed run configuration: keyword-only dataclasses, one section per concern.

A run is described by one :class:`RunConfig`. Recipes (``recipes/``) are functions returning one;
the command line applies dotted ``key.path=value`` overrides (:mod:`fastrl.cli`). Every field
carries its documentation in ``field(metadata={"doc": ...})`` (``python -m fastrl.train
--recipe NAME --describe`` prints it). Cross-field validation happens when a config is built and
raises :class:`ConfigError` naming the values involved.

Only this package defines defaults; nothing else repeats them. Modules:

- :mod:`~fastrl.config.fields`: ``ConfigError``, the documented-field helpers, validation.
- :mod:`~fastrl.config.model`: model, parallel layout, precision.
- :mod:`~fastrl.config.algorithm`: rollout, algorithm (advantages / loss / KL), pruning, adaptive sampling.
- :mod:`~fastrl.config.training`: data, reward, optimizer, warm start, trainer, checkpoint, logging, stage.
- :mod:`~fastrl.config.run`: ``RunConfig`` and ``field_docs``.
- :mod:`~fastrl.config.nested`: nested dict -> dataclass with typed values (``RunConfig.from_dict``, the CLI).
"""

from fastrl.config.algorithm import AdaptiveSamplingConfig, AlgorithmConfig, PruningConfig, RolloutConfig
from fastrl.config.fields import ConfigError, doc, section, transformer_engine_available
from fastrl.config.model import ModelConfig, ParallelConfig, PrecisionConfig, check_machine_supports
from fastrl.config.run import RunConfig, field_docs
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

__all__ = [
    "AdaptiveSamplingConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "PruningConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "StageConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "doc",
    "field_docs",
    "section",
    "check_machine_supports",
    "transformer_engine_available",
]
