"""Validation on the held-out split: decode, grade, and report accuracy (overall and per type).

Accuracy is the fraction of *valid* graded responses whose accuracy reaches the threshold; a
response whose grading failed (timeout, grader error) is counted in ``val/invalid`` and left out.
With ``val_n > 1`` responses per question, ``val/pass@k`` is the fraction of questions with at
least one correct response and ``val/accuracy`` the mean over all responses.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastrl.data import Record
from fastrl.rollout.engine import RolloutEngine, RolloutPrompt, SamplingParams
from fastrl.training.seeds import derive_seed

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.training.parts import RunParts


def summarize_validation(
    records: Sequence[Record], results: Sequence[Any], n: int, *, threshold: float = 0.5
) -> dict[str, float]:
    """Metrics from graded results (``len(results) == len(records) * n``, grouped per record)."""
    if len(results) != len(records) * n:
        raise ValueError(f"{len(results)} results for {len(records)} records x n={n}")
    correct_by_type: dict[str, list[float]] = defaultdict(list)
    rewards, formats, correct, invalid, passed = [], [], [], 0, 0
    for i, record in enumerate(records):
        group = results[i * n : (i + 1) * n]
        any_correct = False
        for r in group:
            if not r.valid:
                invalid += 1
                continue
            ok = float(r.accuracy >= threshold)
            any_correct |= bool(ok)
            correct.append(ok)
            rewards.append(r.overall)
            formats.append(float(r.format > 0))
            correct_by_type[record.metadata.get("question_type", "all")].append(ok)
        passed += any_correct

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    acc = mean(correct)
    out = {
        "val/accuracy": acc,
        "val/accuracy_stderr": math.sqrt(acc * (1 - acc) / len(correct)) if correct else float("nan"),
        "val/reward": mean(rewards),
        "val/format_rate": mean(formats),
        "val/invalid": float(invalid),
        "val/questions": float(len(records)),
    }
    if n > 1:
        out[f"val/pass@{n}"] = passed / len(records)
    for qtype, values in sorted(correct_by_type.items()):
        if qtype != "all":
            out[f"val/accuracy/{qtype.replace('/', '_')}"] = mean(values)
    return out


def validate(
    engine: RolloutEngine,
    prompts: Sequence[RolloutPrompt],
    records: Sequence[Record],
    scorer: Any,
    sampling: SamplingParams,
    *,
    n: int = 1,
    batch_prompts: int = 256,
    threshold: float = 0.5,
) -> dict[str, float]:
    """Decode ``n`` responses per validation prompt, grade them, and summarize.

    Args:
        engine: the rollout engine (weights already refit).
        prompts / records: the validation prompts and their records (same order).
        scorer: a :class:`fastrl.rewards.RewardScorer`.
        sampling: validation sampling (greedy when temperature is 0).
    """
    if len(prompts) != len(records):
        raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
    start = time.perf_counter()
    results = []
    for begin in range(0, len(prompts), batch_prompts):
        chunk = prompts[begin : begin + batch_prompts]
        rollouts = engine.generate(chunk, n, sampling)
        truths = [records[begin + i].answer for i in rollouts.prompt_index]
        results.extend(scorer.score(rollouts.response_texts, truths))
    metrics = summarize_validation(records, results, n, threshold=threshold)
    metrics["val/time_s"] = time.perf_counter() - start
    return metrics


def validate_policy(run: "RunParts") -> dict[str, float]:
    """:func:`validate` of the run's current policy on its validation records (``rollout.val_*``
    sampling, a fixed seed: the same questions and sampling at every validation)."""
    cfg = run.cfg
    sampling = SamplingParams.for_validation(cfg.rollout, seed=derive_seed(cfg.rollout.seed, 10**9))
    prompts = [run.prompts.prompt_of(r) for r in run.val]
    run.engine.wake()
    try:
        return validate(
            run.engine, prompts, run.val, run.scorer, sampling, n=cfg.rollout.val_n,
            threshold=cfg.reward.accuracy_threshold,
        )
    finally:
        run.engine.sleep()
