"""Engine/trainer log-prob mismatch metrics (pure part)."""

from __future__ import annotations

import math

import pytest
import torch

from fastrl.models.logprobs import mismatch_metrics, reduce_mismatch_metrics


def test_mismatch_metrics_values():
    trainer = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, -9.0]])
    engine = torch.tensor([[0.0, -1.1, -2.0], [0.0, -0.3, -1.0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    m = mismatch_metrics(trainer, engine, mask)
    assert float(m["tokens"]) == 3
    assert float(m["abs_diff_sum"]) == approx(0.1 + 0.0 + 0.2)
    assert float(m["abs_diff_max"]) == approx(0.2)
    r = [math.exp(0.1), 1.0, math.exp(-0.2)]  # p_trainer / p_engine on the masked tokens
    assert float(m["ratio_sum"]) == approx(sum(r))
    assert float(m["kl_k3_sum"]) == approx(sum(x - 1 - math.log(x) for x in r))
    g = reduce_mismatch_metrics(m)  # one process: the global values are the local ones
    assert g["mismatch/abs_diff_mean"] == approx(0.1)
    assert g["mismatch/ratio_mean"] == approx(sum(r) / 3)


def approx(x: float):
    return pytest.approx(x, rel=1e-6, abs=1e-7)  # float32 inputs
