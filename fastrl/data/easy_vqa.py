"""The embedded default dataset: easy-vqa (PyPI package ``easy-vqa`` 1.0, MIT license).

5,000 64x64 RGB images of one coloured shape each; 38,575 training and 9,673 test questions with
13 possible answers (three shapes, eight colours, yes/no). :func:`prepare_easy_vqa` converts the
package data into the canonical format once and caches it (no network access needed).

Splits: ``train`` is the package's train split; the package's test split is cut in two, in package
order: its first :data:`VAL_QUESTIONS` (2,000) questions are the validation split (``val``: every
choice of setting looks at these), the other 7,673 the held-out ``test`` split (reported, never
chosen on). The package orders its test questions by image, so the two splits share one image
(test image 203: 7 validation and 4 held-out questions) and no question; no split is trained on
but ``train``.

Question ids: training question ``i`` (package order) has id ``i``; package test question ``i``
has id ``VAL_ID_OFFSET + i`` in either split. Metadata: ``question_type`` in ``{"yes/no", "shape", "color"}`` and
``image_id`` (the package's image number).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from fastrl.data.canonical import write_canonical
from fastrl.data.record import VAL_ID_OFFSET, DataError, Record

logger = logging.getLogger(__name__)

CACHE_VERSION = "easy_vqa-1.0-canonical-v2"
#: Package test questions that form the validation split; the rest are the held-out test split.
VAL_QUESTIONS = 2000
SPLITS = ("train", "val", "test")
SHAPES = frozenset({"circle", "rectangle", "triangle"})
YES_NO = frozenset({"yes", "no"})


def default_cache_dir() -> Path:
    """``$FASTRL_CACHE_DIR`` if set, else ``~/.cache/fastrl``."""
    return Path(os.environ.get("FASTRL_CACHE_DIR") or Path.home() / ".cache" / "fastrl")


def question_type(answer: str) -> str:
    """``"yes/no"``, ``"shape"`` or ``"color"`` from an easy-vqa answer."""
    if answer in YES_NO:
        return "yes/no"
    return "shape" if answer in SHAPES else "color"


def easy_vqa_records(split: str) -> list[Record]:
    """Records of the ``"train"``, ``"val"`` or ``"test"`` split (module docstring), images as PNG bytes.

    Raises:
        DataError: the package data refers to an image it does not contain.
        ValueError: another split name.
    """
    import easy_vqa

    if split == "train":
        texts, answers, image_ids = easy_vqa.get_train_questions()
        paths, offset = easy_vqa.get_train_image_paths(), 0
        rows = range(len(texts))
    elif split in ("val", "test"):
        texts, answers, image_ids = easy_vqa.get_test_questions()
        paths, offset = easy_vqa.get_test_image_paths(), VAL_ID_OFFSET
        rows = range(VAL_QUESTIONS) if split == "val" else range(VAL_QUESTIONS, len(texts))
    else:
        raise ValueError(f"split {split!r} must be one of {SPLITS}")
    images: dict[int, bytes] = {}
    records = []
    for i in rows:
        text, answer, image_id = texts[i], answers[i], image_ids[i]
        if image_id not in images:
            if image_id not in paths:
                raise DataError(f"easy-vqa {split} question {i} refers to missing image {image_id}")
            images[image_id] = Path(paths[image_id]).read_bytes()
        records.append(
            Record(
                question_id=offset + i,
                problem=text,
                answer=answer,
                images=(images[image_id],),
                metadata={"question_type": question_type(answer), "image_id": str(image_id)},
            )
        )
    return records


def prepare_easy_vqa(cache_dir: str | Path | None = None) -> dict[str, Path]:
    """Convert easy-vqa into canonical parquet files under ``cache_dir/easy_vqa`` unless present.

    Returns ``{"train": path, "val": path, "test": path}``. Files are written atomically, so concurrent callers
    (several ranks) at worst convert twice.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = root / "easy_vqa"
    marker = folder / "VERSION"
    paths = {split: folder / f"{split}.parquet" for split in SPLITS}
    if marker.is_file() and marker.read_text().strip() == CACHE_VERSION and all(p.is_file() for p in paths.values()):
        return paths
    logger.info("converting the easy-vqa package data into %s (first use)", folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, path in paths.items():
        records = easy_vqa_records(split)
        write_canonical(records, path)
        counts[split] = len(records)
    _write_text_atomic(folder / "summary.json", json.dumps({"version": CACHE_VERSION, "rows": counts}, indent=2) + "\n")
    _write_text_atomic(marker, CACHE_VERSION + "\n")  # last: marks the conversion complete
    return paths


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
