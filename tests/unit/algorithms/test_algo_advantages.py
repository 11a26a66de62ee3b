"""GRPO / Dr. GRPO / RLOO advantages: spec section 7 vectors, invariants, bad input."""

import pytest
import torch
from _algo_settings import PROPERTY
from hypothesis import given
from hypothesis import strategies as st

from fastrl.algorithms.advantages import (
    grpo_advantages,
    rloo_advantages,
    sequence_to_token_advantages,
    token_to_sequence_advantages,
)

ONE_GROUP = torch.zeros(8, dtype=torch.int64)


def test_spec_vector_one_success():
    adv = grpo_advantages(torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]), ONE_GROUP)
    assert adv.dtype == torch.float32
    assert adv[0].item() == pytest.approx(2.474867, abs=2e-6)
    assert adv[1:].tolist() == pytest.approx([-0.353552] * 7, abs=2e-6)


def test_spec_vector_mixed_levels():
    r = torch.tensor([1.5, 1.5, 0.5, 0.5, 0.5, 0, 1.5, 0.5])
    adv = grpo_advantages(r, ONE_GROUP)
    expected = {1.5: 1.157664, 0.5: -0.526211, 0.0: -1.368148}
    for reward, a in zip(r.tolist(), adv.tolist()):
        assert a == pytest.approx(expected[reward], abs=2e-6)


def test_spec_vector_constant_group_is_exactly_zero():
    assert grpo_advantages(torch.tensor([0.5] * 8), ONE_GROUP).tolist() == [0.0] * 8
    # 0.1 is not representable: the mean differs from the values by rounding, still exactly 0
    assert (
        grpo_advantages(torch.tensor([0.1] * 3, dtype=torch.float64), torch.zeros(3, dtype=torch.int64)).tolist()
        == [0.0] * 3
    )
    assert (
        grpo_advantages(torch.tensor([0.1] * 3), torch.zeros(3, dtype=torch.int64), scale=False).tolist() == [0.0] * 3
    )


def test_dr_grpo_and_biased_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    g = torch.zeros(5, dtype=torch.int64)
    assert grpo_advantages(r, g, scale=False).tolist() == pytest.approx([0.4, -0.6, -0.6, 0.4, 0.4])
    biased = grpo_advantages(r, g, unbiased=False, eps=0.0)
    std = (0.24) ** 0.5  # population std of three 1s and two 0s
    assert biased.tolist() == pytest.approx([0.4 / std, -0.6 / std, -0.6 / std, 0.4 / std, 0.4 / std])


def test_groups_are_independent_and_any_ids_work():
    r = torch.tensor([1.0, 5.0, 0.0, 7.0, 1.0, 5.0])
    g = torch.tensor([-3, 900, -3, 900, -3, 11])
    adv = grpo_advantages(r, g, scale=False)
    assert adv.tolist() == pytest.approx([1 / 3, -1.0, -2 / 3, 1.0, 1 / 3, 0.0])  # id 11 is a singleton -> 0


def test_valid_mask_excludes_rows_from_statistics():
    r = torch.tensor([1.0, 0.0, float("nan"), 1.0, 0.0])
    g = torch.zeros(5, dtype=torch.int64)
    valid = torch.tensor([True, True, False, True, False])
    adv = grpo_advantages(r, g, valid=valid)
    expected = grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.int64))
    assert adv[valid].tolist() == expected.tolist()
    assert adv[~valid].tolist() == [0.0, 0.0]
    # one valid row left: no relative signal
    assert grpo_advantages(r, g, valid=torch.tensor([True] + [False] * 4)).tolist() == [0.0] * 5


def test_rloo():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    adv = rloo_advantages(r, torch.zeros(4, dtype=torch.int64))
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert rloo_advantages(torch.tensor([2.0, 2.0]), torch.tensor([1, 1])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    "rewards, group_ids, kwargs, match",
    [
        (torch.tensor([1.0, 0.0]), torch.tensor([0, 0, 0]), {}, "group_ids` has 3 rows"),
        (torch.tensor([]), torch.tensor([], dtype=torch.int64), {}, "empty"),
        (torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), {}, r"rewards\[1\]` is nan"),
        (torch.tensor([[1.0, 0.0]]), torch.tensor([0, 0]), {}, "one-dimensional"),
        (torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), {"valid": torch.tensor([True])}, "valid"),
    ],
)
def test_bad_input(rewards, group_ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        grpo_advantages(rewards, group_ids, **kwargs)


def test_bad_types():
    with pytest.raises(TypeError, match="integers"):
        grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    with pytest.raises(TypeError, match="bool"):
        grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), valid=torch.tensor([1, 0]))


def test_sequence_token_round_trip():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    adv = torch.tensor([0.5, -2.0, 3.0])
    tok = sequence_to_token_advantages(adv, mask)
    assert tok.tolist() == [[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    back = token_to_sequence_advantages(tok, mask)
    assert back.tolist() == [0.5, -2.0, 0.0]  # a response without tokens gets 0
    with pytest.raises(ValueError, match="response_mask"):
        sequence_to_token_advantages(adv, mask[:2])


def test_token_to_sequence_is_exact_for_constant_rows():
    """Summing many float32 copies drifts; accumulating in float64 keeps equal rows bit-identical
    (MDAP buckets by these values)."""
    a = torch.tensor(-0.5262110233306885, dtype=torch.float32)
    mask = torch.zeros(2, 2000, dtype=torch.bool)
    mask[0, :1999] = True
    mask[1, :7] = True
    out = token_to_sequence_advantages(a * mask.float(), mask)
    assert out[0].item() == out[1].item() == a.item()


rewards_and_groups = st.integers(1, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, -2.0, 3.25]), min_size=n, max_size=n),
        st.lists(st.integers(-3, 3), min_size=n, max_size=n),
    )
)


@PROPERTY
@given(rewards_and_groups, st.booleans())
def test_property_group_sums_vanish_and_match_per_group_loop(data, scale):
    """Invariants: (1) advantages sum to 0 within every group; (2) the vectorized result equals a
    per-group Python loop of the formula; (3) permuting the rows permutes the result."""
    rewards, gids = data
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.tensor(gids)
    adv = grpo_advantages(r, g, scale=scale)
    for gid in set(gids):
        rows = [i for i, x in enumerate(gids) if x == gid]
        vals = [rewards[i] for i in rows]
        mean = sum(vals) / len(vals)
        if len(rows) < 2 or max(vals) == min(vals):
            expected = [0.0] * len(rows)
        else:
            std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5
            expected = [(v - mean) / (std + 1e-6) if scale else v - mean for v in vals]
        assert adv[rows].tolist() == pytest.approx(expected, abs=1e-9)
        assert sum(adv[rows].tolist()) == pytest.approx(0.0, abs=1e-9)
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(0))
    assert grpo_advantages(r[perm], g[perm], scale=scale).tolist() == pytest.approx(adv[perm].tolist(), abs=1e-12)


@PROPERTY
@given(rewards_and_groups, st.floats(-10, 10), st.floats(0.5, 4))
def test_property_affine_invariance(data, shift, factor):
    """GRPO advantages are invariant to shifting rewards and (up to eps) to scaling them."""
    rewards, gids = data
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.tensor(gids)
    base = grpo_advantages(r, g, eps=0.0)
    assert grpo_advantages(r * factor + shift, g, eps=0.0).tolist() == pytest.approx(base.tolist(), abs=1e-9)
