"""The canonical dataset record and the load report.

Every loader turns its source into :class:`Record` objects; the canonical on-disk format
(:mod:`fastrl.data.canonical`) stores exactly these fields.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

VAL_ID_OFFSET = 1_000_000_000
"""Validation question ids start here; training ids start at 0 (they can never collide)."""

TEST_ID_OFFSET = 2_000_000_000
"""Held-out test question ids of file datasets start here (easy-vqa's test questions keep their
package ids, which follow the validation questions')."""


@dataclass(frozen=True)
class Record:
    """One prompt of a dataset.

    Fields:
        question_id: stable integer id, unique across the training and validation splits
            (training ids from 0, validation ids from :data:`VAL_ID_OFFSET`).
        problem: the question text. Geometry3K-style text may hold ``<image>`` placeholders; when it
            does, their count equals ``len(images)`` (checked at load).
        answer: ground-truth answer (non-empty string).
        images: encoded images (PNG/JPEG/... bytes), each decoded and checked at load.
        metadata: small string map (e.g. ``{"question_type": "color"}`` for easy-vqa).
    """

    question_id: int
    problem: str
    answer: str
    images: tuple[bytes, ...] = field(default=(), repr=False)
    metadata: dict[str, str] = field(default_factory=dict, hash=False)

    def pil_images(self) -> list[Image.Image]:
        """The images decoded as RGB PIL images (in ``images`` order)."""
        return [decode_image(data) for data in self.images]


def decode_image(data: bytes) -> Image.Image:
    """Decode encoded image bytes into an RGB PIL image (fully loaded)."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image.convert("RGB")


class DataError(ValueError):
    """Bad input data, with the file, row, column and what to do in the message."""


@dataclass(frozen=True)
class BadRow:
    """A row rejected at load: where it is and why."""

    path: str
    row: int
    column: str
    reason: str

    def message(self) -> str:
        """``"<path> row <row> column '<column>': <reason>"`` (rows 0-based; for jsonl files also
        the 1-based line number)."""
        where = f"row {self.row}"
        if self.path.endswith(".jsonl"):
            where += f" (line {self.row + 1})"
        return f"{self.path} {where} column {self.column!r}: {self.reason}"


@dataclass
class LoadReport:
    """What a loader read, kept, skipped and filtered (logged at start-up, exported as metrics).

    ``rows_kept`` counts the records left after skipping bad rows and, once
    :func:`fastrl.data.prompts.filter_long_prompts` ran with this report, after filtering long prompts.
    ``origins`` maps each loaded record's question id to its file and 0-based row (what a later
    filter names when it drops the record).
    """

    source: str
    paths: list[str]
    rows_read: int = 0
    rows_kept: int = 0
    bad_rows: list[BadRow] = field(default_factory=list)
    prompts_filtered_too_long: int = 0
    origins: dict[int, tuple[str, int]] = field(default_factory=dict, repr=False)

    def where(self, question_id: int) -> str:
        """``"<file> row <row>"`` (jsonl: also ``(line <row + 1>)``) of a loaded record, or
        ``"question id <id>"`` when the report does not know it."""
        origin = self.origins.get(question_id)
        if origin is None:
            return f"question id {question_id}"
        path, row = origin
        return f"{path} row {row}" + (f" (line {row + 1})" if path.endswith(".jsonl") else "")

    @property
    def rows_skipped(self) -> int:
        """Rows skipped as bad (``on_bad_row="skip"``)."""
        return len(self.bad_rows)

    def as_metrics(self, prefix: str = "data/") -> dict[str, Any]:
        """``{data/rows_read, data/rows_kept, data/rows_skipped, data/prompts_filtered_too_long}``."""
        return {
            f"{prefix}rows_read": self.rows_read,
            f"{prefix}rows_kept": self.rows_kept,
            f"{prefix}rows_skipped": self.rows_skipped,
            f"{prefix}prompts_filtered_too_long": self.prompts_filtered_too_long,
        }
