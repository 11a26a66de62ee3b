"""Small image, parquet and jsonl writers for the data tests."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image


def png(width: int = 32, height: int = 24, color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


HUB_IMAGE_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def write_hub_parquet(path: Path, rows: list[dict], *, struct_images: bool = True) -> Path:
    """Rows of {images, problem, answer} in the Hugging Face hub schema (images as {bytes, path})."""
    if struct_images:
        images = [
            None if r["images"] is None else [x if isinstance(x, dict) else {"bytes": x, "path": None} for x in r["images"]]
            for r in rows
        ]
        image_type = HUB_IMAGE_TYPE
    else:
        images, image_type = [r["images"] for r in rows], pa.list_(pa.binary())
    table = pa.table(
        {
            "images": pa.array(images, type=image_type),
            "problem": pa.array([r["problem"] for r in rows], type=pa.string()),
            "answer": pa.array([r["answer"] for r in rows], type=pa.string()),
        }
    )
    pq.write_table(table, path)
    return path


def write_jsonl(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    for index, text in (raw_lines or {}).items():
        lines.insert(index, text)
    path.write_text("\n".join(lines) + "\n")
    return path


