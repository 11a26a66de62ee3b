"""Reading raw rows from parquet and jsonl files (no validation here)."""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from fastrl.data.record import DataError

SUPPORTED_SUFFIXES = (".parquet", ".jsonl")


def expand_paths(path: str | Path) -> list[Path]:
    """A file, a directory (its ``*.parquet`` / ``*.jsonl`` files, sorted) or a glob pattern.

    Raises:
        DataError: nothing matches, or a file has an unsupported suffix.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in SUPPORTED_SUFFIXES)
        if not files:
            raise DataError(f"directory {p} holds no .parquet or .jsonl files")
    elif p.is_file():
        files = [p]
    else:
        files = [Path(f) for f in sorted(glob.glob(str(p)))]
        if not files:
            raise DataError(f"data path {p} does not exist (no file, directory or glob match)")
    for f in files:
        if f.suffix not in SUPPORTED_SUFFIXES:
            raise DataError(f"data file {f}: unsupported format {f.suffix!r}; use .parquet or .jsonl")
    return files


def file_columns(path: Path) -> list[str] | None:
    """Column names of a parquet file; ``None`` for jsonl (columns are per row)."""
    if path.suffix == ".parquet":
        return list(pq.ParquetFile(path).schema_arrow.names)
    return None


def iter_rows(path: Path, columns: list[str] | None = None, batch_size: int = 256) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_index, row)`` for every row of ``path`` (0-based; for jsonl, the line index).

    A parquet row is a ``dict`` of the requested ``columns``. A jsonl row is the decoded JSON value,
    or a :class:`json.JSONDecodeError` instance when the line is not valid JSON (the caller decides
    what to do with it); blank lines are skipped.

    Raises:
        DataError: the parquet file cannot be opened or lacks a requested column.
    """
    if path.suffix == ".parquet":
        try:
            parquet = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types here
            raise DataError(f"{path}: cannot read parquet file ({exc})") from exc
        if columns is not None:
            missing = [c for c in columns if c not in parquet.schema_arrow.names]
            if missing:
                raise DataError(f"{path}: missing column(s) {missing}; the file has {parquet.schema_arrow.names}")
        index = 0
        for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
            for row in batch.to_pylist():
                yield index, row
                index += 1
        return
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                yield index, json.loads(line)
            except json.JSONDecodeError as exc:
                yield index, exc
