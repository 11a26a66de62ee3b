"""bench/heldout.py: run order, time to accuracy, paired intervals, and the refusal to report on a
split the rows were chosen on."""

import json
import math
import shutil
import statistics

import pytest

from bench.heldout import (
    BASE,
    BY_LABEL,
    ROWS,
    adjust,
    check_reportable,
    markdown,
    measure,
    paired_interval,
    run_order,
    summarize,
    time_to_accuracy,
)
from recipes.registry import get_recipe


def test_every_row_is_a_recipe_and_the_matched_peers_differ_from_fastrl_only_in_the_choice():
    for row in ROWS:
        assert get_recipe(row.recipe).recipe == row.recipe
    fastrl, paper = get_recipe(BY_LABEL["fastrl_grpo"].recipe), get_recipe(BY_LABEL["fastrl_paper_grpo"].recipe)
    for label, base, method, weighting in (
        ("matched_random_grpo", fastrl, "matched_random", "inverse_keep"),
        ("matched_random_unweighted_grpo", paper, "matched_random", "none"),
        ("matched_top_abs_grpo", fastrl, "matched_top_abs", "inverse_keep"),
        ("matched_pods_grpo", fastrl, "matched_pods", "inverse_keep"),
    ):
        cfg = get_recipe(BY_LABEL[label].recipe)
        assert (cfg.pruning.method, cfg.pruning.weighting) == (method, weighting)
        assert cfg.adaptive_sampling == base.adaptive_sampling and cfg.trainer == base.trainer
        assert cfg.pruning.similarity_threshold == base.pruning.similarity_threshold


def test_run_order_rotates_so_no_row_runs_first_or_last_twice_in_five_seeds():
    labels = [r.label for r in ROWS]
    orders = [run_order(labels, s) for s in range(1, 6)]
    assert orders[0] == labels and all(sorted(o) == sorted(labels) for o in orders)
    assert len({o[0] for o in orders}) == 5 and len({o[-1] for o in orders}) == 5
    # every row takes five different places (a fixed order would give GRPO place 0 every time)
    assert all(len({o.index(label) for o in orders}) == 5 for label in labels)


def test_time_to_accuracy_needs_two_consecutive_evaluations():
    curve = [(10.0, 0.60), (20.0, 0.73), (30.0, 0.70), (40.0, 0.74), (50.0, 0.75)]
    assert time_to_accuracy(curve, 0.72) == 40.0  # the lone 0.73 at 20 s is not a crossing
    assert time_to_accuracy(curve[:4], 0.72) is None  # a last evaluation alone is not confirmed
    assert time_to_accuracy(curve, 0.80) is None


def test_paired_interval_is_students_t():
    mean, lo, hi = paired_interval([0.01, 0.02, 0.03])
    # sd 0.01, n 3: half width t(0.975, 2) * 0.01 / sqrt(3) = 4.303 * 0.005774
    assert mean == pytest.approx(0.02) and hi - mean == pytest.approx(4.303 * 0.01 / math.sqrt(3))
    assert mean - lo == pytest.approx(hi - mean)
    assert math.isnan(paired_interval([0.01])[1])


def test_the_validation_split_is_refused(tmp_path):
    # Breakage caught: a report that read the validation records (kind 'val'), the split every
    # setting was chosen on
    with pytest.raises(SystemExit, match="refusing to report on the 'val' split"):
        measure(tmp_path, split="val")
    check_reportable("test")


def test_the_retime_rule_flags_runs_that_other_work_disturbed():
    from bench.heldout import RETIME_OTHER_CORES, disturbed

    assert not disturbed({"other_cores": 0.02})
    assert disturbed({"other_cores": RETIME_OTHER_CORES + 0.01})
    assert disturbed({})  # recorded without the measurement: cannot be shown undisturbed


def _run(train: float, acc: float, e2e: float, curve=((10.0, 0.5), (20.0, 0.75), (30.0, 0.76))) -> dict:
    return {"train_time_s": train, "test_accuracy": acc, "test_stderr": 0.01, "test_questions": 2000,
            "end_to_end_s": e2e, "test_curve": list(curve), "kept_fraction": 0.25, "mean_n": 8.0,
            "bench_run": {"other_cores": 0.0}}


