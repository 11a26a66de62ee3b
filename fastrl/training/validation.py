"""Validation on the validation split (and on the held-out test split: on the final policy, and
every ``trainer.test_every`` steps when set): decode, grade, and report accuracy (overall and per
type).

Every evaluation of a run that has a step also writes its per-question outcomes,
``<run dir>/evaluations/<split>_step<NNNNNNNN>.jsonl`` (:func:`question_rows`), so that two
policies' accuracies on one split can be compared question by question (paired: McNemar, a
seed x question bootstrap; ``bench/paired_stats.py``).

Accuracy is the fraction of *valid* graded responses whose accuracy reaches the threshold; a
response whose grading failed (timeout, grader error) is counted in ``val/invalid`` and left out.
With ``val_n > 1`` responses per question, ``val/pass@k`` is the fraction of questions with at
least one correct response and ``val/accuracy`` the mean over all responses; its standard error
``val/accuracy_stderr`` is clustered by question (the ``n`` responses to one question are not
independent), see :func:`summarize_validation`.

Over data-parallel ranks the questions are split into contiguous shares (:func:`share_bounds`):
each DP rank decodes and grades its share, the graded results are gathered in question order, and
every rank summarizes the same full list. Within a DP rank's model-parallel group only the first
rank holds an engine: it decodes and grades, and broadcasts the graded results to its peers
(as training generation does). The metrics, and the best-checkpoint decision the loop takes from
them, are rank 0's on every rank (:func:`validate_policy` broadcasts them). The engine is woken
for the validation (KV cache; weights after a refit are awake) and left awake: a level-2 sleep
would discard its weights before the next step's generation, with no refit in between.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastrl.data import Record
from fastrl.distributed import collectives, world
from fastrl.rollout.engine import RolloutEngine, RolloutPrompt, SamplingParams
from fastrl.training.seeds import derive_seed

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.training.parts import RunParts


def summarize_validation(
    records: Sequence[Record], results: Sequence[Any], n: int, *, threshold: float = 0.5
) -> dict[str, float]:
    """Metrics from graded results (``len(results) == len(records) * n``, grouped per record).

    ``val/accuracy`` is ``p = C / M``, correct over valid responses. Its standard error is clustered
    by question (the cluster-robust, CR0 / Liang-Zeger, standard error of a ratio mean): with
    ``c_q`` correct of ``m_q`` valid responses to question ``q``,

        SE = sqrt(sum_q (c_q - p m_q)^2) / M.

    With equal ``m_q = n`` it is ``sqrt(mean_q (a_q - p)^2 / Q)``, the standard error of the mean of
    the per-question accuracies ``a_q = c_q / n`` over the ``Q`` questions; with ``n = 1`` it is the
    binomial ``sqrt(p (1 - p) / M)``. Treating the ``n`` responses of a question as independent
    (that binomial formula with ``M = Q n``) understates it when questions differ in difficulty.
    Questions without a valid response are left out.
    """
    if len(results) != len(records) * n:
        raise ValueError(f"{len(results)} results for {len(records)} records x n={n}")
    correct_by_type: dict[str, list[float]] = defaultdict(list)
    rewards, formats, correct, invalid, passed = [], [], [], 0, 0
    clusters: list[tuple[float, int]] = []  # (correct, valid) per question
    for i, record in enumerate(records):
        group = results[i * n : (i + 1) * n]
        any_correct = False
        c_q, m_q = 0.0, 0
        for r in group:
            if not r.valid:
                invalid += 1
                continue
            ok = float(r.accuracy >= threshold)
            any_correct |= bool(ok)
            correct.append(ok)
            c_q += ok
            m_q += 1
            rewards.append(r.overall)
            formats.append(float(r.format > 0))
            correct_by_type[record.metadata.get("question_type", "all")].append(ok)
        passed += any_correct
        if m_q:
            clusters.append((c_q, m_q))

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else float("nan")

    acc = mean(correct)
    out = {
        "val/accuracy": acc,
        "val/accuracy_stderr": (
            math.sqrt(sum((c - acc * m) ** 2 for c, m in clusters)) / len(correct) if correct else float("nan")
        ),
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


#: characters of the end of each question's first response kept in the per-question file (where
#: the final answer stands; enough to audit a grade, small enough to keep every evaluation)
RESPONSE_END_CHARS = 64


def question_rows(
    records: Sequence[Record], results: Sequence[Any], texts: Sequence[str], n: int, *, threshold: float = 0.5
) -> list[dict[str, Any]]:
    """One row per record (``len(results) == len(texts) == len(records) * n``, grouped per record):
    ``id`` (the record's ``question_id``), ``correct`` (responses whose accuracy reaches
    ``threshold``, an int in ``[0, n]``), ``valid`` (responses graded without error), ``answer``
    (the ground truth) and ``response_end`` (the last :data:`RESPONSE_END_CHARS` characters of the
    first response). ``correct`` counts as :func:`summarize_validation` does.

    Raises:
        ValueError: the lengths disagree.
    """
    if not len(results) == len(texts) == len(records) * n:
        raise ValueError(f"{len(results)} results and {len(texts)} texts for {len(records)} records x n={n}")
    rows = []
    for i, record in enumerate(records):
        group = results[i * n : (i + 1) * n]
        rows.append({
            "id": record.question_id,
            "correct": sum(1 for r in group if r.valid and r.accuracy >= threshold),
            "valid": sum(1 for r in group if r.valid),
            "answer": record.answer,
            "response_end": texts[i * n][-RESPONSE_END_CHARS:],
        })
    return rows


def write_question_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` as JSON lines to ``path`` atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def evaluation_file(run_dir: Path, split: str, step: int) -> Path:
    """Where the per-question outcomes of ``split`` at ``step`` are written."""
    return Path(run_dir) / "evaluations" / f"{split}_step{step:08d}.jsonl"


class ValidationStopped(Exception):
    """:func:`validate` was stopped by its ``should_stop`` check before every chunk was decoded.

    Attributes:
        done / total: validation questions decoded and graded before the stop / in all.
    """

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"validation stopped after {done} of {total} questions")
        self.done, self.total = done, total


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
    should_stop: Callable[[], bool] | None = None,
    weight_version: int | None = None,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> dict[str, float]:
    """:func:`validate_questions`' metrics alone."""
    return validate_questions(
        engine, prompts, records, scorer, sampling, n=n, batch_prompts=batch_prompts, threshold=threshold,
        should_stop=should_stop, weight_version=weight_version, dp_rank=dp_rank, dp_size=dp_size,
    )[0]


