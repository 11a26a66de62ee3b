"""Policy losses, KL estimators, aggregation and truncated IS: spec section 7 vectors, gradients,
invariance to the micro-batch / DP split, bad input."""

import math

import pytest
import torch
from _algo_settings import PROPERTY
from hypothesis import given
from hypothesis import strategies as st

from fastrl.algorithms.importance_sampling import truncated_importance_weights
from fastrl.algorithms.kl import k1, k2, kl_estimate, low_var_kl
from fastrl.algorithms.losses import aggregate_loss, gspo_loss, kl_loss, loss_denominator, ppo_clip_loss


def one_token(ratio: float, adv: float, dtype=torch.float64):
    logp = torch.tensor([[math.log(ratio)]], dtype=dtype)
    return logp, torch.zeros(1, 1, dtype=dtype), torch.tensor([adv], dtype=dtype), torch.ones(1, 1)


@pytest.mark.parametrize(
    "adv, ratio, clip_high, expected",
    [
        (1.0, 1.35, 0.28, -1.28),
        (1.0, 1.35, 0.3, -1.30),
        (1.0, 0.7, 0.28, -0.7),
        (-1.0, 0.7, 0.28, 0.8),
        (-1.0, 1.35, 0.28, 1.35),
        (-1.0, 5.0, 0.28, 3.0),
    ],
)
def test_ppo_spec_vectors(adv, ratio, clip_high, expected):
    logp, old, a, m = one_token(ratio, adv)
    loss, _ = ppo_clip_loss(logp, old, a, m, global_denominator=1, clip_low=0.2, clip_high=clip_high, dual_clip=3.0)
    assert loss.item() == pytest.approx(expected, abs=1e-12)


