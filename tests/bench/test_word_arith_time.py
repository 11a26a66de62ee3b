"""The equal-training-time benchmark's estimands on synthetic evaluations with known answers, and the
paired statistics it uses (bench/word_arith_time.py, bench/paired_stats.py)."""

import json
import math
import shutil
from pathlib import Path

import pytest

from bench import paired_stats, word_arith_time
from bench.word_arith_time import PRIMARY, at_time, row_overrides, seed_comparison, summarize


def _entry(step, seconds, correct, total=10):
    return {"step": step, "train_seconds": seconds, "outcomes": {i: int(i < correct) for i in range(total)}}


GRPO = [_entry(10, 1500.0, 3), _entry(20, 3000.0, 5)]
ROW = [_entry(10, 700.0, 2), _entry(20, 1400.0, 4), _entry(38, 2700.0, 6), _entry(44, 3300.0, 7), _entry(51, 3900.0, 4)]


def test_equal_time_uses_the_last_checkpoint_at_or_before_grpo_time():
    """catches: the first checkpoint after T_G taken (step 44: +20 points, the row's extra 300 s
    counted), the row's step 20 compared as equal time, or the time to GRPO's accuracy taken at a
    single checkpoint (step 38 is confirmed by step 44; the last one alone would not be)."""
    c = seed_comparison(ROW, GRPO)
    assert c["t_grpo"] == 3000.0 and c["grpo_accuracy"] == 0.5
    assert c["equal_time"]["step"] == 38 and c["equal_time"]["diff"] == pytest.approx(0.1)
    assert c["equal_steps"]["step"] == 20 and c["equal_steps"]["diff"] == pytest.approx(-0.1)
    assert c["equal_time"]["question_diffs"] == [0] * 5 + [1] + [0] * 4
    assert c["equal_time"]["mcnemar_p"] == 1.0  # one discordant question
    assert c["time_to_grpo"] == 2700.0 and c["sooner"] == pytest.approx(3000 / 2700)
    assert at_time(ROW, 2699.0)["step"] == 20 and at_time(ROW, 100.0) is None
    # a row that reaches GRPO's accuracy only at its last checkpoint: not reached (unconfirmed)
    assert seed_comparison(ROW[:2] + [_entry(30, 2000.0, 5)], GRPO)["time_to_grpo"] is None


def test_holm_adjusts_every_row_but_the_primary(monkeypatch):
    """catches: the primary comparison adjusted with the others, or the adjustment left out."""
    p = {"fastrl_paper_grpo": 0.03, "fastrl_grpo": 0.02, "stratified_grpo": 0.04}
    order = [label for label in p for _ in range(2)]  # equal_time then equal_steps, per row in order
    monkeypatch.setattr(paired_stats, "seed_question_bootstrap",
                        lambda diffs, resamples=2000, seed=0: (0.0, -0.01, 0.01, p[order.pop(0)]))
    per_seed = {1: {"grpo": GRPO, **{label: ROW for label in p}}}
    summary = summarize(per_seed, ["grpo", *p])
    assert {r["label"]: r["equal_time"]["p"] for r in summary} == p
    adjusted = {r["label"]: r["equal_time"]["p_holm"] for r in summary}
    assert adjusted[PRIMARY] == 0.03  # its own p (with it in the family the others would be 0.06)
    # Holm over the two others: 0.02 x 2 = 0.04, then max(0.04, 0.04 x 1)
    assert adjusted["fastrl_grpo"] == pytest.approx(0.04) and adjusted["stratified_grpo"] == pytest.approx(0.04)


