"""The arithmetic word-problem task of the SmolLM2 recipes (recipes/word_arith.py): embedded splits,
generator, grader and reward; and the three recipes that use it."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from recipes import get_recipe
from recipes.word_arith import (
    CONTAINERS,
    DATA_DIR,
    ITEMS,
    KINDS,
    LARGE_MIX,
    MIX,
    NAMES,
    SPLITS,
    TEST300,
    grade,
    kind_problems,
    large_test_records,
    parse_answer,
    problems,
    split_records,
    word_arith_reward,
)


def _committed(split: str) -> list[dict]:
    return [json.loads(line) for line in (DATA_DIR / f"word_arith_{split}.jsonl").read_text().splitlines()]


def test_committed_splits_are_the_generator_output_and_disjoint():
    generated = split_records()
    keys = {}
    for split, size in SPLITS.items():
        rows = _committed(split)
        assert rows == generated[split] and abs(len(rows) - size) <= len(MIX)  # rounded per kind
        keys[split] = {r["problem"] for r in rows}
    assert not (keys["train"] & keys["val"]) and not (keys["train"] & keys["test"]) and not (keys["val"] & keys["test"])
    mixes = [sorted({r["kind"] for r in generated[split]}) for split in SPLITS]  # stratified: every kind in every split
    assert all(m == sorted(MIX) for m in mixes)


def test_large_test_split_is_disjoint_by_construction_and_keeps_the_300():
    """The committed larger test split is the generator's output; its first 300 rows are the test
    split unchanged (subset test300); its 1,500 new problems share no text, no (kind, numbers) and
    no (story, numbers) key with each other or with any row of train / val / test.

    catches: the draws not excluding the splits' keys (``exclude`` ignored in ``kind_problems``: new
    problems coincide with training ones), the family map dropped (an add_twenties problem with an
    add training problem's numbers), or the 300 reordered."""
    large = _committed("test_large")
    assert large == large_test_records()
    assert large[:300] == [{**r, "subset": TEST300} for r in _committed("test")]
    new = [r for r in large if r["subset"] == "new"]
    assert len(new) == sum(LARGE_MIX.values()) >= 1500 and len(large) == 300 + len(new)
    old = [r for split in SPLITS for r in _committed(split)]
    def kind_numbers(r):
        return r["kind"], tuple(int(x) for x in re.findall(r"\d+", r["problem"]))

    def story_numbers(r):  # the text with names, items, containers and numbers blanked, and the numbers
        words = "|".join((*NAMES, *ITEMS, *CONTAINERS, "He", "She"))
        return re.sub(rf"\b({words})\b", "_", re.sub(r"\d+", "#", r["problem"])), kind_numbers(r)[1]

    for field in (lambda r: r["problem"], kind_numbers, story_numbers):
        new_keys = [field(r) for r in new]
        assert len(set(new_keys)) == len(new_keys)
        assert not set(new_keys) & {field(r) for r in old}
    assert {r["kind"] for r in new} == set(LARGE_MIX)
    for r in new:  # the numbers as written, with the kind's rule, give the answer
        assert int(r["answer"]) == RULES[r["kind"]](kind_numbers(r)[1])


RULES = {"add": lambda n: n[0] + n[1], "sub": lambda n: n[0] - n[1], "mul": lambda n: n[0] * n[1],
         "add_add": sum, "add_sub": lambda n: n[0] + n[1] - n[2], "mul_add": lambda n: n[0] * n[1] + n[2],
         "add_sub_add": lambda n: n[0] + n[1] - n[2] + n[3], "add_small": sum, "add_teen": sum,
         "sub_small": lambda n: n[0] - n[1], "mul_small": lambda n: n[0] * n[1], "add_add_small": sum,
         "mul_wide": lambda n: n[0] * n[1], "mul_add_wide": lambda n: n[0] * n[1] + n[2], "add_twenties": sum,
         "sub_teen": lambda n: n[0] - n[1], "add_no_carry": sum, "add2_no_carry": sum,
         "sub_no_borrow": lambda n: n[0] - n[1], "add_hundred": sum, "mul_ten": lambda n: n[0] * n[1], "add_round": sum}


def test_generator_is_seeded_and_answers_are_right():
    a, b = problems(300, seed=5), problems(300, seed=5)
    assert a == b and a != problems(300, seed=6)
    assert {p.kind for p in a} == set(MIX) and set(MIX) <= set(KINDS) and set(RULES) == set(KINDS)
    every_kind = a + [p for kind in KINDS for p in kind_problems(kind, 30, seed=5)]
    for p in every_kind:
        n = p.numbers
        assert p.answer == RULES[p.kind](n) and p.answer >= 0 and all(str(x) in p.text for x in n)


def test_a_kind_with_too_few_distinct_problems_is_refused_by_name():
    # add_small: 8 x 8 one-digit pairs; asking for more must stop with a clear error, not loop forever
    assert len(kind_problems("add_small", 64)) == 64
    with pytest.raises(ValueError, match="kind 'add_small' has only 64 distinct problems, 65 were asked for"):
        kind_problems("add_small", 65)


@pytest.mark.parametrize("response, answer, outcome", [
    ("7 + 5 = 12. The answer is 12.", "12", "correct"),
    ("The answer is 13.", "12", "wrong"),
    ("Answer: 1,200", "1200", "correct"),
    ("first 3, then 4. So the answer is: **7**", "7", "correct"),
    ("We get \\boxed{9}", "9", "correct"),
    ("She has 5 + 4 apples.\nThat makes 9 apples", "9", "correct"),
    ("The answer is 12, not 10.\nDone.", "12", "correct"),  # the answer phrase wins over a later number
    ("She has some apples left.", "4", "invalid"),
    ("", "4", "invalid"),
    ("The answer is twelve.", "12", "invalid"),
])
def test_grader(response, answer, outcome):
    assert grade(response, answer) == outcome


def test_reward_tells_invalid_from_wrong_in_format_only():
    right, wrong, invalid = (word_arith_reward(r, "12") for r in ("The answer is 12.", "The answer is 11.", "no idea"))
    assert (right.overall, right.accuracy, right.format) == (1.0, 1.0, 1.0)
    assert (wrong.overall, wrong.accuracy, wrong.format) == (0.0, 0.0, 1.0)
    assert (invalid.overall, invalid.accuracy, invalid.format) == (0.0, 0.0, 0.0)
    assert right.valid and wrong.valid and invalid.valid  # a response that fails is not a grader that fails
    assert parse_answer("-3 degrees, the answer is -3") == -3


def test_the_recipes_differ_only_in_pruning():
    names = ["smollm2_135m_grpo_wordarith_vllm_cpu", "smollm2_135m_fastrl_grpo_wordarith_vllm_cpu",
             "smollm2_135m_matched_random_grpo_wordarith_vllm_cpu", "smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu",
             "smollm2_135m_stratified_grpo_wordarith_vllm_cpu"]
    grpo, fast, peer, paper, strat = (get_recipe(n) for n in names)
    assert (paper.pruning.method, paper.pruning.weighting) == ("fastrl", "none")
    assert (strat.pruning.method, strat.pruning.weighting) == ("advantage_only", "inverse_keep")
    assert dataclasses.replace(paper, recipe=fast.recipe, pruning=dataclasses.replace(paper.pruning, method="fastrl_unbiased")) == fast
    assert grpo.model.hf_path == "packaged:smollm2-135m-instruct" and grpo.rollout.engine == "vllm"
    assert grpo.rollout.verify_refit_every > 0 and all(Path(p).is_file() for p in (grpo.data.train_path, grpo.data.val_path))
    assert (grpo.pruning.method, fast.pruning.method, peer.pruning.method) == ("none", "fastrl_unbiased", "matched_random")
    assert peer.pruning.weighting == "inverse_keep" and fast.adaptive_sampling.enabled and peer.adaptive_sampling.enabled
    for other in (fast, peer, paper, strat):
        same = dataclasses.replace(other, recipe=grpo.recipe, pruning=grpo.pruning, adaptive_sampling=grpo.adaptive_sampling)
        assert same == grpo


def test_the_recipes_reward_loads_as_a_custom_reward_file():
    from fastrl.rewards.registry import load_reward

    reward = load_reward(get_recipe("smollm2_135m_fastrl_grpo_wordarith_vllm_cpu").reward.name)
    assert reward("The answer is 3.", "3").overall == 1.0 and reward("none", "3").format == 0.0
