"""Balanced re-partition of kept rollouts over data-parallel ranks (pure; no communication).

After DP-global pruning every rank holds some of the kept rollouts, in uneven numbers. The update
needs the same count on every DP rank (whole micro-batches in lock-step) and near-equal token
loads (the slowest rank sets the step time). :func:`balanced_assignment` computes a target rank for
each kept rollout:

1. Fast path: if the current placement already has equal counts and every rank's load is within
   the largest rollout's length of the mean, nothing moves.
2. Otherwise, greedy LPT with a cardinality constraint: rollouts sorted by length (descending) are
   taken in blocks of P (P = DP size); within a block the longest goes to the lightest bin, the
   next longest to the next lightest, and so on. Every bin gets exactly one rollout per block, so
   counts are equal, and the spread of bin loads never exceeds the longest rollout (if the spread
   before a block is at most L_max, pairing ascending loads with descending lengths keeps it so).
   Hence every load is within one sequence length of the mean.
3. Bins are then matched to ranks to maximize the rollouts that stay where they are (an optimal
   assignment, Hungarian algorithm, over the P x P overlap matrix); only the rest move.
"""

from __future__ import annotations

from typing import Sequence


def _hungarian_max(weight: list[list[int]]) -> list[int]:
    """``col[row]`` maximizing ``sum weight[row][col[row]]`` (square matrix; O(P^3))."""
    n = len(weight)
    big = max((max(r) for r in weight), default=0)
    cost = [[big - w for w in row] for row in weight]  # minimize
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    p, way = [0] * (n + 1), [0] * (n + 1)
    for i in range(1, n + 1):
        p[0], j0 = i, 0
        minv, used = [inf] * (n + 1), [False] * (n + 1)
        while True:
            used[j0] = True
            i0, delta, j1 = p[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, j0
                    if minv[j] < delta:
                        delta, j1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[p[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            j0 = j1
            if p[j0] == 0:
                break
        while True:
            j1 = way[j0]
            p[j0] = p[j1]
            j0 = j1
            if j0 == 0:
                break
    col = [0] * n
    for j in range(1, n + 1):
        col[p[j] - 1] = j - 1
    return col


def _balanced(loads: Sequence[int], counts: Sequence[int], max_len: int) -> bool:
    if len(set(counts)) > 1:
        return False
    mean = sum(loads) / len(loads)
    return all(abs(load - mean) <= max_len for load in loads)


def balanced_assignment(lengths: Sequence[int], owners: Sequence[int], num_ranks: int) -> list[int]:
    """Target DP rank of each kept rollout: equal counts, loads within one length of the mean.

    Args:
        lengths: token load of each kept rollout (prompt + response tokens), N >= 0 values.
        owners: the DP rank currently holding each rollout (0 <= owner < num_ranks).
        num_ranks: DP size P (never the world size).

    Returns:
        ``target[i]`` in ``[0, P)``; every rank receives N / P rollouts and
        ``|load_r - sum(lengths) / P| <= max(lengths)``.

    Raises:
        ValueError: N is not a multiple of P (the refill must produce a multiple of the DP size;
            an empty rank would stall the update), N == 0, or bad owners / lengths.
    """
    n = len(lengths)
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if len(owners) != n:
        raise ValueError(f"{len(owners)} owners for {n} rollouts")
    if n == 0 or n % num_ranks:
        raise ValueError(
            f"{n} kept rollouts cannot be split evenly over {num_ranks} data-parallel ranks; the kept "
            f"count must be a positive multiple of the DP size (pruning's refill multiple includes it)"
        )
    if any(not 0 <= o < num_ranks for o in owners):
        raise ValueError(f"owners must be DP ranks in [0, {num_ranks}), got {sorted(set(owners))}")
    if any(length < 0 for length in lengths):
        raise ValueError("rollout lengths must be >= 0")
    max_len = max(lengths)
    loads, counts = [0] * num_ranks, [0] * num_ranks
    for length, owner in zip(lengths, owners):
        loads[owner] += length
        counts[owner] += 1
    if _balanced(loads, counts, max_len):
        return list(owners)
    # Greedy LPT in blocks of P: longest rollout of a block to the lightest bin.
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    bin_of = [0] * n
    bin_load = [0] * num_ranks
    for start in range(0, n, num_ranks):
        block = order[start : start + num_ranks]
        bins = sorted(range(num_ranks), key=lambda b: (bin_load[b], b))
        for item, b in zip(block, bins):
            bin_of[item] = b
            bin_load[b] += lengths[item]
    # Match bins to ranks keeping as many rollouts in place as possible.
    overlap = [[0] * num_ranks for _ in range(num_ranks)]
    for i in range(n):
        overlap[bin_of[i]][owners[i]] += 1
    rank_of_bin = _hungarian_max(overlap)
    return [rank_of_bin[bin_of[i]] for i in range(n)]