def test_summary_pairs_each_seed_with_its_own_grpo_run():
    per_seed = {
        1: {BASE: _run(100.0, 0.76, 200.0), "fastrl_grpo": _run(25.0, 0.75, 100.0)},
        2: {BASE: _run(120.0, 0.78, 220.0), "fastrl_grpo": _run(40.0, 0.79, 110.0)},
        3: {BASE: _run(110.0, 0.77, 210.0)},  # the FastRL run of seed 3 is missing: seed 3 is left out of its row
    }
    rows = [BY_LABEL[BASE], BY_LABEL["fastrl_grpo"]]
    grpo, fast = summarize(per_seed, rows)
    assert grpo["seeds"] == [1, 2, 3] and fast["seeds"] == [1, 2]
    assert fast["train_speedup"] == pytest.approx([4.0, 3.0]) and fast["e2e_speedup"] == pytest.approx([2.0, 2.0])
    assert fast["diff_to_grpo"] == pytest.approx([-0.01, 0.01]) and fast["diff_mean"] == pytest.approx(0.0)
    assert fast["time_to_accuracy_s"] == [20.0, 20.0]
    # geometric mean of 4x and 3x; t(1) interval of the mean log ratio
    assert fast["train_speedup_mean"] == pytest.approx(math.sqrt(12.0))
    half = 12.706 * statistics.stdev([math.log(4.0), math.log(3.0)]) / math.sqrt(2)
    assert fast["train_speedup_ci95"] == pytest.approx([math.sqrt(12.0) * math.exp(-half), math.sqrt(12.0) * math.exp(half)])
    for s, order in ((1, [BASE, "fastrl_grpo"]), (2, ["fastrl_grpo", BASE])):
        for position, label in enumerate(order):
            per_seed[s][label]["bench_run"] = {"position": position, "other_cores": 0.01}
    text = markdown([grpo, fast], per_seed)
    assert ("| GRPO + FastRL (default: weighted MDAP + ARS) | 2 | 3.46x [0.56, 21.54] | 2.00x [2.00, 2.00] | "
            "77.00 ± 2.83 | +0.00 | [-12.71, +12.71] |") in text
    assert "| 2 | fastrl_grpo (0; 0.01), grpo (1; 0.01) |" in text


def test_a_run_without_a_final_test_evaluation_is_not_reported(tmp_path):
    run_dir = tmp_path / "seed1" / "easyvqa_tiny_grpo_cpu"
    run_dir.mkdir(parents=True)
    records = [{"kind": "val", "step": 0, "val/accuracy": 0.5, "val/accuracy_stderr": 0.01, "val/questions": 10,
                "val/time_s": 1.0, "val/format_rate": 1.0}]
    records += [{"kind": "train", "step": s, "time/gen": 1.0, "time/update": 1.0, "rollout/n": 8.0,
                 "time/train_elapsed": 2.0 * s, "reward/mean": 0.5} for s in (1, 2)]
    records += [{"kind": "test", "step": 1, "test/accuracy": 0.6, "test/accuracy_stderr": 0.01, "test/questions": 10,
                 "test/time_s": 1.0, "time/train_elapsed": 2.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SystemExit, match="no held-out test evaluation of its final step 2"):
        measure(run_dir)
    final = {**records[-1], "step": 2, "test/accuracy": 0.7, "time/train_elapsed": 4.0}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, final]))
    (tmp_path / "seed1" / "easyvqa_tiny_grpo_cpu.bench_run.json").write_text(json.dumps({"process_seconds": 30.0}))
    out = measure(run_dir)
    assert out["test_accuracy"] == 0.7 and out["test_curve"] == [(2.0, 0.6), (4.0, 0.7)]
    assert out["end_to_end_s"] == 28.0  # the process's seconds without its two test evaluations


def test_a_retimed_run_must_compute_what_the_original_did():
    from bench.heldout import same_computation

    a = [{"kind": "train", "step": 1, "reward/mean": 0.5, "time/gen": 1.0, "rollout/tokens_per_s": 9.0, "wall_time": 1.0},
         {"kind": "test", "step": 1, "test/accuracy": 0.7, "test/accuracy_stderr": 0.01, "test/time_s": 3.0}]
    slower = [{**a[0], "time/gen": 2.0, "rollout/tokens_per_s": 4.5, "wall_time": 9.0}, {**a[1], "test/time_s": 6.0}]
    assert same_computation(a, slower) is None  # only times differ
    # Breakage caught: a re-timed run that trained something else (another seed, code or data)
    # would lend its times to the original's accuracy
    other = [{**a[0], "reward/mean": 0.25}, a[1]]
    assert same_computation(a, other) == "step 1 (train): reward/mean = 0.5 against 0.25"
    assert same_computation(a, [{**a[0]}, {**a[1], "test/accuracy_stderr": 0.02}]).startswith("step 1 (test)")
    assert same_computation(a, a[:1]) == "2 records against 1"


