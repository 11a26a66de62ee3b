"""bench/algorithms.py: the table arithmetic, and the --quick smoke run (table and plots produced)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.algorithms import (
    BY_LABEL,
    FAMILY,
    QUICK_FAMILY,
    aggregate,
    drift_control,
    drift_table,
    finished_runs,
    markdown_table,
    per_seed_table,
    run_recipe,
    select_entries,
    time_to_accuracy,
)
from recipes.registry import get_recipe

REPO = Path(__file__).resolve().parents[2]


def _run(train_time: float, val_final: float, kept: float = 1.0) -> dict:
    return {"train_time_s": train_time, "time/gen": train_time / 10, "val_final": val_final, "val_best": val_final,
            "kept_fraction": kept, "mean_n": 8.0, "steps": 10.0}


def test_aggregate_speedup_per_seed_then_mean_and_spread():
    entries = [BY_LABEL["grpo"], BY_LABEL["fastrl_grpo"]]
    per_seed = {
        1: {"grpo": _run(100.0, 0.50), "fastrl_grpo": _run(50.0, 0.52, kept=0.5)},
        2: {"grpo": _run(120.0, 0.54), "fastrl_grpo": _run(40.0, 0.56, kept=0.7)},
    }
    base, fast = aggregate(entries, per_seed)
    assert base["speedup"] == 1.0 and base["speedup_sd"] == 0.0
    assert fast["speedup"] == pytest.approx((2.0 + 3.0) / 2)
    assert fast["speedup_sd"] == pytest.approx(0.7071067811865476)  # sample std of (2, 3)
    assert fast["train_time_s"] == 45.0
    assert fast["kept_fraction"] == pytest.approx(0.6)
    assert fast["seeds"] == 2
    table = markdown_table([base, fast])
    assert "| GRPO + FastRL (weighted MDAP + ARS) | 2 | 45.0 ± 7.1 | 2.50x ± 0.71x |" in table
    assert "54.0 ± 2.8" in table  # val final in points
    seeds = per_seed_table(entries, {**per_seed, 3: {"fastrl_grpo": _run(30.0, 0.6)}}).splitlines()
    assert seeds[0] == "| recipe | seed 1: val final (%), speedup | seed 2: val final (%), speedup | seed 3: val final (%), speedup |"
    assert seeds[2] == "| GRPO | 50.00, 1.00x | 54.00, 1.00x | - |"
    assert seeds[3] == "| GRPO + FastRL (weighted MDAP + ARS) | 52.00, 2.00x | 56.00, 3.00x | 60.00 |"  # no base run on seed 3


def test_time_to_target_accuracy_is_the_first_validation_that_reaches_it():
    curve = [(0.0, 0.52), (100.0, 0.755), (200.0, 0.77), (300.0, 0.75)]
    assert time_to_accuracy(curve, 0.76) == 200.0
    assert time_to_accuracy(curve, 0.50) == 0.0  # the start already reaches it
    assert time_to_accuracy(curve, 0.80) is None
    entries = [BY_LABEL["grpo"], BY_LABEL["fastrl_grpo"]]
    per_seed = {1: {"grpo": {**_run(100.0, 0.75), "val_curve": curve},
                    "fastrl_grpo": {**_run(40.0, 0.74), "val_curve": [(0.0, 0.5), (20.0, 0.74)]}}}
    lines = per_seed_table(entries, per_seed, target=0.76).splitlines()
    assert lines[0] == "| recipe | seed 1: val final (%), speedup, s to >= 76% |"
    assert lines[2] == "| GRPO | 75.00, 1.00x, >= 76%: 200 s |"
    assert lines[3] == "| GRPO + FastRL (weighted MDAP + ARS) | 74.00, 2.50x, >= 76%: - |"


def test_drift_control_divides_out_the_slowdown_measured_over_the_identical_prefix():
    # 12 identical steps (same tokens, same reward) at 1 s in the base and 1.25 s in the run (a slower
    # machine), then the run generates fewer tokens (ARS lowered n) and takes 0.9 s per step there
    base_trace = [(s, 1.0, 100.0, 0.5) for s in range(2, 22)]
    run_trace = [(s, 1.25, 100.0, 0.5) for s in range(2, 14)] + [(s, 0.9, 80.0, 0.5) for s in range(14, 22)]
    base = {"train_time_s": 20.0, "step_trace": base_trace}
    run = {"train_time_s": 12 * 1.25 + 8 * 0.9, "step_trace": run_trace}
    c = drift_control(base, run)
    assert c["prefix_steps"] == 12
    assert c["drift"] == pytest.approx(1.25)
    assert c["speedup"] == pytest.approx(20.0 / 22.2)
    # on the base's machine the run would have taken 12 * 1 + 8 * 0.9 / 1.25 = 17.76 s
    assert c["corrected_speedup"] == pytest.approx(20.0 / 22.2 * 1.25)
    # a different mean reward ends the prefix, and a short prefix gives no control
    changed = [(s, 1.25, 100.0, 0.5 if s < 7 else 0.6) for s in range(2, 22)]
    assert drift_control(base, {"train_time_s": 25.0, "step_trace": changed}) is None
    assert drift_control(base, {"train_time_s": 25.0, "step_trace": changed}, min_steps=5)["prefix_steps"] == 5
    entries = [BY_LABEL["grpo"], BY_LABEL["ars_grpo"], BY_LABEL["fastrl_grpo"]]
    per_seed = {1: {"grpo": base, "ars_grpo": run, "fastrl_grpo": {"train_time_s": 5.0, "step_trace": changed[:3]}}}
    lines = drift_table(entries, per_seed).splitlines()
    assert len(lines) == 3  # the pruned row shares no prefix with GRPO: no line
    assert lines[2] == "| GRPO + ARS only | 1 | 12 | 1.250 | 0.90x | 1.13x |"
    assert drift_table(entries, {1: {"grpo": base}}) == ""


def test_missing_base_leaves_the_speedup_empty():
    (row,) = aggregate([BY_LABEL["fastrl_dapo"]], {1: {"fastrl_dapo": _run(10.0, 0.3)}})
    assert row["seeds"] == 1
    assert "| DAPO + FastRL | 1 | 10.0 | - |" in markdown_table([row])


def test_select_entries_keeps_the_family_order_and_rejects_unknown_names():
    assert [e.label for e in select_entries("fastrl_grpo,grpo")] == ["grpo", "fastrl_grpo"]
    assert [e.label for e in select_entries("easyvqa_tiny_gspo_cpu")] == ["gspo"]
    assert len(select_entries(None)) == len(FAMILY) == 17
    assert [e.label for e in select_entries(None, quick=True)] == [e.label for e in QUICK_FAMILY]
    assert len(QUICK_FAMILY) == 8
    for e in FAMILY:  # every row names a registered recipe
        assert get_recipe(e.recipe).recipe == e.recipe
    with pytest.raises(SystemExit, match="unknown recipe 'grpoo'"):
        select_entries("grpoo")


def test_a_run_directory_with_other_settings_is_refused(tmp_path):
    entry = BY_LABEL["grpo"]
    (tmp_path / entry.recipe).mkdir()
    (tmp_path / f"{entry.recipe}.args.json").write_text(json.dumps(["--recipe", entry.recipe, "trainer.max_steps=3"]))
    with pytest.raises(SystemExit, match="holds a run with other settings"):
        run_recipe(entry, tmp_path, ["trainer.max_steps=5"], threads=1, timeout=10)


def test_only_finished_runs_reach_the_tables(tmp_path, capsys):
    grpo, fast, gspo = BY_LABEL["grpo"], BY_LABEL["fastrl_grpo"], BY_LABEL["gspo"]
    for seed, entry, finished in ((1, grpo, True), (1, fast, False), (2, grpo, True), (2, gspo, False)):
        run_dir = tmp_path / f"seed{seed}" / entry.recipe
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
        if finished:
            (run_dir / "FINISHED").write_text('{"step": 120}')
    found = finished_runs(tmp_path, [1, 2, 3], [grpo, fast, gspo])
    assert found == [(1, "grpo", tmp_path / "seed1" / grpo.recipe), (2, "grpo", tmp_path / "seed2" / grpo.recipe)]
    notes = capsys.readouterr().out
    assert f"{tmp_path / 'seed1' / fast.recipe} is not finished" in notes
    assert f"{tmp_path / 'seed2' / gspo.recipe} is not finished" in notes


@pytest.mark.functional
@pytest.mark.long(90)
@pytest.mark.timeout(900)
def test_quick_mode_writes_the_table_and_plots(tmp_path):
    # One base and its FastRL row: every table, the cost-model check and every plot are made from
    # them (the other algorithm families train in tests/functional/test_algorithms_run.py).
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "bench/algorithms.py", "--quick", "--recipes", "grpo,fastrl_grpo", "--steps", "4",
         "--threads", "1", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    entries = [BY_LABEL["grpo"], BY_LABEL["fastrl_grpo"]]
    md = (tmp_path / "algorithms.md").read_text()
    for entry in entries:
        assert f"| {entry.title} |" in md
    with open(tmp_path / "algorithms.csv") as f:
        assert [r["label"] for r in csv.DictReader(f)] == [e.label for e in entries]
    rows = json.loads((tmp_path / "algorithms.json").read_text())["rows"]
    assert [r["seeds"] for r in rows] == [1, 1] and rows[1]["speedup"] > 0
    assert rows[1]["kept_fraction"] < 1.0 == rows[0]["kept_fraction"]  # the FastRL row pruned, GRPO did not
    assert "## GRPO + FastRL (weighted MDAP + ARS)" in (tmp_path / "cost_model_check.md").read_text()
    for name in ("accuracy_vs_time.png", "time_breakdown.png", "ars_n.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
