"""The text reasoning task of the SmolLM2-135M recipes: arithmetic word problems of one to three steps.

Each problem is a short story about a person and a count of things (``Mia has 7 marbles. She buys
5 more marbles and then gives 3 to a friend. How many marbles does Mia have now?``) whose answer is
a whole number. The steps are additions, subtractions and multiplications of small numbers;
:data:`KINDS` lists the story shapes and how many steps each takes. SmolLM2-135M-Instruct solves
some of them and not others (docs/results.md, "A real pretrained model"), which leaves RL a signal
in most groups.

Data (embedded, ``recipes/data/word_arith_{train,val,test}.jsonl``; ``python -m recipes.word_arith``
rewrites them identically): :func:`split_records` draws each kind's distinct problems from a seeded
stream and cuts them into the splits in proportion, so every split has the same mix of kinds and
a problem (its kind and numbers) appears in one split only. Train about 600, validation about 150,
test about 300 (rounded per kind): a 90-minute run of the recipes sees about 160 training prompts,
and the one-digit kinds hold under a hundred distinct problems each. The larger held-out test split
``word_arith_test_large.jsonl`` (:func:`large_test_records`, 1,800 problems) holds the 300 test
problems first, unchanged (subset ``test300``), then 1,500 new ones whose story and numbers
(:func:`problem_key`) no problem of any split has.

Prompt (template ``word_arith`` in ``recipes/templates/``): the story, then the instruction to end
with ``The answer is N.``

Grader (:func:`grade`): the answer is the integer of the last ``answer is N`` / ``Answer: N``
phrase, else of a last ``\\boxed{N}``, else the last integer of the last line -- no number anywhere is
``invalid`` (cannot be parsed), which is reported apart from ``wrong``. Reward
(:func:`word_arith_reward`, used as ``recipes/word_arith.py:word_arith_reward``): 1 for a correct
answer, 0 for a wrong one and for an invalid one; ``format`` is 1 when an answer could be parsed
(0 when invalid), ``accuracy`` 1 when correct. An invalid answer is a response that fails, not a
grader that fails: it gets reward 0 (so that RL can teach the format), whereas
``RewardResult.invalid`` would take the rollout out of the advantage statistics.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Callable, Literal, NamedTuple

DATA_DIR = Path(__file__).resolve().parent / "data"
SEED = 31
SPLITS = {"train": 600, "val": 150, "test": 300}

NAMES = ("Mia", "Tom", "Anna", "Ben", "Lily", "Sam", "Zoe", "Max", "Emma", "Leo", "Nora", "Jack", "Ava", "Noah",
         "Ella", "Luke")
PRONOUN = {"Mia": "She", "Anna": "She", "Lily": "She", "Zoe": "She", "Emma": "She", "Nora": "She", "Ava": "She",
           "Ella": "She"}
ITEMS = ("apples", "pencils", "stickers", "cookies", "marbles", "books", "stamps", "shells", "cards", "balloons",
         "coins", "flowers")
CONTAINERS = ("boxes", "bags", "jars", "baskets")

Outcome = Literal["correct", "wrong", "invalid"]


class Problem(NamedTuple):  # not a dataclass: the reward loader imports this file without registering it in sys.modules
    kind: str
    steps: int
    numbers: tuple[int, ...]
    text: str
    answer: int


def _he(name: str) -> str:
    return PRONOUN.get(name, "He")


def _add(r: random.Random, n: str, it: str) -> tuple[tuple[int, ...], str, int]:
    a, b = r.randint(2, 30), r.randint(2, 30)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gets {b} more {it}. How many {it} does {n} have now?", a + b


def _sub(r, n, it):
    a = r.randint(8, 50)
    b = r.randint(2, a - 2)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gives {b} {it} to a friend. How many {it} does {n} have left?", a - b


def _mul(r, n, it):
    a, b, box = r.randint(2, 12), r.randint(2, 25), r.choice(CONTAINERS)
    return (a, b), f"{n} has {a} {box} with {b} {it} in each. How many {it} does {n} have?", a * b


def _add_add(r, n, it):
    a, b, c = r.randint(2, 15), r.randint(2, 15), r.randint(2, 15)
    return (a, b, c), (f"{n} has {a} {it}. {_he(n)} buys {b} more {it} and then finds {c} more. "
                       f"How many {it} does {n} have now?"), a + b + c


def _add_sub(r, n, it):
    a, b = r.randint(2, 15), r.randint(2, 15)
    c = r.randint(2, a + b - 2)
    return (a, b, c), (f"{n} has {a} {it}. {_he(n)} buys {b} more {it} and then gives {c} to a friend. "
                       f"How many {it} does {n} have now?"), a + b - c


def _mul_add(r, n, it):
    a, b, c, box = r.randint(2, 6), r.randint(2, 6), r.randint(2, 12), r.choice(CONTAINERS)
    return (a, b, c), (f"{n} has {a} {box} with {b} {it} in each, and {c} more {it} on the table. "
                       f"How many {it} does {n} have in all?"), a * b + c


def _add_sub_add(r, n, it):
    a, b = r.randint(2, 12), r.randint(2, 12)
    c = r.randint(2, a + b - 2)
    d = r.randint(2, 12)
    return (a, b, c, d), (f"{n} has {a} {it}. {_he(n)} buys {b} more {it}, gives {c} to a friend, "
                          f"and then finds {d} more. How many {it} does {n} have now?"), a + b - c + d


def _add_small(r, n, it):
    a, b = r.randint(2, 9), r.randint(2, 9)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gets {b} more {it}. How many {it} does {n} have now?", a + b


def _add_teen(r, n, it):
    a, b = r.randint(10, 20), r.randint(2, 9)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gets {b} more {it}. How many {it} does {n} have now?", a + b


def _sub_small(r, n, it):
    a = r.randint(5, 19)
    b = r.randint(2, min(9, a - 2))
    return (a, b), f"{n} has {a} {it}. {_he(n)} gives {b} {it} to a friend. How many {it} does {n} have left?", a - b


def _mul_small(r, n, it):
    a, b, box = r.randint(2, 5), r.randint(2, 10), r.choice(CONTAINERS)
    return (a, b), f"{n} has {a} {box} with {b} {it} in each. How many {it} does {n} have?", a * b


def _mul_wide(r, n, it):
    a, b, box = r.randint(2, 12), r.randint(26, 50), r.choice(CONTAINERS)
    return (a, b), f"{n} has {a} {box} with {b} {it} in each. How many {it} does {n} have?", a * b


def _mul_add_wide(r, n, it):
    a, b, c, box = r.randint(2, 6), r.randint(2, 6), r.randint(13, 30), r.choice(CONTAINERS)
    return (a, b, c), (f"{n} has {a} {box} with {b} {it} in each, and {c} more {it} on the table. "
                       f"How many {it} does {n} have in all?"), a * b + c


def _add_twenties(r, n, it):
    a, b = r.randint(21, 40), r.randint(2, 9)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gets {b} more {it}. How many {it} does {n} have now?", a + b


def _sub_teen(r, n, it):
    a, b = r.randint(20, 39), r.randint(2, 9)
    return (a, b), f"{n} has {a} {it}. {_he(n)} gives {b} {it} to a friend. How many {it} does {n} have left?", a - b


def _gets(n, it, a, b):
    return f"{n} has {a} {it}. {_he(n)} gets {b} more {it}. How many {it} does {n} have now?"


def _gives(n, it, a, b):
    return f"{n} has {a} {it}. {_he(n)} gives {b} {it} to a friend. How many {it} does {n} have left?"


def _add_no_carry(r, n, it):
    a = r.randint(11, 89)
    while a % 10 in (0, 9):
        a = r.randint(11, 89)
    b = r.randint(1, 9 - a % 10)
    return (a, b), _gets(n, it, a, b), a + b


def _add2_no_carry(r, n, it):
    a1, a0 = r.randint(1, 8), r.randint(0, 8)
    b1, b0 = r.randint(1, 9 - a1), r.randint(1, 9 - a0)
    a, b = 10 * a1 + a0, 10 * b1 + b0
    return (a, b), _gets(n, it, a, b), a + b


def _sub_no_borrow(r, n, it):
    a = r.randint(12, 99)
    while a % 10 < 2:
        a = r.randint(12, 99)
    b = r.randint(1, a % 10)
    return (a, b), _gives(n, it, a, b), a - b


def _add_hundred(r, n, it):
    a, b = 100 * r.randint(1, 9), r.randint(2, 60)
    return (a, b), _gets(n, it, a, b), a + b


def _mul_ten(r, n, it):
    a, box = r.randint(2, 40), r.choice(CONTAINERS)
    return (a, 10), f"{n} has {a} {box} with 10 {it} in each. How many {it} does {n} have?", a * 10


def _add_round(r, n, it):
    a, b = r.randint(2, 40), 10 * r.randint(1, 5)
    return (a, b), _gets(n, it, a, b), a + b


def _add_add_small(r, n, it):
    a, b, c = r.randint(2, 9), r.randint(2, 9), r.randint(2, 9)
    return (a, b, c), (f"{n} has {a} {it}. {_he(n)} buys {b} more {it} and then finds {c} more. "
                       f"How many {it} does {n} have now?"), a + b + c


#: every story shape: kind -> (steps, generator); each generator draws its numbers from fixed ranges
#: (``*_small`` / ``*_teen``: one-digit operands, the others up to 50)
KINDS: dict[str, tuple[int, Callable]] = {
    "add": (1, _add),
    "sub": (1, _sub),
    "mul": (1, _mul),
    "add_add": (2, _add_add),
    "add_sub": (2, _add_sub),
    "mul_add": (2, _mul_add),
    "add_sub_add": (3, _add_sub_add),
    "add_small": (1, _add_small),
    "add_teen": (1, _add_teen),
    "sub_small": (1, _sub_small),
    "mul_small": (1, _mul_small),
    "add_add_small": (2, _add_add_small),
    "mul_wide": (1, _mul_wide),
    "mul_add_wide": (2, _mul_add_wide),
    "add_twenties": (1, _add_twenties),
    "sub_teen": (1, _sub_teen),
    "add_no_carry": (1, _add_no_carry),
    "add2_no_carry": (1, _add2_no_carry),
    "sub_no_borrow": (1, _sub_no_borrow),
    "add_hundred": (1, _add_hundred),
    "mul_ten": (1, _mul_ten),
    "add_round": (1, _add_round),
}

#: kinds that tell the same story (one template): the same numbers make the same problem whatever
#: the kind's own range; a problem's identity is (its family, its numbers) (:func:`problem_key`)
FAMILY: dict[str, str] = {
    "add_small": "add", "add_teen": "add", "add_twenties": "add", "sub_small": "sub", "sub_teen": "sub",
    "mul_small": "mul", "mul_wide": "mul", "add_add_small": "add_add", "mul_add_wide": "mul_add",
    "add_no_carry": "add", "add2_no_carry": "add", "sub_no_borrow": "sub", "add_hundred": "add", "mul_ten": "mul",
    "add_round": "add",
}

#: the kinds the splits hold and their weights in the mix, chosen from the probe of every kind
#: (``recipes/word_arith_baseline.py --probe 20``, problems drawn with another seed than the splits':
#: greedy accuracy add_teen 50%, mul 30%, mul_add 15%, add 10%, add_sub 5%, sub_small 5%, and 0% for
#: sub, add_add and add_sub_add; docs/results.md) so that the base model starts near 15%: kinds it
#: solves sometimes, none it never solves, within each kind's count of distinct problems
MIX: dict[str, int] = {"mul": 3, "mul_add": 3, "add": 4, "add_sub": 3, "add_teen": 1, "sub_small": 1}


#: the larger held-out test split (``recipes/data/word_arith_test_large.jsonl``): the 300 problems of
#: ``word_arith_test.jsonl`` first, unchanged (the named subset ``test300``: ``data.test_size=300``
#: evaluates exactly them), then LARGE_MIX's 1,500 problems (subset ``new``), drawn with LARGE_SEED
#: in this order (the narrow kinds first: a kind's draws exclude the problems of the kinds of its
#: story drawn before it). Per kind: the training mix's kinds as far as their distinct problems reach
#: (add_teen, sub_small, mul and mul_add are nearly used up by the three splits), and other number
#: ranges of the same stories for the rest (numbers the training split never holds, so the new subset
#: also asks how far the training generalizes), chosen by the base model's greedy accuracy on a probe
#: of another seed (``recipes/word_arith_baseline.py --probe 20``; bench/results/word_arith/
#: probe_2026-12-07.json: groups of ten 25%, add a round ten 20%, two-digit + digit without carry 10%)
#: and on a first draw of this split (base_accuracy_large_first_draw_2026-12-07.json: wider groups 9%,
#: teen subtraction 7%, add-then-subtract 3%; twenties + digit 3% and wider groups-plus-remainder 3%
#: were dropped) so that the base model starts inside 10-50%
LARGE_SEED = 4801
LARGE_MIX: dict[str, int] = {"add_teen": 12, "sub_small": 25, "mul": 50, "mul_add": 60, "mul_ten": 25, "add_round": 150,
                             "add_no_carry": 240, "add": 350, "mul_wide": 270, "sub_teen": 150, "add_sub": 168}
TEST300 = "test300"


def problem_key(kind: str, numbers: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """A problem's identity: its story (:data:`FAMILY`, else the kind) and its numbers. Two problems
    with one key differ at most in the name and the item."""
    return FAMILY.get(kind, kind), tuple(numbers)


def kind_problems(kind: str, count: int, seed: int = SEED, exclude: frozenset = frozenset()) -> list[Problem]:
    """``count`` distinct problems (by numbers) of one kind, drawn with ``seed``, none whose
    :func:`problem_key` is in ``exclude``.

    Raises ValueError when the kind's number ranges hold fewer than ``count`` distinct problems
    (10,000 draws in a row without a new one)."""
    steps, make = KINDS[kind]
    r = random.Random(f"{seed}-{kind}")
    seen: set[tuple] = set()
    out: list[Problem] = []
    misses = 0
    while len(out) < count:
        name, item = r.choice(NAMES), r.choice(ITEMS)
        numbers, text, answer = make(r, name, item)
        if numbers in seen or problem_key(kind, numbers) in exclude:
            misses += 1
            if misses > 10_000:
                besides = f" besides the {len(exclude)} excluded" if exclude else ""
                raise ValueError(f"word_arith: kind {kind!r} has only {len(seen)} distinct problems{besides}, {count} "
                                 f"were asked for; lower its weight in MIX or LARGE_MIX or the split sizes in SPLITS")
            continue
        misses = 0
        seen.add(numbers)
        out.append(Problem(kind, steps, numbers, text, answer))
    return out


def problems(count: int, seed: int = SEED) -> list[Problem]:
    """``count`` problems in :data:`MIX` (per kind its weight's share, distinct numbers within a
    kind), shuffled with ``seed``."""
    total = sum(MIX.values())
    out = [p for kind, w in MIX.items() for p in kind_problems(kind, round(count * w / total), seed)]
    random.Random(seed).shuffle(out)
    return out


def split_records(seed: int = SEED) -> dict[str, list[dict]]:
    """The train / val / test records, stratified by kind: each kind's distinct problems are cut into
    the three splits in :data:`SPLITS` proportions, so every split has the same mix and no (kind,
    numbers) is in two splits."""
    total = sum(MIX.values())
    parts: dict[str, list[Problem]] = {split: [] for split in SPLITS}
    for kind, w in MIX.items():
        sizes = {split: round(size * w / total) for split, size in SPLITS.items()}
        pool = kind_problems(kind, sum(sizes.values()), seed)
        start = 0
        for split, size in sizes.items():
            parts[split] += pool[start:start + size]
            start += size
    out = {}
    for i, (split, rows) in enumerate(parts.items()):
        random.Random(seed + i).shuffle(rows)
        out[split] = [{"problem": p.text, "answer": str(p.answer), "kind": p.kind, "steps": p.steps} for p in rows]
    return out


def record_key(row: dict) -> tuple[str, tuple[int, ...]]:
    """:func:`problem_key` of a split record (its numbers read from the text in order: every story
    states its numbers once, in the order of the kind's numbers)."""
    return problem_key(row["kind"], tuple(int(x) for x in re.findall(r"\d+", row["problem"])))


def large_test_records(splits: dict[str, list[dict]] | None = None, seed: int = LARGE_SEED) -> list[dict]:
    """The larger held-out test split: ``splits["test"]`` (subset :data:`TEST300`) followed by
    :data:`LARGE_MIX`'s problems (subset ``new``, shuffled with ``seed``).

    Disjoint by construction: every new problem is drawn with every key (:func:`record_key`) of the
    train, validation and test splits and of the new problems drawn before it excluded, so no new
    problem shares a story and numbers -- hence no text -- with another problem of any split.
    (Within the three original splits, which are kept as they are, the add and add_teen kinds
    share 20 keys: ``docs/results.md``.)"""
    splits = splits if splits is not None else split_records()
    taken = {record_key(row) for rows in splits.values() for row in rows}
    new: list[Problem] = []
    for kind, count in LARGE_MIX.items():
        drawn = kind_problems(kind, count, seed, exclude=frozenset(taken))
        taken |= {problem_key(p.kind, p.numbers) for p in drawn}
        new += drawn
    random.Random(seed).shuffle(new)
    return ([{**row, "subset": TEST300} for row in splits["test"]]
            + [{"problem": p.text, "answer": str(p.answer), "kind": p.kind, "steps": p.steps, "subset": "new"}
               for p in new])


def write(directory: Path = DATA_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    splits = split_records()
    for split, rows in [*splits.items(), ("test_large", large_test_records(splits))]:
        with open(directory / f"word_arith_{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


# ---- grading ----

_INT = r"-?\d[\d,]*"
_ANSWER_IS = re.compile(rf"answer\s*(?:is|:|=)\s*:?\s*\**\s*\$?\s*({_INT})", re.IGNORECASE)
_BOXED = re.compile(rf"\\boxed\s*\{{\s*({_INT})\s*\}}")
_ANY_INT = re.compile(_INT)


def parse_answer(response: str) -> int | None:
    """The response's final answer as an integer, or None when it cannot be parsed: the last
    ``answer is N`` / ``answer: N``, else the last ``\\boxed{N}``, else the last integer of the last
    non-empty line that holds one. Thousands separators are dropped (``1,200`` -> 1200)."""
    for pattern in (_ANSWER_IS, _BOXED):
        found = pattern.findall(response)
        if found:
            return _to_int(found[-1])
    for line in reversed(response.strip().splitlines()):
        found = _ANY_INT.findall(line)
        if found:
            return _to_int(found[-1])
    return None


def _to_int(text: str) -> int | None:
    digits = text.replace(",", "")
    return int(digits) if re.fullmatch(r"-?\d+", digits) else None


def grade(response: str, ground_truth: str) -> Outcome:
    """``correct``, ``wrong`` (an answer that differs) or ``invalid`` (no answer could be parsed)."""
    answer = parse_answer(response)
    if answer is None:
        return "invalid"
    return "correct" if answer == int(ground_truth.strip()) else "wrong"


def word_arith_reward(response: str, ground_truth: str):
    """1 for a correct answer, 0 otherwise; ``format`` 1 when an answer was parsed (0: invalid)."""
    from fastrl.rewards.result import RewardResult

    outcome = grade(response, ground_truth)
    correct = 1.0 if outcome == "correct" else 0.0
    return RewardResult(overall=correct, format=0.0 if outcome == "invalid" else 1.0, accuracy=correct)


if __name__ == "__main__":
    write()