def test_rows_run_to_the_budget_except_grpo():
    """catches: GRPO given the time budget or the grid, a budget row left on GRPO's 20 steps, or a
    budget row without the band before GRPO's time."""
    grpo, fast = (word_arith_time.BY_LABEL[x] for x in ("grpo", "fastrl_paper_grpo"))
    assert "trainer.max_steps=20" in row_overrides(grpo) and not any("max_train_time_s" in o for o in row_overrides(grpo))
    assert not any("save_at_train_s" in o for o in row_overrides(grpo))  # its last checkpoint is its step 20
    got = row_overrides(fast, 1744.8)
    assert "trainer.max_train_time_s=2400" in got and "trainer.max_steps=80" in got
    assert "trainer.epochs=2" in got  # one epoch of 600 prompts is 75 steps
    assert ("checkpoint.save_at_train_s=[300,600,900,1200,1494.8,1500,1544.8,1594.8,1644.8,1694.8,1800,2100,2400]"
            in got)
    for overrides in (row_overrides(grpo), got):
        assert "checkpoint.save_at_steps=[5,10,15,20]" in overrides and "data.test_size=0" in overrides
    with pytest.raises(ValueError, match="run GRPO first"):
        row_overrides(fast)


def test_a_grpo_time_near_the_budget_moves_the_budget_and_the_grid_past_it():
    """catches: a budget row stopped before or just after its seed's T_G (estimand (a) read at an
    earlier checkpoint, or none after it for the curve), the grid left at 2,400 s under a longer budget
    (no curve checkpoint past it), or seeds 1-3's budget changed (their committed runs' settings, which
    a rerun of the sitting must match to reuse them)."""
    fast = word_arith_time.BY_LABEL["fastrl_paper_grpo"]
    for t_g in (1744.8, 2017.0, 2241.8):  # seeds 1-3
        assert word_arith_time.budget_seconds(t_g) == 2400.0
        assert "trainer.max_train_time_s=2400" in row_overrides(fast, t_g)
    assert word_arith_time.budget_seconds(2260.0) == 2560.0
    assert word_arith_time.budget_seconds(2250.0) == 2400.0  # the amendment's edge: 150 s short of the budget
    assert word_arith_time.budget_seconds(2613.0) == 2913.0  # past the budget (seed 4)
    got = row_overrides(fast, 2430.4)
    assert "trainer.max_train_time_s=2730.4" in got
    assert ("checkpoint.save_at_train_s=[300,600,900,1200,1500,1800,2100,2180.4,2230.4,2280.4,2330.4,2380.4,"
            "2400,2700]" in got)
    kept = [(20, 1000.0), (48, 2380.0), (49, 2420.0), (50, 2460.0), (56, 2705.0), (57, 2740.0)]
    assert word_arith_time.checkpoints_to_keep(kept, 2430.4) == {20, 48, 49, 56, 57}


def test_run_order_puts_grpo_first_and_rotates_the_others():
    """catches: a rotation that moves GRPO (the band needs its time), or no rotation of the others."""
    rows = ["grpo", PRIMARY, "stratified_grpo"]
    assert [word_arith_time.run_order(rows, s) for s in (1, 2, 3)] == [
        rows, ["grpo", "stratified_grpo", PRIMARY], rows]


def test_band_keeps_only_the_checkpoint_before_grpos_time():
    """catches: the checkpoint of estimand (a) taken after T_G (``<=`` as ``<`` is harmless; ``>=``
    keeps the last checkpoint, step 40, and drops step 33), a grid time's first checkpoint dropped, or
    the last checkpoint dropped (here a run that reached its step horizon before the budget: its last
    checkpoint is no grid time's)."""
    # (step, train seconds): step marks, grid saves, band saves around T_G = 1744.8, the final save
    kept = [(5, 280.0), (6, 330.0), (20, 1010.0), (30, 1510.0), (31, 1560.0), (32, 1610.0), (33, 1700.0),
            (34, 1750.0), (35, 1805.0), (40, 2090.0)]
    keep = word_arith_time.checkpoints_to_keep(kept, 1744.8)
    assert keep == {5, 6, 20, 30, 33, 35, 40}  # 6: first >= 300; 30: first >= 1500; 33: last <= T_G; 35: >= 1800; 40: last
    assert word_arith_time.checkpoints_to_keep(kept, None) == {5, 6, 20, 30, 35, 40}


