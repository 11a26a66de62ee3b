"""CI check that GRPO learns (the second of the learning tests; design, control and margin in
``tests/functional/test_learning.py``, kept in its own file so that make test's two workers run the
two runs side by side; calibration there: GRPO leaves the plateau between steps 10 and 20 and
saw +23.2 points, 11.0 standard errors, at step 20).
"""

from __future__ import annotations

import pytest

from tests.functional.test_learning import assert_validation_rises, train_seed

pytestmark = [pytest.mark.functional, pytest.mark.long(200)]


@pytest.mark.timeout(1600)  # above the subprocess's own limit in train_seed
def test_grpo_validation_accuracy_rises(tmp_path):
    steps = 20
    records = train_seed(tmp_path, "easyvqa_tiny_grpo_cpu", f"trainer.max_steps={steps}")
    assert_validation_rises(records, steps)
