"""Near-duplicate clusters of responses for the budgeted selector (issue 49, item 3).

MDAP's unigram token-set Jaccard at 0.2 does not separate anything on natural text (on the
SmolLM2 word-problem runs >= 0.2 for 96-98% of same-bucket pairs and 76-93% of pairs of answers
to *different* problems; docs/algorithm.md). The standard near-duplicate test is a Jaccard index
of word or token n-gram sets, n around 5, at 0.7-0.8 (Broder 1997, "On the resemblance and
containment of documents"; the shingling used for web and training-data deduplication, e.g. Lee et
al. 2022, "Deduplicating Training Data Makes Language Models Better"). Here: token-id ``ngram``-gram
sets (:func:`fastrl.algorithms.pruning.jaccard`'s sets; two empty sets have J = 1).

Clusters are formed inside each advantage bucket (a copy earns the same reward, so it is in the
same bucket), greedily in the group's batch order: a row joins the cluster of the first earlier
representative of its bucket with ``J >= threshold``, otherwise it starts a cluster. The first row
of a cluster is its representative. Only the group's own order is used, so the clusters are the same
on every data-parallel layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fastrl.algorithms._checks import check_choice, check_positive_int
from fastrl.algorithms._prune_batch import SEMANTICS, Semantics, advantage_buckets, prepare_batch
from fastrl.algorithms.token_sets import flatten_responses, group_intersections, ngram_items

__all__ = ["near_duplicate_clusters"]


def near_duplicate_clusters(
    advantages: Any,
    group_ids: Any,
    responses: Sequence[Any],
    *,
    ngram: int = 5,
    threshold: float = 0.8,
    semantics: Semantics = "reference",
    adv_tolerance: float = 1e-4,
) -> np.ndarray:
    """Cluster each advantage bucket's near-copies (module docstring).

    Args:
        advantages: float [N]; group_ids: int [N]; responses: N 1-D int token-id sequences
            (unpadded).
        ngram: n-gram size >= 1 of the token-id sets.
        threshold: Jaccard index in [0, 1] at or above which a row joins a representative's cluster.
        semantics, adv_tolerance: the advantage buckets (spec 2.1).

    Returns:
        int64 [N]: the row of each row's representative (a representative points to itself).

    Raises:
        ValueError: mismatched lengths, a bad option; TypeError: non-integer ids.
    """
    ngram = check_positive_int(ngram, "ngram")
    check_choice(semantics, "semantics", SEMANTICS)
    if not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"`threshold` must be in [0, 1], got {threshold}")
    b = prepare_batch(advantages, group_ids)
    if len(responses) != b.n:
        raise ValueError(f"`responses` has {len(responses)} rows but `advantages` has {b.n}; they must match")
    flat, lengths = flatten_responses(responses, order=b.order)
    items, counts = ngram_items(flat, lengths[b.order], ngram)
    inter = group_intersections(items, counts, b.group_sizes)
    bid, _ = advantage_buckets(b, semantics, float(adv_tolerance))
    rep = np.arange(b.n, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(b.group_sizes)[:-1]])
    for g, (start, size) in enumerate(zip(starts.tolist(), b.group_sizes.tolist())):
        rows = b.order[start : start + size]  # the group's rows in batch order; local index = position
        m = inter[g]
        reps: list[int] = []  # local indices of this group's representatives
        for i in range(size):
            for r in reps:
                if bid[rows[r]] != bid[rows[i]]:
                    continue
                union = m[i, i] + m[r, r] - m[i, r]
                if (m[i, r] / union if union > 0 else 1.0) >= threshold:
                    rep[rows[i]] = rows[r]
                    break
            else:
                reps.append(i)
    return rep
