"""Command-line configuration: ``--recipe NAME`` plus dotted ``key.path=value`` overrides.

Overrides are parsed against the dataclass annotations of :mod:`fastrl.config` (``int``,
``float``, ``bool``, ``str``, ``Literal[...]`` and ``X | None``); an unknown key is an error that
names the closest known key. The config is validated again after the overrides are applied.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Literal, Sequence

from fastrl.config import ConfigError, RunConfig, field_docs

_NONE_WORDS = {"none", "null", "~"}
_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}


def _closest(key: str, candidates: Sequence[str]) -> str:
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


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build_from_nested(cls: type, data: dict[str, Any], *, source: str = "config", prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested dict, type-checking every value.

    Raises:
        ConfigError: unknown key (with the closest known one), wrong type, or failed validation.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            known = [prefix + n for n in names]
            raise ConfigError(f"{source}: unknown key {prefix + key!r}{_closest(prefix + key, known)}")
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = build_from_nested(annotation, value, source=source, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, annotation, prefix + key)
    return cls(**kwargs)


def apply_overrides(config: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """Return ``config`` with ``key.path=value`` overrides applied and validated again.

    Raises:
        ConfigError: malformed override, unknown key (naming the closest key), or invalid value.
    """
    known = field_docs()
    nested = config.to_dict()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        key, value = item.split("=", 1)
        key = key.strip()
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}{_closest(key, list(known))}")
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return build_from_nested(RunConfig, nested, source="overrides")


def format_config(config: RunConfig) -> str:
    """The resolved config as indented JSON."""
    return json.dumps(config.to_dict(), indent=2, sort_keys=False)


def describe_config(config: RunConfig) -> str:
    """Every key with its current value and its documentation, one per line."""
    flat: dict[str, Any] = {}

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                flat[prefix + f.name] = value

    walk(config, "")
    docs = field_docs()
    return "\n".join(f"{key} = {flat[key]!r}\n    {docs[key]}" for key in flat)
