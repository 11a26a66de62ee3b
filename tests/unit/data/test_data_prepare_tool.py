"""tools/prepare_data.py: --help documents every format; conversion writes canonical files + summary."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _data_files import write_hub_parquet

from fastrl.data import DATASETS, VAL_ID_OFFSET, load_records

TOOL = Path(__file__).resolve().parents[3] / "tools" / "prepare_data.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("prepare_data_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_documents_every_source_format():
    out = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True, check=True).stdout
    for name in DATASETS:
        assert name in out
    for words in ("{bytes, path}", "problem", "answer", "images", "list<binary>", "--on-bad-row", "1,000,000,000"):
        assert words in out


def test_converts_hub_parquet_with_summary(tool, tmp_path, geometry_rows, capsys):
    bad = {"images": [b"garbage"], "problem": "p", "answer": "1"}
    train = write_hub_parquet(tmp_path / "train.parquet", geometry_rows + [bad, geometry_rows[0]])
    val = write_hub_parquet(tmp_path / "test.parquet", geometry_rows[:2])
    out = tmp_path / "canonical"
    assert tool.main(["--dataset", "geometry3k", "--train", str(train), "--val", str(val), "--out", str(out)]) == 2
    assert "row 3 column 'images': image 0: cannot be decoded" in capsys.readouterr().err
    assert not out.exists()

    code = tool.main(["--dataset", "geometry3k", "--train", str(train), "--val", str(val), "--out", str(out),
                      "--on-bad-row", "skip"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "train: 4 rows" in printed and "skipped as bad 1" in printed and "'60'" in printed
    summary = json.loads((out / "summary.json").read_text())
    split = summary["splits"]["train"]
    assert (split["rows"], split["load"]["rows_read"], split["load"]["rows_skipped"]) == (4, 5, 1)
    assert split["top_answers"][0] == ["60", 2]
    assert split["unique_images"] == 3
    assert split["image_width"]["max"] == 50 and split["image_height"]["min"] == 30
    reloaded = load_records("canonical", out / "val.parquet")
    assert [r.question_id for r in reloaded.records] == [VAL_ID_OFFSET, VAL_ID_OFFSET + 1]
    assert [r.question_id for r in load_records("canonical", out / "train.parquet").records] == [0, 1, 2, 4]


def test_argument_checks(tool, tmp_path):
    with pytest.raises(SystemExit):
        tool.main(["--dataset", "geometry3k", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        tool.main(["--dataset", "easy_vqa", "--train", "x", "--out", str(tmp_path)])
