"""The main job, tiny: every phase of a FastRL step runs and its metrics are consistent.

The run uses the deterministic coin reward (``tests/functional/coin_rewards.py``): under the recipe's
strict reward the untrained policy never answers right, every advantage is 0, the update changes
nothing but weight decay, and a skipped refit or a dead update would pass unnoticed. Breakage
checked: zeroing the advantages (``fastrl/training/scoring.py``) fails the advantage and gradient
bounds at step 1.
"""

import json
import time
from pathlib import Path

import pytest

from tests.functional.conftest import COIN_REWARD, read_jsonl, run_train

pytestmark = pytest.mark.functional

THRESHOLDS = json.loads((Path(__file__).parent / "tiny_run_thresholds.json").read_text())


def test_tiny_fastrl_run_metrics_within_thresholds(tmp_path):
    start = time.monotonic()
    proc = run_train(tmp_path, "trainer.max_steps=3", COIN_REWARD, "data.test_size=8", "trainer.test_every=2",
                     "logging.rollouts_every=2", "logging.plots=true")
    wall = time.monotonic() - start
    run_dir = tmp_path / "easyvqa_tiny_fastrl_grpo_cpu"
    assert "validation accuracy:" in proc.stdout + proc.stderr
    records = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["step"] for r in val] == [0, 3]
    # the held-out test split is evaluated every trainer.test_every=2 steps and on the final policy
    # after its last validation (breakage caught: an evaluation skipped, repeated at the last step,
    # or taken before the checkpoint)
    assert [(r["kind"], r["step"]) for r in records if r["kind"] in ("val", "test")] == [
        ("val", 0), ("test", 2), ("val", 3), ("test", 3)]
    assert records[-1]["kind"] == "test" and records[-1]["test/questions"] == 8
    for r in train:
        for key in THRESHOLDS["required_metrics"]:
            assert key in r, key
        # every phase is timed (time/step is their sum)
        assert min(r[f"time/{phase}"] for phase in THRESHOLDS["required_time_phases"]) > 0.0
        # the refit reached the engine: a skipped or partial refit leaves the engine on the previous
        # weights, whose log-probs differ from the trainer's once an update has changed them
        assert r["mismatch/abs_diff_max"] <= THRESHOLDS["max_abs_logprob_mismatch"]
        # the policy-gradient term is live: zeroed advantages (or the strict reward) read 0 here, and
        # at step 1 (policy == reference, so the KL term has no gradient) a gradient norm of 0
        assert r["advantage/abs_mean"] >= THRESHOLDS["min_abs_advantage_mean"]
        # (pre-clip) 0.7-1.1 in this run: the upper bound catches a loss scale off by an order of magnitude
        assert 0.0 < r["actor/grad_norm"] <= THRESHOLDS["max_grad_norm"]
        # MDAP keeps at least one rollout of every group (one per advantage bucket): a pruner that
        # drops whole groups keeps less than 1 in n = 4; nothing is kept twice
        assert THRESHOLDS["min_prune_kept_fraction"] <= r["prune/kept_fraction"] <= 1.0
        assert r["prune/kept_fraction"] == r["prune/num_kept"] / r["prune/num_rollouts"]
        # the free geometry (default) trains on what MDAP's Phase 1 kept: no refill, nothing dropped
        assert r["prune/num_kept"] == r["prune/phase1_kept"] and r["prune/num_refilled"] == 0
        assert r["prune/dropped_for_geometry"] == 0 and r["actor/updates"] == 2  # 4 prompts / 2 per mini-batch
        assert r["rollout/n"] == 4
        assert r["accuracy/mean"] == r["reward/mean"]  # the coin reward scores accuracy as its reward
    # the training clock adds up the steps and fits in the process's wall time: a timer in the
    # wrong unit (ms) or a step counted twice breaks one of the two
    assert [r["time/train_elapsed"] for r in train] == pytest.approx(
        [sum(t["time/step"] for t in train[: i + 1]) for i in range(len(train))]
    )
    assert 0.0 < train[-1]["time/train_elapsed"] < wall
    assert val[-1]["val/questions"] == 16
    finished = json.loads((run_dir / "FINISHED").read_text())
    assert finished["step"] == 3 and finished["finished_at"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["finished"] is True and summary["step"] == 3
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts[-1] == "step_00000003"
    saves = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "checkpoint saved:" in ln and "step_00000003" in ln]
    assert len(saves) == 1, saves  # the last step is written once, also when it is the best
    # plots and the run comparison work on a real run directory
    from tools import compare_runs, plot_run

    assert plot_run.main([str(run_dir), "--out", str(tmp_path / "plots")]) == 0
    written = [tmp_path / "plots" / n for n in ("reward.png", "accuracy_vs_time.png", "pruning.png", "time_breakdown.png", "ars.png")]
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == sorted(p.name for p in written)  # made by the run
    assert all(p.stat().st_size > 5000 for p in written)
    summary_a = compare_runs.summarize(run_dir)
    assert summary_a["steps"] == 3 and summary_a["mean_n"] == 4 and summary_a["train_time_s"] > 0
    text = compare_runs.table(summary_a, summary_a, ("a", "b"))
    assert "speed ratio time(A)/time(B): 1.00x" in text
    # logging.rollouts_every=2: step 2's 16 rollouts with the pruner's decision, which the analysis
    # recomputes from the token ids (breakage caught: records out of step with the keep mask or the
    # advantages, another step's rollouts, a step logged that was not due)
    from bench.prune_text import analyze
    from fastrl.training.rollout_log import read_rollouts

    logged = read_rollouts(run_dir)
    step2 = train[1]
    assert {r["step"] for r in logged} == {2} and len(logged) == step2["prune/num_rollouts"] == 16
    assert sum(r["kept"] for r in logged) == step2["prune/num_kept"]
    assert sum(r["reward"] for r in logged) / 16 == pytest.approx(step2["reward/mean"])
    assert sum(abs(r["advantage"]) for r in logged) / 16 == pytest.approx(step2["advantage/abs_mean"], rel=1e-5)
    assert analyze(run_dir)["decisions_checked"]  # MDAP's Phase 1, recomputed, equals what was logged
    # a finished run started again does nothing and exits 0
    again = run_train(tmp_path, "trainer.max_steps=3", COIN_REWARD)
    assert "already complete" in again.stdout + again.stderr
