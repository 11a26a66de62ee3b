"""bench/word_arith_bench.py: the real-model benchmark's report from finished runs (speedups against
GRPO of the same seed, the phase split and its Amdahl bound, MDAP on the logged rollouts)."""

import json

import pytest

from bench.word_arith_bench import BY_LABEL, amdahl_bound, main

PHASES = {"gen": 2.0, "reward": 0.0, "prune": 0.0, "old": 1.0, "ref": 1.0, "update": 2.0, "refit": 0.0}


def test_amdahl_bound_counts_only_the_phases_pruning_shrinks():
    # Breakage caught: generation or the refit counted as prunable (the bound would be too high).
    assert amdahl_bound(PHASES, 0.25) == pytest.approx(6.0 / (2.0 + 0.25 * 4.0))
    assert amdahl_bound(PHASES, 0.0) == pytest.approx(3.0)
    assert amdahl_bound(PHASES, 1.0) == pytest.approx(1.0)


def _run(out, seed, label, *, scale, test_acc, kept, position, steps=3):
    seed_dir = out / f"seed{seed}"
    run_dir = seed_dir / BY_LABEL[label].recipe
    (run_dir / "rollouts").mkdir(parents=True)
    records = [{"kind": "val", "step": 0, "val/accuracy": 0.1, "val/accuracy_stderr": 0.02, "val/questions": 150,
                "val/time_s": 1.0, "val/format_rate": 1.0}]
    for s in range(1, steps + 1):
        rec = {"kind": "train", "step": s, "rollout/n": 8.0, "reward/mean": 0.2, "prune/kept_fraction": kept,
               "time/train_elapsed": 6.0 * scale * s}
        rec.update({f"time/{p}": (v * (kept if p in ("old", "ref", "update") else 1.0) * scale) for p, v in PHASES.items()})
        records.append(rec)
    records += [{"kind": "val", "step": steps, "val/accuracy": 0.3, "val/accuracy_stderr": 0.03, "val/questions": 150,
                 "val/time_s": 1.0, "val/format_rate": 1.0},
                {"kind": "test", "step": steps, "test/accuracy": test_acc, "test/accuracy_stderr": 0.02,
                 "test/questions": 300, "test/time_s": 10.0, "time/train_elapsed": 6.0 * scale * steps}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "FINISHED").write_text("{}")
    (seed_dir / f"{BY_LABEL[label].recipe}.bench_run.json").write_text(
        json.dumps({"position": position, "process_seconds": 100.0 * scale, "other_cores": 0.0}))
    rollouts = [{"step": 1, "dp_rank": 0, "group": 0, "response": t, "response_token_ids": ids, "advantage": a,
                 "phase1_kept": k, "kept": k, "reward": 0.0, "weight": 1.0}
                for t, ids, a, k in (("a", [1, 2], 1.0, True), ("a", [1, 2], 1.0, False), ("b", [3], -1.0, True))]
    (run_dir / "rollouts" / "dp0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    (run_dir / "rollouts" / "pruning.json").write_text(json.dumps(
        {"method": "fastrl_unbiased", "semantics": "reference", "ngram": 1, "similarity_threshold": 0.2,
         "adv_tolerance": 1e-4, "similarity_mode": "exact", "apply": True}))


def test_the_report_pairs_each_seed_with_its_grpo_run(tmp_path, capsys):
    # Breakage caught: speedups not against GRPO of the same seed (seed 2's GRPO is twice as slow
    # as seed 1's), the Amdahl bound taken from the pruned run's own phases, the test accuracy
    # difference unpaired, or the MDAP text analysis missing from the report.
    for seed, grpo_scale in ((1, 1.0), (2, 2.0)):
        _run(tmp_path, seed, "grpo", scale=grpo_scale, test_acc=0.30, kept=1.0, position=0)
        _run(tmp_path, seed, "fastrl_grpo", scale=grpo_scale / 2, test_acc=0.30 + 0.01 * seed, kept=0.25, position=1)
    assert main(["--seeds", "2", "--report-only", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "word_arith.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    fastrl = rows["fastrl_grpo"]
    # train time: seed s's FastRL steps take (2 + 0.25 x 4) / 6 of its GRPO's at half the scale
    assert fastrl["train_speedup_mean"] == pytest.approx(6.0 / (0.5 * 3.0))
    assert fastrl["diff_mean"] == pytest.approx(0.015) and fastrl["seeds"] == [1, 2]
    assert rows["matched_random_grpo"]["seeds"] == []  # not run: left out, not zero
    text = (tmp_path / "word_arith.md").read_text()
    assert "| GRPO + FastRL (weighted MDAP + ARS) | 2 | 4.00x" in text
    assert "| 2.00x | 3.00x |" in text  # the bound at kept 0.25 and at 0, from GRPO's phases
    assert "J(member, seed) p10/p50/p90 1.00/1.00/1.00" in text and "the base model answered 18.7%" in text
    assert "Pruned members beside their seeds" in text and "J = 1.000" in text
