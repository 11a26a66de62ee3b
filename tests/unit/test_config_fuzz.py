"""Fuzzing the command line: dotted overrides over every config field, with values of the field's
type and edge values (0, -1, nan, inf, huge, empty string, junk).

Properties: building a recipe with the overrides either succeeds or raises ``ConfigError`` (never
another exception type); a config that builds passes ``--dry-run``, round-trips through the JSON
stored in checkpoints, and passes the start-up steps that need no model (sampling parameters, the
prompt sampler, the reward scorer, the LR schedule, the overlong penalty, the seeded generators,
the batch layout at the smallest world size, torch threads).
The holes this found are refused in ``fastrl/config`` (see ``test_config.py::test_holes_are_refused``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import types
import typing
from typing import Literal

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastrl.config import ConfigError, RunConfig
from fastrl.train import main, resolve_config
from recipes import list_recipes

EDGE_VALUES = ["0", "-1", "-2", "nan", "inf", "-inf", "1e30", str(2**70), "", " ", "none", "junk"]


def _leaves(cls: type, prefix: str = "") -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, typing.Any] = {}
    for f in dataclasses.fields(cls):
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            out.update(_leaves(annotation, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = annotation
    return out


LEAVES = _leaves(RunConfig)


def _values(annotation: typing.Any) -> st.SearchStrategy[str]:
    """Command-line strings for a field of type ``annotation``: typed values plus edge values."""
    origin = typing.get_origin(annotation)
    edge = st.sampled_from(EDGE_VALUES)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[_values(a) for a in typing.get_args(annotation) if a is not type(None)])
    if origin is Literal:
        return st.one_of(st.sampled_from([str(c) for c in typing.get_args(annotation)]), edge)
    if origin is tuple:
        return st.one_of(st.sampled_from(["[]", "[optimizer.lr]", "[a,b]", "[,]"]), edge)
    if annotation is bool:
        return st.one_of(st.sampled_from(["true", "false"]), edge)
    if annotation is int:
        return st.one_of(st.integers(-4, 5000).map(str), st.sampled_from(["1", "2", "4", "8", "2.5"]), edge)
    if annotation is float:
        return st.one_of(st.floats(-10, 1e4, allow_nan=False).map(repr), st.sampled_from(["1e-6", "0.5", "1.0", "1"]), edge)
    if annotation is str:
        return st.one_of(st.text(max_size=6), edge)
    raise TypeError(f"no strategy for {annotation!r}")


OVERRIDES = st.sampled_from(sorted(LEAVES)).flatmap(lambda key: _values(LEAVES[key]).map(lambda v: f"{key}={v}"))


def _start_up_without_a_model(config: RunConfig) -> None:
    """What the trainer derives from the config before it needs a model, data or processes."""
    from fastrl.algorithms.filters import overlong_penalty
    from fastrl.data import ResumableSampler
    from fastrl.rewards import RewardScorer
    from fastrl.rollout.engine import SamplingParams
    from fastrl.training.actor import build_lr_scheduler
    from fastrl.training.geometry import updates_per_step_estimate
    from fastrl.training.parts import total_steps
    from fastrl.training.seeds import derive_seed

    SamplingParams.for_training(config.rollout, seed=derive_seed(config.rollout.seed, 1, 0))
    SamplingParams.for_validation(config.rollout, seed=derive_seed(config.rollout.seed, 10**9))
    sampler = ResumableSampler(50, seed=config.data.shuffle_seed)
    sampler.next_batch(min(config.rollout.prompts_per_step, 200))
    RewardScorer(config.reward.name, num_workers=config.reward.num_workers, timeout_s=config.reward.timeout_s).close()
    steps = total_steps(config, 100) * updates_per_step_estimate(config)
    optimizer = types.SimpleNamespace(param_groups=[{"params": [], "lr": 0.0, "weight_decay": 0.0}])
    scheduler = build_lr_scheduler(optimizer, config.optimizer, min(steps, 10))
    scheduler.step(increment=1)
    if config.algorithm.overlong_shaping:
        overlong_penalty(torch.tensor([0, config.rollout.max_response_length]), config.rollout.max_response_length,
                         config.algorithm.overlong_cache_length)  # fmt: skip
    for seed in (config.model.seed, config.trainer.seed, config.rollout.seed, config.pruning.seed):
        torch.Generator().manual_seed(seed + 2718)  # megatron's RNG tracker adds offsets like this
    world = config.parallel.world_size or config.parallel.model_parallel_size  # the smallest launch
    config.check_layout(world)  # what the Trainer checks against the launcher's world size
    config.update_multiple(config.parallel.dp_size(world))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(config.trainer.torch_threads)
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(recipe=st.sampled_from(list_recipes()), overrides=st.lists(OVERRIDES, min_size=1, max_size=3))
def test_overrides_build_or_raise_config_error(recipe, overrides):
    try:
        config = resolve_config(recipe, overrides)
    except ConfigError:
        return
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["--recipe", recipe, *overrides, "--dry-run"]) == 0
    assert f'"recipe": {json.dumps(config.recipe)}' in out.getvalue()
    stored = json.loads(json.dumps(config.to_dict()))  # the form a checkpoint keeps
    assert json.dumps(RunConfig.from_dict(stored).to_dict()) == json.dumps(config.to_dict())
    _start_up_without_a_model(config)