def test_a_run_from_another_build_of_the_warm_start_is_set_aside_to_run_again(tmp_path):
    # Breakage caught: rows of one seed paired although they started from two builds of its warm
    # start (seed 2: a rebuild on another machine gave SFT color accuracy 0.951 against 0.934).
    from bench.heldout import set_aside_other_warm_start, warm_start_fingerprint

    def run(name, acc, seconds, cached):
        d = tmp_path / name
        d.mkdir(parents=True)
        start = {"step": 0, "kind": "start", "wall_time": seconds, "warm_start/sft_color_acc": acc,
                 "warm_start/seconds": seconds, "warm_start/cached": cached}
        (d / "metrics.jsonl").write_text(json.dumps(start) + "\n" + json.dumps({"step": 1, "kind": "train"}) + "\n")
        (d / "FINISHED").write_text("")
        return d

    reference = warm_start_fingerprint(run("_warm_start/grpo", 0.951, 92.0, 0.0))
    assert reference == {"warm_start/sft_color_acc": 0.951}  # times and the cache flag are not what it computed
    run("same", 0.951, 11.0, 1.0)
    assert set_aside_other_warm_start(tmp_path, "same", reference) is None
    run("other", 0.934, 77.0, 1.0)
    (tmp_path / "other.bench_run.json").write_text("{}")
    (tmp_path / "other.log").write_text("")
    run("retime/other", 0.934, 70.0, 1.0)
    dest = set_aside_other_warm_start(tmp_path, "other", reference)
    assert dest == tmp_path / "other_warm_start" / "1"
    assert sorted(p.name for p in dest.iterdir()) == ["other", "other.bench_run.json", "other.log", "retime-other"]
    assert not (tmp_path / "other").exists() and not (tmp_path / "retime" / "other").exists()
    assert set_aside_other_warm_start(tmp_path, "missing", reference) is None


def _args(seed_dir, recipe, seed=1, threads=2):
    """What bench/heldout.py's main gives ``python -m fastrl.train`` for a row of ``seed``."""
    from bench.algorithms import COMMON, seed_overrides, train_args
    from bench.heldout import OVERRIDES

    return train_args(recipe, seed_dir, [*COMMON, *OVERRIDES, *seed_overrides(seed)], threads=threads)


def _finished_run(seed_dir, recipe, acc, other_cores=0.0, seed=1):
    d = seed_dir / recipe
    d.mkdir(parents=True)
    start = {"step": 0, "kind": "start", "warm_start/sft_color_acc": acc, "warm_start/seconds": 9.0}
    (d / "metrics.jsonl").write_text(json.dumps(start) + "\n")
    (d / "FINISHED").write_text("")
    (seed_dir / f"{recipe}.bench_run.json").write_text(json.dumps({"other_cores": other_cores}))
    (seed_dir / f"{recipe}.args.json").write_text(json.dumps(_args(seed_dir, recipe, seed)))
    return d


def test_a_complete_seed_is_not_touched_again_and_an_incomplete_one_is(tmp_path):
    # Breakage caught: a later session rebuilding a finished seed's warm start (on another machine
    # it can differ) and so training all of its rows again; or a seed skipped although a row is
    # missing, started from another build, or still waits for its re-timing.
    from bench.algorithms import COMMON, seed_overrides
    from bench.heldout import OVERRIDES, seed_complete

    def complete(threads=2):
        return seed_complete(tmp_path, rows, [*COMMON, *OVERRIDES, *seed_overrides(1)], threads=threads)

    rows = [BY_LABEL["grpo"], BY_LABEL["fastrl_grpo"]]
    _finished_run(tmp_path, rows[0].recipe, 0.917)
    assert not complete()  # a row missing
    fastrl = _finished_run(tmp_path, rows[1].recipe, 0.917)
    assert complete()
    assert not complete(threads=1)  # trained with other settings (e.g. a --steps 4 smoke run)
    moved_elsewhere = [a.replace(str(tmp_path), "/elsewhere") for a in _args(tmp_path, rows[1].recipe)]
    (tmp_path / f"{rows[1].recipe}.args.json").write_text(json.dumps(moved_elsewhere))
    assert complete()  # where the runs were written does not count
    (fastrl / "metrics.jsonl").write_text(json.dumps({"step": 0, "kind": "start", "warm_start/sft_color_acc": 0.933}))
    assert not complete()  # another build of the warm start
    (fastrl / "metrics.jsonl").write_text(json.dumps({"step": 0, "kind": "start", "warm_start/sft_color_acc": 0.917}))
    (tmp_path / f"{rows[1].recipe}.bench_run.json").write_text(json.dumps({"other_cores": 0.5}))
    assert not complete()  # disturbed, not yet re-timed
    _verified_retime(tmp_path, rows[1].recipe, sitting=None)
    assert not complete()  # re-timed, but with no GRPO re-timed in its sitting
    _verified_retime(tmp_path, rows[0].recipe, sitting="B")
    _verified_retime(tmp_path, rows[1].recipe, sitting="A")
    assert not complete()  # GRPO re-timed in another sitting than the row
    _verified_retime(tmp_path, rows[1].recipe, sitting="B")
    assert complete()


