"""Loaders: hub parquet, MATH jsonl/parquet, canonical round trip, bad rows, question ids."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _data_files import png, write_hub_parquet, write_jsonl

from fastrl.data import (
    VAL_ID_OFFSET,
    DataError,
    Record,
    check_disjoint_question_ids,
    load_records,
    load_train_val,
    write_canonical,
)


def test_hub_parquet_struct_images(tmp_path, geometry_rows):
    path = write_hub_parquet(tmp_path / "train.parquet", geometry_rows)
    data = load_records("geometry3k", path)
    assert [r.question_id for r in data.records] == [0, 1, 2]
    assert [r.answer for r in data.records] == ["60", "24\\sqrt{3}", "\\frac{1}{2}"]
    assert data.records[0].problem == "<image>Find x."
    assert [im.size for r in data.records for im in r.pil_images()] == [(40, 30), (50, 50), (28, 56)]
    assert data.records[1].pil_images()[0].getpixel((3, 3)) == (0, 0, 255)
    assert data.report.as_metrics() == {
        "data/rows_read": 3, "data/rows_kept": 3, "data/rows_skipped": 0, "data/prompts_filtered_too_long": 0,
    }


def test_hub_parquet_plain_binary_images_and_val_ids(tmp_path, geometry_rows):
    path = write_hub_parquet(tmp_path / "test.parquet", geometry_rows, struct_images=False)
    data = load_records("geoqa8k", path, split="val")
    assert [r.question_id for r in data.records] == [VAL_ID_OFFSET, VAL_ID_OFFSET + 1, VAL_ID_OFFSET + 2]
    assert data.records[2].images == (geometry_rows[2]["images"][0],)


def test_image_given_by_path_relative_to_the_file(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png(20, 20))
    rows = [{"images": [{"bytes": None, "path": "img/a.png"}], "problem": "Find x.", "answer": "3"}]
    data = load_records("geometry3k", write_hub_parquet(tmp_path / "t.parquet", rows))
    assert data.records[0].pil_images()[0].size == (20, 20)


BAD_ROWS = {
    "corrupt image": ({"images": [b"\x89PNG\r\n\x1a\nnot really"], "problem": "p", "answer": "1"}, "images", "image 0: cannot be decoded"),
    "missing image file": ({"images": [{"bytes": None, "path": "nope.png"}], "problem": "p", "answer": "1"}, "images", "nope.png does not exist"),
    "no image": ({"images": [], "problem": "p", "answer": "1"}, "images", "no image"),
    "null images": ({"images": None, "problem": "p", "answer": "1"}, "images", "no image"),
    "empty answer": ({"images": [png()], "problem": "p", "answer": "  "}, "answer", "empty answer"),
    "null answer": ({"images": [png()], "problem": "p", "answer": None}, "answer", "missing or null answer"),
    "null problem": ({"images": [png()], "problem": None, "answer": "1"}, "problem", "must be a string, got NoneType"),
    "placeholder mismatch": ({"images": [png()], "problem": "<image><image> p", "answer": "1"}, "problem", "2 <image> placeholder(s) but 1 image(s)"),
    "aspect ratio": ({"images": [png(402, 2)], "problem": "p", "answer": "1"}, "images", "aspect ratio of 402x2 exceeds 200"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_fails_at_load_naming_file_row_column(tmp_path, geometry_rows, kind):
    bad, column, reason = BAD_ROWS[kind]
    path = write_hub_parquet(tmp_path / "train.parquet", [geometry_rows[0], bad, geometry_rows[1]])
    with pytest.raises(DataError) as info:
        load_records("geometry3k", path)
    message = str(info.value)
    assert f"{path} row 1 column '{column}'" in message
    assert reason in message
    assert "on_bad_row=skip" in message


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_bad_row_skipped_and_counted(tmp_path, geometry_rows, kind):
    bad, column, reason = BAD_ROWS[kind]
    path = write_hub_parquet(tmp_path / "train.parquet", [geometry_rows[0], bad, geometry_rows[1]])
    data = load_records("geometry3k", path, on_bad_row="skip")
    assert [r.question_id for r in data.records] == [0, 2]  # ids do not shift past a skipped row
    assert data.report.rows_skipped == 1
    assert data.report.as_metrics()["data/rows_skipped"] == 1
    assert (data.report.bad_rows[0].row, data.report.bad_rows[0].column) == (1, column)
    assert reason in data.report.bad_rows[0].reason


def test_non_string_problem_in_jsonl_and_integer_answers(tmp_path):
    rows = [{"problem": "1+1?", "answer": 2}, {"problem": 7, "answer": "7"}, {"problem": "2+2?", "answer": "4"}]
    path = write_jsonl(tmp_path / "math.jsonl", rows, raw_lines={3: "{not json"})
    with pytest.raises(DataError, match=r"math.jsonl row 1 \(line 2\) column 'problem': must be a string, got int 7"):
        load_records("math", path)
    data = load_records("math", path, on_bad_row="skip")
    assert [(r.question_id, r.answer) for r in data.records] == [(0, "2"), (2, "4")]
    assert [b.column for b in data.report.bad_rows] == ["problem", "<row>"]
    assert "line 4" in data.report.bad_rows[1].message() and "not valid JSON" in data.report.bad_rows[1].reason


def test_math_parquet_without_images(tmp_path):
    path = tmp_path / "math.parquet"
    pq.write_table(pa.table({"problem": ["What is 1/2 + 1/4?"], "answer": ["\\frac{3}{4}"]}), path)
    data = load_records("math", path)
    assert data.records == [Record(question_id=0, problem="What is 1/2 + 1/4?", answer="\\frac{3}{4}")]


def test_missing_column_is_a_schema_error(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), path)
    with pytest.raises(DataError, match=r"missing column\(s\) \['problem', 'images'\]; the file has \['question', 'answer'\]"):
        load_records("geometry3k", path)


def test_directory_of_files_limit_and_no_usable_rows(tmp_path, geometry_rows):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_hub_parquet(folder / "a.parquet", geometry_rows[:2])
    write_hub_parquet(folder / "b.parquet", geometry_rows)
    data = load_records("geometry3k", folder)
    assert [r.question_id for r in data.records] == [0, 1, 2, 3, 4]
    assert data.records[3].answer == "24\\sqrt{3}"
    assert len(load_records("geometry3k", folder, limit=3).records) == 3
    bad = write_hub_parquet(tmp_path / "bad.parquet", [{"images": [], "problem": "p", "answer": "1"}])
    with pytest.raises(DataError, match="no usable rows"):
        load_records("geometry3k", bad, on_bad_row="skip")
    with pytest.raises(DataError, match="does not exist"):
        load_records("geometry3k", tmp_path / "missing.parquet")


def test_train_val_ids_never_collide(tmp_path, geometry_rows):
    train = write_hub_parquet(tmp_path / "train.parquet", geometry_rows)
    val = write_hub_parquet(tmp_path / "val.parquet", geometry_rows)
    tr, va = load_train_val("geometry3k", train, val)
    assert {r.question_id for r in tr.records}.isdisjoint(r.question_id for r in va.records)
    same = load_records("geometry3k", val, split="val", id_offset=0)
    with pytest.raises(DataError, match=r"3 question id\(s\) appear in both .* \[0, 1, 2\]"):
        check_disjoint_question_ids(tr.records, same.records)


def test_canonical_round_trip_and_duplicate_ids(tmp_path, geometry_rows):
    data = load_records("geometry3k", write_hub_parquet(tmp_path / "train.parquet", geometry_rows))
    records = [Record(question_id=r.question_id + 10, problem=r.problem, answer=r.answer, images=r.images,
                      metadata={"source": "geometry3k"}) for r in data.records]
    path = write_canonical(records, tmp_path / "out" / "train.parquet")
    assert load_records("canonical", path).records == records
    duplicated = write_canonical(records + records[:1], tmp_path / "dup.parquet")
    with pytest.raises(DataError, match="row 3 column 'question_id': duplicate question id 10"):
        load_records("canonical", duplicated)


def test_argument_errors():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_records("mnist", "x")
    with pytest.raises(ValueError, match="on_bad_row"):
        load_records("math", "x", on_bad_row="ignore")
    with pytest.raises(ValueError, match="leave the path empty"):
        load_records("easy_vqa", "x")
    with pytest.raises(ValueError, match="needs a path"):
        load_records("geometry3k")
