"""CI check that GRPO learns (the second of the learning tests; calibration and method in
``tests/functional/test_learning.py``, kept in its own file so that make test's two workers run the
two minutes-long runs side by side)."""

from __future__ import annotations

import pytest

from tests.functional.test_learning import train_seed

pytestmark = [pytest.mark.functional, pytest.mark.long(390)]


@pytest.mark.timeout(900)  # the subprocess's own limit
def test_grpo_validation_accuracy_rises(tmp_path):
    records = train_seed(
        tmp_path, "easyvqa_tiny_grpo_cpu", "trainer.max_steps=20", "trainer.val_every=0", "data.val_size=500",
    )
    val = {r["step"]: r["val/accuracy"] for r in records if r["kind"] == "val"}
    assert sorted(val) == [0, 20] and all(r["val/questions"] == 500 for r in records if r["kind"] == "val")
    rise = val[20] - val[0]
    assert rise >= 0.01, f"validation accuracy rose by {100 * rise:.2f} points (0 -> 20 steps); calibrated >= +1.8"