def _verified_retime(seed_dir, recipe, sitting):
    (seed_dir / "retime" / recipe).mkdir(parents=True, exist_ok=True)
    (seed_dir / "retime" / recipe / "VERIFIED").write_text("")
    (seed_dir / "retime" / f"{recipe}.bench_run.json").write_text(json.dumps({"other_cores": 0.0, "sitting": sitting}))


def test_a_retimed_row_is_compared_only_with_grpo_retimed_in_its_sitting():
    # Breakage caught: a re-timing made hours later (seed 2's, on a machine then 25% faster) divided
    # into GRPO's first run; a disturbed run's time reported as if undisturbed.
    base = {**_run(100.0, 0.76, 200.0), "retime": {**_run(80.0, 0.76, 160.0), "retimed": True}}
    base["retime"]["bench_run"] = {"other_cores": 0.0, "sitting": "B"}
    same = {**_run(20.0, 0.75, 100.0), "retimed": True, "bench_run": {"other_cores": 0.0, "sitting": "B"}}
    other = {**_run(20.0, 0.75, 100.0), "retimed": True, "bench_run": {"other_cores": 0.0, "sitting": "C"}}
    disturbed_run = {**_run(25.0, 0.77, 100.0), "bench_run": {"other_cores": 0.5}}
    per_seed = {1: {BASE: base, "fastrl_grpo": same, "cppo_grpo": disturbed_run},
                2: {BASE: _run(100.0, 0.76, 200.0), "fastrl_grpo": _run(50.0, 0.77, 100.0), "cppo_grpo": other}}
    rows = [BY_LABEL[BASE], BY_LABEL["fastrl_grpo"], BY_LABEL["cppo_grpo"]]
    grpo, fast, cppo = summarize(per_seed, rows)
    assert fast["train_speedup"] == pytest.approx([4.0, 2.0]) and fast["timed_seeds"] == [1, 2]
    assert cppo["seeds"] == [1, 2] and cppo["timed_seeds"] == [] and cppo["train_speedup"] == []
    assert cppo["diff_to_grpo"] == pytest.approx([0.01, -0.01])  # accuracy is reported either way
    text = markdown([grpo, fast, cppo], per_seed)
    assert "| GRPO + CPPO (half of each group) | 2 (0 timed) | - |" in text
    assert "77.00, not timed with GRPO |" in text and cppo["time_to_accuracy_s"] == []


