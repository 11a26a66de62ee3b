"""Plain-Python MDAP (Python sets, dicts and loops), written from spec section 2, to check the
vectorized implementation against. Deliberately naive: one rollout at a time."""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def token_set(tokens, ngram):
    seq = [int(t) for t in tokens]
    if ngram == 1:
        return set(seq)
    return {tuple(seq[p : p + ngram]) for p in range(len(seq) - ngram + 1)}


def jac(a, b):
    union = len(a | b)
    return len(a & b) / union if union > 0 else 1.0


def buckets_of_group(rows, adv, semantics, tol):
    """List of buckets (lists of rows in batch order)."""
    if semantics == "reference":
        by_key = defaultdict(list)
        for i in rows:
            by_key[adv[i].round(4)].append(i)  # numpy scalar round, in the advantages' dtype
        return list(by_key.values())
    srt = sorted(rows, key=lambda i: (float(adv[i]), i))
    clusters, cur = [], [srt[0]]
    for prev, i in zip(srt, srt[1:]):
        if float(adv[i]) - float(adv[prev]) < tol:
            cur.append(i)
        else:
            clusters.append(cur)
            cur = [i]
    clusters.append(cur)
    return [sorted(c) for c in clusters]


def mdap_reference(
    adv,
    group_ids,
    responses,
    *,
    threshold=0.2,
    semantics="reference",
    ngram=1,
    tol=1e-4,
    multiple=1,
    refill="round_robin",
):
    """Returns (keep list[bool], phase1 list[bool], num_buckets).

    Raises ValueError when Phase 2 cannot reach a multiple."""
    adv = np.asarray(adv)
    abs_adv = np.abs(adv)
    n = len(adv)
    sets = [token_set(r, ngram) for r in responses]
    groups = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[int(g)].append(i)
    phase1 = [False] * n
    num_buckets = 0
    for g in sorted(groups):
        for members in buckets_of_group(groups[g], adv, semantics, tol):
            num_buckets += 1
            if semantics == "reference":
                seed = members[0]
                for i in members:
                    if abs_adv[i] > abs_adv[seed]:
                        seed = i
                phase1[seed] = True
                for i in members:
                    if i != seed and jac(sets[i], sets[seed]) < threshold:
                        phase1[i] = True
            else:
                kept = []
                for i in sorted(members, key=lambda i: (-float(abs_adv[i]), i)):
                    if all(jac(sets[i], sets[k]) <= threshold for k in kept):
                        kept.append(i)
                for i in kept:
                    phase1[i] = True
    keep = list(phase1)
    need = (multiple - sum(phase1) % multiple) % multiple
    pruned = [i for i in range(n) if not phase1[i]]
    if need > len(pruned):
        raise ValueError("not enough pruned rollouts")
    if refill == "round_robin":
        queues = {
            g: sorted([i for i in groups[g] if not phase1[i]], key=lambda i: (-float(abs_adv[i]), i)) for g in groups
        }
        order = sorted(groups)
        ptr = 0
        while need > 0:
            g = order[ptr % len(order)]
            if queues[g]:
                keep[queues[g].pop(0)] = True
                need -= 1
            ptr += 1
    else:
        for i in sorted(pruned, key=lambda i: (-float(abs_adv[i]), i))[:need]:
            keep[i] = True
    return keep, phase1, num_buckets