def test_ppo_without_dual_clip_and_metrics():
    logp, old, a, m = one_token(5.0, -1.0)
    loss, metrics = ppo_clip_loss(logp, old, a, m, global_denominator=1, dual_clip=None)
    assert loss.item() == pytest.approx(5.0)
    # two tokens: one clipped on the high side (A>0, ratio 1.5), one dual-clipped (A<0, ratio 5)
    logp = torch.log(torch.tensor([[1.5, 5.0, 1.0]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = ppo_clip_loss(logp, torch.zeros_like(logp), adv, mask, global_denominator=2, clip_high=0.28)
    assert loss.item() == pytest.approx((-1.28 + 3.0) / 2)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)  # the A<0, ratio 5 token is not clip-active
    assert metrics["pg_clipfrac_high"].item() == pytest.approx(0.5)
    assert metrics["pg_clipfrac_low"].item() == 0.0
    assert metrics["pg_dual_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["ratio_max"].item() == pytest.approx(5.0)
    assert metrics["ratio_min"].item() == pytest.approx(1.5)
    assert metrics["ppo_kl"].item() == pytest.approx(-(math.log(1.5) + math.log(5.0)) / 2)
    assert metrics["approx_kl"].item() == pytest.approx(((0.5 - math.log(1.5)) + (4.0 - math.log(5.0))) / 2)


def test_ppo_gradient():
    """d loss / d logp = -A * ratio where unclipped and 0 where clipped; dual-clipped tokens get 0."""
    logp = torch.log(torch.tensor([[1.1, 1.5, 0.5, 5.0]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([[2.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 4, dtype=torch.float64), adv, torch.ones(1, 4), global_denominator=4)
    loss.backward()
    assert logp.grad.tolist()[0] == pytest.approx([-2.0 * 1.1 / 4, 0.0, 0.0, 0.0])


def test_importance_weights_scale_the_token_loss():
    logp, old, a, m = one_token(1.1, 1.0)
    loss, _ = ppo_clip_loss(logp, old, a, m, global_denominator=1, importance_weights=torch.tensor([[0.5]]))
    assert loss.item() == pytest.approx(-1.1 * 0.5)


def test_aggregation_modes():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert loss_denominator(mask, "token-mean").item() == 4
    assert loss_denominator(mask, "seq-mean-token-mean").item() == 2
    assert aggregate_loss(loss_mat, mask, "token-mean", global_denominator=4).item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean", global_denominator=2).item() == pytest.approx(
        (2 + 4) / 2
    )
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum", global_denominator=2).item() == pytest.approx(10 / 2)
    # a row without response tokens is not a sequence
    assert loss_denominator(torch.tensor([[1, 0], [0, 0]]), "seq-mean-token-sum").item() == 1


@PROPERTY
@given(
    st.integers(2, 9),
    st.integers(1, 6),
    st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
    st.lists(st.integers(1, 8), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_property_split_invariance(n, t, agg_mode, cuts, seed):
    """Invariant: summing the micro-batch losses (each divided by the global denominator, summed
    over micro-batches first) gives the full-batch loss and gradient, whatever the split."""
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, t, generator=gen, dtype=torch.float64)).requires_grad_()
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, t, generator=gen) < 0.7
    mask[:, 0] = True
    full, _ = ppo_clip_loss(
        logp, old, adv, mask, global_denominator=loss_denominator(mask, agg_mode), agg_mode=agg_mode
    )
    (g_full,) = torch.autograd.grad(full, logp)
    bounds = sorted({0, n, *[c % n for c in cuts]})
    parts = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    denom = sum(loss_denominator(mask[a:b], agg_mode) for a, b in parts)
    total = sum(
        ppo_clip_loss(logp[a:b], old[a:b], adv[a:b], mask[a:b], global_denominator=denom, agg_mode=agg_mode)[0]
        for a, b in parts
    )
    (g_split,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-12)
    assert torch.allclose(g_split, g_full, rtol=1e-12, atol=1e-14)


def test_gspo_spec_vectors():
    lr = torch.tensor([[0.01, -0.02, 0.04], [-0.002, -0.001, 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 3)
    # A = +1 on the first response (ratio above the range), -1 on the second (below it): both clipped
    loss, metrics = gspo_loss(
        lr, torch.zeros_like(lr), torch.tensor([1.0, -1.0], dtype=torch.float64), mask, global_denominator=2
    )
    assert metrics["seq_ratio_max"].item() == pytest.approx(1.010050, abs=1e-6)
    assert metrics["seq_ratio_min"].item() == pytest.approx(0.9990005, abs=1e-9)
    assert metrics["seq_clipfrac"].item() == 1.0
    assert loss.item() == pytest.approx((-1.0004 + 0.9997) / 2, abs=1e-12)
    # with the opposite signs the unclipped ratios are the pessimistic ones
    loss, _ = gspo_loss(
        lr, torch.zeros_like(lr), torch.tensor([-1.0, 1.0], dtype=torch.float64), mask, global_denominator=2
    )
    assert loss.item() == pytest.approx((math.exp(0.01) - math.exp(-0.001)) / 2, abs=1e-12)


def test_gspo_token_variant_matches_sequence_variant():
    gen = torch.Generator().manual_seed(3)
    base = -torch.rand(4, 5, generator=gen, dtype=torch.float64)
    old = base + 1e-4 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0], dtype=torch.float64)
    grads, losses = [], []
    for variant in ("sequence", "token"):
        logp = base.clone().requires_grad_()
        loss, _ = gspo_loss(logp, old, adv, mask, global_denominator=4, variant=variant)
        loss.backward()
        grads.append(logp.grad)
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-15)
    assert torch.allclose(grads[0], grads[1], atol=1e-15)
    assert grads[0][1, 2:].abs().sum() == 0  # padding gets no gradient


def test_gspo_sequence_variant_rejects_token_advantages():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one advantage per response"):
        gspo_loss(x, x, torch.zeros(2, 3), torch.ones(2, 3), global_denominator=2)
    loss, _ = gspo_loss(x, x, torch.ones(2, 3), torch.ones(2, 3), global_denominator=2, variant="token")
    assert loss.item() == pytest.approx(-1.0)


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-0.9, -2.5], dtype=torch.float64)
    assert low_var_kl(logp, ref).tolist() == pytest.approx([0.0051709, 0.1065307], abs=1e-7)
    assert k1(logp, ref).tolist() == pytest.approx([-0.1, 0.5])
    assert k2(logp, ref).tolist() == pytest.approx([0.005, 0.125])
    assert kl_estimate(logp, ref, "k2").tolist() == k2(logp, ref).tolist()
    # clamps: x clamped to 20, then the value to 10
    assert low_var_kl(torch.tensor([-100.0]), torch.tensor([0.0])).item() == 10.0
    assert low_var_kl(torch.tensor([0.0]), torch.tensor([-100.0])).item() == 10.0  # x = -20: 19.0 -> 10
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k4")
    with pytest.raises(ValueError, match="shape"):
        k1(logp, ref[:1])


def test_kl_loss_token_mean():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=torch.float64)
    ref = torch.tensor([[-0.9, -2.5, 0.0]], dtype=torch.float64)
    loss, metrics = kl_loss(logp, ref, torch.tensor([[1, 1, 0]]), global_denominator=2)
    assert loss.item() == pytest.approx((0.0051709 + 0.1065307) / 2, abs=1e-7)
    assert metrics["kl_token_mean"].item() == pytest.approx(loss.item())


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, m: ppo_clip_loss(x, x, torch.zeros(2), m, global_denominator=0), "global_denominator"),
        (lambda x, m: ppo_clip_loss(x, x, torch.zeros(2), m, global_denominator=1, agg_mode="mean"), "agg_mode"),
        (lambda x, m: ppo_clip_loss(x, x[:1], torch.zeros(2), m, global_denominator=1), "old_log_probs"),
        (lambda x, m: ppo_clip_loss(x, x, torch.zeros(3), m, global_denominator=1), "advantages"),
        (lambda x, m: ppo_clip_loss(x, x, torch.zeros(2), m, global_denominator=1, dual_clip=1.0), "dual_clip"),
        (lambda x, m: gspo_loss(x, x, torch.zeros(2), m, global_denominator=1, variant="seq"), "variant"),
        (lambda x, m: aggregate_loss(x, m[:1], "token-mean", global_denominator=1), "share one shape"),
    ],
)
def test_loss_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.zeros(2, 3), torch.ones(2, 3))


