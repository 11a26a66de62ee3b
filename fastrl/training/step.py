"""One FastRL training step, in the order of the specification (docs/algorithm.md, section 1).

A pipeline of typed values: prompts -> rollouts -> scored -> advantages -> prune outcome ->
policy batch -> update; each phase returns its value and its metrics. The math lives in
:mod:`fastrl.algorithms`, the collectives in :mod:`fastrl.distributed`, the model work in
:class:`fastrl.training.actor.Actor`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.checkpoint.train_state import TrainState
from fastrl.training.generation import generate, group_size, prompts_this_step
from fastrl.training.parts import RunParts
from fastrl.training.prune_phase import prune, repartition_kept
from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
from fastrl.training.scoring import compute_advantages, dynamic_sampling, score
from fastrl.training.seeds import derive_seed
from fastrl.training.update_phase import add_log_probs, refit, update_policy


@dataclass(frozen=True)
class StepOutput:
    """What a step hands back to the loop.

    Attributes:
        metrics: every phase's metrics (times are added by the loop).
        epochs_completed: data epochs the prompt sampler finished during the step.
    """

    metrics: dict[str, float]
    epochs_completed: int


def train_step(run: RunParts, state: TrainState, step: int) -> StepOutput:
    """Generate, score, prune, update and refit once (records the kept counts in ``state.ars``)."""
    cfg, ctx, timer = run.cfg, run.ctx, run.timer
    m: dict[str, float] = {}
    n = group_size(cfg, state.ars)                                           # 1. ARS group size
    count = prompts_this_step(cfg.rollout, n)
    epochs = 0

    def rollout_round(round_index: int, seed: int) -> tuple[ScoredRollouts, dict[str, float], int]:
        nonlocal epochs
        with timer.phase("gen"):                                             # 2. rollout
            prompts = run.prompts.next_batch(
                state.sampler, count, dp_size=ctx.dp_size, dp_rank=ctx.dp_rank, round_index=round_index
            )
            epochs += prompts.epochs_completed
            rollouts = generate(
                run.engine, run.prompts, prompts.items, n, rollout=cfg.rollout, seed=seed, dp_rank=ctx.dp_rank
            )
        with timer.phase("reward"):                                          # 3. rewards
            scored, metrics = score(run.scorer, prompts, rollouts, cfg)
        return scored, metrics, len(prompts)

    scored, metrics, _ = rollout_round(0, step)
    m.update(metrics)
    scored, metrics = dynamic_sampling(                                      # DAPO filter (+ rounds)
        scored, alg=cfg.algorithm, step=step, more=lambda r: _drop_metrics(rollout_round(r, derive_seed(step, r)))
    )
    m.update(metrics)
    scored, metrics = compute_advantages(scored, cfg.algorithm)              # 4. advantages, full batch
    m.update(metrics)
    batch = to_policy_batch(scored, range(len(scored)), pad_token_id=run.engine.pad_token_id)
    mbs = cfg.parallel.micro_batch_size
    early = cfg.logprobs_before_pruning
    if early:                                                                # (old/ref before pruning)
        batch, metrics = add_log_probs(batch, run.actor, run.reference, micro_batch_size=mbs, phase=timer.phase)
        m.update(metrics)
    with timer.phase("prune"):                                               # 5-7. DP-global pruning,
        outcome, metrics = prune(cfg, scored, batch, step=step, n=n, dp_size=ctx.dp_size)  # refill,
        m.update(metrics)
        batch, metrics = repartition_kept(batch, outcome)                    #      re-partition over DP
        m.update(metrics)
    if not early:                                                            # 8. old/ref on kept rows
        batch, metrics = add_log_probs(batch, run.actor, run.reference, micro_batch_size=mbs, phase=timer.phase)
        m.update(metrics)
    with timer.phase("update"):                                              # 9. policy update
        m.update(update_policy(batch, run.actor, cfg, n=n, dp_size=ctx.dp_size))
    with timer.phase("refit"):                                               # weights -> engine
        m.update(refit(run.engine, run.actor))
    state.ars.record(list(outcome.result.kept_per_group.values()))           # ARS statistics
    m["rollout/n"] = float(n)
    return StepOutput(m, epochs)


def _drop_metrics(out: tuple[ScoredRollouts, dict[str, float], int]) -> tuple[ScoredRollouts, int]:
    return out[0], out[2]
