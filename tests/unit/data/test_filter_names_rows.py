"""The prompt-length filter names the rows it drops by file and row (issue 45, item 8c)."""

from __future__ import annotations

import json
import logging

from fastrl.data import load_records
from fastrl.data.prompts import filter_records_by_length


def test_dropped_rows_are_named_by_file_and_row(tmp_path, caplog):
    """catches: the filter's warning giving only a count ("filtered 7 of 10 prompt(s)"), which leaves
    the user to find the long rows in the file; or rows named by position in the kept list, which
    is off after a skipped bad row."""
    path = tmp_path / "train.jsonl"
    rows = [{"problem": "short question", "answer": "1"}] * 3
    rows.insert(1, {"problem": "", "answer": "1"})  # a bad row (skipped): the ids and rows below do not shift
    rows += [{"problem": "word " * (10 + i), "answer": "2"} for i in range(7)]  # rows 4..10 are long
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_records("math", path, on_bad_row="skip")
    with caplog.at_level(logging.WARNING, logger="fastrl.data.prompts"):
        kept = filter_records_by_length(loaded.records, lambda r: len(r.problem.split()), 5, report=loaded.report,
                                        what="training data")
    assert len(kept) == 3 and loaded.report.prompts_filtered_too_long == 7
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("filtered "))
    assert line.startswith(f"filtered 7 of 10 prompt(s) longer than 5 tokens (training data): {path} row 4 (line 5): 10 tokens; ")
    assert f"{path} row 8 (line 9): 14 tokens; and 2 more" in line and "row 9" not in line


def test_records_without_a_report_are_named_by_question_id(caplog):
    """catches: a filter that cannot name rows when it has no load report (the bench tools' path)."""
    from fastrl.data import Record

    records = [Record(question_id=i, problem="w " * (3 * i), answer="1") for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="fastrl.data.prompts"):
        filter_records_by_length(records, lambda r: len(r.problem.split()), 4)
    assert "filtered 1 of 3 prompt(s) longer than 4 tokens: question id 2: 6 tokens" in caplog.text