def test_estimand_steps_are_grpos_last_and_the_rows_equal_time_and_equal_steps(tmp_path, monkeypatch):
    """catches: the first pass evaluating GRPO's first checkpoint instead of its last, GRPO's last
    kept checkpoint instead of its last step (whose checkpoint was evaluated and deleted), or a
    budget row's checkpoint after T_G."""
    from bench.eval_checkpoints import CheckpointInfo
    from fastrl.checkpoint.manager import CheckpointManager

    seconds = {5: 200.0, 20: 900.0, 48: 1710.0, 51: 1830.0}
    monkeypatch.setattr(word_arith_time, "checkpoints_to_evaluate",
                        lambda run_dir: [CheckpointInfo(tmp_path / str(s), s) for s in sorted(seconds)])
    monkeypatch.setattr(CheckpointManager, "verify", staticmethod(lambda path: {"train_seconds": seconds[int(Path(path).name)]}))
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "time/train_elapsed": 36.0 * s}) + "\n" for s in range(1, 61)))
    assert word_arith_time.estimand_steps(tmp_path, "grpo", None) == {60}  # step 60: evaluated, deleted
    assert word_arith_time.estimand_steps(tmp_path, PRIMARY, 1744.8) == {20, 48}


def test_grpo_train_seconds_reads_the_last_step(tmp_path):
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "time/train_elapsed": 90.0}\n'
                                       '{"kind": "val", "step": 1}\n'
                                       '{"kind": "train", "step": 2, "time/train_elapsed": 181.5}\n')
    with pytest.raises(SystemExit, match="has not finished"):
        word_arith_time.grpo_train_seconds(run)
    (run / "FINISHED").write_text("")
    assert word_arith_time.grpo_train_seconds(run) == 181.5


def test_eval_only_skips_unfinished_runs(tmp_path, monkeypatch, capsys):
    """catches: --eval-only evaluating a run its sitting has not finished (its checkpoints then deleted
    under the trainer), or evaluating nothing."""
    done = tmp_path / "seed1" / word_arith_time.BY_LABEL["grpo"].recipe
    running = tmp_path / "seed1" / word_arith_time.BY_LABEL[PRIMARY].recipe
    for d in (done, running):
        d.mkdir(parents=True)
    (done / "FINISHED").write_text("")
    seen = []
    monkeypatch.setattr(word_arith_time, "evaluate_run", lambda run_dir, **kw: seen.append((run_dir, kw)))
    monkeypatch.setattr(word_arith_time, "estimand_steps", lambda run_dir, label, t: {20})
    word_arith_time.evaluate_finished(tmp_path, [1], ["grpo", PRIMARY], keep_checkpoints=False)
    split = {"test_path": word_arith_time.TEST_PATH, "test_size": 1800, "delete_evaluated": True}
    assert seen == [(done, {**split, "steps": {20}}), (done, {**split, "steps": None})]  # estimands first
    assert "not finished" in capsys.readouterr().out


def test_a_sitting_evaluates_each_runs_estimands_before_its_next_run(tmp_path, monkeypatch):
    """catches: a run's whole curve evaluated before the next run trains (a machine that ends in the
    sitting then loses the next runs' estimand checkpoints too), the estimands left until the
    sitting's end, or the rest of the curves never evaluated."""
    calls = []

    def train(row, seed_dir, overrides, **kw):
        (seed_dir / row.recipe).mkdir(parents=True)
        (seed_dir / row.recipe / "FINISHED").write_text("")
        calls.append(("train", row.label))

    class Reported(Exception):
        pass

    def report(*args):
        raise Reported

    monkeypatch.setattr("fastrl.models.packaged.packaged_model_dir", lambda name: None)
    monkeypatch.setattr(word_arith_time, "run_one", train)
    monkeypatch.setattr(word_arith_time, "grpo_train_seconds", lambda run_dir: 1744.8)
    monkeypatch.setattr(word_arith_time, "drop_unused_band", lambda run_dir, t: [])
    monkeypatch.setattr(word_arith_time, "estimand_steps", lambda run_dir, label, t: calls.append((label, t)) or {20})
    monkeypatch.setattr(word_arith_time, "evaluate_run",
                        lambda run_dir, **kw: calls.append(("eval", run_dir.name, kw["steps"])))
    monkeypatch.setattr(word_arith_time, "collect", report)
    with pytest.raises(Reported):
        word_arith_time.main(["--seeds", "1", "--rows", f"grpo,{PRIMARY}", "--out", str(tmp_path)])
    grpo, row = (word_arith_time.BY_LABEL[x].recipe for x in ("grpo", PRIMARY))
    assert calls == [("train", "grpo"), ("grpo", None), ("eval", grpo, {20}), ("train", PRIMARY),
                     (PRIMARY, 1744.8), ("eval", row, {20}), ("eval", grpo, None), ("eval", row, None)]


