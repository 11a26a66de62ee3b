#!/usr/bin/env python
"""What MDAP sees in a run's text: advantage buckets, the similarities it computes, pruned pairs.

Reads the rollouts a run wrote with ``logging.rollouts_every=K`` (``<run>/rollouts/dp<rank>.jsonl``,
:mod:`fastrl.training.rollout_log`) and, per logged step, rebuilds the global batch (DP ranks in
rank order, as the pruner gathered it), MDAP's advantage buckets (``--semantics``, the run's own
``pruning.semantics`` by default) and, inside every bucket of two or more rollouts, the token-set
Jaccard similarity ``J(member, seed)`` of each member to the bucket's seed (its largest ``|A|``,
ties by batch order) on ``pruning.ngram``-grams of the response token ids: the quantity the
reference semantics compares with ``pruning.similarity_threshold`` (spec section 2.2; the paper's
semantics compares a member with every member kept before it, whose largest value is at least this
one).

Report (markdown on stdout, ``--json`` for the numbers): rollouts, Phase-1 and final kept fractions,
bucket sizes (all rollouts of a group with one reward share one bucket: zero advantage), the
distribution of the seed similarities (quantiles, and the share at or above the threshold, which
the reference rule prunes), split into zero-advantage and non-zero buckets, and ``--pairs`` pruned
rollouts side by side with their seeds. For runs of an MDAP recipe with reference semantics, the
recomputed decision (member kept iff ``J < threshold``) is checked against the logged Phase-1 mask
on every rollout a rule decided (also with ``pruning.apply=false``; not on a short DAPO step, where
none ran): a mismatch is an error (the log or the analysis is wrong).

Near-duplicate diagnostics (issue 49; ``--dedup-ngram`` / ``--dedup-threshold``, by default the
``pruning.dedup_ngram`` / ``pruning.dedup_threshold`` defaults of ``budget_stratified``): over every
pair of responses to the same prompt at a step, the share flagged (``J_n >= threshold`` on token-id
n-gram sets), how many flagged pairs are copies (the same final answer, the same text), the AUC of
the similarity (``J_n`` and MDAP's ``J_1``) as a score for "same reward" against "different reward"
(Mann-Whitney, ties count one half), the flagged share of pairs of responses to *different* prompts of
the same step, and a sweep of thresholds. Then what the run trained on, per advantage bucket (kept
count per informative bucket, uniform groups, kept rows and tokens with advantage 0), and the same
for ``pruning.method=budget_stratified`` recomputed on the logged batches (its default settings,
``--budget-seeds`` seeds). The final answer is the last ``\\boxed{..}`` content, else the number after
the last "answer is", else the last number of the response.

    python bench/prune_text.py runs/smollm2_135m_fastrl_grpo_wordarith_vllm_cpu --pairs 5
    python bench/prune_text.py RUN_A RUN_B --pairs 0 --json out.json   # several runs, one report
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastrl.algorithms._prune_batch import advantage_buckets, prepare_batch, rank_by_abs_desc  # noqa: E402
from fastrl.algorithms.budget_select import budget_stratified_select  # noqa: E402
from fastrl.algorithms.near_duplicates import near_duplicate_clusters  # noqa: E402
from fastrl.algorithms.pruning import jaccard  # noqa: E402
from fastrl.config import PruningConfig  # noqa: E402
from fastrl.training.rollout_log import read_pruning, read_rollouts  # noqa: E402

DEFAULTS = PruningConfig(method="budget_stratified")
SWEEP = (0.5, 0.6, 0.7, 0.8, 0.9)

#: Methods whose Phase-1 mask is MDAP's own rule (the matched-ratio peers keep MDAP's count, chosen otherwise).
MDAP_RULE_METHODS = ("fastrl", "fastrl_unbiased")
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass(frozen=True)
class Member:
    """A rollout in an advantage bucket of two or more, against its bucket's seed."""

    step: int
    group: int
    bucket_size: int
    advantage: float
    jaccard: float
    member: dict
    seed: dict


