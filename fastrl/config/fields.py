"""Building blocks of the config dataclasses: the error type, documented fields, validation.

Every config field is declared with :func:`doc` (a default plus its documentation, read back by
``python -m fastrl.train --recipe NAME --describe``) or :func:`section` (a nested section built
from its own defaults). Validation goes through :func:`_check`, whose message names the values.
"""

from __future__ import annotations

import importlib.util
from dataclasses import field
from typing import Any


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
    """Raise :class:`ConfigError` with ``message`` (which names the values) unless ``condition``."""
    if not condition:
        raise ConfigError(message)
