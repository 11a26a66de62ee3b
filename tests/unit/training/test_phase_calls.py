"""Where the trainer's phases call the algorithms (issue 46): the importance weights of ``prune()``
with the response lengths, DAPO's cap on informative groups, invalid rewards left out of the
advantages, and group ids that are global over the data-parallel ranks. Each test names the
deliberate break it catches (tools/mutants.toml lists them all)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from fastrl.algorithms.prune_weights import inverse_keep_weights
from fastrl.config import AlgorithmConfig
from fastrl.data import Record
from fastrl.rewards.result import RewardResult
from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
from fastrl.training.geometry import step_geometry
from fastrl.training.prompting import PromptBatch, PromptSource
from fastrl.training.prune_phase import prune
from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
from fastrl.training.scoring import compute_advantages, dynamic_sampling, score
from recipes.registry import get_recipe


def _rollouts(responses: list[list[int]], prompt_index: list[int]) -> Rollouts:
    prompts = sorted(set(prompt_index))
    return Rollouts(
        prompts=[RolloutPrompt(text=f"q{p}") for p in prompts],
        prompt_inputs=[PromptInputs(input_ids=torch.tensor([1, 2])) for _ in prompts],
        n_per_prompt=[prompt_index.count(p) for p in prompts], prompt_index=list(prompt_index),
        response_token_ids=[torch.tensor(r) for r in responses], logprobs=[-torch.ones(len(r)) for r in responses],
        finish_reasons=["stop"] * len(responses), response_texts=[f"text {i}" for i in range(len(responses))],
    )


def _scored(group_ids: list[int], accuracy: list[float], responses: list[list[int]] | None = None) -> ScoredRollouts:
    """Rollouts of the groups ``group_ids`` (consecutive rows per group), reward = accuracy."""
    responses = responses or [[5 + i, 6 + i] for i in range(len(group_ids))]
    index = [sorted(set(group_ids)).index(g) for g in group_ids]
    acc = torch.tensor(accuracy)
    n = len(group_ids)
    return ScoredRollouts(_rollouts(responses, index), group_ids=torch.tensor(group_ids), rewards=acc.clone(),
                          accuracy=acc, valid=torch.ones(n, dtype=torch.bool), formatted=torch.ones(n, dtype=torch.bool))


# ---- prune(): the importance weights of the default recipe ---------------------------------------


def test_prune_weights_are_inverse_keep_weights_with_the_response_lengths():
    """catches: ``prune()`` computing ``fastrl_unbiased``'s weights without the response lengths
    (``lengths=None`` in ``fastrl/training/prune_phase.py``; issue 46, break 2), or with another
    length (prompt + response)."""
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    assert cfg.pruning.method == "fastrl_unbiased"  # the default recipe's weighting
    # group 0: +1 bucket of two copies (one pruned), -1 bucket of two different responses (both kept);
    # group 1: one 0-advantage bucket of four, [20, 21, 22] a near copy of the seed [20, 21]
    responses = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, 10, 11], [9, 10, 11], [12, 13],
                 [20, 21], [20, 21, 22], [30, 31, 32, 33, 34], [40]]
    scored = _scored([0] * 4 + [1] * 4, [1, 1, 0, 0, 0, 0, 0, 0], responses)
    advantaged = scored.with_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]))
    batch = to_policy_batch(advantaged, range(8), pad_token_id=0)
    outcome, metrics = prune(cfg, advantaged, batch, step=1, geometry=step_geometry(cfg, 1, 4))
    keep = outcome.keep
    assert keep.tolist() == [True, False, True, True, True, False, True, True]
    lengths = torch.tensor([len(r) for r in responses])
    expected = inverse_keep_weights(advantaged.advantages, advantaged.group_ids, keep, lengths=lengths,
                                    semantics=cfg.pruning.semantics, adv_tolerance=cfg.pruning.adv_tolerance)
    torch.testing.assert_close(outcome.weights, expected)
    # the lengths matter here: without them (or with prompt + response) the weights differ
    for other in (None, lengths + 2):
        unlike = inverse_keep_weights(advantaged.advantages, advantaged.group_ids, keep, lengths=other)
        assert (unlike - expected).abs().max() > 1e-3
    assert metrics["prune/weight_max"] == pytest.approx(float(expected.max()))


def test_prune_outcome_is_flat_with_one_count_of_the_response_lengths():
    """The outcome holds what the rule saw, its selection and its weights side by side (no nested
    results), and the response lengths are one field, counted once from the rollouts.

    catches: ``prune()`` handing the pruning inputs the token loads (prompt + response) as the
    response lengths (``response_lengths=batch.lengths`` in ``fastrl/training/prune_phase.py``),
    and ``LocalPruningInputs`` accepting responses whose lengths disagree with ``response_lengths``."""
    from fastrl.distributed.dp_pruning import LocalPruningInputs

    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    responses = [[5, 6, 7], [5, 6, 7], [9], [12, 13], [20, 21], [30, 31, 32, 33], [40], [41, 42]]
    scored = _scored([0] * 4 + [1] * 4, [1, 1, 0, 0, 1, 0, 0, 0], responses)
    advantaged = scored.with_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0, 1.5, -0.5, -0.5, -0.5]))
    batch = to_policy_batch(advantaged, range(8), pad_token_id=0)
    outcome, metrics = prune(cfg, advantaged, batch, step=1, geometry=step_geometry(cfg, 1, 4))
    lengths = torch.tensor([len(r) for r in responses])
    assert torch.equal(outcome.response_lengths, lengths) and outcome.response_lengths is outcome.inputs.response_lengths
    assert not torch.equal(batch.lengths, lengths)  # the token loads count the prompt too
    assert outcome.keep.tolist() == [True, False, True, True, True, True, True, True]  # the copy of row 0 pruned
    assert outcome.indices.tolist() == [0, 2, 3, 4, 5, 6, 7] and outcome.kept_per_group == {0: 3, 1: 4}
    assert metrics["prune/kept_response_length_mean"] == pytest.approx(float(lengths[outcome.keep].float().mean()))
    assert not hasattr(outcome, "dp") and not hasattr(outcome, "result")
    with pytest.raises(ValueError, match="response 1 has 3 tokens, response_lengths says 2"):
        LocalPruningInputs(group_ids=torch.tensor([0, 0]), advantages=torch.zeros(2), lengths=torch.tensor([5, 6]),
                           response_lengths=torch.tensor([3, 2]), responses=[torch.tensor(r) for r in responses[:2]])


# ---- dynamic_sampling(): no more informative groups than the step's prompts ----------------------


def test_dynamic_sampling_trains_on_as_many_groups_as_prompts_when_a_round_overshoots():
    """catches: DAPO training on more informative groups than its target (the ``[:target]`` cap in
    ``fastrl/training/scoring.py`` removed; issue 46, break 3)."""
    first = _scored([0, 0, 1, 1], [1, 0, 1, 1])  # group 0 informative, group 1 all right
    extra = _scored([2, 2, 3, 3, 4, 4], [0, 1, 1, 0, 0, 1])  # three informative groups: one too many
    rounds: list[int] = []

    def more(round_index: int):
        rounds.append(round_index)
        return extra, 3

    alg = AlgorithmConfig(dynamic_sampling=True, max_dynamic_sampling_rounds=3)
    kept, metrics = dynamic_sampling(first, alg=alg, step=1, more=more)
    assert rounds == [1]  # one extra round reached the target
    assert kept.group_ids.tolist() == [0, 0, 2, 2]  # the target (2 groups), first collected first
    assert kept.response_lengths.tolist() == [2, 2, 2, 2]
    assert metrics["dapo/extra_rounds"] == 1.0
    assert metrics["dapo/informative_group_fraction"] == pytest.approx(4 / 5)
    assert metrics["rollout/generated_rows"] == 10.0


# ---- score(): invalid is not wrong -----------------------------------------------------------------


class _StubScorer:
    """Grades the first three responses 1, 1, 0 and times out on the last."""

    def __init__(self) -> None:
        self.last_stats = types.SimpleNamespace(as_metrics=lambda: {"reward/num_invalid": 1.0})

    def score(self, texts, truths):
        assert len(texts) == len(truths) == 4
        ok = [RewardResult(overall=v, format=0.0, accuracy=v) for v in (1.0, 1.0, 0.0)]
        return ok + [RewardResult.invalid("timeout after 10s", timed_out=True)]


def test_a_timed_out_reward_is_left_out_not_scored_as_wrong():
    """catches: invalid rewards (grader timeouts) treated as wrong answers (``valid = [True ...]``
    in ``fastrl/training/scoring.py``; issue 46, break 4): the timed-out row would get advantage
    -0.87 and reward/mean would move from 0.667 to 0.5."""
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, overlong_shaping=False))
    prompts = PromptBatch([(0, Record(question_id=7, problem="q", answer="a"))], epochs_completed=0)
    scored, metrics = score(_StubScorer(), prompts, _rollouts([[1], [2], [3], [4]], [0] * 4), cfg)
    assert scored.valid.tolist() == [True, True, True, False]
    assert metrics["reward/num_invalid"] == 1.0
    advantaged, m = compute_advantages(scored, cfg.algorithm, step=1)
    assert m["reward/mean"] == pytest.approx(2 / 3) and m["accuracy/mean"] == pytest.approx(2 / 3)
    assert advantaged.advantages[3] == 0.0  # left out: no gradient from the timed-out row
    assert advantaged.advantages[:3].sum().abs() < 1e-5  # the three graded rows are their own group


# ---- prompting: group ids are global over the DP ranks ---------------------------------------------


class _Sampler:
    def next_batch(self, count):
        return types.SimpleNamespace(indices=list(range(count)), epochs_completed=0)


@pytest.mark.parametrize("round_index", [0, 2])
def test_dp_ranks_slice_one_global_batch_with_global_group_ids(round_index):
    """catches: per-rank local group ids under DP (``fastrl/training/prompting.py``; issue 46,
    break 6): two ranks would both hold groups 0..k-1, so DP-global pruning merges other prompts'
    buckets and ``prune/f1`` doubles."""
    records = [Record(question_id=i, problem=f"q{i}", answer="a") for i in range(6)]
    source = PromptSource(records, template="{{ problem }}", tokenizer=None, image_size=None)
    single = source.next_batch(_Sampler(), 6, dp_size=1, dp_rank=0, round_index=round_index)
    ranks = [source.next_batch(_Sampler(), 6, dp_size=2, dp_rank=r, round_index=round_index) for r in (0, 1)]
    assert sorted(g for b in ranks for g, _ in b.items) == [g for g, _ in single.items]
    assert [g for g, _ in single.items] == [6 * round_index + i for i in range(6)]
    for b in ranks:  # each group id goes with its own record, as on one rank
        assert all(dict(single.items)[g] is rec for g, rec in b.items)
