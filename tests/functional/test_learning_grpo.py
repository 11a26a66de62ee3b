"""CI check that GRPO learns (the second of the learning tests; design, control and margin in
``tests/functional/test_learning.py``, kept in its own file so that make test's two workers run the
two minutes-long runs side by side).

Calibration (2026-12-03, seed 0, 1,000 validation questions): GRPO (``easyvqa_tiny_grpo_cpu``, no
pruning, every rollout trains) validated 0.528 at step 0, then 0.515 / 0.550 / 0.749 at steps 10 / 20 / 30
(yes/no questions 0.49 -> 0.78): like GRPO + FastRL it leaves the plateau between steps 20 and 30
(at step 20 it was +2.2 points, 1.0 standard error, which the test would refuse).
The test trains 30 steps and requires 3 standard errors of the difference (about 6.4 points);
it saw +22.1 points, 10.6 standard errors.
"""

from __future__ import annotations

import pytest

from tests.functional.test_learning import assert_validation_rises, train_seed

pytestmark = [pytest.mark.functional, pytest.mark.long(520)]


@pytest.mark.timeout(1600)  # above the subprocess's own limit in train_seed
def test_grpo_validation_accuracy_rises(tmp_path):
    steps = 30
    records = train_seed(tmp_path, "easyvqa_tiny_grpo_cpu", f"trainer.max_steps={steps}")
    assert_validation_rises(records, steps)