def test_no_eval_and_eval_only_exclude_each_other_and_report_only():
    with pytest.raises(SystemExit):
        word_arith_time.parse_args(["--rows", "grpo", "--no-eval", "--eval-only"])
    with pytest.raises(SystemExit):
        word_arith_time.parse_args(["--rows", "grpo", "--report-only", "--eval-only"])
    assert word_arith_time.parse_args(["--rows", "grpo", "--no-eval"]).no_eval


def test_mcnemar_and_holm_known_values():
    """catches: a one-sided McNemar p (halved), or Holm without its monotone step (0.04 * 1 < 0.06)."""
    assert paired_stats.mcnemar_exact(0, 5) == 0.0625
    assert paired_stats.mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert paired_stats.mcnemar_exact(0, 0) == 1.0
    assert paired_stats.discordant([1, 1, 0, 0], [1, 0, 1, 1]) == (1, 2)
    assert paired_stats.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})


def test_seed_question_bootstrap_known_cases():
    """catches: seeds not resampled (two seeds of opposite sign then give a zero-width interval), or
    the p-value not two-sided."""
    mean, lo, hi, p = paired_stats.seed_question_bootstrap([[1] * 10 + [0] * 10] * 3, resamples=500)
    assert (mean, p) == (0.5, 0.0) and lo <= 0.5 <= hi
    mean, lo, hi, p = paired_stats.seed_question_bootstrap([[1] * 20, [-1] * 20], resamples=500)
    assert mean == 0.0 and lo == -1.0 and hi == 1.0 and p == 1.0
    with pytest.raises(ValueError, match="same questions"):
        paired_stats.seed_question_bootstrap([[1, 0], [1]])


def test_seeds_for_power_and_half_width():
    """catches: the power term dropped (the half-width count, 7, returned for power, 10)."""
    assert paired_stats.seeds_for_power(0.03, 0.03) == 10
    assert paired_stats.seeds_for_half_width(0.03, 0.03) == 7
    assert math.isclose(paired_stats.question_sd(0.3, 300), math.sqrt(2 * 0.21 / 300))


def test_report_opens_with_the_estimands_and_draws_the_curves(tmp_path):
    """catches: the estimands moved below the tables (or dropped), the power table not from the
    committed runs (its accuracy is theirs: 30.7%), or the plot not written."""
    per_seed = {1: {"grpo": GRPO, PRIMARY: ROW}, 2: {"grpo": GRPO, PRIMARY: ROW[:3]}}
    power = word_arith_time.committed_power()
    assert round(100 * power["p"], 1) == 30.7
    text = word_arith_time.markdown(summarize(per_seed, ["grpo", PRIMARY], resamples=200), power)
    assert text.splitlines()[2] == word_arith_time.ESTIMANDS.splitlines()[0]
    assert "| GRPO + FastRL as published (MDAP + ARS) (primary) | 2: 2 / 2 | +10.0 |" in text
    path = word_arith_time.plot(per_seed, ["grpo", PRIMARY], tmp_path / "curves.png")
    assert path.stat().st_size > 1000


