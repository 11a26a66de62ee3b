"""A stop request during validation: ``validate`` checks ``should_stop`` before every chunk of
prompts and abandons the validation (no partial metrics) instead of decoding the rest."""

from __future__ import annotations

import types

import pytest

from fastrl.data import Record
from fastrl.rewards.result import RewardResult
from fastrl.training.validation import ValidationStopped, validate


class _Engine:
    def __init__(self):
        self.chunks: list[int] = []

    def generate(self, prompts, n, sampling, *, weight_version=None):
        self.chunks.append(len(prompts))
        k = len(prompts)
        return types.SimpleNamespace(prompt_index=[i for i in range(k) for _ in range(n)], response_texts=["a"] * (k * n))


class _Scorer:
    def score(self, texts, truths):
        return [RewardResult(overall=1.0, format=1.0, accuracy=1.0) for _ in texts]


RECORDS = [Record(question_id=i, problem=f"q{i}", answer="a") for i in range(10)]


def test_stop_requested_during_a_chunk_abandons_the_rest():
    engine, asked = _Engine(), []

    def should_stop() -> bool:  # the signal arrives while the first chunk is decoded
        asked.append(len(engine.chunks))
        return len(engine.chunks) >= 1

    with pytest.raises(ValidationStopped) as stopped:
        validate(engine, list(range(10)), RECORDS, _Scorer(), None, batch_prompts=4, should_stop=should_stop)
    assert engine.chunks == [4]  # chunks 2 and 3 were never decoded
    assert (stopped.value.done, stopped.value.total) == (4, 10)
    assert "after 4 of 10 questions" in str(stopped.value)


def test_stop_before_the_first_chunk_decodes_nothing():
    engine = _Engine()
    with pytest.raises(ValidationStopped) as stopped:
        validate(engine, list(range(10)), RECORDS, _Scorer(), None, batch_prompts=4, should_stop=lambda: True)
    assert engine.chunks == [] and stopped.value.done == 0


def test_no_stop_validates_everything():
    engine, calls = _Engine(), []
    out = validate(engine, list(range(10)), RECORDS, _Scorer(), None, batch_prompts=4, should_stop=lambda: calls.append(1) or False)
    assert engine.chunks == [4, 4, 2] and len(calls) == 3
    assert out["val/accuracy"] == 1.0 and out["val/questions"] == 10
