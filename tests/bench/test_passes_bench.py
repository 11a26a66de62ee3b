"""bench/passes_bench.py's report on hand-made run directories (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import passes_bench as PB


def _run(out: Path, variant: str, recipe: str, steps: list[dict], position: int) -> None:
    d = out / variant / recipe
    d.mkdir(parents=True)
    (d / "FINISHED").write_text("")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": i + 1, **s}) + "\n" for i, s in enumerate(steps)))
    (out / variant / f"{recipe}.bench_run.json").write_text(json.dumps({"other_cores": 0.01, "position": position}))


def _step(old: float, ref: float, update: float, kept: float, total: float, loss: float = -0.5, real: float = 0.0) -> dict:
    return {"time/old": old, "time/ref": ref, "time/update": update, "time/gen": 1.0, "time/step": old + ref + update + 1.0,
            "prune/kept_tokens": kept, "prune/total_tokens": total, "actor/padding_fraction": 0.1,
            "actor/log_prob_padding_fraction": 0.05, "actor/update_tokens": real or 2 * kept,
            "actor/loss": loss, "actor/grad_norm": 0.25}


def test_report_compares_variants_and_predicts_from_kept_tokens(tmp_path):
    """catches: the warm-up step counted in the means, the prediction taken from the other variant's
    GRPO run, or the passes' change computed against the wrong base."""
    grpo, fastrl = "g_recipe", "f_recipe"
    _run(tmp_path, "before", grpo, [_step(99, 99, 99, 1000, 1000), _step(10, 10, 20, 1000, 1000)], 0)
    _run(tmp_path, "after", grpo, [_step(99, 99, 99, 1000, 1000), _step(0, 10, 20, 1000, 1000)], 1)
    _run(tmp_path, "before", fastrl, [_step(99, 99, 99, 250, 1000), _step(3, 3, 6, 250, 1000)], 2)
    _run(tmp_path, "after", fastrl, [_step(99, 99, 99, 250, 1000), _step(0, 3, 6, 250, 1000, real=600)], 3)
    runs = PB.report(tmp_path, {"x": (grpo, fastrl)}, ["before", "after"])
    assert runs[grpo]["before"]["passes_s"] == pytest.approx(40.0)  # step 1 left out
    assert runs[grpo]["after"]["passes_s"] == pytest.approx(30.0)
    text = (tmp_path / "passes.md").read_text()
    assert "| g_recipe | after | 0.0 | 10.0 | 20.0 | 30.0 | -25.0% | 31.0 | 10.0% | 5.0% |" in text
    # FastRL after: 9 s of passes against GRPO after's 30 s / 1000 tokens x 250 kept = 7.5 s, and
    # per real token 30 s / 2000 x 600 = 9.0 s (catches: the real-token prediction from response tokens)
    assert "| f_recipe | after | 9.0 | 7.5 | 1.20 | 9.0 | 1.00 | 0.300 |" in text
    assert "| f_recipe | before | 12.0 | 10.0 | 1.20 | 10.0 | 1.20 | 0.300 |" in text
    assert runs[grpo]["after"]["step1"] == {"actor/loss": -0.5, "actor/grad_norm": 0.25}


def test_variants_rotate():
    assert PB.rotated(["a", "b", "c"], 1) == ["b", "c", "a"] and PB.rotated(["a", "b"], 2) == ["a", "b"]
    assert "trainer.old_log_probs=recompute" in PB.overrides(3, "before") and "trainer.max_steps=3" in PB.overrides(3, "after")
