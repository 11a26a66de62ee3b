"""The canonical on-disk format: one parquet file per split.

Columns: ``question_id`` (int64), ``problem`` (string), ``answer`` (string), ``images``
(list<binary>, encoded image bytes), ``metadata`` (string, a JSON object of strings). The file's
schema metadata holds ``fastrl.format = canonical-v1``. Written by ``tools/prepare_data.py`` and
by the easy-vqa conversion; read by ``load_records("canonical", path)``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fastrl.data.record import Record

FORMAT_KEY = b"fastrl.format"
FORMAT_VERSION = b"canonical-v1"
COLUMNS = ("question_id", "problem", "answer", "images", "metadata")

SCHEMA = pa.schema(
    [
        ("question_id", pa.int64()),
        ("problem", pa.string()),
        ("answer", pa.string()),
        ("images", pa.list_(pa.binary())),
        ("metadata", pa.string()),
    ],
    metadata={FORMAT_KEY: FORMAT_VERSION},
)


def records_to_table(records: Iterable[Record]) -> pa.Table:
    """An Arrow table in the canonical schema."""
    records = list(records)
    return pa.table(
        {
            "question_id": [r.question_id for r in records],
            "problem": [r.problem for r in records],
            "answer": [r.answer for r in records],
            "images": [list(r.images) for r in records],
            "metadata": [json.dumps(r.metadata, sort_keys=True) for r in records],
        },
        schema=SCHEMA,
    )


def write_canonical(records: Iterable[Record], path: str | Path) -> Path:
    """Write ``records`` to ``path`` atomically (temporary file, then rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = records_to_table(records)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600 files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def parse_metadata(text: object) -> dict[str, str] | str:
    """The metadata column value as a ``dict[str, str]``, or the reason it is not one."""
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        return f"must be a JSON string, got {type(text).__name__}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return "must be a JSON object of strings"
    return value
