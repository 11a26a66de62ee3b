"""Dataset loaders: Hugging Face parquet (Geometry3K, GeoQA8K-R1V), MATH-style text, the
canonical format and the embedded easy-vqa data, all returning :class:`Record` lists.

    train, val = load_train_val("geometry3k", "data/geometry3k/train.parquet",
                                "data/geometry3k/test.parquet", on_bad_row="error")
    train.records[0].problem, train.report.as_metrics()

Source formats (``dataset`` argument):
- ``geometry3k`` / ``geoqa8k``: parquet (or jsonl) with ``images`` (list of encoded images, as bytes
  or the Hugging Face ``{"bytes", "path"}`` struct; a path is read relative to the file),
  ``problem`` (string, may hold ``<image>`` placeholders) and ``answer`` (string). Every row needs
  at least one image.
- ``math``: parquet or jsonl with ``problem`` and ``answer`` (``images`` read when present).
- ``canonical``: files written by ``tools/prepare_data.py`` (:mod:`fastrl.data.canonical`); ids
  and metadata come from the file.
- ``easy_vqa``: the embedded easy-vqa package data (no path), converted to the canonical format on
  first use and cached (:mod:`fastrl.data.easy_vqa`). ``train`` is the package's train split and
  ``val`` / ``test`` the first 2,000 / the other 7,673 questions of its test split.

Question ids: ``id_offset`` + the row's position over all files of the split, where ``id_offset``
is 0 for ``train``, :data:`VAL_ID_OFFSET` for ``val`` and :data:`TEST_ID_OFFSET` for ``test``; so ids are stable for unchanged files and
skipped rows do not shift the ids of others.

Bad rows (corrupt or missing image, empty or missing answer, non-string problem, invalid JSON,
image placeholders that do not match the images): with ``on_bad_row="error"`` loading stops with
a :class:`DataError` naming file, row, column and reason; with ``"skip"`` the row is skipped and
counted in ``report.rows_skipped`` (metric ``data/rows_skipped``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fastrl.data.canonical import COLUMNS as CANONICAL_COLUMNS
from fastrl.data.canonical import parse_metadata
from fastrl.data.record import TEST_ID_OFFSET, VAL_ID_OFFSET, BadRow, DataError, LoadReport, Record
from fastrl.data.rows import expand_paths, file_columns, iter_rows
from fastrl.data.validation import RowValidator

logger = logging.getLogger(__name__)

DatasetName = Literal["geometry3k", "geoqa8k", "math", "easy_vqa", "canonical"]
DATASETS: tuple[str, ...] = ("geometry3k", "geoqa8k", "math", "easy_vqa", "canonical")
Split = Literal["train", "val", "test"]
OnBadRow = Literal["error", "skip"]

_SKIP_HINT = (
    "Fix or remove the row, or set data.on_bad_row=skip to skip bad rows "
    "(they are counted in the data/rows_skipped metric)."
)
_LOGGED_BAD_ROWS = 5


@dataclass
class LoadedData:
    """The records of one split and the report of how they were loaded."""

    records: list[Record]
    report: LoadReport

    def __len__(self) -> int:
        return len(self.records)


def default_id_offset(split: Split) -> int:
    """0 for ``train``, :data:`VAL_ID_OFFSET` for ``val``, :data:`TEST_ID_OFFSET` for ``test``."""
    offsets = {"train": 0, "val": VAL_ID_OFFSET, "test": TEST_ID_OFFSET}
    if split not in offsets:
        raise ValueError(f"split {split!r} must be one of {tuple(offsets)}")
    return offsets[split]


def load_records(
    dataset: DatasetName,
    path: str | Path | None = None,
    *,
    split: Split = "train",
    on_bad_row: OnBadRow = "error",
    cache_dir: str | Path | None = None,
    limit: int | None = None,
    id_offset: int | None = None,
) -> LoadedData:
    """Load and validate one split (see the module docstring for formats and ids).

    Args:
        dataset: source format.
        path: file, directory or glob (``None`` for ``easy_vqa``).
        split: ``"train"``, ``"val"`` or ``"test"`` (id offset; for easy_vqa also which questions).
        on_bad_row: ``"error"`` or ``"skip"``.
        cache_dir: easy_vqa conversion cache (default ``$FASTRL_CACHE_DIR`` or ``~/.cache/fastrl``).
        limit: keep at most this many records (the first ones, in file order).
        id_offset: override the split's id offset (not used for ``canonical`` / ``easy_vqa``).

    Raises:
        DataError: a bad row with ``on_bad_row="error"``, a missing column or file, duplicate ids,
            or no usable row at all.
        ValueError: an unknown dataset, split or ``on_bad_row`` value.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
    if on_bad_row not in ("error", "skip"):
        raise ValueError(f"on_bad_row {on_bad_row!r} must be 'error' or 'skip'")
    if limit is not None and limit < 1:
        raise ValueError(f"limit ({limit}) must be >= 1")
    offset = default_id_offset(split) if id_offset is None else id_offset
    if dataset == "easy_vqa":
        if path is not None:
            raise ValueError("dataset easy_vqa reads the data embedded in the easy-vqa package; leave the path empty")
        from fastrl.data.easy_vqa import prepare_easy_vqa

        path = prepare_easy_vqa(cache_dir)[split]
        return _load(path, source="easy_vqa", canonical=True, require_images=True,
                     offset=0, on_bad_row=on_bad_row, limit=limit)
    if path is None:
        raise ValueError(f"dataset {dataset!r} needs a path for split {split!r}")
    if dataset == "canonical":
        return _load(path, source="canonical", canonical=True, require_images=False,
                     offset=0, on_bad_row=on_bad_row, limit=limit)
    return _load(path, source=dataset, canonical=False, require_images=dataset != "math",
                 offset=offset, on_bad_row=on_bad_row, limit=limit)


