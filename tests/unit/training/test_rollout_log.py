"""logging.rollouts_every: every rollout of a step with the pruner's decision, written and read back,
and bench/prune_text.py's recomputation of MDAP's buckets and similarities from those records."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench.prune_text import analyze, markdown
from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
from fastrl.training.geometry import step_geometry
from fastrl.training.prune_phase import prune
from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
from fastrl.training.rollout_log import (
    due,
    read_pruning,
    read_rollouts,
    rollout_records,
    rollouts_path,
    write_rollouts,
)
from recipes.registry import get_recipe

# two groups of four: group 0 has two identical right answers (one is MDAP's near-copy) and two
# different wrong ones; group 1 all wrong (one bucket of advantage 0: one seed, three members)
RESPONSES = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11], [12, 13], [20, 21], [20, 21, 22], [30, 31], [40]]
REWARDS = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def _advantaged():
    ro = Rollouts(
        prompts=[RolloutPrompt(text="q0"), RolloutPrompt(text="q1")],
        prompt_inputs=[PromptInputs(input_ids=torch.tensor([1, 2])), PromptInputs(input_ids=torch.tensor([3, 4]))],
        n_per_prompt=[4, 4], prompt_index=[0] * 4 + [1] * 4,
        response_token_ids=[torch.tensor(r) for r in RESPONSES], logprobs=[-torch.ones(len(r)) for r in RESPONSES],
        finish_reasons=["stop"] * 8, response_texts=[f"text {i}" for i in range(8)],
    )
    scored = ScoredRollouts(
        ro, group_ids=torch.tensor([0] * 4 + [1] * 4), rewards=torch.tensor(REWARDS), accuracy=torch.tensor(REWARDS),
        valid=torch.ones(8, dtype=torch.bool), formatted=torch.ones(8, dtype=torch.bool),
    )
    return scored.with_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]))


def _pruned(cfg):
    scored = _advantaged()
    batch = to_policy_batch(scored, range(8), pad_token_id=0)
    outcome, _ = prune(cfg, scored, batch, step=3, geometry=step_geometry(cfg, 1, 4))
    return scored, outcome


def test_due_every_kth_step_and_never_for_zero():
    assert [s for s in range(1, 7) if due(2, s)] == [2, 4, 6]
    assert not any(due(0, s) for s in range(1, 7))


def test_records_carry_the_pruners_decision_row_by_row(tmp_path):
    # Breakage caught: records out of step with the keep mask (a shuffled or another rank's mask), the
    # weighted advantage logged instead of the advantage, or the DP rank's row count not checked.
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")  # importance-weighted MDAP, reference semantics, J < 0.2
    scored, outcome = _pruned(cfg)
    records = rollout_records(3, scored, outcome, dp_rank=0)
    assert [r["kept"] for r in records] == outcome.keep.tolist()
    # rollout 1 repeats rollout 0 (J = 1); rollouts 2 and 3 share no token (J = 0); in group 1, [20, 21, 22]
    # holds all of the seed [20, 21] (J = 2/3), [30, 31] and [40] none
    assert [r["phase1_kept"] for r in records] == [True, False, True, True, True, False, True, True]
    assert [r["advantage"] for r in records] == [1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    assert [r["weight"] for r in records] == pytest.approx(outcome.weights.tolist())
    assert records[0]["weight"] > records[2]["weight"]  # the seed of a pruned bucket is weighted up
    assert records[5] | {"weight": None} == {
        "step": 3, "dp_rank": 0, "group": 1, "prompt": "q1", "response": "text 5", "response_token_ids": [20, 21, 22],
        "finish_reason": "stop", "reward": 0.0, "accuracy": 0.0, "valid": True, "advantage": 0.0, "weight": None,
        "phase1_kept": False, "kept": False,
    }
    with pytest.raises(ValueError, match="holds 0 rollouts of DP rank 1, the rank scored 8"):
        rollout_records(3, scored, outcome, dp_rank=1)


def test_a_dp_rank_logs_its_own_slice_of_the_gathered_decision():
    # Breakage caught: rank 1 logging rank 0's part of the global masks or weights (the first rows
    # instead of the rows it owns), or a step where no selection rule ran logged as chosen.
    from fastrl.distributed.dp_pruning import GlobalPruningInputs
    from fastrl.training.prune_phase import PruneOutcome

    owners = torch.tensor([0] * 8 + [1] * 8)
    selection = torch.tensor([True] * 8 + [True, False, True, False, False, True, True, False])
    keep = torch.tensor([True] * 8 + [True, True, True, False, False, True, True, False])
    weights = torch.arange(16, dtype=torch.float32)
    inputs = GlobalPruningInputs(
        dp_size=2, group_ids=torch.arange(16) // 4, advantages=torch.zeros(16), lengths=torch.ones(16, dtype=torch.long),
        response_lengths=torch.ones(16, dtype=torch.long), owners=owners, local_index=torch.arange(16) % 8,
        responses=None, signatures=None,
    )
    outcome = PruneOutcome(inputs=inputs, keep=keep, kept_per_group={}, rule_keep=selection, weights=weights)
    records = rollout_records(5, _advantaged(), outcome, dp_rank=1)
    assert [r["phase1_kept"] for r in records] == selection[8:].tolist()
    assert [r["kept"] for r in records] == keep[8:].tolist()
    assert [r["weight"] for r in records] == list(range(8, 16))
    short = rollout_records(5, _advantaged(), dataclasses.replace(outcome, rule_keep=None), dp_rank=1)
    assert [r["phase1_kept"] for r in short] == [None] * 8  # a short DAPO batch: no rule decided


def test_written_records_read_back_and_a_resumed_run_sets_aside_the_steps_it_trains_again(tmp_path):
    # Breakage caught: a resumed run's repeated step counted twice, or ranks read out of order.
    from fastrl.training.metrics import supersede_records_after

    first = [{"step": s, "dp_rank": 0, "i": i} for s in (1, 2) for i in range(2)]
    path = write_rollouts(tmp_path, 0, first, pruning={"method": "fastrl"})
    assert path == rollouts_path(tmp_path, 0)
    assert supersede_records_after(path, 1)[0] == 2  # what the loop does on resuming from step 1
    write_rollouts(tmp_path, 0, [{"step": 2, "dp_rank": 0, "i": 9}], pruning={"method": "fastrl"})
    write_rollouts(tmp_path, 10, [{"step": 1, "dp_rank": 10, "i": 0}], pruning={"method": "fastrl"})
    write_rollouts(tmp_path, 2, [{"step": 1, "dp_rank": 2, "i": 0}], pruning={"method": "fastrl"})
    got = [(r["step"], r["dp_rank"], r["i"]) for r in read_rollouts(tmp_path)]
    assert got == [(1, 0, 0), (1, 0, 1), (2, 0, 9), (1, 2, 0), (1, 10, 0)]
    assert read_pruning(tmp_path) == {"method": "fastrl"}
    with open(tmp_path / "rollouts" / "dp2.jsonl", "a") as f:
        f.write('{"step": 3, "dp_ra')
    with pytest.raises(ValueError, match=r"dp2.jsonl:2: not a JSON line"):
        read_rollouts(tmp_path)
    with pytest.raises(FileNotFoundError, match="logging.rollouts_every"):
        read_rollouts(tmp_path / "none")


def test_the_analysis_recomputes_the_pruners_buckets_similarities_and_decisions(tmp_path):
    # Breakage caught: buckets, seeds or similarities computed otherwise than the pruner does (the
    # logged decisions would then disagree), and a log whose decisions are not the pruner's.
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    scored, outcome = _pruned(cfg)
    write_rollouts(tmp_path, 0, rollout_records(3, scored, outcome, dp_rank=0), pruning=dataclasses.asdict(cfg.pruning))
    report = analyze(tmp_path)
    assert report["decisions_checked"]
    # buckets: {0, 1} (A = 1), {2, 3} (A = -1), {4..7} (A = 0); members: 1, 3, and 5, 6, 7
    assert (report["buckets"], report["bucket_sizes"], report["members"]) == (3, {2: 2, 4: 1}, 5)
    assert sorted(m.jaccard for m in report["_members"]) == pytest.approx([0.0, 0.0, 0.0, 2 / 3, 1.0])
    assert report["members_zero_advantage"] == 3 and report["at_or_above_threshold"] == pytest.approx(2 / 5)
    assert report["phase1_kept_fraction"] == 6 / 8
    text = markdown(report, pairs=2)
    assert "J = 1.000" in text and "seed:   'text 0'" in text and "member: 'text 1'" in text
    records = [json.loads(line) for line in (tmp_path / "rollouts" / "dp0.jsonl").read_text().splitlines()]
    records[6]["phase1_kept"] = False  # [30, 31] shares nothing with its seed: the rule keeps it
    (tmp_path / "rollouts" / "dp0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=r"step 3, group 1: logged phase1_kept=False but J\(member, seed\)=0.0000"):
        analyze(tmp_path)
    report = analyze(tmp_path, threshold=0.5)  # another threshold than the run's: numbers, no check
    assert not report["decisions_checked"] and report["at_or_above_threshold"] == pytest.approx(2 / 5)
    # a step where no rule ran (a short DAPO batch: every rollout trains) is not checked
    for r in records:
        r["phase1_kept"] = None
    (tmp_path / "rollouts" / "dp0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = analyze(tmp_path)
    assert report["decisions_checked"] and report["rollouts_without_rule"] == 8


def test_pruning_apply_false_logs_the_rules_choice_although_every_rollout_trains(tmp_path):
    # Breakage caught: the ARS-only ablation (pruning.apply=false) logging its keep-all mask as the
    # selection, which the analysis would then report as a kept fraction of 1.
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    cfg = dataclasses.replace(cfg, pruning=dataclasses.replace(cfg.pruning, apply=False))
    scored, outcome = _pruned(cfg)
    records = rollout_records(3, scored, outcome, dp_rank=0)
    assert all(r["kept"] for r in records)
    assert [r["phase1_kept"] for r in records] == [True, False, True, True, True, False, True, True]
    write_rollouts(tmp_path, 0, records, pruning=dataclasses.asdict(cfg.pruning))
    assert analyze(tmp_path)["decisions_checked"] and analyze(tmp_path)["phase1_kept_fraction"] == 6 / 8