def bucket_members(records: list[dict], *, semantics: str, ngram: int, adv_tolerance: float = 1e-4) -> tuple[list[Member], dict]:
    """Every non-seed member of every bucket of >= 2 rollouts, per logged step, and the counts.

    Returns ``(members, counts)`` with counts ``rollouts``, ``buckets``, ``bucket_sizes`` (size ->
    number of buckets) and ``seeds`` (rollouts that are their bucket's seed or alone in it).
    """
    by_step: dict[int, list[dict]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r["step"], r["dp_rank"])):  # stable: batch order per rank
        by_step[rec["step"]].append(rec)
    members: list[Member] = []
    sizes: dict[int, int] = defaultdict(int)
    buckets = 0
    for step, recs in sorted(by_step.items()):
        b = prepare_batch(np.asarray([r["advantage"] for r in recs], dtype=np.float32), [r["group"] for r in recs])
        bid, num = advantage_buckets(b, semantics, adv_tolerance)
        buckets += num
        srt, rank = rank_by_abs_desc(b, bid)
        seed_of = {int(bid[row]): int(row) for row, k in zip(srt, rank) if k == 0}
        count = np.bincount(bid, minlength=num)
        for c in count:
            sizes[int(c)] += 1
        for row, k in zip(srt, rank):
            if k == 0:
                continue
            seed = recs[seed_of[int(bid[row])]]
            rec = recs[int(row)]
            sim = jaccard(rec["response_token_ids"], seed["response_token_ids"], ngram)
            members.append(Member(step, rec["group"], int(count[bid[row]]), rec["advantage"], sim, rec, seed))
    return members, {"rollouts": len(records), "buckets": buckets, "bucket_sizes": dict(sorted(sizes.items())),
                     "seeds": len(records) - len(members)}


def check_reference_decisions(members: list[Member], records: list[dict], threshold: float) -> None:
    """The logged Phase-1 mask is MDAP's reference rule: seeds kept, members kept iff ``J < threshold``.

    Raises:
        ValueError: names the first rollout whose logged decision differs.
    """
    member_ids = {id(m.member) for m in members}
    for m in members:
        if m.member["phase1_kept"] is None:  # no rule ran at this step (a short DAPO batch)
            continue
        if m.member["phase1_kept"] != (m.jaccard < threshold):
            raise ValueError(
                f"step {m.step}, group {m.group}: logged phase1_kept={m.member['phase1_kept']} but "
                f"J(member, seed)={m.jaccard:.4f} against threshold {threshold}"
            )
    for rec in records:
        if id(rec) not in member_ids and rec["phase1_kept"] is False:
            raise ValueError(f"step {rec['step']}, group {rec['group']}: a bucket seed was logged as pruned by Phase 1")


def quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    arr = np.asarray(xs)
    return {f"p{int(q * 100)}": float(np.quantile(arr, q)) for q in QUANTILES}


def analyze(run_dir: Path, *, semantics: str | None = None, ngram: int | None = None,
            threshold: float | None = None, dedup_ngram: int = DEFAULTS.dedup_ngram,
            dedup_threshold: float = DEFAULTS.dedup_threshold, budget_seeds: int = 3) -> dict:
    """The report's numbers for one run (settings default to the run's, ``rollouts/pruning.json``;
    the near-duplicate ones to ``budget_stratified``'s defaults)."""
    pc = read_pruning(run_dir)
    semantics = semantics or pc["semantics"]
    ngram = pc["ngram"] if ngram is None else ngram
    threshold = pc["similarity_threshold"] if threshold is None else threshold
    records = read_rollouts(run_dir)
    members, counts = bucket_members(records, semantics=semantics, ngram=ngram,
                                     adv_tolerance=pc["adv_tolerance"])
    # the logged mask is MDAP's reference rule on exact similarities with these very settings
    checked = (pc["method"] in MDAP_RULE_METHODS and pc["semantics"] == semantics == "reference"
               and ngram == pc["ngram"] and threshold == pc["similarity_threshold"] and pc["similarity_mode"] == "exact")
    if checked:
        check_reference_decisions(members, records, threshold)
    ruled = [r for r in records if r["phase1_kept"] is not None]
    zero = [m.jaccard for m in members if m.advantage == 0.0]
    nonzero = [m.jaccard for m in members if m.advantage != 0.0]
    every = zero + nonzero
    return {
        "run": str(run_dir), "method": pc["method"], "semantics": semantics, "ngram": ngram, "threshold": threshold,
        "steps": sorted({r["step"] for r in records}), **counts,
        "phase1_kept_fraction": sum(bool(r["phase1_kept"]) for r in ruled) / max(len(ruled), 1),
        "rollouts_without_rule": len(records) - len(ruled),
        "kept_fraction": sum(r["kept"] for r in records) / max(len(records), 1),
        "members": len(members), "members_zero_advantage": len(zero),
        "similarity": quantiles(every), "similarity_zero_advantage": quantiles(zero),
        "similarity_nonzero_advantage": quantiles(nonzero),
        "at_or_above_threshold": sum(j >= threshold for j in every) / max(len(every), 1),
        "at_or_above_threshold_nonzero_advantage": sum(j >= threshold for j in nonzero) / max(len(nonzero), 1),
        "response_tokens_mean": statistics.fmean(len(r["response_token_ids"]) for r in records) if records else 0.0,
        "decisions_checked": checked,
        "near_duplicates": near_duplicate_report(by_step(records), ngram=dedup_ngram, threshold=dedup_threshold),
        "kept_by_bucket": kept_by_bucket(by_step(records), adv_tolerance=pc["adv_tolerance"]),
        "budget_stratified": simulate_budget(by_step(records), seeds=budget_seeds),
        "_members": members,
    }


