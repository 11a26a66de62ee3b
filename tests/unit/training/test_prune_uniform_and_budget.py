"""The pruning phase with pruning.drop_uniform_groups / zero_adv_kl and pruning.method=budget_stratified
(issue 49): what reaches the update (rows, advantage weights, KL weights), what ARS records, and the
config checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fastrl.config import PruningConfig
from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
from fastrl.training.geometry import step_geometry
from fastrl.training.prune_phase import prune, repartition_kept
from fastrl.training.pruner import select_step
from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
from recipes.registry import get_recipe

# group 0 all right, group 1 two right / two wrong, group 2 all wrong, group 3 three right / one wrong
REWARDS = [1.0] * 4 + [1.0, 0.0, 0.0, 1.0] + [0.0] * 4 + [1.0, 1.0, 0.0, 1.0]
RESPONSES = [[i, i + 1, i + 2, i + 3, i + 4, i + 5] for i in range(16)]
RESPONSES[12] = RESPONSES[13] = [7, 7, 8, 8, 9, 9]  # group 3: two copies in the right bucket


def _advantaged():
    ro = Rollouts(
        prompts=[RolloutPrompt(text=f"q{g}") for g in range(4)],
        prompt_inputs=[PromptInputs(input_ids=torch.tensor([1, 2])) for _ in range(4)],
        n_per_prompt=[4] * 4, prompt_index=[g for g in range(4) for _ in range(4)],
        response_token_ids=[torch.tensor(r) for r in RESPONSES], logprobs=[-torch.ones(len(r)) for r in RESPONSES],
        finish_reasons=["stop"] * 16, response_texts=[f"text {i}" for i in range(16)],
    )
    gid = torch.arange(4).repeat_interleave(4)
    r = torch.tensor(REWARDS)
    scored = ScoredRollouts(
        ro, group_ids=gid, rewards=r, accuracy=r, valid=torch.ones(16, dtype=torch.bool),
        formatted=torch.ones(16, dtype=torch.bool),
    )
    from fastrl.algorithms.advantages import grpo_advantages

    return scored.with_advantages(grpo_advantages(r, gid))


def _run(**pruning):
    base = get_recipe("easyvqa_tiny_grpo_cpu")
    cfg = dataclasses.replace(base, pruning=dataclasses.replace(base.pruning, **pruning))
    scored = _advantaged()
    batch = to_policy_batch(scored, range(16), pad_token_id=0)
    outcome, metrics = prune(cfg, scored, batch, step=2, geometry=step_geometry(cfg, 1, 4))
    trained, _ = repartition_kept(batch, outcome)
    return outcome, metrics, trained


UNIFORM = torch.tensor([True] * 4 + [False] * 4 + [True] * 4 + [False] * 4)


def test_drop_uniform_groups_composes_with_mdap_and_is_counted():
    """catches: pruning.drop_uniform_groups ignored by the step (select_step running the method on the
    whole batch), which keeps MDAP's seed of each uniform group."""
    outcome, m, trained = _run(method="fastrl", drop_uniform_groups=True)
    assert not (outcome.keep & UNIFORM).any()
    assert outcome.kept_per_group[0] == outcome.kept_per_group[2] == 0  # ARS sees the drop
    assert m["prune/uniform_groups"] == 2 and m["prune/uniform_dropped"] == 8 and m["prune/uniform_kept"] == 0
    assert trained.kl_weights is None and len(trained) == int(outcome.keep.sum())


def test_kl_sample_reaches_the_update_with_its_weight():
    """catches: the KL weights not carried to the trained rows (``kl_weights`` unset on the batch),
    so the sampled uniform rollouts' KL is counted once instead of U / s times."""
    outcome, m, trained = _run(method="none", drop_uniform_groups=True, zero_adv_kl="sample", zero_adv_kl_samples=2)
    assert int((outcome.keep & UNIFORM).sum()) == 2 and m["prune/kl_sample_weight"] == 4.0
    assert sorted(trained.kl_weights.tolist()) == [1.0] * 8 + [4.0, 4.0]
    assert float(trained.advantages[trained.kl_weights == 4.0].abs().sum()) == 0.0


def test_kl_sample_without_a_kl_loss_is_refused():
    """catches: the check gone (the setting accepted and its KL sample trained on nothing), or made at
    the first step instead of when the config is built (after the model build and a generation)."""
    from fastrl.config import ConfigError

    base = get_recipe("easyvqa_tiny_dapo_cpu")  # no KL loss
    with pytest.raises(ConfigError, match="zero_adv_kl='sample' keeps uniform-group rollouts for the KL loss"):
        dataclasses.replace(base, pruning=PruningConfig(method="none", drop_uniform_groups=True, zero_adv_kl="sample"))


def test_the_kl_sample_counts_in_the_loss_denominator_as_often_as_in_the_kl_sum():
    """catches: the denominator counting a sampled uniform rollout once while the KL sum counts it
    U / s times (the KL term inflated by about (K + U) / (K + s): a larger effective kl_coef)."""
    from types import SimpleNamespace

    from fastrl.batch import PolicyBatch
    from fastrl.training.actor import Actor

    mask = torch.tensor([[False, True, True], [False, True, False]])
    batch = PolicyBatch(input_ids=torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3, dtype=torch.bool),
                        response_mask=mask)
    stub = SimpleNamespace(agg_mode="token-mean")
    assert float(Actor.local_denominator(stub, batch)) == 3.0
    assert float(Actor.local_denominator(stub, batch.with_tensors(kl_weights=torch.tensor([1.0, 4.0])))) == 6.0
    seq = SimpleNamespace(agg_mode="seq-mean-token-mean")
    assert float(Actor.local_denominator(seq, batch.with_tensors(kl_weights=torch.tensor([1.0, 4.0])))) == 5.0


