"""One step of the issue-49 pruning rules through the real trainer (tiny model): the uniform groups
dropped with their KL sampled (KL weights through the actor's loss), and the budget-stratified rule
with near-copies merged and its weights."""

import pytest

from tests.functional.conftest import COIN_REWARD, read_jsonl, run_train

pytestmark = pytest.mark.functional


@pytest.mark.parametrize(
    "recipe, overrides",
    [
        ("easyvqa_tiny_zeroadv_klsample_grpo_cpu", ()),
        ("easyvqa_tiny_budget_grpo_cpu", ("pruning.drop_uniform_groups=true", "pruning.zero_adv_kl=sample",
                                          "pruning.zero_adv_kl_samples=2")),
    ],
)
def test_one_step(tmp_path, recipe, overrides):
    """catches: a step that fails with the KL weights in the batch (a per-rollout tensor the actor or
    the re-partition does not carry), or uniform groups trained although dropped."""
    run_train(tmp_path, "trainer.max_steps=1", "trainer.val_before_train=false", COIN_REWARD, *overrides, recipe=recipe)
    train = [r for r in read_jsonl(tmp_path / recipe / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train) == 1
    for row in train:
        assert row["prune/uniform_kept"] <= (2.0 if overrides else 4.0)  # the KL sample (refill adds none at DP=1)
        assert row["prune/uniform_dropped"] == row["prune/uniform_rollouts"] - row["prune/uniform_kept"]
        assert "actor/kl_loss" in row
    if "budget" in recipe:
        assert all(r["prune/num_kept"] < r["prune/num_rollouts"] for r in train)
