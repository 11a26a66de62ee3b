"""Per-step metrics: JSON lines always, TensorBoard when installed, Weights & Biases when configured.

Only rank 0 writes. Values must be numbers (ints, floats, bools, 0-d tensors); nested dicts are
flattened with ``/`` (``{"time": {"gen": 1.2}}`` -> ``time/gen``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten nested dicts with '/' and convert tensors / numpy scalars to Python floats."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
            continue
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            raise TypeError(f"metric {name!r} is {type(value).__name__}, not a number")
        out[name] = value
    return out


class MetricsLogger:
    """Writes ``metrics.jsonl`` under ``run_dir`` and optional TensorBoard / W&B streams.

    Args:
        run_dir: run directory (created when missing).
        tensorboard: write TensorBoard events under ``run_dir/tensorboard`` if tensorboard imports.
        wandb_project: W&B project name, or None for no W&B.
        enabled: False on ranks other than 0 (every call is then a no-op).
        filename: name of the JSON-lines file.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        enabled: bool = True,
        filename: str = "metrics.jsonl",
    ) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / filename
        self._tb = None
        self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", buffering=1)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb_project:
            import wandb  # configured explicitly: a missing package is an error, not a silent skip

            self._wandb = wandb.init(project=wandb_project, name=run_name, config=dict(config or {}))

    def log(self, step: int, metrics: Mapping[str, Any], *, kind: str = "train") -> dict[str, float]:
        """Record ``metrics`` for ``step``; returns the flattened values.

        ``kind`` tags the record ("train" for step metrics, "val" for validation, "start" for
        what was measured before the first step).
        """
        flat = flatten(metrics)
        if not self.enabled:
            return flat
        finite = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in flat.items()}
        record = {"step": step, "kind": kind, "wall_time": time.time(), **finite}
        self._fh.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in flat.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(flat, step=step)
        return flat

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


SUPERSEDED_SUFFIX = ".superseded.jsonl"


def supersede_records_after(path: str | Path, step: int) -> tuple[int, Path | None]:
    """Move the records a resumed run is about to write again out of ``path``.

    A run resumed from the checkpoint of ``step`` re-does every later step (and a run that starts
    from nothing, ``step == 0``, re-logs its start and step-0 validation too): their old records
    (of every kind) leave ``metrics.jsonl`` so that each step has one record, and are appended,
    unchanged, to ``metrics.superseded.jsonl`` beside it (nothing measured is lost). A line torn by
    a crash mid-write (not JSON) moves there too. The file is rewritten atomically.

    Returns:
        (records moved, the superseded file or None when nothing moved).

    Raises:
        ValueError: a line that is JSON but has no integer ``step`` (not a FastRL metrics file).
    """
    path = Path(path)
    if not path.exists():
        return 0, None
    keep, moved = [], []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            moved.append(line)  # torn by a crash mid-write
            continue
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{line_no}: a record without an integer 'step'; is this a FastRL metrics.jsonl?")
        (moved if record["step"] > step or step == 0 else keep).append(line)
    if not moved:
        return 0, None
    superseded = path.with_name(path.name.removesuffix(".jsonl") + SUPERSEDED_SUFFIX)
    with open(superseded, "a", encoding="utf-8") as fh:
        fh.write("".join(f"{line}\n" for line in moved))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in keep), encoding="utf-8")
    tmp.replace(path)
    return len(moved), superseded


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back; a later record for the same step replaces an earlier one
    (a resumed run re-logs the steps after its checkpoint)."""
    by_step: dict[tuple[int, str], dict[str, Any]] = {}
    order: list[tuple[int, str]] = []
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not a JSON line ({err})") from None
            key = (record["step"], record.get("kind", "train"))
            if key not in by_step:
                order.append(key)
            by_step[key] = record
    return [by_step[k] for k in order]
