"""The text task of the vLLM-in-the-loop CPU recipe (``qwen2_tiny_text_fastrl_grpo_vllm_cpu``).

"Colour copy": each prompt describes one shape and asks for its colour, in the tiny tokenizer's
easy-vqa words (``the image shows a red circle. what color is the circle?``); the answer is the
colour named in the prompt, so a text-only model can learn it from reward alone. The data is
generated deterministically (every colour x shape x phrasing, shuffled with a fixed seed) into
``recipes/data/color_copy_{train,val}.jsonl`` (``python -m recipes.color_copy`` rewrites them).

Reward (:func:`color_copy_reward`, used as ``recipes/color_copy.py:color_copy_reward``): the first
word of the response is graded: the right colour 1.0, another colour 0.25, anything else 0. A
random tiny policy starts near 0.03; the first thing RL teaches it is to answer with a colour word
(reward towards 0.25), then which colour (towards 1).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

COLORS = ("red", "green", "blue", "yellow", "teal", "brown", "gray", "black")
SHAPES = ("circle", "rectangle", "triangle")
PHRASES = (
    "the image shows a {c} {s}. what color is the {s}?",
    "there is a {c} {s} in the image. what color is the {s}?",
    "a {c} {s} is in the image. what is the color of the {s}?",
    "the {s} is {c}. what color is the {s}?",
)
DATA_DIR = Path(__file__).resolve().parent / "data"


def records() -> list[dict]:
    """Every (colour, shape, phrasing) prompt, shuffled with seed 0."""
    rows = [{"problem": p.format(c=c, s=s), "answer": c} for c in COLORS for s in SHAPES for p in PHRASES]
    random.Random(0).shuffle(rows)
    return rows


def write(directory: Path = DATA_DIR) -> None:
    rows = records()
    directory.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows[16:]), ("val", rows[:16])):
        with open(directory / f"color_copy_{split}.jsonl", "w") as f:
            for r in part:
                f.write(json.dumps(r) + "\n")


def color_copy_reward(response: str, ground_truth: str):
    """First response word: the right colour 1.0, another colour 0.25, else 0."""
    from fastrl.rewards.result import RewardResult

    words = re.findall(r"[a-z]+", response.lower())
    first = words[0] if words else ""
    correct = first == ground_truth.strip().lower()
    overall = 1.0 if correct else (0.25 if first in COLORS else 0.0)
    return RewardResult(overall=overall, format=1.0 if first in COLORS else 0.0, accuracy=1.0 if correct else 0.0)


if __name__ == "__main__":
    write()
