"""Dataset summaries: rows, images and their sizes, answer distribution (``tools/prepare_data.py``)."""

from __future__ import annotations

import io
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from PIL import Image

from fastrl.data.record import Record


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def summarize(records: Sequence[Record], *, top_answers: int = 15) -> dict[str, Any]:
    """A JSON-serializable summary of ``records``.

    Keys: ``rows``; ``question_id`` (min, max); ``images_per_row`` (stats); ``unique_images``;
    ``image_width`` / ``image_height`` / ``image_pixels`` (stats over unique images, read from the
    image headers); ``problem_chars`` (stats); ``distinct_answers``; ``top_answers`` (list of
    ``[answer, count]``); ``metadata`` (value counts per metadata key when there are <= 50 values).
    """
    sizes: dict[bytes, tuple[int, int]] = {}
    for record in records:
        for data in record.images:
            if data not in sizes:
                with Image.open(io.BytesIO(data)) as image:
                    sizes[data] = image.size
    answers = Counter(r.answer for r in records)
    metadata: dict[str, Counter] = {}
    for record in records:
        for key, value in record.metadata.items():
            metadata.setdefault(key, Counter())[value] += 1
    ids = [r.question_id for r in records]
    return {
        "rows": len(records),
        "question_id": {"min": min(ids), "max": max(ids)} if ids else {},
        "images_per_row": _stats([len(r.images) for r in records]),
        "unique_images": len(sizes),
        "image_width": _stats([w for w, _ in sizes.values()]),
        "image_height": _stats([h for _, h in sizes.values()]),
        "image_pixels": _stats([w * h for w, h in sizes.values()]),
        "problem_chars": _stats([len(r.problem) for r in records]),
        "distinct_answers": len(answers),
        "top_answers": [[a, c] for a, c in answers.most_common(top_answers)],
        "metadata": {k: dict(c.most_common()) for k, c in metadata.items() if len(c) <= 50},
    }


def format_summary(name: str, summary: dict[str, Any]) -> str:
    """Human-readable lines of a :func:`summarize` result."""

    def fmt(stats: dict[str, float]) -> str:
        if not stats:
            return "-"
        return f"min {stats['min']:g}, median {stats['median']:g}, max {stats['max']:g}"

    ids = summary["question_id"]
    lines = [
        f"{name}: {summary['rows']} rows, question ids {ids.get('min')}..{ids.get('max')}",
        f"  images per row: {fmt(summary['images_per_row'])}; unique images: {summary['unique_images']}",
        f"  image width: {fmt(summary['image_width'])}; height: {fmt(summary['image_height'])}",
        f"  problem length (chars): {fmt(summary['problem_chars'])}",
        f"  distinct answers: {summary['distinct_answers']}; most common:",
    ]
    total = max(1, summary["rows"])
    for answer, count in summary["top_answers"]:
        lines.append(f"    {answer!r:<30} {count:>7} ({100.0 * count / total:.1f}%)")
    for key, counts in summary["metadata"].items():
        lines.append(f"  {key}: " + ", ".join(f"{v}={c}" for v, c in counts.items()))
    return "\n".join(lines)