def load_train_val(
    dataset: DatasetName,
    train_path: str | Path | None = None,
    val_path: str | Path | None = None,
    *,
    on_bad_row: OnBadRow = "error",
    cache_dir: str | Path | None = None,
    max_train: int | None = None,
    max_val: int | None = None,
) -> tuple[LoadedData, LoadedData]:
    """Load both splits and check that their question ids are disjoint.

    Raises:
        DataError: as :func:`load_records`, or when a question id appears in both splits.
    """
    common = {"on_bad_row": on_bad_row, "cache_dir": cache_dir}
    train = load_records(dataset, train_path, split="train", limit=max_train, **common)
    val = load_records(dataset, val_path, split="val", limit=max_val, **common)
    check_disjoint_question_ids(train.records, val.records)
    return train, val


def load_test(
    dataset: DatasetName,
    test_path: str | Path | None,
    *,
    size: int,
    others: Iterable[tuple[str, LoadedData]] = (),
    on_bad_row: OnBadRow = "error",
    cache_dir: str | Path | None = None,
) -> LoadedData:
    """The first ``size`` questions of the held-out test split (``test_path``; easy_vqa: its own).

    Raises:
        DataError: as :func:`load_records`; the split holds fewer than ``size`` usable questions
            (a smaller sample than asked for would be reported as if it were the asked one); a
            question id also in one of ``others`` (``(name, split)``: the training and validation splits).
    """
    if dataset != "easy_vqa" and not test_path:
        raise DataError(f"data.test_size={size} needs data.test_path (the held-out test split of dataset {dataset!r})")
    test = load_records(dataset, test_path, split="test", limit=size, on_bad_row=on_bad_row, cache_dir=cache_dir)
    if len(test.records) < size:
        where = "easy-vqa's test split" if dataset == "easy_vqa" else f"{test_path}"
        raise DataError(
            f"data.test_size={size} but {where} holds {len(test.records)} usable questions; "
            f"set data.test_size to at most {len(test.records)}"
        )
    for name, other in others:
        check_disjoint_question_ids(other.records, test.records, names=(name, "held-out test"))
    return test


def check_disjoint_question_ids(
    train: Iterable[Record], val: Iterable[Record], *, names: tuple[str, str] = ("training", "validation")
) -> None:
    """Raise :class:`DataError` when a question id is in both splits (naming a few of them);
    ``names``: the two splits' names in the message."""
    common = {r.question_id for r in train} & {r.question_id for r in val}
    if common:
        raise DataError(
            f"{len(common)} question id(s) appear in both {names[0]} and {names[1]} data, e.g. "
            f"{sorted(common)[:5]}; give {names[1]} ids an offset (tools/prepare_data.py does)"
        )


def _load(
    path: str | Path,
    *,
    source: str,
    canonical: bool,
    require_images: bool,
    offset: int,
    on_bad_row: OnBadRow,
    limit: int | None,
) -> LoadedData:
    files = expand_paths(path)
    report = LoadReport(source=source, paths=[str(f) for f in files])
    records: list[Record] = []
    seen_ids: set[int] = set()
    image_cache: dict = {}
    ordinal = 0
    for file in files:
        present = file_columns(file)
        if canonical:
            columns = list(CANONICAL_COLUMNS)
        else:
            columns = ["problem", "answer"]
            if present is None or "images" in present or require_images:
                columns.append("images")
        validator = RowValidator(
            file, image_key="images" if "images" in columns else None,
            require_images=require_images, image_cache=image_cache,
        )
        for row_index, row in iter_rows(file, columns=columns if present is not None else None):
            report.rows_read += 1
            result = _row_to_record(validator, row_index, row, canonical, offset + ordinal, seen_ids)
            ordinal += 1
            if isinstance(result, BadRow):
                if on_bad_row == "error":
                    raise DataError(f"{result.message()}. {_SKIP_HINT}")
                report.bad_rows.append(result)
                if report.rows_skipped <= _LOGGED_BAD_ROWS:
                    logger.warning("skipping bad row: %s", result.message())
                continue
            seen_ids.add(result.question_id)
            report.origins[result.question_id] = (str(file), row_index)
            records.append(result)
            if limit is not None and len(records) >= limit:
                break
        if limit is not None and len(records) >= limit:
            break
    report.rows_kept = len(records)
    if report.rows_skipped:
        logger.warning(
            "%s: skipped %d bad row(s) of %d read from %s", source, report.rows_skipped, report.rows_read, report.paths
        )
    if not records:
        raise DataError(
            f"{source}: no usable rows in {report.paths} ({report.rows_read} read, {report.rows_skipped} bad)"
        )
    logger.info("%s: loaded %d record(s) from %s", source, len(records), report.paths)
    return LoadedData(records=records, report=report)


def _row_to_record(
    validator: RowValidator, row_index: int, row, canonical: bool, question_id: int, seen_ids: set[int]
) -> Record | BadRow:
    metadata: dict[str, str] = {}
    if canonical and isinstance(row, dict):
        qid = row.get("question_id")
        if not isinstance(qid, int) or isinstance(qid, bool):
            return validator.bad(row_index, "question_id", f"must be an integer, got {qid!r:.40}")
        if qid in seen_ids:
            return validator.bad(row_index, "question_id", f"duplicate question id {qid}")
        question_id = qid
        parsed = parse_metadata(row.get("metadata"))
        if isinstance(parsed, str):
            return validator.bad(row_index, "metadata", parsed)
        metadata = parsed
    return validator.record(row_index, row, question_id, metadata)
