"""Grader conformance corpus: every case of tests/rewards/cases.jsonl through the named rewards.

One JSON object per line: ``id``; ``response`` (what the policy wrote; rewards never see a prompt);
``ground_truth``; ``expected_accuracy`` ({reward name: 0 or 1}); ``expected_format`` (0.5 or 0,
the same for every built-in reward); ``source``; optional ``note``, ``prompt`` (context only),
``thread`` (grade from a non-main thread) and ``group`` (cases forming one rollout group).
Where graders disagree the corpus records each one's answer and the note says why.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from fastrl.rewards import get_reward

CASES_PATH = Path(__file__).resolve().parents[2] / "rewards" / "cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
PAIRS = [(case, name) for case in CASES for name in case["expected_accuracy"]]


def _in_worker_thread(fn, *args):
    out: dict = {}

    def run():
        try:
            out["result"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "grading hung in a worker thread"
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_corpus_is_well_formed():
    assert len(CASES) >= 60
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in CASES:
        assert {"id", "response", "ground_truth", "expected_accuracy", "expected_format", "source"} <= set(case)
        assert case["expected_accuracy"], case["id"]
        for value in case["expected_accuracy"].values():
            assert value in (0, 1)


@pytest.mark.parametrize("case,name", PAIRS, ids=[f"{c['id']}[{n}]" for c, n in PAIRS])
def test_case(case, name):
    reward = get_reward(name)
    if case.get("thread"):
        result = _in_worker_thread(reward, case["response"], case["ground_truth"])
    else:
        result = reward(case["response"], case["ground_truth"])
    assert result.valid, result.error
    assert result.accuracy == case["expected_accuracy"][name], case.get("note", "")
    assert result.format == case["expected_format"]
    if name == "easy_vqa_strict":
        assert result.overall == (1.0 if result.format > 0 and result.accuracy > 0 else 0.0)
    else:
        assert result.overall == result.accuracy + result.format


def test_reward_functions_take_the_response_only():
    # The boxed-in-prompt case: the prompt cannot reach a reward function.
    case = next(c for c in CASES if c["id"] == "boxed-only-in-prompt")
    assert "\\boxed{}" in case["prompt"]
    for name in ("geo3k", "geoqa8k", "math", "easy_vqa", "easy_vqa_strict"):
        params = list(inspect.signature(get_reward(name)).parameters)
        assert params == ["response", "ground_truth"], (name, params)
        result = get_reward(name)(case["response"], case["ground_truth"])
        assert (result.format, result.accuracy) == (0.0, 0.0)
        # The same text with the prompt prepended would have been "formatted": the bug this guards.
        with_prompt = get_reward(name)(case["prompt"] + " <thinking>" + case["response"], case["ground_truth"])
        assert with_prompt.format == 0.0


def test_math_verify_default_timeouts_fail_off_the_main_thread():
    # The trap the "non-main-thread" cases guard: math-verify's default signal.alarm timeouts
    # raise in a worker thread; our math reward disables them and still grades correctly.
    from math_verify import parse

    with pytest.raises(ValueError, match="thread"):
        _in_worker_thread(parse, "$\\frac{1}{2}$")
    result = _in_worker_thread(get_reward("math"), "<thinking>x</thinking> \\boxed{\\frac{1}{2}}", "0.5")
    assert (result.valid, result.accuracy) == (True, 1.0)


def test_dapo_filter_uses_accuracy_not_the_shaped_reward():
    from fastrl.algorithms.filters import dynamic_sampling_keep, overlong_penalty

    groups = defaultdict(list)
    for case in CASES:
        if case.get("group"):
            groups[case["group"]].append(case)
    group = groups["dapo-all-wrong"]
    assert len(group) >= 4
    reward = get_reward("geo3k")
    results = [reward(c["response"], c["ground_truth"]) for c in group]
    accuracy = torch.tensor([r.accuracy for r in results])
    lengths = torch.tensor([len(c["response"]) for c in group])  # characters stand in for tokens
    shaped = torch.tensor([r.overall for r in results]) + overlong_penalty(lengths, max_len=1200, cache_len=800)
    assert accuracy.tolist() == [0.0] * len(group)
    assert float(shaped.std()) > 0.1, "the overlong penalty makes the shaped rewards differ"
    keep = dynamic_sampling_keep(accuracy, torch.zeros(len(group), dtype=torch.int64))
    assert keep.tolist() == [False] * len(group)
    # A group with one correct answer is kept.
    mixed = torch.cat([accuracy, torch.tensor([1.0])])
    assert dynamic_sampling_keep(mixed, torch.zeros(len(group) + 1, dtype=torch.int64)).tolist() == [True] * (len(group) + 1)
