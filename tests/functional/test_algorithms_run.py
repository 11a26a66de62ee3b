"""One step of every base algorithm family through the real trainer (tiny model)."""

import pytest

from tests.functional.conftest import read_jsonl, run_train

pytestmark = pytest.mark.functional


@pytest.mark.parametrize(
    "recipe, checks",
    [
        ("easyvqa_tiny_fastrl_dapo_cpu", {"dapo/extra_rounds": 1.0}),
        ("easyvqa_tiny_gspo_cpu", {"prune/kept_fraction": 1.0}),
        ("easyvqa_tiny_cppo_grpo_cpu", {"prune/kept_fraction": 0.5}),
        ("easyvqa_tiny_dapo_cpu", {"dapo/extra_rounds": 1.0, "prune/kept_fraction": 1.0}),
        # GSPO's sequence-level loss and the no-ARS ablation through MDAP (every advantage 0: the
        # untrained policy answers nothing right; one advantage bucket per group)
        ("easyvqa_tiny_fastrl_gspo_cpu", {"rollout/n": 4.0}),
        ("easyvqa_tiny_fastrl_mdap_grpo_cpu", {"rollout/n": 4.0}),
    ],
)
def test_one_step(tmp_path, recipe, checks):
    proc = run_train(
        tmp_path, "trainer.max_steps=1", "trainer.val_before_train=false", "algorithm.max_dynamic_sampling_rounds=1",
        recipe=recipe,
    )
    train = [r for r in read_jsonl(tmp_path / recipe / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train) == 1
    for key, value in checks.items():
        assert train[0][key] == value, key
    if "fastrl_gspo" in recipe or "mdap" in recipe:
        # MDAP keeps at least the seed of each group's one bucket (4 groups), and nothing twice
        assert train[0]["prune/num_kept"] >= 4 and train[0]["prune/kept_fraction"] <= 1.0
    if "dapo" in recipe:
        # the untrained policy answers nothing right: every group is uninformative, the extra
        # round is spent, and the step trains on what was collected, with a warning
        assert train[0]["dapo/informative_group_fraction"] == 0.0
        assert "training on the unfiltered batch" in proc.stdout + proc.stderr
        assert "actor/kl_loss" not in train[0]  # DAPO has no KL term
