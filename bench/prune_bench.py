"""MDAP pruning speed: fastrl's mdap_select against a Python-set implementation, measured in one run.

Workload (defaults): 256 groups x 8 responses, response lengths up to 2048 tokens, token ids from
a 151,936-entry vocabulary (Qwen2.5) with Zipf-distributed frequencies. Each group has one to four
"reasoning paths"; a response either copies a path with a few edits and a random truncation
(near-duplicates, unigram Jaccard ~0.3-0.95) or follows a different path (sharing function
words and the problem's vocabulary, Jaccard ~0.03-0.3, many pairs near the 0.2 threshold).
Rewards are accuracy (per path, with noise) + format (0.5, 90%), advantages are GRPO's, and
Phase 2 refills to a multiple of 128 (the reference's 16 prompts x 8).

Baselines, both written here in plain Python, following the reference semantics:
- "python-set (reference style)": token sets rebuilt for every comparison from ``tensor.tolist()``,
  as the reference code does;
- "python-set (cached sets)": each response's set built once.

Prints: identical-mask checks ("reference" and "paper" semantics, final and Phase-1 masks), the
median time of each implementation, the speed ratios, the time per million response tokens, and
the MinHash mode's agreement with the exact mode and its bytes per rollout.

Usage (from the repository root):
    python bench/prune_bench.py            # full size
    python bench/prune_bench.py --quick    # small, a few seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrl.algorithms.advantages import grpo_advantages  # noqa: E402
from fastrl.algorithms.minhash import estimate_jaccard, minhash_sketch  # noqa: E402
from fastrl.algorithms.pruning import jaccard, mdap_select  # noqa: E402

VOCAB = 151_936


# ----------------------------------------------------------------------------------------------
# Workload
# ----------------------------------------------------------------------------------------------


def make_workload(num_groups: int, n: int, max_len: int, seed: int):
    """Synthetic rollouts with realistic token overlap. Returns (advantages f32 [N], group_ids [N], responses)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(VOCAB)

    def common_tokens(size):  # Zipf over the 3,000 most frequent tokens (function words, notation)
        return perm[np.minimum(rng.zipf(1.1, size) - 1, 2999)]

    responses, group_ids, rewards = [], [], []
    for g in range(num_groups):
        num_paths = int(rng.integers(1, 5))
        topic = rng.integers(0, VOCAB, 400)  # vocabulary of the problem, shared by all its paths
        paths = []
        for _ in range(num_paths):
            length = int(rng.integers(max_len // 4, max_len + 1))
            own = rng.integers(0, VOCAB, 1500)  # this path's own vocabulary (its line of reasoning)
            share = rng.uniform(0.25, 0.65)  # how much of the path is about the problem itself
            src = rng.random(length)
            tok = np.where(
                src < 0.2,
                common_tokens(length),
                np.where(
                    src < 0.2 + share,
                    topic[rng.integers(0, topic.size, length)],
                    own[rng.integers(0, own.size, length)],
                ),
            )
            paths.append((tok.astype(np.int64), float(rng.random() < 0.5)))
        for _ in range(n):
            tok, acc = paths[int(rng.integers(0, num_paths))]
            tok = tok.copy()
            edit = rng.random(tok.size) < rng.uniform(0.01, 0.15)
            tok[edit] = rng.integers(0, VOCAB, int(edit.sum()))
            cut = int(rng.integers(max(8, tok.size // 3), tok.size + 1))
            tok = tok[:cut]
            if rng.random() < 0.1:  # wrong answer on a right path, or a lucky guess
                acc = 1.0 - acc
            fmt = 0.5 if rng.random() < 0.9 else 0.0
            responses.append(torch.from_numpy(tok))
            group_ids.append(1000 + g)
            rewards.append(acc + fmt)
    group_ids_t = torch.tensor(group_ids, dtype=torch.int64)
    adv = grpo_advantages(torch.tensor(rewards, dtype=torch.float32), group_ids_t)
    return adv, group_ids_t, responses


# ----------------------------------------------------------------------------------------------
# Python-set implementations (the baselines)
# ----------------------------------------------------------------------------------------------


def python_mdap(advantages, group_ids, responses, *, threshold, multiple, semantics="reference", cached=False, ngram=1):
    """MDAP with Python sets: Phase 1 + round-robin Phase 2. Returns (keep list[bool], phase1 list[bool])."""
    adv = advantages.numpy()  # float32, as the reference's avg_advantages
    abs_adv = np.abs(adv)
    gids = group_ids.tolist()
    index_to_rows = defaultdict(list)
    for i, q in enumerate(gids):
        index_to_rows[q].append(i)
    qids = sorted(index_to_rows)
    set_cache = {}

    def build(i):
        seq = responses[i].tolist()
        if ngram == 1:
            return set(seq)
        return {tuple(seq[p : p + ngram]) for p in range(len(seq) - ngram + 1)}

    def token_set(i):
        if cached:
            s = set_cache.get(i)
            if s is None:
                s = set_cache[i] = build(i)
            return s
        return build(i)

    def jac(i, j):
        a, b = token_set(i), token_set(j)
        union = len(a | b)
        return len(a & b) / union if union > 0 else 1.0

    selected = defaultdict(list)
    unselected = defaultdict(list)
    for q in qids:
        rows = index_to_rows[q]
        chosen = set()
        if semantics == "reference":
            buckets = defaultdict(list)
            for i in rows:
                buckets[adv[i].round(4)].append(i)
            for members in buckets.values():
                seed = members[int(abs_adv[members].argmax())]
                chosen.add(seed)
                for i in members:
                    if i != seed and jac(i, seed) < threshold:
                        chosen.add(i)
        else:
            srt = sorted(rows, key=lambda i: float(adv[i]))
            clusters, cur = [], [srt[0]]
            for prev, i in zip(srt, srt[1:]):
                if float(adv[i]) - float(adv[prev]) < 1e-4:
                    cur.append(i)
                else:
                    clusters.append(cur)
                    cur = [i]
            clusters.append(cur)
            for members in clusters:
                kept = []
                for i in sorted(members, key=lambda i: (-float(abs_adv[i]), i)):
                    if all(jac(i, k) <= threshold for k in kept):
                        kept.append(i)
                chosen.update(kept)
        for i in rows:
            (selected if i in chosen else unselected)[q].append(i)
    phase1 = [False] * len(gids)
    for q in qids:
        for i in selected[q]:
            phase1[i] = True
    total = sum(phase1)
    need = (multiple - total % multiple) % multiple
    keep = list(phase1)
    if need:
        for q in qids:
            unselected[q] = sorted(unselected[q], key=lambda i: float(abs_adv[i]), reverse=True)
        ptr = 0
        while need > 0 and any(unselected[q] for q in qids):
            q = qids[ptr % len(qids)]
            if unselected[q]:
                keep[unselected[q].pop(0)] = True
                need -= 1
            ptr += 1
        if need:
            raise RuntimeError("not enough pruned rollouts to refill")
    return keep, phase1


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------


def median_time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def interleaved_times(fns, repeats):
    """Run the functions in turn, ``repeats`` rounds, so that all see the same machine load.
    Returns one list of times (seconds) per function."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small workload (32 groups, up to 512 tokens)")
    p.add_argument("--groups", type=int, default=256)
    p.add_argument("--n", type=int, default=8, help="responses per group")
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--threshold", type=float, default=0.2)
    p.add_argument("--multiple", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds")
    p.add_argument("--ngram", type=int, default=1, help="n-gram size of the token sets")
    p.add_argument("--num-bins", type=int, default=128, help="MinHash sketch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args(argv)
    if args.quick:
        args.groups, args.max_len, args.multiple, args.repeats = 32, 512, 16, 15
    torch.set_num_threads(args.threads)

    adv, gids, responses = make_workload(args.groups, args.n, args.max_len, args.seed)
    num_tokens = sum(int(r.shape[0]) for r in responses)
    print(
        f"workload: {args.groups} groups x {args.n} responses = {len(responses)} rollouts, "
        f"{num_tokens:,} response tokens (max length {args.max_len}), vocabulary {VOCAB:,}, "
        f"{args.ngram}-gram sets, threshold {args.threshold}, multiple {args.multiple}"
    )

    ok_all = True
    for semantics in ("reference", "paper"):
        res = mdap_select(
            adv,
            gids,
            responses,
            similarity_threshold=args.threshold,
            semantics=semantics,
            multiple=args.multiple,
            ngram=args.ngram,
        )
        keep_py, phase1_py = python_mdap(
            adv,
            gids,
            responses,
            threshold=args.threshold,
            multiple=args.multiple,
            semantics=semantics,
            cached=True,
            ngram=args.ngram,
        )
        same = res.keep.tolist() == keep_py and res.phase1_keep.tolist() == phase1_py
        ok_all &= same
        print(
            f"[{semantics:9s}] identical masks vs Python sets: {same}  "
            f"(phase 1 kept {int(res.phase1_keep.sum())}, final {res.num_kept} of {res.num_rollouts}, "
            f"f1 {res.f1:.3f}, f2 {res.f2}, buckets {res.num_buckets}, kept tokens {res.kept_token_fraction:.1%})"
        )

    kw = dict(threshold=args.threshold, multiple=args.multiple, ngram=args.ngram)
    fast_kw = dict(similarity_threshold=args.threshold, multiple=args.multiple, ngram=args.ngram)
    mdap_select(adv, gids, responses, **fast_kw)  # warm-up (the first call compiles the numba kernels)
    res = mdap_select(adv, gids, responses, **fast_kw)
    t_ref_all, t_cached_all, t_fast_all = interleaved_times(
        [
            lambda: python_mdap(adv, gids, responses, **kw),
            lambda: python_mdap(adv, gids, responses, cached=True, **kw),
            lambda: mdap_select(adv, gids, responses, **fast_kw),
        ],
        args.repeats,
    )
    t_ref, t_cached, t_fast = (statistics.median(x) for x in (t_ref_all, t_cached_all, t_fast_all))
    per_m = 1e6 / num_tokens
    print(f"\ntime per call, reference semantics (median / best of {args.repeats} interleaved rounds):")
    for name, ts in (
        ("python-set (reference style)", t_ref_all),
        ("python-set (cached sets)    ", t_cached_all),
        ("fastrl mdap_select (exact)  ", t_fast_all),
    ):
        med, best = statistics.median(ts), min(ts)
        print(f"  {name} {med * 1e3:9.1f} / {best * 1e3:7.1f} ms   {med * per_m * 1e3:8.1f} ms per million tokens")
    print(
        f"speed ratio vs reference style: {t_ref / t_fast:.1f}x (best-of: {min(t_ref_all) / min(t_fast_all):.1f}x)   "
        f"vs cached sets: {t_cached / t_fast:.1f}x (best-of: {min(t_cached_all) / min(t_fast_all):.1f}x)"
    )

    # approximate mode
    t_sketch, sketch = median_time(
        lambda: minhash_sketch(responses, num_bins=args.num_bins, ngram=args.ngram), args.repeats
    )
    t_approx, approx = median_time(lambda: mdap_select(adv, gids, sketch, **fast_kw), args.repeats)
    agree_final = float((approx.keep == res.keep).double().mean())
    agree_p1 = float((approx.phase1_keep == res.phase1_keep).double().mean())
    # estimation error on the pairs compared by the reference semantics (member vs bucket seed)
    rng = np.random.default_rng(1)
    rows = rng.choice(len(responses), size=min(2000, len(responses)), replace=False)
    by_group = defaultdict(list)
    for i, g in enumerate(gids.tolist()):
        by_group[g].append(i)
    partner = np.array([by_group[gids[i].item()][(by_group[gids[i].item()].index(i) + 1) % args.n] for i in rows])

    exact_j = np.array([jaccard(responses[i], responses[j], args.ngram) for i, j in zip(rows, partner)])
    est_j = estimate_jaccard(sketch.signatures[rows], sketch.signatures[partner])
    print(
        f"\nMinHash mode ({args.num_bins} bins): {sketch.bytes_per_rollout} bytes per rollout "
        f"(+8 for the length) vs {num_tokens * 8 / len(responses):,.0f} bytes of int64 tokens on average; "
        f"sketch {t_sketch * 1e3:.1f} ms, select {t_approx * 1e3:.1f} ms"
    )
    print(
        f"  agreement with exact mode: final mask {agree_final:.2%}, phase-1 mask {agree_p1:.2%}; "
        f"Jaccard estimate error on {rows.size} within-group pairs: mean |err| {np.abs(est_j - exact_j).mean():.4f}, "
        f"max {np.abs(est_j - exact_j).max():.4f}"
    )
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
