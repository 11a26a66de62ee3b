"""What may change between the config a checkpoint was written with and the config resuming it.

At resume, :class:`~fastrl.checkpoint.io.CheckpointIO` compares the two configs key by key
(:func:`diff_configs`) and logs every changed key, old -> new. Each key falls in one class
(:func:`classify`; the most specific rule wins: an exact key, then the longest section prefix):

``harmless``
    Accepted and listed: where and how often things are logged, saved and validated, the Slurm
    stage budget, grading workers, the rollout backend's resources, the warm start (the checkpoint
    replaces the starting weights). See :data:`HARMLESS`.
``schedule``
    Accepted and applied for real: ``optimizer.*`` (peak / minimum LR, warm-up, decay style, weight
    decay, Adam betas and epsilon, gradient clipping) and the run length (``trainer.max_steps``,
    ``trainer.epochs``). The LR scheduler is built from the new config and keeps only the
    checkpoint's step count, so the decay horizon follows the new total. See :data:`SCHEDULE`.
``layout``
    Accepted: the TP / PP / DP layout (the checkpoint is resharded; a ``dp_reshardable`` optimizer
    state still refuses a TP/PP change). See :data:`LAYOUT`.
``refused``
    Everything else (``data.*``, ``rollout.n`` and the other rollout settings, ``algorithm.*``,
    ``pruning.*``, ``adaptive_sampling.*``, ``parallel.micro_batch_size``, ``precision.*``,
    ``model.*``, ``reward.name``, seeds, ...): the resumed run would silently be another run than
    the one checkpointed (other prompts, another sampler position, another loss). The resume stops
    with a :class:`~fastrl.checkpoint.manager.CheckpointError` naming the keys, unless
    ``checkpoint.allow_changed`` names each of them (a dotted key or a section prefix).

The pseudo-keys :data:`DATA_FINGERPRINT` (``data.fingerprint``: a digest of the training records'
text, :func:`records_fingerprint`) and :data:`IMAGES_FINGERPRINT` (``data.images_fingerprint``: a
digest of their encoded images, :func:`images_fingerprint`) take part in the comparison like
``data.*`` keys, so a different data file with the same size and settings is refused too, and so is
the same file with other images. A checkpoint written before a fingerprint existed has nothing to
compare for it (the resume logs that it cannot check). A key present in only one of the two
configs (a config written by another version of FastRL) is listed and accepted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

HARMLESS = "harmless"
SCHEDULE = "schedule"
LAYOUT = "layout"
REFUSED = "refused"

#: Pseudo-key of the training data's content digest (stored in ``train_state.pt``).
DATA_FINGERPRINT = "data.fingerprint"
#: Pseudo-key of the training images' content digest (stored in ``train_state.pt``).
IMAGES_FINGERPRINT = "data.images_fingerprint"
FINGERPRINT_KEYS = (DATA_FINGERPRINT, IMAGES_FINGERPRINT)

#: Keys (or section prefixes) accepted and only listed.
HARMLESS_KEYS: tuple[str, ...] = (
    "recipe",
    "logging",
    "stage",
    "checkpoint.dir",
    "checkpoint.keep_last",
    "checkpoint.save_every",
    "checkpoint.save_at_train_s",
    "checkpoint.save_at_steps",
    "checkpoint.resume",
    "checkpoint.allow_changed",
    "checkpoint.optimizer_format",  # the loader reads the format the checkpoint was written in
    "checkpoint.fully_parallel_save",  # who writes which file; the same checkpoint either way
    "trainer.val_every",
    "trainer.test_every",
    "trainer.val_before_train",
    "data.test_size",  # the held-out test split is evaluated at the end and decides nothing
    "data.test_path",
    "trainer.val_only",
    "trainer.torch_threads",
    "trainer.max_skipped_updates",  # a guard's bound: stops a run, never changes what it computes
    "reward.num_workers",
    "reward.timeout_s",
    "reward.max_invalid_fraction",
    "reward.max_invalid_steps",
    "rollout.engine",
    "rollout.engine_tensor_parallel_size",
    "rollout.gpu_memory_utilization",
    "rollout.sleep_between_steps",
    "rollout.engine_python",
    "rollout.engine_timeout_s",
    "rollout.engine_startup_timeout_s",
    "rollout.engine_restart_retries",
    "rollout.engine_kv_cache_mb",
    "rollout.engine_threads",
    "rollout.refit_bucket_mb",
    "rollout.verify_refit_every",
    "rollout.verify_refit_tolerance",
    "rollout.mismatch_tolerance",  # a guard's bound: stops a run, never changes what it computes
    "warm_start",
)
#: Keys applied to the optimizer, the LR schedule and the run length.
SCHEDULE_KEYS: tuple[str, ...] = ("optimizer", "trainer.max_steps", "trainer.epochs", "trainer.max_train_time_s")
#: Keys of the parallel layout the checkpoint is resharded to.
LAYOUT_KEYS: tuple[str, ...] = (
    "parallel.tensor_model_parallel_size",
    "parallel.pipeline_model_parallel_size",
    "parallel.world_size",
    "parallel.sequence_parallel",
    "parallel.backend",
)

_RULES: dict[str, str] = {
    **{k: HARMLESS for k in HARMLESS_KEYS},
    **{k: SCHEDULE for k in SCHEDULE_KEYS},
    **{k: LAYOUT for k in LAYOUT_KEYS},
}

_WHAT = {
    HARMLESS: "accepted",
    SCHEDULE: "applied to the optimizer / LR schedule / run length",
    LAYOUT: "accepted, the checkpoint is resharded",
}

_ABSENT = object()


def matches(key: str, pattern: str) -> bool:
    """True when ``pattern`` is ``key`` itself or a section prefix of it (``data`` matches ``data.train_path``)."""
    pattern = pattern.strip().rstrip(".")
    return bool(pattern) and (key == pattern or key.startswith(pattern + "."))


def classify(key: str) -> str:
    """The class of a dotted config key: ``harmless``, ``schedule``, ``layout`` or ``refused``."""
    best, kind = -1, REFUSED
    for pattern, rule in _RULES.items():
        if matches(key, pattern) and len(pattern) > best:
            best, kind = len(pattern), rule
    return kind


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict -> ``{"section.key": value}`` (lists and tuples compare alike)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = tuple(value) if isinstance(value, list) else value
    return out


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between the checkpoint's config and this run's.

    Attributes:
        key: dotted key.
        old / new: the checkpoint's value and this run's (:data:`MISSING` text when the key is absent).
        kind: :func:`classify` of the key (``harmless`` for a key present in only one config).
        allowed: a ``refused`` key named by ``checkpoint.allow_changed``.
    """

    key: str
    old: Any
    new: Any
    kind: str
    allowed: bool = False

    @property
    def accepted(self) -> bool:
        """True unless the change is refused (a refused key not named by ``checkpoint.allow_changed``)."""
        return self.kind != REFUSED or self.allowed

    def describe(self) -> str:
        """``optimizer.lr: 0.0001 -> 0.0002 (schedule: applied to ...)``, one log line."""
        if self.kind == REFUSED:
            what = "refused by default, allowed by checkpoint.allow_changed" if self.allowed else "REFUSED: not in checkpoint.allow_changed"
        else:
            what = f"{self.kind}: {_WHAT[self.kind]}"
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)} ({what})"