# ---- near-duplicate diagnostics (issue 49) ----------------------------------------------------

_BOXED = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*\**\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str) -> str | None:
    """The last ``\\boxed{..}`` content, else the number after the last "answer is", else the last
    number in ``text`` (thousands separators dropped); None when there is none."""
    for pattern in (_BOXED, _ANSWER_IS, _NUMBER):
        found = pattern.findall(text)
        if found:
            return found[-1].strip().replace(",", "")
    return None


def by_step(records: list[dict]) -> dict[int, list[dict]]:
    """Records per step, DP ranks in rank order (the gathered batch's row order)."""
    out: dict[int, list[dict]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r["step"], r["dp_rank"])):
        out[rec["step"]].append(rec)
    return dict(sorted(out.items()))


def auc(scores: list[float], positive: list[bool]) -> float | None:
    """Probability that a positive pair scores above a negative one (ties: 1/2); None without both."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive, dtype=bool)
    npos, nneg = int(y.sum()), int((~y).sum())
    if npos == 0 or nneg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size)
    sorted_s = s[order]
    i = 0
    while i < s.size:  # average ranks over ties
        j = i
        while j + 1 < s.size and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def near_duplicate_report(steps: dict[int, list[dict]], *, ngram: int, threshold: float) -> dict:
    """Pairs of responses to the same prompt (and, for the flagged share only, to different prompts
    of the same step): flagged share at ``threshold``, copies among the flagged, AUCs, a sweep."""
    jn, j1, same_reward, same_answer, same_text, same_bucket = [], [], [], [], [], []
    cross = []
    for recs in steps.values():
        sets = [_ngrams(r["response_token_ids"], ngram) for r in recs]
        answers = [final_answer(r["response"]) for r in recs]
        for a in range(len(recs)):
            for b in range(a + 1, len(recs)):
                j = _jacc(sets[a], sets[b])
                if recs[a]["group"] != recs[b]["group"]:
                    cross.append(j >= threshold)
                    continue
                jn.append(j)
                j1.append(jaccard(recs[a]["response_token_ids"], recs[b]["response_token_ids"], 1))
                same_reward.append(recs[a]["reward"] == recs[b]["reward"])
                same_bucket.append(round(recs[a]["advantage"], 4) == round(recs[b]["advantage"], 4))
                same_answer.append(answers[a] is not None and answers[a] == answers[b])
                same_text.append(recs[a]["response"] == recs[b]["response"])
    jn_a = np.asarray(jn)

    def at(t: float) -> dict:
        flagged = jn_a >= t
        k = int(flagged.sum())
        return {
            "threshold": t, "flagged_share": k / max(len(jn), 1), "flagged": k,
            "flagged_same_answer": float(np.asarray(same_answer)[flagged].mean()) if k else None,
            "flagged_identical_text": float(np.asarray(same_text)[flagged].mean()) if k else None,
            "flagged_same_reward": float(np.asarray(same_reward)[flagged].mean()) if k else None,
        }

    return {
        "ngram": ngram, **at(threshold), "pairs": len(jn), "pairs_same_bucket": int(sum(same_bucket)),
        "auc_ngram": auc(jn, same_reward), "auc_unigram": auc(j1, same_reward),
        "unigram_at_or_above_0.2": float(np.mean(np.asarray(j1) >= 0.2)) if j1 else None,
        "cross_prompt_pairs": len(cross), "cross_prompt_flagged_share": float(np.mean(cross)) if cross else None,
        "sweep": [at(t) for t in SWEEP],
    }


def _ngrams(tokens: list[int], n: int) -> set:
    return set(tokens) if n == 1 else {tuple(tokens[p:p + n]) for p in range(len(tokens) - n + 1)}


def _jacc(a: set, b: set) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _bucket_stats(recs: list[dict], keep: np.ndarray, stats: dict) -> None:
    """Accumulate, for one step, kept counts per informative bucket and the zero-advantage shares."""
    groups: dict[int, dict[float, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, r in enumerate(recs):
        groups[r["group"]][round(r["advantage"], 4)].append(i)
    for buckets in groups.values():
        if set(buckets) == {0.0}:
            stats["uniform_groups"] += 1
            stats["uniform_groups_kept"][int(keep[buckets[0.0]].sum())] += 1
            continue
        stats["mixed_groups"] += 1
        info = {a: rows for a, rows in buckets.items() if a != 0.0}
        stats["mixed_groups_one_per_bucket"] += all(int(keep[rows].sum()) == 1 for rows in info.values())
        for rows in info.values():
            stats["informative_bucket_kept"][int(keep[rows].sum())] += 1
    lens = np.asarray([len(r["response_token_ids"]) for r in recs])
    zero = np.asarray([round(r["advantage"], 4) == 0.0 for r in recs])
    stats["rows"] += len(recs)
    stats["kept"] += int(keep.sum())
    stats["kept_zero_adv"] += int((keep & zero).sum())
    stats["informative"] += int((~zero).sum())
    stats["informative_kept"] += int((keep & ~zero).sum())
    stats["kept_tokens"] += int(lens[keep].sum())
    stats["kept_tokens_nonzero_adv"] += int(lens[keep & ~zero].sum())


def _summarize(stats: dict) -> dict:
    return {
        "kept_fraction": stats["kept"] / max(stats["rows"], 1),
        "kept_zero_advantage_share": stats["kept_zero_adv"] / max(stats["kept"], 1),
        "kept_tokens_nonzero_advantage_share": stats["kept_tokens_nonzero_adv"] / max(stats["kept_tokens"], 1),
        "informative_kept_fraction": stats["informative_kept"] / max(stats["informative"], 1),
        "informative_rollouts_share": stats["informative"] / max(stats["rows"], 1),
        "mixed_groups": stats["mixed_groups"], "uniform_groups": stats["uniform_groups"],
        "mixed_groups_one_per_bucket": stats["mixed_groups_one_per_bucket"] / max(stats["mixed_groups"], 1),
        "informative_bucket_kept": dict(sorted(stats["informative_bucket_kept"].items())),
        "uniform_group_kept": dict(sorted(stats["uniform_groups_kept"].items())),
    }


def _new_stats() -> dict:
    return defaultdict(int, informative_bucket_kept=defaultdict(int), uniform_groups_kept=defaultdict(int))


def kept_by_bucket(steps: dict[int, list[dict]], *, adv_tolerance: float = 1e-4) -> dict:
    """What the run trained on (the logged ``kept``), per advantage bucket (4-decimal keys)."""
    stats = _new_stats()
    for recs in steps.values():
        _bucket_stats(recs, np.asarray([bool(r["kept"]) for r in recs]), stats)
    return _summarize(stats)


def simulate_budget(steps: dict[int, list[dict]], *, seeds: int = 3, cfg: PruningConfig = DEFAULTS) -> dict:
    """``budget_stratified`` (``cfg``'s settings, near-copies merged) recomputed on every logged
    batch for ``seeds`` seeds of the selector: the :func:`kept_by_bucket` numbers, pooled."""
    stats = _new_stats()
    for recs in steps.values():
        adv = np.asarray([r["advantage"] for r in recs], dtype=np.float32)
        gid = np.asarray([r["group"] for r in recs])
        resp = [r["response_token_ids"] for r in recs]
        lens = np.asarray([len(t) for t in resp])
        cand = None
        if cfg.dedup_threshold is not None:
            rep = near_duplicate_clusters(adv, gid, resp, ngram=cfg.dedup_ngram, threshold=cfg.dedup_threshold)
            cand = rep == np.arange(len(recs))
        for seed in range(seeds):
            r = budget_stratified_select(
                adv, gid, generator=torch.Generator().manual_seed(seed), budget_fraction=cfg.budget_fraction,
                budget_unit=cfg.budget_unit, min_per_bucket=cfg.min_per_bucket, candidates=cand,
                response_lengths=lens,
            )
            _bucket_stats(recs, r.keep.numpy(), stats)
    return {"seeds": seeds, "budget_fraction": cfg.budget_fraction, "min_per_bucket": cfg.min_per_bucket,
            **_summarize(stats)}


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def near_duplicate_markdown(report: dict) -> list[str]:
    nd, kb, bs = report["near_duplicates"], report["kept_by_bucket"], report["budget_stratified"]
    lines = [
        "",
        f"Near-duplicates ({nd['ngram']}-gram token Jaccard, threshold {nd['threshold']}; {nd['pairs']} same-prompt "
        f"pairs, {nd['pairs_same_bucket']} in one advantage bucket):",
        "",
        "| | |",
        "| --- | --- |",
        f"| same-prompt pairs flagged | {_f(nd['flagged_share'])} ({nd['flagged']}) |",
        f"| flagged pairs with the same final answer / identical text / same reward | {_f(nd['flagged_same_answer'])} / "
        f"{_f(nd['flagged_identical_text'])} / {_f(nd['flagged_same_reward'])} |",
        f"| different-prompt pairs flagged | {_f(nd['cross_prompt_flagged_share'], 4)} ({nd['cross_prompt_pairs']} pairs) |",
        f"| AUC same vs different reward: {nd['ngram']}-gram J / MDAP's unigram J | {_f(nd['auc_ngram'])} / {_f(nd['auc_unigram'])} |",
        f"| same-prompt pairs with unigram J >= 0.2 (MDAP's test) | {_f(nd['unigram_at_or_above_0.2'])} |",
        "",
        "| threshold | flagged | same answer | identical text | same reward |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {t['threshold']} | {_f(t['flagged_share'])} ({t['flagged']}) | {_f(t['flagged_same_answer'])} | "
          f"{_f(t['flagged_identical_text'])} | {_f(t['flagged_same_reward'])} |" for t in nd["sweep"]),
        "",
        f"Kept per advantage bucket: the run as trained, and budget_stratified (budget {bs['budget_fraction']}, "
        f"min_per_bucket {bs['min_per_bucket']}, near-copies merged) recomputed on the same batches ({bs['seeds']} seeds):",
        "",
        "| | trained | budget_stratified |",
        "| --- | --- | --- |",
    ]
    rows = [
        ("kept fraction of the rollouts", "kept_fraction"),
        ("informative rollouts (A != 0) kept", "informative_kept_fraction"),
        ("kept rollouts with A = 0", "kept_zero_advantage_share"),
        ("kept tokens with A != 0", "kept_tokens_nonzero_advantage_share"),
        ("mixed groups keeping exactly one per bucket", "mixed_groups_one_per_bucket"),
    ]
    lines += [f"| {label} | {_f(kb[key])} | {_f(bs[key])} |" for label, key in rows]
    hist = lambda d: ", ".join(f"{k}: {v}" for k, v in d.items())  # noqa: E731
    lines += [
        f"| kept per informative bucket (kept: buckets) | {hist(kb['informative_bucket_kept'])} | "
        f"{hist(bs['informative_bucket_kept'])} |",
        f"| kept per uniform group (kept: groups) | {hist(kb['uniform_group_kept'])} | {hist(bs['uniform_group_kept'])} |",
        f"| informative rollouts in the batch | {_f(kb['informative_rollouts_share'])} | |",
    ]
    return lines


def _pooled(rows: list[dict], key: str) -> float | None:
    k = sum(x["flagged"] for x in rows)
    return sum((x[key] or 0.0) * x["flagged"] for x in rows) / k if k else None


def pooled_sweep_markdown(reports: list[dict]) -> list[str]:
    """The threshold sweep pooled over several runs' same-prompt pairs (how the default was chosen)."""
    pairs = sum(r["near_duplicates"]["pairs"] for r in reports)
    lines = [
        f"# Near-duplicate threshold sweep pooled over {len(reports)} runs ({pairs} same-prompt pairs, "
        f"{reports[0]['near_duplicates']['ngram']}-gram token Jaccard)",
        "",
        "| threshold | flagged | same answer | identical text | same reward |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, t in enumerate(reports[0]["near_duplicates"]["sweep"]):
        rows = [r["near_duplicates"]["sweep"][i] for r in reports]
        k = sum(x["flagged"] for x in rows)
        shares = [_pooled(rows, key) for key in ("flagged_same_answer", "flagged_identical_text", "flagged_same_reward")]
        lines.append(f"| {t['threshold']} | {_f(k / max(pairs, 1), 4)} ({k}) | " + " | ".join(_f(x) for x in shares) + " |")
    return lines


def _q(d: dict[str, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in d.values()) if d else "-"


def markdown(report: dict, pairs: int) -> str:
    sizes = ", ".join(f"{k}: {v}" for k, v in report["bucket_sizes"].items())
    lines = [
        f"# MDAP on {report['run']}",
        "",
        f"pruning.method={report['method']}, semantics={report['semantics']}, {report['ngram']}-gram Jaccard, "
        f"threshold {report['threshold']}; steps {report['steps']}",
        "",
        "| | |",
        "| --- | --- |",
        f"| rollouts | {report['rollouts']} (mean response {report['response_tokens_mean']:.1f} tokens) |",
        f"| chosen by the selection rule / trained | {report['phase1_kept_fraction']:.3f} / {report['kept_fraction']:.3f} "
        f"({report['rollouts_without_rule']} rollouts of steps where no rule ran) |",
        f"| advantage buckets (size: count) | {report['buckets']} ({sizes}) |",
        f"| members compared with a seed | {report['members']} ({report['members_zero_advantage']} with advantage 0) |",
        f"| J(member, seed) p10 / p25 / p50 / p75 / p90 | {_q(report['similarity'])} |",
        f"| ... advantage 0 | {_q(report['similarity_zero_advantage'])} |",
        f"| ... advantage not 0 | {_q(report['similarity_nonzero_advantage'])} |",
        f"| J >= threshold (pruned by the reference rule) | {report['at_or_above_threshold']:.3f} "
        f"(advantage not 0: {report['at_or_above_threshold_nonzero_advantage']:.3f}) |",
        f"| logged decisions recomputed | {'yes, all equal' if report['decisions_checked'] else 'no (not an MDAP reference run)'} |",
    ]
    if "near_duplicates" in report:
        lines += near_duplicate_markdown(report)
    pruned = sorted((m for m in report["_members"] if m.jaccard >= report["threshold"]), key=lambda m: -m.jaccard)
    if pairs and pruned:
        picks = pruned[: (pairs + 1) // 2] + pruned[len(pruned) - pairs // 2:] if len(pruned) > pairs else pruned
        lines += ["", f"Pruned members beside their seeds (the most and the least similar of {len(pruned)}):", ""]
        for m in picks:
            lines += [
                f"step {m.step}, group {m.group}, advantage {m.advantage:+.4f}, bucket of {m.bucket_size}, J = {m.jaccard:.3f}",
                "", f"    seed:   {m.seed['response']!r}", f"    member: {m.member['response']!r}", "",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", type=Path, nargs="+", help="run directories trained with logging.rollouts_every=K")
    p.add_argument("--semantics", choices=("reference", "paper"), help="bucket rule (default: the run's)")
    p.add_argument("--ngram", type=int, help="n-gram size (default: the run's pruning.ngram)")
    p.add_argument("--threshold", type=float, help="similarity threshold (default: the run's)")
    p.add_argument("--pairs", type=int, default=4, help="pruned pairs to show side by side")
    p.add_argument("--json", type=Path, help="also write the numbers here (a list with one entry per run)")
    p.add_argument("--dedup-ngram", type=int, default=DEFAULTS.dedup_ngram, help="near-duplicate n-gram size")
    p.add_argument("--dedup-threshold", type=float, default=DEFAULTS.dedup_threshold, help="near-duplicate threshold")
    p.add_argument("--budget-seeds", type=int, default=3, help="seeds of the recomputed budget_stratified rule")
    args = p.parse_args(argv)
    if args.dedup_ngram < 1 or not 0.0 <= args.dedup_threshold <= 1.0 or args.budget_seeds < 1:
        p.error("--dedup-ngram must be >= 1, --dedup-threshold in [0, 1], --budget-seeds >= 1")
    if args.ngram is not None and args.ngram < 1:
        p.error(f"--ngram must be >= 1, got {args.ngram}")
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        p.error(f"--threshold must be in [0, 1], got {args.threshold}")
    if args.pairs < 0:
        p.error(f"--pairs must be >= 0, got {args.pairs}")
    reports = []
    for run_dir in args.run_dirs:
        report = analyze(run_dir, semantics=args.semantics, ngram=args.ngram, threshold=args.threshold,
                         dedup_ngram=args.dedup_ngram, dedup_threshold=args.dedup_threshold,
                         budget_seeds=args.budget_seeds)
        print(markdown(report, args.pairs))
        reports.append({k: v for k, v in report.items() if not k.startswith("_")})
    if len(reports) > 1:
        print("\n".join(pooled_sweep_markdown(reports)))
    if args.json:
        args.json.write_text(json.dumps(reports if len(reports) > 1 else reports[0], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
