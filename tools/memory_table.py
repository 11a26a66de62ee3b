#!/usr/bin/env python
"""Print the table of the shipped GPU recipes' memory timelines that ``docs/parallelism.md`` holds:
``python tools/memory_table.py`` (a test checks that the docs hold exactly this output).

Every GPU recipe's timeline (:func:`fastrl.models.memory_plan.estimate_memory`): total GiB per GPU
per phase for both kinds of GPU, the smallest margin and the KV waves.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastrl.models.memory_plan import GPU_KINDS, PHASES, MemoryPlan, estimate_memory  # noqa: E402
from recipes import get_recipe, list_recipes  # noqa: E402


def recipes_markdown(names: list[str] | None = None) -> str:
    """The table of ``docs/parallelism.md`` ("The shipped GPU recipes"): every GPU recipe's timeline
    (total GiB per GPU per phase, both kinds of GPU), smallest margin and KV waves, recipes with
    identical numbers on one row (an fp8 recipe plans like its bf16 sibling: bf16 weights, fp32
    gradients and optimizer state alike)."""
    names = names or [n for n in list_recipes() if n.startswith("qwen25vl_")]
    groups: dict[tuple, list[str]] = {}
    plans: dict[tuple, MemoryPlan] = {}
    for name in names:
        cfg = get_recipe(name)
        plan = estimate_memory(cfg, cfg.parallel.world_size, cfg.parallel.gpu_memory_gib)
        sp = " SP" if cfg.parallel.sequence_parallel else ""
        key = (f"{plan.gpu_memory_gib:g}", f"{plan.tp} {plan.pp} {plan.dp}{sp}",
               f"{plan.engine_tp}, {cfg.rollout.gpu_memory_utilization:g}",
               tuple(f"{r.total_gib:.1f}" for r in plan.timeline), tuple(k.waves for k in plan.kv_checks))
        groups.setdefault(key, []).append(name)
        plans[key] = plan
    head = ["recipes", "GPUs x GiB", "TP PP DP", "vLLM TP, share", "GPU", *PHASES, "margin", "KV waves (train, val)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, members in groups.items():
        plan = plans[key]
        algos = sorted({a for m in members for a in ("grpo", "dapo", "gspo") if f"_{a}_" in m})
        label = f"`{members[0]}`" + (f" and {len(members) - 1} more ({', '.join(algos)})" if len(members) > 1 else "")
        gpus = f"{plan.generating_gpus + plan.other_gpus} x {plan.gpu_memory_gib:g}"
        waves = ", ".join(str(k.waves) for k in plan.kv_checks) or "-"
        for kind in GPU_KINDS:
            rows = [r for r in plan.timeline if r.gpu == kind]
            if not rows:
                continue
            count = plan.generating_gpus if kind == "generating" else plan.other_gpus
            cells = [label, gpus, key[1], key[2], f"{kind} ({count})", *(f"{r.total_gib:.1f}" for r in rows),
                     f"{min(r.margin_gib for r in rows):.1f}", waves]
            lines.append("| " + " | ".join(cells) + " |")
            label = gpus = waves = ""
            key = (key[0], "", "", key[3], key[4])
    return "\n".join(lines)


if __name__ == "__main__":
    print(recipes_markdown())
