"""Every rollout of a step as JSON lines, with what pruning decided for it (``logging.rollouts_every``).

The records are what an analysis of the pruner needs and the metrics cannot show: the prompt and
response texts, the response token ids the pruner compared, the reward and advantage, whether the
selection rule (Phase 1) chose the rollout (``phase1_kept``; also with ``pruning.apply=false``,
where every rollout trains; null on a step where no rule ran: a DAPO batch shorter than one
micro-batch per rank), and whether it trained (``kept``: the final mask, after the refill and the
trim to whole micro-batches). ``bench/prune_text.py`` reads them and recomputes MDAP's advantage
buckets and similarities from the token ids.

Each data-parallel rank writes its own rollouts (the first rank of its model-parallel group) to
``<run dir>/rollouts/dp<rank>.jsonl``, one line per rollout, appended step after step, and the
run's ``pruning`` settings beside them (``pruning.json``). A resumed run first moves the records of
the steps it trains again to ``dp<rank>.superseded.jsonl``, as it does for ``metrics.jsonl``.
The first rank of each model-parallel group builds and writes them (the group's ranks hold the
same rollouts).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fastrl.training.prune_phase import PruneOutcome
from fastrl.training.rollout_batch import AdvantagedRollouts


def due(every: int, step: int) -> bool:
    """Whether step ``step`` (1-based) writes its rollouts: every ``every``-th step, never for 0."""
    return every > 0 and step % every == 0


def rollout_records(step: int, scored: AdvantagedRollouts, outcome: PruneOutcome, *, dp_rank: int) -> list[dict]:
    """One dict per rollout of this DP rank, in its batch order.

    Keys: ``step``, ``dp_rank``, ``group`` (global prompt id), ``prompt`` (the chat-formatted text),
    ``response`` (decoded, without special tokens), ``response_token_ids``, ``finish_reason``,
    ``reward``, ``accuracy``, ``valid``, ``advantage`` (before any pruning weight), ``weight`` (the
    pruning importance weight, 1.0 without one), ``phase1_kept`` (the selection rule's choice, None
    where no rule ran) and ``kept`` (trained).

    Raises:
        ValueError: the outcome does not describe ``len(scored)`` rollouts of ``dp_rank``.
    """
    mine = outcome.inputs.rows_of(dp_rank)
    if int(mine.sum()) != len(scored):
        raise ValueError(
            f"step {step}: the pruning outcome holds {int(mine.sum())} rollouts of DP rank {dp_rank}, "
            f"the rank scored {len(scored)}"
        )
    phase1 = outcome.rule_keep[mine].tolist() if outcome.rule_keep is not None else [None] * len(scored)
    kept = outcome.keep[mine]
    weights = outcome.weights[mine] if outcome.weights is not None else torch.ones(len(scored))
    r = scored.rollouts
    return [
        {
            "step": step, "dp_rank": dp_rank, "group": int(scored.group_ids[i]),
            "prompt": r.prompts[r.prompt_index[i]].text, "response": r.response_texts[i],
            "response_token_ids": [int(t) for t in r.response_token_ids[i]], "finish_reason": r.finish_reasons[i],
            "reward": float(scored.rewards[i]), "accuracy": float(scored.accuracy[i]), "valid": bool(scored.valid[i]),
            "advantage": float(scored.advantages[i]), "weight": float(weights[i]),
            "phase1_kept": phase1[i], "kept": bool(kept[i]),
        }
        for i in range(len(scored))
    ]


def writes_rollouts(ctx) -> bool:
    """Whether this rank writes its DP rank's rollouts: the first rank of its model-parallel group
    (the others hold the same rollouts)."""
    return ctx.tp_rank == 0 and ctx.pp_rank == 0


def rollouts_path(run_dir: Path, dp_rank: int) -> Path:
    """``run_dir/rollouts/dp<dp_rank>.jsonl``."""
    return Path(run_dir) / "rollouts" / f"dp{dp_rank}.jsonl"


def rollout_files(run_dir: Path) -> list[Path]:
    """Every ``run_dir/rollouts/dp<rank>.jsonl``, in rank order (not ``dp<rank>.superseded.jsonl``).
    A resumed run moves the records of the steps it trains again out of each of them (rank 0, with
    ``fastrl.training.metrics.supersede_records_after``, as for ``metrics.jsonl``; also the files of
    DP ranks that a resume at a smaller DP size no longer has)."""
    found = [p for p in (Path(run_dir) / "rollouts").glob("dp*.jsonl") if p.stem[2:].isdigit()]
    return sorted(found, key=lambda p: int(p.stem[2:]))


def write_rollouts(run_dir: Path, dp_rank: int, records: list[dict], *, pruning: dict) -> Path:
    """Append ``records`` to :func:`rollouts_path` and write the run's ``pruning`` settings (the
    config section, which the analysis needs) to ``run_dir/rollouts/pruning.json``; returns the
    JSON-lines file."""
    path = rollouts_path(run_dir, dp_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "pruning.json").write_text(json.dumps(pruning, indent=1, sort_keys=True) + "\n")
    with open(path, "a") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    return path


def read_pruning(run_dir: Path) -> dict:
    """The ``pruning`` settings the run wrote beside its rollouts.

    Raises:
        FileNotFoundError: no ``rollouts/pruning.json`` (the run wrote no rollouts).
    """
    path = Path(run_dir) / "rollouts" / "pruning.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: train with logging.rollouts_every=K")
    return json.loads(path.read_text())


def read_rollouts(run_dir: Path) -> list[dict]:
    """Every record under ``run_dir/rollouts/``, DP rank files in rank order.

    Raises:
        FileNotFoundError: the run wrote none (``logging.rollouts_every`` was 0).
        ValueError: a line is not JSON (names the file and line).
    """
    files = rollout_files(run_dir)
    if not files:
        raise FileNotFoundError(f"{Path(run_dir) / 'rollouts'} holds no dp<rank>.jsonl: train with logging.rollouts_every=K")
    out = []
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e}); was the run stopped while writing?") from e
    return out