def validate_questions(
    engine: RolloutEngine,
    prompts: Sequence[RolloutPrompt],
    records: Sequence[Record],
    scorer: Any,
    sampling: SamplingParams,
    *,
    n: int = 1,
    batch_prompts: int = 256,
    threshold: float = 0.5,
    should_stop: Callable[[], bool] | None = None,
    weight_version: int | None = None,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Decode ``n`` responses per validation prompt, grade them, and summarize: the metrics of
    :func:`summarize_validation` (plus ``val/time_s``) and the per-question rows of
    :func:`question_rows`.

    With ``dp_size > 1`` this DP rank decodes only its share of the prompts (:func:`share_bounds`)
    and the graded results of every share are gathered over the DP group (a collective: every DP
    rank must call this with the same prompts); each rank then returns the metrics of all prompts.

    Args:
        engine: the rollout engine (weights already refit).
        prompts / records: the validation prompts and their records (same order).
        scorer: a :class:`fastrl.rewards.RewardScorer`.
        sampling: validation sampling (greedy when temperature is 0).
        batch_prompts: prompts decoded per chunk.
        dp_rank / dp_size: this rank's place in the data-parallel group.
        should_stop: called before each chunk of ``batch_prompts`` prompts (in a multi-process
            run it must give every rank the same answer, e.g. a MAX all-reduce of the stop flag).
            When it returns True the validation is abandoned: nothing partial is returned (a
            partial accuracy would be another question set's, not comparable with the best one).
        weight_version: the trainer's policy version, carried by every generate request (an engine
            holding older weights raises :class:`~fastrl.rollout.engine.StaleWeightsError`).

    Raises:
        ValidationStopped: ``should_stop`` returned True before the last chunk.
    """
    if len(prompts) != len(records):
        raise ValueError(f"{len(prompts)} prompts for {len(records)} records")
    start = time.perf_counter()
    total = len(prompts)
    lo, hi = share_bounds(total, dp_rank, dp_size)
    largest = max(b - a for a, b in (share_bounds(total, r, dp_size) for r in range(dp_size)))
    results = []
    for begin in range(0, largest, batch_prompts):  # the same number of chunks (and stop checks) on every rank
        if should_stop is not None and should_stop():
            raise ValidationStopped(min(begin * dp_size, total), total)
        first, last = lo + begin, min(lo + begin + batch_prompts, hi)
        if first >= last:
            continue
        def decode_and_grade(first: int = first, last: int = last) -> list:
            rollouts = engine.generate(prompts[first:last], n, sampling, weight_version=weight_version)
            truths = [records[first + i].answer for i in rollouts.prompt_index]
            return list(zip(scorer.score(rollouts.response_texts, truths), rollouts.response_texts))

        results.extend(collectives.computed_on_model_parallel_source(decode_and_grade, what="validation decoding"))
    if dp_size > 1:
        results = list(chain.from_iterable(collectives.all_gather_objects_dp(results)))
    graded, texts = [r for r, _ in results], [t for _, t in results]
    metrics = summarize_validation(records, graded, n, threshold=threshold)
    metrics["val/time_s"] = time.perf_counter() - start
    return metrics, question_rows(records, graded, texts, n, threshold=threshold)


def share_bounds(total: int, rank: int, size: int) -> tuple[int, int]:
    """``[lo, hi)``: the contiguous share of ``total`` items of rank ``rank`` of ``size`` (the first
    ``total % size`` ranks hold one item more). Concatenated in rank order the shares are
    ``range(total)``.

    Raises:
        ValueError: ``size < 1`` or ``rank`` outside ``[0, size)``.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of size {size}: need size >= 1 and 0 <= rank < size")
    base, extra = divmod(total, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def validate_policy(
    run: "RunParts", should_stop: Callable[[], bool] | None = None, *, split: str = "val", step: int | None = None
) -> dict[str, float]:
    """:func:`validate` of the run's current policy on its validation records (``split="val"``) or
    its held-out test records (``split="test"``: the same metrics, named ``test/*`` instead of
    ``val/*``), with ``rollout.val_*`` sampling and a fixed seed (the same questions and sampling
    at every validation), split over the DP ranks; ``should_stop`` as there (raises
    :class:`ValidationStopped`). With ``step`` the logging rank writes the per-question outcomes to
    :func:`evaluation_file` (``<run dir>/evaluations/<split>_step<step>.jsonl``; an evaluation of
    the same step again replaces it). Every rank returns global rank 0's metrics (a broadcast), so that
    every rank takes the same best-checkpoint decision before the collective save.

    Raises:
        ValueError: ``split`` is neither ``"val"`` nor ``"test"``, or ``"test"`` on a run without
            test records (``data.test_size=0``).
    """
    if split not in ("val", "test"):
        raise ValueError(f"split {split!r} must be 'val' or 'test'")
    records = run.val if split == "val" else run.test
    if not records:
        raise ValueError(f"no {split} records to evaluate (data.test_size is 0)")
    cfg = run.cfg
    sampling = SamplingParams.for_validation(cfg.rollout, seed=derive_seed(cfg.rollout.seed, 10**9))
    prompts = [run.prompts.prompt_of(r) for r in records]
    run.engine.wake()  # and it stays awake: a level-2 sleep would discard the weights before the next generation
    metrics, rows = validate_questions(
        run.engine, prompts, records, run.scorer, sampling, n=cfg.rollout.val_n,
        threshold=cfg.reward.accuracy_threshold, should_stop=should_stop,
        weight_version=run.actor.policy_version, dp_rank=run.ctx.dp_rank, dp_size=run.ctx.dp_size,
    )
    if step is not None and run.ctx.is_logging_rank:
        write_question_rows(evaluation_file(run.run_dir, split, step), rows)
    if split == "test":
        metrics = {"test/" + k.removeprefix("val/"): v for k, v in metrics.items()}
    return world.broadcast_object(metrics)