def test_again_moves_every_run_of_the_seed_aside_before_training(tmp_path, monkeypatch, capsys):
    # Breakage caught: --again accepted and ignored (the seed's old runs reused), or runs deleted
    # instead of kept aside; a complete seed not named by --again is skipped without a warm start; a
    # seed this machine cannot re-time stops the seeds after it.
    import bench.heldout as heldout
    from bench.heldout import warm_start_fingerprint

    calls = []
    def build_warm_start(seed_dir, *args, **kwargs):
        calls.append(("warm", seed_dir.name))
        shutil.rmtree(seed_dir / "_warm_start", ignore_errors=True)  # as the real one: built anew each time
        _finished_run(seed_dir / "_warm_start", BY_LABEL["grpo"].recipe, built[0])

    built = [0.95]
    monkeypatch.setattr(heldout, "build_warm_start", build_warm_start)

    def run_one(row, seed_dir, *args, **kwargs):
        calls.append(("run", seed_dir.name, row.label))
        if not (seed_dir / row.recipe / "FINISHED").exists():  # run_recipe reuses a finished run
            _finished_run(seed_dir, row.recipe, 0.95, seed=2)

    monkeypatch.setattr(heldout, "run_one", run_one)
    monkeypatch.setattr(heldout, "measure", lambda run_dir: {})
    for seed in (1, 2):
        for label in ("grpo", "fastrl_grpo", "cppo_grpo"):
            _finished_run(tmp_path / f"seed{seed}", BY_LABEL[label].recipe, 0.9, seed=seed)
    (tmp_path / "seed2" / "retime").mkdir()
    (tmp_path / "seed2" / "retime" / f"{BY_LABEL['grpo'].recipe}.log").write_text("")
    monkeypatch.setattr(heldout, "summarize", lambda per_seed, rows: [])
    monkeypatch.setattr(heldout, "markdown", lambda summary, per_seed: "")
    command = ["--seeds", "2", "--rows", "grpo,fastrl_grpo", "--again", "2", "--out", str(tmp_path)]
    heldout.main(command)
    assert calls == [("warm", "seed2"), ("run", "seed2", "grpo"), ("run", "seed2", "fastrl_grpo")]
    # every row of the seed moves, the one --rows leaves out too, with the re-timing's side files
    recipes = [BY_LABEL[label].recipe for label in ("grpo", "fastrl_grpo", "cppo_grpo")]
    assert sorted(p.name for p in (tmp_path / "seed2" / "earlier" / "1").iterdir()) == sorted(
        [f"{r}{suffix}" for r in recipes for suffix in ("", ".args.json", ".bench_run.json")]
        + [f"retime-{recipes[0]}.log"])
    # the same command again (an interrupted benchmark started anew) keeps the new runs
    calls.clear()
    heldout.main(command)
    assert calls == [("warm", "seed2"), ("run", "seed2", "grpo"), ("run", "seed2", "fastrl_grpo")]
    assert not (tmp_path / "seed2" / "earlier" / "2").exists()
    assert warm_start_fingerprint(tmp_path / "seed2" / BY_LABEL["grpo"].recipe) == {"warm_start/sft_color_acc": 0.95}
    # a finished seed whose row other work disturbed: only the re-timing runs, no warm-start rebuild
    (tmp_path / "seed1" / f"{BY_LABEL['cppo_grpo'].recipe}.bench_run.json").write_text(json.dumps({"other_cores": 0.5}))
    retimed = []
    monkeypatch.setattr(heldout, "retime", lambda row, seed_dir, *a, **k: retimed.append((seed_dir.name, row.label)))
    calls.clear()
    built[0] = 0.9
    heldout.main(["--seeds", "1", "--rows", "grpo,fastrl_grpo,cppo_grpo", "--out", str(tmp_path)])
    assert calls == [("warm", "seed1")] and retimed == [("seed1", "grpo"), ("seed1", "cppo_grpo")]
    # ... on a machine that builds another warm start: not re-timed, said so, nothing moved, and the
    # next seed still runs
    built[0], retimed[:], calls[:] = 0.97, [], []
    heldout.main(["--seeds", "2", "--rows", "grpo,fastrl_grpo,cppo_grpo", "--out", str(tmp_path)])
    assert "seed 1: NOT re-timed: this machine builds another warm start" in capsys.readouterr().out
    assert retimed == [] and not (tmp_path / "seed1" / "other_warm_start").exists()
    assert ("run", "seed2", "cppo_grpo") in calls and not any(c[1] == "seed1" and c[0] == "run" for c in calls)
    for bad in (["--again", "3"], ["--again", "2", "--report-only"]):
        with pytest.raises(SystemExit):
            heldout.main(["--seeds", "2", *bad, "--out", str(tmp_path)])