def test_two_passes_delete_only_the_unused_band_and_evaluate_every_kept_checkpoint(tmp_path, monkeypatch):
    """A budget row's checkpoints through ``evaluate`` twice, as ``--eval-only`` runs it: the band
    checkpoints other than the last at or before T_G are deleted unevaluated, the first pass evaluates
    step 20 and that one, the second pass the rest of the curve, and no checkpoint the curve or an
    estimand needs is deleted unevaluated (the second pass's band rule sees the first pass's
    checkpoints gone).

    catches: a band checkpoint evaluated, the checkpoint of estimand (a) deleted unevaluated, or
    the second pass deleting a grid checkpoint once the first pass removed its neighbours."""
    from bench.eval_checkpoints import CheckpointInfo
    from fastrl.checkpoint.manager import CheckpointManager

    # seed 1's checkpoints of GRPO + FastRL as published (T_G 1744.8 s): steps 43, 45, 46 are band only
    seconds = {5: 251.3, 7: 336.7, 10: 462.4, 15: 630.9, 20: 783.4, 24: 910.1, 33: 1204.8, 42: 1518.5, 43: 1551.4,
               45: 1623.5, 46: 1655.7, 48: 1718.3, 51: 1829.9, 60: 2133.7, 68: 2408.4}
    ckpts = tmp_path / "checkpoints"
    for s in seconds:
        (ckpts / str(s)).mkdir(parents=True)

    def on_disk(run_dir):
        return [CheckpointInfo(ckpts / str(s), s) for s in sorted(seconds) if (ckpts / str(s)).is_dir()]

    monkeypatch.setattr(word_arith_time, "checkpoints_to_evaluate", on_disk)
    monkeypatch.setattr(CheckpointManager, "verify", staticmethod(lambda path: {"train_seconds": seconds[int(Path(path).name)]}))
    evaluated = []

    def evaluate_run(run_dir, *, steps, delete_evaluated, **_):
        for c in on_disk(run_dir):
            if steps is None or c.step in steps:
                evaluated.append(c.step)
                if delete_evaluated:
                    shutil.rmtree(c.path)

    monkeypatch.setattr(word_arith_time, "evaluate_run", evaluate_run)
    word_arith_time.evaluate(tmp_path, PRIMARY, 1744.8, keep_checkpoints=False, first_pass=True)
    assert evaluated == [20, 48]
    word_arith_time.evaluate(tmp_path, PRIMARY, 1744.8, keep_checkpoints=False, first_pass=False)
    assert evaluated == [20, 48, 5, 7, 10, 15, 24, 33, 42, 51, 60, 68]
    assert not any(ckpts.iterdir())  # 43, 45 and 46 deleted unevaluated
    # the report's estimand (a) reads the checkpoint the band kept: at_time over the evaluated curve
    curve = sorted((_entry(s, seconds[s], 1) for s in evaluated), key=lambda e: e["train_seconds"])
    assert at_time(curve, 1744.8)["step"] == 48


def _pending(step, seconds):
    return {"step": step, "train_seconds": seconds, "outcomes": None}


def test_estimands_that_read_an_unevaluated_checkpoint_are_pending():
    """catches: an estimand computed from the evaluated checkpoints alone while a kept one is not
    evaluated yet: equal time read at an earlier checkpoint (step 20 for the pending step 38), the
    time to GRPO's accuracy decided past a pending checkpoint, or GRPO's unevaluated final step
    used as if evaluated; and the report's seed count taken from the trained seeds alone (tools/mutants.toml
    ``time-report-seeds-trained``)."""
    row = [ROW[0], ROW[1], _pending(38, 2700.0), ROW[3], ROW[4]]
    c = seed_comparison(row, GRPO)
    assert c["equal_time"] is None and c["time_to_grpo"] is None and c["sooner"] is None
    assert c["pending"] == ["equal_time", "time_to_grpo"] and c["equal_steps"]["step"] == 20
    # decided before the pending checkpoint: reached at step 38 (confirmed by step 44), step 51 unevaluated
    done = seed_comparison(ROW[:4] + [_pending(51, 3900.0)], GRPO)
    assert done["pending"] == [] and done["time_to_grpo"] == 2700.0 and done["equal_time"]["step"] == 38
    # a row whose only checkpoint at or above GRPO's accuracy waits for its confirmation
    assert seed_comparison(ROW[:3] + [_pending(44, 3300.0)], GRPO)["pending"] == ["time_to_grpo"]
    base = seed_comparison(ROW, GRPO[:1] + [_pending(20, 3000.0)])
    assert base["pending"] == ["equal_time", "equal_steps", "time_to_grpo"] and base["grpo_accuracy"] is None
    summary = summarize({1: {"grpo": GRPO, PRIMARY: row}}, ["grpo", PRIMARY], resamples=10)[0]
    assert summary["pending"] == {"equal_time": 1, "equal_steps": 0, "time_to_grpo": 1}
    assert summary["not_reached"] == 0 and summary["equal_time"]["seeds"] == 0
    report = word_arith_time.markdown([summary], word_arith_time.committed_power())
    assert "Pending" in report
    # the seeds column says how many seeds each estimand read: one trained, none at (a), one at equal steps
    assert "| GRPO + FastRL as published (MDAP + ARS) (primary) | 1: 0 / 1 |" in report


