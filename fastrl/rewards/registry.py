"""Reward functions by name: built-ins and custom ``path.py:function`` rewards (:func:`load_reward`;
the public entry point is :func:`fastrl.rewards.get_reward`)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from fastrl.rewards.easy_vqa_reward import easy_vqa_reward, easy_vqa_strict_reward
from fastrl.rewards.geometry import geo3k_reward, geoqa8k_reward
from fastrl.rewards.math_reward import math_reward
from fastrl.rewards.result import RewardResult

RewardFn = Callable[[str, str], RewardResult]
"""``fn(response, ground_truth) -> RewardResult``. The response only: never the prompt."""

_BUILTIN: dict[str, RewardFn] = {
    "geo3k": geo3k_reward,
    "geoqa8k": geoqa8k_reward,
    "math": math_reward,
    "easy_vqa": easy_vqa_reward,
    "easy_vqa_strict": easy_vqa_strict_reward,
}


class RewardSpecError(ValueError):
    """A reward name or ``path.py:function`` spec that cannot be resolved."""


def list_rewards() -> list[str]:
    """Names of the built-in rewards."""
    return sorted(_BUILTIN)


def is_custom_spec(name: str) -> bool:
    """Whether ``name`` looks like a custom ``path.py:function`` spec."""
    path, sep, _ = name.rpartition(":")
    return bool(sep) and path.endswith(".py")


def load_reward(name: str) -> RewardFn:
    """The reward function ``name`` itself, unbounded: :func:`fastrl.rewards.get_reward` without
    ``timeout_s`` (its docstring documents the names and the return values). It grades in the calling
    thread with no time limit; the grading workers call it.

    Raises:
        RewardSpecError: unknown name, missing file, missing or non-callable function.
    """
    if name in _BUILTIN:
        return _BUILTIN[name]
    if is_custom_spec(name):
        path, _, function = name.rpartition(":")
        return _custom_reward(str(Path(path).expanduser().resolve()), function)
    raise RewardSpecError(
        f"unknown reward {name!r}; choose one of {list_rewards()} or give 'path/to/file.py:function'"
    )


@functools.lru_cache(maxsize=None)
def _custom_reward(path: str, function: str) -> RewardFn:
    file = Path(path)
    if not file.is_file():
        raise RewardSpecError(f"custom reward file {path} does not exist (from spec '{path}:{function}')")
    module_name = f"fastrl_custom_reward_{file.stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RewardSpecError(f"cannot import custom reward file {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardSpecError(f"importing custom reward file {path} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, function, None)
    if fn is None:
        raise RewardSpecError(f"custom reward file {path} has no function {function!r}")
    if not callable(fn):
        raise RewardSpecError(f"{path}:{function} is not callable (it is a {type(fn).__name__})")

    @functools.wraps(fn)
    def reward(response: str, ground_truth: str) -> RewardResult:
        return as_reward_result(fn(response, ground_truth), source=f"{path}:{function}")

    return reward


def as_reward_result(value: object, *, source: str) -> RewardResult:
    """Convert a custom reward's return value (see :func:`fastrl.rewards.get_reward`) to a :class:`RewardResult`.

    Raises:
        TypeError: any other return type, or a bool (ambiguous), naming ``source``.
        ValueError: a mapping without the three keys, or a non-finite number in a valid result.
    """
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, Mapping):
        missing = [k for k in ("overall", "format", "accuracy") if k not in value]
        if missing:
            raise ValueError(f"reward {source} returned a mapping without {missing}: {dict(value)!r}")
        result = RewardResult(
            overall=float(value["overall"]),
            format=float(value["format"]),
            accuracy=float(value["accuracy"]),
            valid=bool(value.get("valid", True)),
            error=value.get("error"),
        )
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = RewardResult(overall=float(value), format=0.0, accuracy=float(value))
    else:
        raise TypeError(
            f"reward {source} returned {type(value).__name__}; return a RewardResult, a mapping with "
            "overall/format/accuracy, or a number"
        )
    if result.valid and not all(math.isfinite(v) for v in (result.overall, result.format, result.accuracy)):
        raise ValueError(f"reward {source} returned a non-finite score in a valid result: {result}")
    return result