def test_budget_stratified_merges_copies_and_weights_restore_the_group_sums():
    """catches: the budget rule's own weights not applied (weights None, or pruning.weighting's
    instead), or the near-duplicate clusters not passed to them: every trained group's weighted
    advantages must sum to 0 and a merged pair's representative weighs for both."""
    outcome, m, trained = _run(method="budget_stratified", budget_fraction=0.5, dedup_threshold=0.7)
    keep = outcome.keep
    assert m["prune/duplicate_rows"] == 1 and not keep[13]  # row 13 copies row 12
    assert keep[12] and keep[15]  # the right bucket of group 3 has two candidates (12, 15): k = 2 keeps both
    w = outcome.weights
    assert float(w[12]) == pytest.approx(2 * float(w[15]))  # 12 stands for itself and its copy 13
    adv = outcome.inputs.advantages * outcome.weights.double()
    for g in (1, 3):
        assert float(adv[outcome.inputs.group_ids == g].sum()) == pytest.approx(0.0, abs=1e-6)
    assert outcome.kept_per_group == {g: int(keep[4 * g: 4 * g + 4].sum()) for g in range(4)}  # ARS


def test_select_step_runs_the_method_on_the_mixed_groups_only():
    """catches: the budget spent on the whole batch before the uniform groups are dropped (the
    selector must see the mixed groups only: with a budget of 50% of them, 4 of the 8 mixed rows)."""
    from fastrl.algorithms.advantages import grpo_advantages

    r = torch.tensor(REWARDS)
    gid = torch.arange(4).repeat_interleave(4)
    cfg = PruningConfig(method="budget_stratified", budget_fraction=0.5, dedup_threshold=None, drop_uniform_groups=True)
    s = select_step(cfg, grpo_advantages(r, gid), gid, [torch.tensor(x) for x in RESPONSES], multiple=1,
                    generator=torch.Generator().manual_seed(0), response_lengths=torch.tensor([len(x) for x in RESPONSES]))
    assert int(s.result.keep.sum()) == 4 and not (s.result.keep & UNIFORM).any()
    assert s.metrics["prune/uniform_rollouts"] == 8 and s.metrics["prune/budget_excess"] == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(zero_adv_kl="sample"), "set pruning.drop_uniform_groups=true"),
        (dict(drop_uniform_groups=True, zero_adv_kl_samples=8), "used by pruning.zero_adv_kl='sample' only"),
        (dict(method="fastrl", budget_fraction=0.5), "configure pruning.method=budget_stratified"),
        (dict(method="cppo", dedup_threshold=None), "configure pruning.method=budget_stratified"),
        (dict(method="budget_stratified", weighting="bucket_size"), "applies its own members / kept weights"),
        (dict(method="budget_stratified", similarity_mode="minhash"), "leave it at 'exact'"),
        (dict(method="budget_stratified", min_per_bucket=0), "min_per_bucket must be >= 1"),
    ],
)
def test_settings_that_would_be_ignored_are_refused(kwargs, message):
    """catches: a budget / KL-sample setting accepted and ignored under another method or mode."""
    with pytest.raises(ValueError, match=message):
        PruningConfig(**kwargs)


def test_budget_excess_counts_the_floor_kept_past_a_tiny_budget():
    """catches: the excess logged against the wrong budget (the whole batch instead of the mixed
    groups the rule saw) or not at all: budget 1 of 8 mixed rollouts, 4 informative buckets -> 3."""
    from fastrl.algorithms.advantages import grpo_advantages

    r = torch.tensor(REWARDS)
    gid = torch.arange(4).repeat_interleave(4)
    cfg = PruningConfig(method="budget_stratified", budget_fraction=0.125, dedup_threshold=None, drop_uniform_groups=True)
    s = select_step(cfg, grpo_advantages(r, gid), gid, [torch.tensor(x) for x in RESPONSES], multiple=1,
                    generator=torch.Generator().manual_seed(0), response_lengths=torch.tensor([len(x) for x in RESPONSES]))
    assert int(s.result.keep.sum()) == 4 and s.metrics["prune/budget_excess"] == 3


def test_the_actor_loss_applies_the_batchs_kl_weights():
    """catches: the actor not passing the batch's ``kl_weights`` to the KL loss (a sampled uniform
    rollout's KL counted once instead of U / s times)."""
    from types import SimpleNamespace

    from fastrl.batch import PolicyBatch
    from fastrl.config import AlgorithmConfig
    from fastrl.training.actor import Actor

    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.tensor([[False, True, True], [False, True, True]])
    lp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -1.5]])
    mb = PolicyBatch(
        input_ids=ids, attention_mask=torch.ones(2, 3, dtype=torch.bool), response_mask=mask,
        advantages=torch.zeros(2), old_log_probs=lp, ref_log_probs=lp - 0.3,
    )
    stub = SimpleNamespace(algorithm=AlgorithmConfig(tis_cap=None), agg_mode="token-mean")
    den = torch.tensor(4.0)
    _, plain = Actor.micro_batch_loss(stub, mb, lp, den)
    _, weighted = Actor.micro_batch_loss(stub, mb.with_tensors(kl_weights=torch.tensor([1.0, 3.0])), lp, den)
    # equal per-row KL here, so weights 1 and 3 double the KL term
    torch.testing.assert_close(weighted["actor/kl_loss"], 2 * plain["actor/kl_loss"])
