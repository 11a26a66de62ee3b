"""bench/word_arith_bench.py: the real-model benchmark's report from finished runs (speedups against
GRPO of the same seed, the phase split and its Amdahl bound, MDAP on the logged rollouts)."""

import json
import math
import statistics

import pytest

from bench.word_arith_bench import BY_LABEL, amdahl_bound, main

PHASES = {"gen": 2.0, "reward": 0.0, "prune": 0.0, "old": 1.0, "ref": 1.0, "update": 2.0, "refit": 0.0}


def test_amdahl_bound_counts_only_the_phases_pruning_shrinks():
    # Breakage caught: generation or the refit counted as prunable (the bound would be too high).
    assert amdahl_bound(PHASES, 0.25) == pytest.approx(6.0 / (2.0 + 0.25 * 4.0))
    assert amdahl_bound(PHASES, 0.0) == pytest.approx(3.0)
    assert amdahl_bound(PHASES, 1.0) == pytest.approx(1.0)


def _run(out, seed, label, *, scale, test_acc, kept, position, steps=3):
    """A finished run whose steps take ``scale`` x PHASES (old / ref / update x ``kept``)."""
    from bench.algorithms import COMMON, seed_overrides, train_args

    seed_dir = out / f"seed{seed}"
    recipe = BY_LABEL[label].recipe
    run_dir = seed_dir / recipe
    (run_dir / "rollouts").mkdir(parents=True)
    records = [{"kind": "val", "step": 0, "val/accuracy": 0.1, "val/accuracy_stderr": 0.02, "val/questions": 150,
                "val/time_s": 1.0, "val/format_rate": 1.0}]
    step_s = sum(v * (kept if p in ("old", "ref", "update") else 1.0) for p, v in PHASES.items()) * scale
    for s in range(1, steps + 1):
        rec = {"kind": "train", "step": s, "rollout/n": 8.0, "reward/mean": 0.2, "prune/kept_fraction": kept,
               "rollout/generated_tokens": 100.0, "prune/kept_tokens": 100.0 * kept, "time/train_elapsed": step_s * s}
        rec.update({f"time/{p}": (v * (kept if p in ("old", "ref", "update") else 1.0) * scale) for p, v in PHASES.items()})
        records.append(rec)
    records += [{"kind": "val", "step": steps, "val/accuracy": 0.3, "val/accuracy_stderr": 0.03, "val/questions": 150,
                 "val/time_s": 1.0, "val/format_rate": 1.0},
                {"kind": "test", "step": steps, "test/accuracy": test_acc, "test/accuracy_stderr": 0.02,
                 "test/questions": 300, "test/time_s": 10.0, "time/train_elapsed": step_s * steps}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "FINISHED").write_text("{}")
    (seed_dir / f"{recipe}.bench_run.json").write_text(
        json.dumps({"position": position, "process_seconds": 10.0 + 20.0 * step_s, "other_cores": 0.0}))
    (seed_dir / f"{recipe}.args.json").write_text(json.dumps(train_args(recipe, seed_dir, [*COMMON, *seed_overrides(seed)],
                                                                         threads=2)))
    rollouts = [{"step": 1, "dp_rank": 0, "group": 0, "response": t, "response_token_ids": ids, "advantage": a,
                 "phase1_kept": k, "kept": k, "reward": 0.0, "weight": 1.0}
                for t, ids, a, k in (("a", [1, 2], 1.0, True), ("a", [1, 2], 1.0, False), ("b", [3], -1.0, True))]
    (run_dir / "rollouts" / "dp0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    (run_dir / "rollouts" / "pruning.json").write_text(json.dumps(
        {"method": "fastrl_unbiased", "semantics": "reference", "ngram": 1, "similarity_threshold": 0.2,
         "adv_tolerance": 1e-4, "similarity_mode": "exact", "apply": True}))
    return step_s


def test_the_report_pairs_each_seed_with_its_grpo_run(tmp_path):
    # Breakage caught: speedups or accuracy differences not paired with GRPO of the same seed (seed
    # 2's GRPO is twice as slow as seed 1's and its FastRL gains less: a crossed pairing changes the
    # ratios and the intervals), the end-to-end time keeping the test evaluation, the Amdahl bound
    # taken from the pruned run's own phases, a smoke run with other arguments mixed in, or the MDAP
    # text analysis missing from the report.
    speed, e2e, diffs = [], [], []
    for seed, grpo_scale, fastrl_scale, acc in ((1, 1.0, 0.5, 0.32), (2, 2.0, 1.5, 0.29)):
        g = _run(tmp_path, seed, "grpo", scale=grpo_scale, test_acc=0.30, kept=1.0, position=0)
        f = _run(tmp_path, seed, "fastrl_grpo", scale=fastrl_scale, test_acc=acc, kept=0.25, position=1)
        speed.append(g / f)
        e2e.append((20.0 * g) / (20.0 * f))  # process seconds less the 10 s test evaluation
        diffs.append(acc - 0.30)
    _run(tmp_path, 1, "matched_random_grpo", scale=0.5, test_acc=0.5, kept=0.25, position=2, steps=2)
    args = tmp_path / "seed1" / f"{BY_LABEL['matched_random_grpo'].recipe}.args.json"
    args.write_text(json.dumps([*json.loads(args.read_text()), "trainer.max_steps=2"]))  # a --steps 2 smoke run
    assert main(["--seeds", "2", "--report-only", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "word_arith.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    fastrl = rows["fastrl_grpo"]
    logs = [math.log(x) for x in speed]
    half = 12.706 * statistics.stdev(logs) / math.sqrt(2)  # Student t, 1 degree of freedom
    assert fastrl["train_speedup_mean"] == pytest.approx(math.sqrt(speed[0] * speed[1]))
    assert fastrl["train_speedup_ci95"] == pytest.approx([math.exp(statistics.fmean(logs) - half),
                                                          math.exp(statistics.fmean(logs) + half)])
    assert fastrl["e2e_speedup_mean"] == pytest.approx(math.sqrt(e2e[0] * e2e[1]))
    d_half = 12.706 * statistics.stdev(diffs) / math.sqrt(2)
    assert fastrl["diff_mean"] == pytest.approx(statistics.fmean(diffs))
    assert fastrl["diff_ci95"] == pytest.approx([statistics.fmean(diffs) - d_half, statistics.fmean(diffs) + d_half])
    assert rows["matched_random_grpo"]["seeds"] == []  # the smoke run is left out, and said so
    assert report["left_out"] == ["seed 1, matched_random_grpo: trained with other arguments "
                                  f"({BY_LABEL['matched_random_grpo'].recipe}.args.json)"]
    text = (tmp_path / "word_arith.md").read_text()
    assert "| 0.250 | 2.00x | 3.00x |" in text  # the bound at the kept token share and at 0, from GRPO's phases
    assert "J(member, seed) p10/p50/p90 1.00/1.00/1.00" in text and "the base model answered 18.7%" in text
    assert "Pruned members beside their seeds" in text and "J = 1.000" in text