def test_a_new_sitting_moves_earlier_retimings_aside_and_retimes_grpo_first(tmp_path, monkeypatch):
    # Breakage caught: a row re-timed without GRPO beside it, or an earlier sitting's re-timing reused
    # (run_recipe reuses a finished run) and so paired with this sitting's GRPO.
    import bench.heldout as heldout

    for label, other in (("grpo", 0.0), ("fastrl_grpo", 0.0), ("cppo_grpo", 0.5)):
        _finished_run(tmp_path, BY_LABEL[label].recipe, 0.9, other_cores=other)
    labels = ["grpo", "fastrl_grpo", "cppo_grpo"]
    assert heldout.retimes_due(tmp_path, labels) == ["grpo", "cppo_grpo"]
    _verified_retime(tmp_path, BY_LABEL["cppo_grpo"].recipe, sitting="A")
    assert heldout.retimes_due(tmp_path, labels) == ["grpo", "cppo_grpo"]  # no GRPO of sitting A
    done = []
    monkeypatch.setattr(heldout, "retime", lambda row, seed_dir, *a, **k: done.append(row.label)
                        or _verified_retime(seed_dir, row.recipe, sitting="B"))
    heldout.retime_seed(tmp_path, heldout.retimes_due(tmp_path, labels), [], threads=2, timeout=1)
    assert done == ["grpo", "cppo_grpo"] and heldout.retimes_due(tmp_path, labels) == []
    assert (tmp_path / "retime_earlier" / "1" / BY_LABEL["cppo_grpo"].recipe / "VERIFIED").exists()
    # a disturbed GRPO run: every row is re-timed, since every speedup divides by its time
    (tmp_path / f"{BY_LABEL['grpo'].recipe}.bench_run.json").write_text(json.dumps({"other_cores": 0.4}))
    assert heldout.retimes_due(tmp_path, labels) == ["grpo", "fastrl_grpo", "cppo_grpo"]


def test_time_to_accuracy_ratios_and_holm_over_the_rows_but_the_primary_peer():
    """The speed figures at accuracy: per seed GRPO's time to the target over the row's, a row that
    never gets there counted apart, and the adjustment over every row but GRPO and the primary peer.

    catches: the ratio inverted (row over GRPO), a never-reached seed counted as a ratio, or the
    primary peer adjusted with the others (its p would be Holm's, not its own)."""
    slow = ((10.0, 0.60), (20.0, 0.73), (30.0, 0.76), (40.0, 0.76))
    fast = ((5.0, 0.73), (10.0, 0.76), (15.0, 0.76))
    never = ((5.0, 0.60), (10.0, 0.70), (15.0, 0.73))
    per_seed = {s: {BASE: _run(100.0, 0.76, 200.0, slow), "fastrl_grpo": _run(25.0, 0.76, 100.0, fast),
                    "cppo_grpo": _run(50.0, 0.76, 150.0, fast if s < 3 else never),
                    "random_grpo": _run(50.0, 0.75, 150.0, fast)} for s in (1, 2, 3)}
    rows = [BY_LABEL[x] for x in (BASE, "fastrl_grpo", "cppo_grpo", "random_grpo")]
    _, primary, cppo, rand = summarize(per_seed, rows)
    assert primary["time_to"]["0.72"]["ratio"] == pytest.approx([4.0] * 3)  # 20 s against 5 s
    assert primary["time_to"]["0.75"]["ratio"] == pytest.approx([3.0] * 3)  # 30 s against 10 s
    assert cppo["time_to"]["0.75"]["ratio"] == pytest.approx([3.0, 3.0]) and cppo["time_to"]["0.75"]["not_reached"] == 1
    assert primary["time_to"]["0.72"]["p_holm"] == primary["time_to"]["0.72"]["p"]
    # the primary peer keeps its own p; Holm over the two others: 0.02 x 2, then max(0.04, 0.04)
    fake = [dict(r, diff_p=p) for r, p in zip((primary, cppo, rand), (0.03, 0.02, 0.04))]
    adjusted = {r["label"]: r["diff_p_holm"] for r in adjust(fake)}
    assert adjusted == pytest.approx({"fastrl_grpo": 0.03, "cppo_grpo": 0.04, "random_grpo": 0.04})  # with it: 0.06


def test_student_t_functions_reproduce_the_committed_interval():
    """catches: a one-sided p (halved) or the normal quantile for t (the interval of the unweighted
    random peer, [-2.95, -0.17] in docs/results.md, would narrow)."""
    from bench.paired_stats import one_sample_t, t_cdf, t_quantile

    assert t_cdf(2.776, 4) == pytest.approx(0.975, abs=1e-4) and t_cdf(0.0, 3) == 0.5
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    mean, lo, hi, p = one_sample_t([-0.0005, -0.019, -0.0315, -0.0125, -0.0145])
    assert (round(100 * lo, 2), round(100 * hi, 2)) == (-2.95, -0.17) and p == pytest.approx(0.0359, abs=1e-4)
