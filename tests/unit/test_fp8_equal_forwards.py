"""FP8 delayed scaling needs the same number of FP8 forwards on every DP rank: the settings that
give ranks different micro-batch counts are refused when the config is built (issue 29, item 8)."""

from __future__ import annotations

import re

import pytest

from fastrl import config as cfg
from fastrl.config import ConfigError, RunConfig


@pytest.fixture()
def fp8():
    return lambda recipe="delayed": cfg.PrecisionConfig(mode="fp8", fp8_recipe=recipe, fp8_format="e4m3")


def _free():
    return cfg.PruningConfig(refill_to="free")


def test_token_budget_micro_batches_are_refused_with_delayed_scaling(fp8):
    # Breakage caught: the config accepting a token budget under delayed scaling, whose ranks then
    # run different numbers of micro-batches and hang in the amax all-reduce.
    with pytest.raises(ConfigError, match=r"all-reduces the FP8 amax.*trainer.micro_batch_tokens=4096.*set trainer.micro_batch_tokens=0"):
        RunConfig(precision=fp8(), pruning=_free(), trainer=cfg.TrainerConfig(micro_batch_tokens=4096))
    # current scaling reduces no amax over DP: accepted
    RunConfig(precision=fp8("tensorwise"), pruning=_free(), trainer=cfg.TrainerConfig(micro_batch_tokens=4096))


@pytest.mark.parametrize("uneven", ["dapo", "greso"])
def test_full_batch_log_probs_with_uneven_rows_are_refused(fp8, uneven):
    # DAPO's filter and GRESO's skip leave each rank its own number of rows before pruning; the
    # early old/ref pass then runs a different number of micro-batches per rank.
    kw = {"algorithm": cfg.AlgorithmConfig(dynamic_sampling=True)} if uneven == "dapo" else {
        "pruning": cfg.PruningConfig(method="greso")}
    name = "algorithm.dynamic_sampling" if uneven == "dapo" else "pruning.method='greso'"
    with pytest.raises(ConfigError, match=rf"full batch .* with {re.escape(name)}"):
        RunConfig(precision=fp8(), trainer=cfg.TrainerConfig(logprobs_before_pruning=True), **kw)
    RunConfig(precision=fp8(), **kw)  # after pruning every rank holds the same kept count: accepted
    RunConfig(precision=cfg.PrecisionConfig(mode="bf16"), trainer=cfg.TrainerConfig(logprobs_before_pruning=True), **kw)



