"""bench/prune_text.py's near-duplicate diagnostics and kept counts per bucket (issue 49 item 3)."""

from __future__ import annotations

import pytest

from bench.prune_text import auc, by_step, final_answer, kept_by_bucket, near_duplicate_report

BASE = list(range(100, 110))


def _rec(group, reward, adv, tokens, text, kept=True, step=1):
    return {"step": step, "dp_rank": 0, "group": group, "reward": reward, "advantage": adv,
            "response_token_ids": tokens, "response": text, "kept": kept}


def test_auc_counts_ties_as_one_half():
    """catches: ties counted as wins (or losses) for the positive pairs: equal scores must give 0.5."""
    assert auc([0.3, 0.3, 0.3, 0.3], [True, False, True, False]) == 0.5
    assert auc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auc([0.5, 0.5, 0.1], [True, False, False]) == pytest.approx(0.75)
    assert auc([0.1, 0.2], [True, True]) is None


def test_final_answer_prefers_the_box_then_answer_is_then_the_last_number():
    assert final_answer(r"so 3 \boxed{12} and 5") == "12"
    assert final_answer("3 + 4 = 7. The answer is 1,200. Done 9") == "1200"
    assert final_answer("it is 5 or 6") == "6" and final_answer("none") is None


def test_flagged_pairs_and_their_copies_at_the_threshold():
    """catches: a strict ``>`` at the threshold (a pair at exactly J = threshold not flagged), or
    pairs of different prompts counted as same-prompt pairs."""
    near = BASE[:9] + [999]  # 5-gram J with BASE: 5 / 7
    recs = [
        _rec(0, 1.0, 0.5, BASE, "The answer is 4."), _rec(0, 1.0, 0.5, near, "so the answer is 4"),
        _rec(0, 0.0, -1.5, list(range(200, 210)), "The answer is 5."),
        _rec(1, 1.0, 0.0, BASE, "The answer is 4."),  # another prompt: a cross-prompt pair only
    ]
    nd = near_duplicate_report(by_step(recs), ngram=5, threshold=5 / 7)
    assert nd["pairs"] == 3 and nd["flagged"] == 1 and nd["flagged_share"] == pytest.approx(1 / 3)
    assert nd["flagged_same_answer"] == 1.0 and nd["flagged_identical_text"] == 0.0
    assert nd["cross_prompt_pairs"] == 3 and nd["cross_prompt_flagged_share"] == pytest.approx(2 / 3)
    assert nd["auc_ngram"] == 1.0  # the same-reward pair is the most similar


def test_kept_counts_per_bucket_and_zero_advantage_shares():
    """catches: a uniform group's kept rows counted in an informative bucket, or tokens of kept
    zero-advantage rows counted as informative."""
    recs = [
        _rec(0, 1.0, 0.87, [1] * 4, "a"), _rec(0, 1.0, 0.87, [1] * 4, "a", kept=False),
        _rec(0, 0.0, -0.87, [1] * 2, "b"), _rec(0, 0.0, -0.87, [1] * 2, "b"),
        _rec(1, 0.0, 0.0, [1] * 6, "c"), _rec(1, 0.0, 0.0, [1] * 6, "c", kept=False),
    ]
    kb = kept_by_bucket(by_step(recs))
    assert kb["informative_bucket_kept"] == {1: 1, 2: 1} and kb["uniform_group_kept"] == {1: 1}
    assert kb["kept_zero_advantage_share"] == pytest.approx(1 / 4)
    assert kb["kept_tokens_nonzero_advantage_share"] == pytest.approx(8 / 14)
    assert kb["informative_kept_fraction"] == pytest.approx(3 / 4) and kb["mixed_groups_one_per_bucket"] == 0.0