def test_truncated_importance_weights_token_level():
    trainer = torch.tensor([[-1.0, -1.0, -1.0, 0.0]], dtype=torch.float64)
    engine = torch.tensor([[-1.5, -1.0, -0.2, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    w, metrics = truncated_importance_weights(trainer, engine, mask, cap=1.5)
    assert w.tolist()[0] == pytest.approx([1.5, 1.0, math.exp(-0.8), 0.0])  # exp(0.5) = 1.65 is capped
    assert metrics["is/frac_capped"].item() == pytest.approx(1 / 3)
    assert metrics["is/mean_abs_logp_diff"].item() == pytest.approx((0.5 + 0.0 + 0.8) / 3)
    assert metrics["is/max_abs_logp_diff"].item() == pytest.approx(0.8)
    assert not w.requires_grad


def test_truncated_importance_weights_sequence_level():
    trainer = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    engine = torch.tensor([[-1.2, -1.3], [-0.9, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    w, metrics = truncated_importance_weights(trainer, engine, mask, level="sequence", cap=1.5)
    assert w.flatten().tolist() == pytest.approx([1.5, 1.5, math.exp(-0.1), 0.0])  # exp(0.5) capped; padding 0
    assert metrics["is/frac_capped"].item() == pytest.approx(0.5)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(trainer, engine, mask, cap=0.0)
    with pytest.raises(ValueError, match="level"):
        truncated_importance_weights(trainer, engine, mask, level="batch")
