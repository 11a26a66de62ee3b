"""summarize_validation: accuracy, pass@k and the standard error clustered by question."""

import math

import pytest

from fastrl.data import Record
from fastrl.rewards.result import RewardResult
from fastrl.training.validation import summarize_validation

RIGHT = RewardResult(overall=1.5, format=0.5, accuracy=1.0)
WRONG = RewardResult(overall=0.5, format=0.5, accuracy=0.0)
INVALID = RewardResult(overall=float("nan"), format=float("nan"), accuracy=float("nan"), valid=False, error="timeout")


def records(q: int) -> list[Record]:
    return [Record(question_id=i, problem=f"q{i}", answer="a", metadata={"question_type": "color"}) for i in range(q)]


def test_clustering_matters_when_questions_differ():
    # question 0: 4/4 right, question 1: 0/4 right. p = 0.5 over 8 responses.
    out = summarize_validation(records(2), [RIGHT] * 4 + [WRONG] * 4, 4)
    assert out["val/accuracy"] == 0.5 and out["val/pass@4"] == 0.5
    # independent responses would give sqrt(0.25 / 8) = 0.1768; the questions are the samples:
    # per-question accuracies (1, 0): sqrt(((1 - .5)^2 + (0 - .5)^2) / 2 / 2) = 0.35355
    assert out["val/accuracy_stderr"] == pytest.approx(math.sqrt(0.5) / 2, abs=1e-12)
    assert out["val/accuracy_stderr"] > 1.9 * math.sqrt(0.25 / 8)


def test_clustering_with_uneven_valid_counts():
    # q0: 2 right of 3 valid (one invalid), q1: 1 right of 4, q2: 3 right of 3 (one invalid)
    results = [RIGHT, RIGHT, WRONG, INVALID] + [RIGHT, WRONG, WRONG, WRONG] + [RIGHT, INVALID, RIGHT, RIGHT]
    out = summarize_validation(records(3), results, 4)
    p = 6 / 10
    assert out["val/accuracy"] == pytest.approx(p) and out["val/invalid"] == 2.0
    # sqrt(sum_q (c_q - p m_q)^2) / M = sqrt((2 - 1.8)^2 + (1 - 2.4)^2 + (3 - 1.8)^2) / 10
    assert out["val/accuracy_stderr"] == pytest.approx(math.sqrt(0.04 + 1.96 + 1.44) / 10, abs=1e-12)


def test_n1_is_the_binomial_standard_error():
    out = summarize_validation(records(5), [RIGHT, WRONG, RIGHT, RIGHT, WRONG], 1)
    assert out["val/accuracy"] == pytest.approx(0.6)
    assert out["val/accuracy_stderr"] == pytest.approx(math.sqrt(0.6 * 0.4 / 5), abs=1e-12)
    assert "val/pass@1" not in out


def test_all_invalid_is_nan():
    out = summarize_validation(records(1), [INVALID, INVALID], 2)
    assert math.isnan(out["val/accuracy"]) and math.isnan(out["val/accuracy_stderr"])