def test_load_curve_holds_a_placeholder_for_each_unevaluated_kept_checkpoint(tmp_path, monkeypatch):
    """catches: load_curve returning the evaluated checkpoints alone (the report would then read an
    estimand from an earlier checkpoint than its own)."""
    from bench.eval_checkpoints import CheckpointInfo
    from fastrl.checkpoint.manager import CheckpointManager

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "q.jsonl").write_text('{"id": "a", "correct": 1}\n{"id": "b", "correct": 0}\n')
    (tmp_path / "evals" / "curve.json").write_text(json.dumps([
        {"step": 20, "train_seconds": 900.0, "test_path": word_arith_time.TEST_PATH, "test_size": word_arith_time.TEST_SIZE,
         "per_question": "evals/q.jsonl"}]))
    seconds = {20: 900.0, 48: 1710.0}  # step 20 evaluated and deleted in practice; 48 kept, not evaluated
    monkeypatch.setattr(word_arith_time, "checkpoints_to_evaluate", lambda run_dir: [CheckpointInfo(tmp_path / "48", 48)])
    monkeypatch.setattr(CheckpointManager, "verify", staticmethod(lambda path: {"train_seconds": seconds[int(Path(path).name)]}))
    curve = word_arith_time.load_curve(tmp_path)
    assert [(e["step"], e["outcomes"]) for e in curve] == [(20, {"a": 1, "b": 0}), (48, None)]


