"""Nested dict -> config dataclass, type-checking every value against the field annotations.

Used by :meth:`fastrl.config.RunConfig.from_dict` (configs stored in checkpoints) and by the
command line (:mod:`fastrl.cli`, dotted ``key.path=value`` overrides). Supported annotations:
``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]`` (``[a,b]`` on
the command line) and nested config dataclasses.
Strings are parsed (``"none"`` / ``"null"`` / ``"~"`` -> None, ``"true"`` / ``"off"`` ... ->
bool, ``"1_000"`` -> 1000); an unknown key is an error that names the closest known key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Sequence

from fastrl.config.fields import ConfigError

__all__ = ["build_from_nested", "closest_key_hint"]

_NONE_WORDS = {"none", "null", "~"}
_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}


def closest_key_hint(key: str, candidates: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` naming the candidate closest to ``key`` ("" when there is none)."""
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.0)
    return f"; did you mean {match[0]!r}?" if match else ""


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Convert ``value`` (a string from the command line, or a JSON value) to ``annotation``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE_WORDS):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: cannot parse {value!r}")
    if origin is tuple:  # tuple[X, ...]: "[a,b]", "a,b", "[]" on the command line; a list or tuple in JSON
        item_type = typing.get_args(annotation)[0]
        if isinstance(value, str):
            text = value.strip()
            if text[:1] + text[-1:] in ("[]", "()"):
                text = text[1:-1]
            items: list[Any] = [part.strip().strip("'\"") for part in text.split(",") if part.strip()]
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            raise ConfigError(f"{key}={value!r} is not a list (use [a,b])")
        return tuple(_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(items))
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value in choices:
            return value
        raise ConfigError(f"{key}={value!r} is not one of {list(choices)}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ConfigError(f"{key}={value!r} is not a boolean (use true or false)")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} is not an integer")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value) if not isinstance(value, str) else int(value.strip().replace("_", ""))
        except ValueError:
            raise ConfigError(f"{key}={value!r} is not an integer") from None
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r} is not a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r} is not a number") from None
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} is not a string")
    raise ConfigError(f"{key}: unsupported field type {annotation!r}")


def build_from_nested(cls: type, data: dict[str, Any], *, source: str = "config", prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict, type-checking every value.

    Args:
        cls: a config dataclass (nested sections are built recursively).
        data: key -> value; values are coerced to the field annotations, missing keys keep defaults.
        source: where ``data`` comes from, for error messages ("overrides", a checkpoint path).
        prefix: dotted path of ``cls`` inside the run config (recursion; "" at the top).

    Raises:
        ConfigError: unknown key (with the closest known one), wrong type, or failed validation.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            known = [prefix + n for n in names]
            raise ConfigError(f"{source}: unknown key {prefix + key!r}{closest_key_hint(prefix + key, known)}")
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = build_from_nested(annotation, value, source=source, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, annotation, prefix + key)
    return cls(**kwargs)
