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

    python bench/prune_text.py runs/smollm2_135m_fastrl_grpo_wordarith_vllm_cpu --pairs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fastrl.algorithms._prune_batch import advantage_buckets, prepare_batch, rank_by_abs_desc  # noqa: E402
from fastrl.algorithms.pruning import jaccard  # noqa: E402
from fastrl.training.rollout_log import read_pruning, read_rollouts  # noqa: E402

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
            threshold: float | None = None) -> dict:
    """The report's numbers for one run (settings default to the run's, ``rollouts/pruning.json``)."""
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
        "_members": members,
    }


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
    p.add_argument("run_dir", type=Path, help="a run directory trained with logging.rollouts_every=K")
    p.add_argument("--semantics", choices=("reference", "paper"), help="bucket rule (default: the run's)")
    p.add_argument("--ngram", type=int, help="n-gram size (default: the run's pruning.ngram)")
    p.add_argument("--threshold", type=float, help="similarity threshold (default: the run's)")
    p.add_argument("--pairs", type=int, default=4, help="pruned pairs to show side by side")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.ngram is not None and args.ngram < 1:
        p.error(f"--ngram must be >= 1, got {args.ngram}")
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        p.error(f"--threshold must be in [0, 1], got {args.threshold}")
    if args.pairs < 0:
        p.error(f"--pairs must be >= 0, got {args.pairs}")
    report = analyze(args.run_dir, semantics=args.semantics, ngram=args.ngram, threshold=args.threshold)
    print(markdown(report, args.pairs))
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in report.items() if not k.startswith("_")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