MISSING = "<absent>"


def _show(value: Any) -> str:
    return MISSING if value is _ABSENT else repr(value)


def diff_configs(
    saved: Mapping[str, Any], new: Mapping[str, Any], *, allow_changed: Sequence[str] = ()
) -> list[ConfigChange]:
    """Every key whose value differs between two nested config dicts, sorted by key.

    Args:
        saved: the checkpoint's config (``RunConfig.to_dict()`` when it was written), optionally
            with the :data:`FINGERPRINT_KEYS` pseudo-keys added to its ``data`` section.
        new: this run's config, the same way.
        allow_changed: ``checkpoint.allow_changed``: dotted keys or section prefixes whose change is
            accepted although the key is ``refused``.
    """
    a, b = flatten(saved), flatten(new)
    changes = []
    for key in sorted(set(a) | set(b)):
        old, cur = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if old is not _ABSENT and cur is not _ABSENT and old == cur:
            continue
        if old is _ABSENT or cur is _ABSENT:
            # Another FastRL version added or removed the key: nothing the user changed.
            if key in FINGERPRINT_KEYS:
                continue  # a checkpoint written before this fingerprint: nothing to compare
            changes.append(ConfigChange(key, old, cur, HARMLESS))
            continue
        kind = classify(key)
        allowed = kind == REFUSED and any(matches(key, p) for p in allow_changed)
        changes.append(ConfigChange(key, old, cur, kind, allowed))
    return changes


def refused(changes: Iterable[ConfigChange]) -> list[ConfigChange]:
    """The changes that stop a resume."""
    return [c for c in changes if not c.accepted]


def refusal_message(path: Any, changes: Sequence[ConfigChange]) -> str:
    """The error text of a refused resume: the keys, why, and the override that accepts them."""
    keys = [c.key for c in changes]
    detail = "; ".join(f"{c.key}: {_show(c.old)} -> {_show(c.new)}" for c in changes)
    data_note = "".join(
        note for key, note in (
            (DATA_FINGERPRINT, " (data.fingerprint: the training records differ from those the checkpoint was trained on)"),
            (IMAGES_FINGERPRINT, " (data.images_fingerprint: the training images differ from those the checkpoint was "
                                 "trained on)"),
        ) if key in keys
    )
    return (
        f"cannot resume from {path}: the config changes {', '.join(keys)} since the checkpoint was written "
        f"({detail}){data_note}; resuming would silently continue another run than the one checkpointed. "
        f"Restore the checkpoint's values, start a new run (another logging.run_name or checkpoint.resume=none), "
        f"or accept the change explicitly with checkpoint.allow_changed=[{','.join(keys)}]"
    )


def unknown_patterns(allow_changed: Sequence[str], known_keys: Iterable[str]) -> list[str]:
    """Entries of ``checkpoint.allow_changed`` that name no config key and no section."""
    keys = [*known_keys, *FINGERPRINT_KEYS]
    return [p for p in allow_changed if not any(matches(k, p) for k in keys)]


def records_fingerprint(items: Iterable[tuple[Any, ...]]) -> str:
    """A cheap content digest of the training records: sha256 over each record's
    ``(id, question, answer)`` fields, in order (the images: :func:`images_fingerprint`). 16 hex digits."""
    h = hashlib.sha256()
    count = 0
    for item in items:
        for part in item:
            h.update(str(part).encode("utf-8", "surrogatepass"))
            h.update(b"\x1f")
        h.update(b"\x1e")
        count += 1
    h.update(str(count).encode())
    return h.hexdigest()[:16]


def images_fingerprint(images: Iterable[Sequence[bytes]]) -> str:
    """A content digest of the training records' images: sha256 over each record's encoded image
    bytes, in order (one group of 0 or more images per record; the bytes are hashed as stored,
    not decoded). 16 hex digits. Sees a changed, added, removed or reordered image.

    Raises:
        TypeError: an image is not ``bytes``.
    """
    h = hashlib.sha256()
    count = 0
    for group in images:
        for data in group:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"record {count}: an image is {type(data).__name__}, expected encoded bytes")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        h.update(b"\x1e")
        count += 1
    h.update(str(count).encode())
    return h.hexdigest()[:16]
