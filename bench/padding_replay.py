#!/usr/bin/env python
"""The padding a committed run's trainer passes compute, replayed under a recipe's token budget:
the greedy fill against the fewest-padded cut (``fastrl.training.geometry.fewest_padded_cut``).

Each step's trained rows (``rollouts/dp<rank>.jsonl``, ``kept`` rows; not a resumed run's
``dp<rank>.superseded.jsonl``; length = prompt tokens, counted
with the run's tokenizer, + response tokens) go through the recipe's step geometry
(:func:`fastrl.training.geometry.step_geometry`, one DP rank) as the trainer runs them: the update's
rows grouped by length within each update and cut by the budget, at most
``parallel.micro_batch_size`` rows a micro-batch; the old / reference passes' rows sorted longest
first and cut by the budget, at most ``8 x micro_batch_size`` rows. Both cuts make the same number
of micro-batches (the fewest the budget allows), and the trainer's pads none beyond the greedy
fill's largest; the counts are exact and do not depend on the machine, so no timing is involved.

    python bench/padding_replay.py bench/results/word_arith_time/seed1/smollm2_135m_grpo_wordarith_vllm_cpu \\
        --recipe smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def step_lengths(run_dir: Path, tokenizer) -> dict[int, list[int]]:
    """Per step, the token lengths (prompt + response) of the rows the trainer trained on.

    Raises:
        FileNotFoundError: the run has no ``rollouts/dp*.jsonl``.
        ValueError: a row lacks ``step``, ``prompt`` or ``response_token_ids`` (file and line named).
    """
    # dp<rank>.jsonl only: a resumed run's dp<rank>.superseded.jsonl holds the steps it trained again
    files = sorted(f for f in (run_dir / "rollouts").glob("dp*.jsonl") if re.fullmatch(r"dp\d+\.jsonl", f.name))
    if not files:
        raise FileNotFoundError(f"{run_dir}/rollouts has no dp*.jsonl: not a run directory with its rollouts logged")
    prompt_tokens: dict[str, int] = {}
    out: dict[int, list[int]] = defaultdict(list)
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            row = json.loads(line)
            if not row.get("kept", True):
                continue
            try:
                prompt, step, response = row["prompt"], int(row["step"]), row["response_token_ids"]
            except KeyError as err:
                raise ValueError(f"{path}:{number}: the row has no {err.args[0]!r}; rollouts logged by an older trainer?") from err
            if prompt not in prompt_tokens:
                prompt_tokens[prompt] = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            out[step].append(prompt_tokens[prompt] + len(response))
    return dict(out)


def replay(steps: dict[int, list[int]], geometry) -> dict[str, dict[str, int]]:
    """Real and computed tokens of the update and of one log-prob pass over every step, under the
    greedy fill and the geometry's own (fewest-padded) cut, and the micro-batches of each."""
    from fastrl.training.geometry import greedy_fill, padded_token_share

    totals = {f"{p}/{c}": {"real": 0, "computed": 0, "micro_batches": 0}
              for p in ("update", "log_prob") for c in ("greedy", "fewest_padded")}

    def add(key: str, lengths: list[int], sizes: list[int]) -> None:
        real, computed = padded_token_share(lengths, sizes)
        totals[key]["real"] += real
        totals[key]["computed"] += computed
        totals[key]["micro_batches"] += len(sizes)

    for step, lengths in sorted(steps.items()):
        plan = geometry.plan_update(lengths, step=step)
        ordered = [lengths[i] for i in plan.row_order]
        start = 0
        for rows, cut in zip(plan.update_rows, plan.micro_batches):
            share = ordered[start : start + rows]
            add("update/fewest_padded", share, list(cut))
            add("update/greedy", share, greedy_fill(share, geometry.micro_batch_tokens, geometry.micro_batch_size))
            start += rows
        longest_first = sorted(lengths, reverse=True)
        add("log_prob/fewest_padded", longest_first, geometry.log_prob_cut(longest_first))
        add("log_prob/greedy", longest_first, greedy_fill(longest_first, geometry.micro_batch_tokens, geometry.log_prob_max_rows))
    return totals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (with rollouts/dp*.jsonl)")
    p.add_argument("--recipe", required=True, help="the recipe whose geometry and token budget cut the rows")
    p.add_argument("--json", type=Path, default=None, help="also write the totals here")
    args = p.parse_args(argv)

    from transformers import AutoTokenizer

    from fastrl.models.hub import resolve_model_dir
    from fastrl.training.geometry import step_geometry
    from recipes.registry import get_recipe

    cfg = get_recipe(args.recipe)
    if cfg.trainer.micro_batch_tokens <= 0:
        p.error(f"--recipe {args.recipe} has no token budget (trainer.micro_batch_tokens=0): nothing to compare")
    if cfg.model.source != "hf":
        p.error(f"--recipe {args.recipe}: model.source={cfg.model.source!r} has no tokenizer of a Hugging Face directory")
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_dir(cfg.model.hf_path)))
    geometry = step_geometry(cfg, 1, cfg.rollout.n)
    report = {}
    print(f"token budget {cfg.trainer.micro_batch_tokens}, update micro-batches of at most {geometry.micro_batch_size} rows, "
          f"log-prob ones of at most {geometry.log_prob_max_rows} ({args.recipe})\n")
    print("| run | pass | cut | micro-batches | real tokens | computed tokens | padding |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run in args.runs:
        totals = replay(step_lengths(run, tokenizer), geometry)
        report[str(run)] = totals
        for key, t in totals.items():
            pass_name, cut = key.split("/")
            print(f"| {run} | {pass_name} | {cut} | {t['micro_batches']} | {t['real']} | {t['computed']} | "
                  f"{1 - t['real'] / t['computed']:.2%} |")
    if args.json:
        args.json.write_text(json.dumps({"recipe": args.recipe, "runs": report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
