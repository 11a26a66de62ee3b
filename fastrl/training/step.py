"""One FastRL training step, in the order of the specification (docs/algorithm.md, section 1).

Orchestration only: the math lives in :mod:`fastrl.algorithms`, the collectives in
:mod:`fastrl.distributed`, the model work in :class:`fastrl.training.actor.Actor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.training.trainer import Trainer


def train_step(t: "Trainer", step: int) -> dict[str, float]:
    """Generate, score, prune, update and refit once; return this step's metrics."""
    m: dict[str, float] = {}
    n = t.group_size()                                                   # 1. ARS group size
    with t.timer.phase("gen"):                                           # 2. rollout
        prompts = t.next_prompts(step)
        rollouts = t.generate(prompts, n, step)
    with t.timer.phase("reward"):                                        # 3. rewards
        scored = t.score(prompts, rollouts, m)
    scored = t.dynamic_sampling(scored, step, m)                         # DAPO filter (+ extra rounds)
    t.compute_advantages(scored, m)                                      # 4. advantages, full batch
    batch = t.policy_batch(scored, range(len(scored)))                   # this rank's rollouts
    early = t.cfg.logprobs_before_pruning
    if early:
        t.add_logprobs(batch, m)                                         # (old/ref before pruning)
    with t.timer.phase("prune"):                                         # 5-7. DP-global pruning,
        prune = t.prune(scored, batch, step, m)                          #      refill,
        batch = t.repartition(batch, prune, m)                           #      re-partition over DP
    if not early:
        t.add_logprobs(batch, m)                                         # 8. old/ref on kept rows
    with t.timer.phase("update"):                                        # 9. policy update
        t.update(batch, m)
    with t.timer.phase("refit"):                                         # weights -> engine
        t.refit(m)
    t.record_ars(prune, m)                                               # ARS statistics
    return m