def _saved_run(run_dir: Path, seconds: dict[int, float]) -> None:
    """A run directory whose train.log says it saved a checkpoint at each step of ``seconds`` (in the
    trainer's words) and whose metrics.jsonl gives each step's training time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.log").write_text("".join(
        f"2026-12-07 12:00:00 [rank 0] fastrl.checkpoint: checkpoint saved: {run_dir}/checkpoints/step_{s:08d}\n"
        for s in seconds) + f"2026-12-07 12:00:01 [rank 0] fastrl.checkpoint: checkpoint saved: {run_dir}/checkpoints/"
        f"step_{max(seconds):08d} (best)\n")
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "time/train_elapsed": seconds.get(s, 40.0 * s)}) + "\n"
        for s in range(1, max(seconds) + 1)))


def test_saved_checkpoints_come_from_the_trainers_log_at_their_training_time(tmp_path):
    """catches: the "(best)" line counted as a second checkpoint, a step's time taken from another step,
    a saved step without a training time accepted, or a run stopped between its last save and that
    step's metrics line refused (the report of every seed would fail on it)."""
    _saved_run(tmp_path, {5: 210.0, 20: 800.0})
    assert word_arith_time.saved_checkpoints(tmp_path) == [(5, 210.0), (20, 800.0)]
    record = {"kind": "train", "step": 5, "time/train_elapsed": 210.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    assert word_arith_time.saved_checkpoints(tmp_path) == [(5, 210.0)]  # step 20 saved, never logged
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n" + json.dumps({**record, "step": 25}) + "\n")
    with pytest.raises(ValueError, match=r"steps \[20\]"):
        word_arith_time.saved_checkpoints(tmp_path)


def test_saved_checkpoints_read_a_path_with_a_space(tmp_path):
    """catches: a save line whose run directory has a space in its path not seen (its checkpoints
    would never be counted as lost)."""
    run = tmp_path / "my runs" / "row"
    run.mkdir(parents=True)
    _saved_run(run, {5: 210.0, 20: 800.0})
    assert word_arith_time.saved_checkpoints(run) == [(5, 210.0), (20, 800.0)]


def test_a_saved_checkpoint_neither_evaluated_nor_kept_is_lost_and_its_estimands_not_computable(tmp_path, monkeypatch):
    """catches: load_curve building its placeholders from the checkpoints on disk alone (a curve whose
    unevaluated checkpoints are gone reads as complete: time to GRPO's accuracy "not reached", equal time
    read at an earlier checkpoint), a band checkpoint deleted by design counted as lost, a checkpoint
    still on disk counted as lost too, or a lost checkpoint reported as pending (``--eval-only``
    cannot evaluate it)."""
    t_grpo = 1745.0
    seconds = {20: 800.0, 24: 980.0, 33: 1290.0, 42: 1560.0, 43: 1700.0, 45: 1720.0, 48: 1740.0, 51: 1800.0}
    run = tmp_path / "run"
    _saved_run(run, seconds)
    (run / "evals").mkdir()
    rows = [{"id": i, "correct": int(i < 3)} for i in range(10)]
    (run / "evals" / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "evals" / "curve.json").write_text(json.dumps([
        {"step": s, "train_seconds": seconds[s], "test_path": word_arith_time.TEST_PATH,
         "test_size": word_arith_time.TEST_SIZE, "per_question": "evals/q.jsonl"} for s in (20, 51)]))
    # 43 and 45 are band checkpoints deleted unevaluated by design; the grid's 24, 33, 42 and the
    # band's 48 (the last at or before T_G) were meant for evaluation; 42 is still on disk (pending)
    from bench.eval_checkpoints import CheckpointInfo
    from fastrl.checkpoint.manager import CheckpointManager

    (run / "checkpoints").mkdir()
    monkeypatch.setattr(word_arith_time, "checkpoints_to_evaluate", lambda run_dir: [CheckpointInfo(run / "42", 42)])
    monkeypatch.setattr(CheckpointManager, "verify", staticmethod(lambda path: {"train_seconds": 1560.0}))
    curve = word_arith_time.load_curve(run, t_grpo, budget=True)
    assert [(e["step"], e["outcomes"] is None, e.get("lost", False)) for e in curve] == [
        (20, False, False), (24, True, True), (33, True, True), (42, True, False), (48, True, True), (51, False, False)]
    shutil.rmtree(run / "checkpoints")
    curve = word_arith_time.load_curve(run, t_grpo, budget=True)
    assert [e["step"] for e in curve if e.get("lost")] == [24, 33, 42, 48]
    grpo = [_entry(20, t_grpo, 3)]
    c = seed_comparison(curve, grpo)
    assert c["lost"] == ["equal_time", "time_to_grpo"] and c["pending"] == []
    assert c["equal_time"] is None and c["time_to_grpo"] is None and c["equal_steps"]["step"] == 20
    summary = summarize({1: {"grpo": grpo, PRIMARY: curve}}, ["grpo", PRIMARY], resamples=10)[0]
    assert summary["lost"]["time_to_grpo"] == 1 and summary["not_reached"] == 0
    report = word_arith_time.markdown([summary], word_arith_time.committed_power())
    assert "Not computable" in report and "Pending" not in report
    assert "to GRPO's accuracy: not computable" in report
    # GRPO's final step lost: nothing of the seed is computable
    assert seed_comparison(curve, [{**_pending(20, t_grpo), "lost": True}])["lost"] == [
        "equal_time", "equal_steps", "time_to_grpo"]
