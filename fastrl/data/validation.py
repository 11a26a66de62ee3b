"""Checking raw rows and turning them into :class:`Record` objects (or :class:`BadRow`).

Every image is decoded here, at load time, so that a corrupt image stops the run at start-up with
its file and row instead of failing in the middle of training.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from fastrl.data.record import BadRow, Record

MAX_ASPECT_RATIO = 200
"""The Qwen2-VL image processor rejects images whose long/short side ratio exceeds this."""

IMAGE_PLACEHOLDER = "<image>"


class RowValidator:
    """Validates rows of one file.

    Args:
        path: the file (for messages; relative image paths are resolved against its directory).
        problem_key / answer_key / image_key: column names (``image_key=None``: no images).
        require_images: a row without any image is bad (vision datasets).

    Decoded-image checks are cached by content digest, and identical image bytes are shared
    between records (easy-vqa has ~10 questions per image).
    """

    def __init__(
        self,
        path: Path,
        *,
        problem_key: str = "problem",
        answer_key: str = "answer",
        image_key: str | None = "images",
        require_images: bool = False,
        image_cache: dict[bytes, tuple[bytes, str | None]] | None = None,
    ) -> None:
        self.path = path
        self.problem_key = problem_key
        self.answer_key = answer_key
        self.image_key = image_key
        self.require_images = require_images
        # digest -> (shared bytes, None if the image is fine else the reason it is not)
        self._images = image_cache if image_cache is not None else {}

    def bad(self, row: int, column: str, reason: str) -> BadRow:
        return BadRow(path=str(self.path), row=row, column=column, reason=reason)

    def record(
        self, row_index: int, row: Any, question_id: int, metadata: dict[str, str] | None = None
    ) -> Record | BadRow:
        """The record of ``row``, or the first problem found in it."""
        if isinstance(row, Exception):
            return self.bad(row_index, "<row>", f"not valid JSON ({row})")
        if not isinstance(row, Mapping):
            return self.bad(row_index, "<row>", f"a row must be an object with keys, got {type(row).__name__}")
        problem = row.get(self.problem_key)
        if self.problem_key not in row:
            return self.bad(row_index, self.problem_key, "missing")
        if not isinstance(problem, str):
            kind = type(problem).__name__
            return self.bad(row_index, self.problem_key, f"must be a string, got {kind} {problem!r:.80}")
        if not problem.strip():
            return self.bad(row_index, self.problem_key, "empty problem text")
        answer = row.get(self.answer_key)
        if isinstance(answer, int) and not isinstance(answer, bool):
            answer = str(answer)  # integer answers in jsonl are unambiguous
        if answer is None:
            return self.bad(row_index, self.answer_key, "missing or null answer")
        if not isinstance(answer, str):
            return self.bad(row_index, self.answer_key, f"must be a string, got {type(answer).__name__} {answer!r:.80}")
        if not answer.strip():
            return self.bad(row_index, self.answer_key, "empty answer")
        images: tuple[bytes, ...] = ()
        if self.image_key is not None:
            raw = row.get(self.image_key)
            result = self.images(raw)
            if isinstance(result, str):
                return self.bad(row_index, self.image_key, result)
            images = result
        if self.require_images and not images:
            return self.bad(row_index, self.image_key or "images", "no image (this dataset needs one per row)")
        placeholders = problem.count(IMAGE_PLACEHOLDER)
        if placeholders and placeholders != len(images):
            return self.bad(
                row_index, self.problem_key,
                f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but {len(images)} image(s)",
            )
        return Record(question_id=question_id, problem=problem, answer=answer.strip(), images=images,
                      metadata=dict(metadata or {}))

    def images(self, raw: Any) -> tuple[bytes, ...] | str:
        """Encoded bytes of every image in ``raw``, or the reason they are unusable."""
        if raw is None:
            return ()
        items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        out: list[bytes] = []
        for k, item in enumerate(items):
            data = self._image_bytes(item)
            if isinstance(data, str):
                return f"image {k}: {data}"
            digest = hashlib.blake2b(data, digest_size=16).digest()
            cached = self._images.get(digest)
            if cached is None:
                cached = (data, _check_image(data))
                self._images[digest] = cached
            shared, problem = cached
            if problem is not None:
                return f"image {k}: {problem}"
            out.append(shared)
        return tuple(out)

    def _image_bytes(self, item: Any) -> bytes | str:
        if isinstance(item, (bytes, bytearray, memoryview)):
            return bytes(item)
        path = None
        if isinstance(item, Mapping):  # Hugging Face datasets Image feature: {"bytes", "path"}
            if item.get("bytes") is not None:
                return bytes(item["bytes"])
            path = item.get("path")
        elif isinstance(item, str):
            path = item
        else:
            return f"unsupported image value of type {type(item).__name__} (expected bytes, {{bytes, path}} or a path)"
        if not path:
            return "no bytes and no path"
        file = Path(path)
        if not file.is_absolute():
            file = self.path.parent / file
        if not file.is_file():
            return f"image file {file} does not exist"
        return file.read_bytes()


def _check_image(data: bytes) -> str | None:
    """``None`` when ``data`` decodes to a usable image, else the reason."""
    if not data:
        return "empty image bytes"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            width, height = image.size
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for corrupt data
        return f"cannot be decoded ({type(exc).__name__}: {exc})"
    if width < 1 or height < 1:
        return f"has size {width}x{height}"
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        return f"aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO} (the Qwen2-VL image processor rejects it)"
    return None
