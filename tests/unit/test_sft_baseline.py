"""bench/sft_baseline.py: the equal-time step count and the table."""

import pytest

from bench.sft_baseline import extra_steps_for, rl_summary, row, table


def _val(acc):
    return {"val/accuracy": acc, "val/accuracy_stderr": 0.01, "val/format_rate": 1.0,
            "val/accuracy/yes_no": 0.8, "val/accuracy/shape": 0.4, "val/accuracy/color": 0.9}


def test_extra_steps_match_the_rl_training_time():
    warm = {"warm_start/seconds": 43.0, "warm_start/vision_seconds": 15.0}  # 28 s for 35 SFT steps
    steps, per_step = extra_steps_for(456.0, warm, 35)
    assert per_step == pytest.approx(0.8)
    assert steps == 570


def test_rl_summary_reads_time_and_first_last_validation(tmp_path):
    records = [
        {"kind": "start", "step": 0, "warm_start/seconds": 43.0, "warm_start/vision_seconds": 15.0},
        {"kind": "val", "step": 0, **_val(0.5)},
        {"kind": "train", "step": 1, "time/train_elapsed": 3.5},
        {"kind": "train", "step": 2, "time/train_elapsed": 7.25},
        {"kind": "val", "step": 2, **_val(0.7)},
    ]
    s = rl_summary(records, tmp_path)
    assert s["steps"] == 2 and s["train_seconds"] == 7.25
    assert s["val_start"]["val/accuracy"] == 0.5 and s["val_end"]["val/accuracy"] == 0.7


def test_rl_summary_names_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="warm-start record"):
        rl_summary([{"kind": "val", "step": 0, **_val(0.5)}], tmp_path)


def test_table_rows():
    md = table([row("warm start", _val(0.535), None), row("RL", _val(0.772), 456.0)])
    lines = md.splitlines()
    assert lines[2] == "| warm start | 53.5 ± 1.0 | 80.0 | 40.0 | 90.0 | 100% | - |"
    assert lines[3] == "| RL | 77.2 ± 1.0 | 80.0 | 40.0 | 90.0 | 100% | 456 |"
