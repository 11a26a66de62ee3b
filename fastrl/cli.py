"""Command-line configuration: ``--recipe NAME`` plus dotted ``key.path=value`` overrides.

Overrides are parsed against the dataclass annotations of :mod:`fastrl.config` (``int``,
``float``, ``bool``, ``str``, ``Literal[...]`` and ``X | None``; see :mod:`fastrl.config.nested`);
an unknown key is an error that names the closest known key. The config is validated again after
the overrides are applied; :func:`check_names` then resolves what it names (reward function, prompt
template), so that a typo fails before the run starts (also under ``--dry-run``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from fastrl.config import ConfigError, RunConfig, field_docs
from fastrl.config.nested import build_from_nested, closest_key_hint


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
            raise ConfigError(f"unknown config key {key!r}{closest_key_hint(key, list(known))}")
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return build_from_nested(RunConfig, nested, source="overrides")


def check_names(config: RunConfig) -> None:
    """Resolve ``reward.name`` (a custom ``path.py:function`` reward is imported) and
    ``data.template`` as the trainer will.

    Raises:
        ConfigError: naming the key and the value: unknown reward or template, missing file or
            function, a custom reward file that fails to import.
    """
    from fastrl.data import resolve_template
    from fastrl.rewards import RewardSpecError, get_reward

    try:
        get_reward(config.reward.name)
    except (RewardSpecError, ValueError, OSError) as err:
        raise ConfigError(f"reward.name={config.reward.name!r}: {err}") from None
    try:
        resolve_template(config.data.template)
    except FileNotFoundError as err:
        raise ConfigError(f"data.template={config.data.template!r}: {err}") from None


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
