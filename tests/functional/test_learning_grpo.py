"""CI check that GRPO learns (the second of the learning tests; design, control and margin in
``tests/functional/test_learning.py``, kept in its own file so that make test's two workers run the
two runs side by side; calibration there: GRPO left the plateau between steps 10 and 20 on one
machine and between 30 and 40 on another, and trains 50 steps here).
"""

from __future__ import annotations

import pytest

from tests.functional.test_learning import assert_validation_rises, train_seed

pytestmark = [pytest.mark.functional, pytest.mark.long(380)]


@pytest.mark.timeout(1600)  # above the subprocess's own limit in train_seed
def test_grpo_validation_accuracy_rises(tmp_path):
    steps = 50
    records = train_seed(tmp_path, "easyvqa_tiny_grpo_cpu", f"trainer.max_steps={steps}")
    assert_validation_rises(records, steps)
