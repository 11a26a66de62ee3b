"""Building blocks of the config dataclasses: the error type, documented fields, validation.

Every config field is declared with :func:`doc` (a default plus its documentation, read back by
``python -m fastrl.train --recipe NAME --describe``) or :func:`section` (a nested section built
from its own defaults). Validation goes through :func:`_check`, whose message names the values;
:func:`_check_finite` and :func:`_check_seed` are the rules every section applies to its float and
seed fields.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import field
from typing import Any

#: Largest accepted seed: every consumer (numpy, torch, megatron's RNG tracker) takes it.
MAX_SEED = 2**32 - 1


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
    """True when NVIDIA Transformer Engine's PyTorch layers can be imported (never on CPU-only
    machines). The core package alone is not enough: ``transformer_engine.pytorch`` is the torch
    extension the layers need (built separately, requirements/gpu-trainer-te.txt), and a core
    install without it fails only when the first TE layer is built."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception:  # a broken or partial install raises ImportError, OSError (missing CUDA libs), ...
        return False
    return True


def _check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` (which names the values) unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def _check_finite(section_obj: Any, prefix: str) -> None:
    """Refuse ``nan`` and ``inf`` in every float field of the config section ``section_obj``.

    No field means anything by a non-finite value (a comparison with ``nan`` is always false, so
    a ``nan`` would slip through every range check); optional ones are switched off with None.
    """
    for f in dataclasses.fields(section_obj):
        value = getattr(section_obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                f"{prefix}.{f.name}={value} is not a finite number (nan and inf are refused; "
                f"a field that can be switched off takes none)"
            )


def _check_seed(value: int, key: str) -> None:
    """Refuse a seed outside ``[0, MAX_SEED]`` (numpy refuses negative seeds, torch huge ones)."""
    _check(0 <= value <= MAX_SEED, f"{key}={value} must be a seed in [0, 2**32 - 1]")
