"""Per-question outcomes of an evaluation (``evaluations/<split>_step<N>.jsonl``): one row per
question, in question order, with its correct count, so two policies pair question by question."""

from __future__ import annotations

import json
import math
import types

from fastrl.data import Record
from fastrl.rewards.result import RewardResult
from fastrl.training.validation import evaluation_file, validate_questions, write_question_rows

RECORDS = [Record(question_id=100 + i, problem=f"q{i}", answer=str(i)) for i in range(5)]


class _Engine:
    def generate(self, prompts, n, sampling, *, weight_version=None):
        k = len(prompts)
        # response j of prompt p answers str(prompt) for j == 0, else "x"
        texts = [f"the answer is {p}" if j == 0 else "x" for p in prompts for j in range(n)]
        return types.SimpleNamespace(prompt_index=[i for i in range(k) for _ in range(n)], response_texts=texts)


class _Scorer:
    def score(self, texts, truths):
        out = []
        for text, truth in zip(texts, truths):
            if text == "the answer is 3":  # question 3's first response: a grader failure
                out.append(RewardResult(overall=math.nan, format=math.nan, accuracy=math.nan, valid=False))
            else:
                ok = float(text.endswith(f" {truth}"))
                out.append(RewardResult(overall=ok, format=1.0, accuracy=ok))
        return out


def test_rows_pair_each_question_with_its_own_responses(tmp_path):
    """catches: a response of another question counted (texts indexed ``i`` instead of ``i * n``),
    an invalid response counted as correct, or rows out of question order."""
    metrics, rows = validate_questions(_Engine(), list(range(5)), RECORDS, _Scorer(), None, n=2, batch_prompts=2)
    assert [r["id"] for r in rows] == [100, 101, 102, 103, 104]
    assert [r["correct"] for r in rows] == [1, 1, 1, 0, 1]
    assert [r["valid"] for r in rows] == [2, 2, 2, 1, 2]
    assert [r["response_end"] for r in rows] == [f"the answer is {i}" for i in range(5)]
    assert rows[4]["answer"] == "4"
    # the rows agree with the summary: 4 correct of 9 valid responses
    assert metrics["val/accuracy"] == sum(r["correct"] for r in rows) / sum(r["valid"] for r in rows)
    path = evaluation_file(tmp_path, "test", 20)
    assert path == tmp_path / "evaluations" / "test_step00000020.jsonl"
    write_question_rows(path, rows)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
