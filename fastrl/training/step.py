"""One FastRL training step, in the order of the specification (docs/algorithm.md, section 1).

A pipeline of typed values; each phase returns a new value (none is changed in place) and its
metrics:

    PromptBatch -> Rollouts -> ScoredRollouts (DAPO: filtered, more rounds) -> AdvantagedRollouts
    -> PolicyBatch (with advantages) -> PruneOutcome + this rank's kept PolicyBatch
    -> UpdatePlan (rows grouped by length) -> PolicyBatch with ref log-probs, and old log-probs
    except for the first update's rows (on-policy: its own forward gives them) -> update metrics
    -> refit

With ``trainer.logprobs_before_pruning`` or ``algorithm.kl_in_reward`` the old/ref log-probs come
before the advantages, on the full batch:

    ScoredRollouts -> PolicyBatch -> PolicyBatch with old/ref log-probs -> (KL-penalized rewards)
    -> AdvantagedRollouts, PolicyBatch with advantages -> PruneOutcome + kept PolicyBatch -> update

The math lives in :mod:`fastrl.algorithms`, the collectives in :mod:`fastrl.distributed`, the
model work in :class:`fastrl.training.actor.Actor`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from fastrl.batch import PolicyBatch
from fastrl.checkpoint.train_state import TrainState
from fastrl.data import ResumableSampler
from fastrl.training.generation import generate, group_size, prompts_this_step, sleep_engine
from fastrl.training.geometry import step_geometry
from fastrl.training.parts import RunParts
from fastrl.training.prompt_skip import record_rewards, skip_prompts
from fastrl.training.prune_phase import prune, repartition_kept
from fastrl.training.refit_verify import check_rollout_mismatch
from fastrl.training.rollout_batch import AdvantagedRollouts, ScoredRollouts, sequence_multiple, to_policy_batch
from fastrl.training.rollout_log import due, rollout_records, writes_rollouts
from fastrl.training.scoring import compute_advantages, dynamic_sampling, kl_in_reward, score
from fastrl.training.seeds import derive_seed
from fastrl.training.update_phase import add_log_probs, refit, release_cached_memory, update_policy

logger = logging.getLogger("fastrl.trainer")

#: Round metrics that are counts: DAPO's extra rounds add to the first round's (the rest are the first round's).
_ROUND_COUNTS = ("rollout/generated_tokens", "rollout/time_s")
_ROUND_COUNT_PREFIXES = ("reward/num_",)


@dataclass(frozen=True)
class StepOutput:
    """What a step hands back to the loop.

    Attributes:
        metrics: every phase's metrics (times are added by the loop).
        epochs_completed: data epochs the prompt sampler finished during the step.
        rollouts: this DP rank's rollouts with the pruning decision (:func:`~fastrl.training.rollout_log.rollout_records`)
            on the steps ``logging.rollouts_every`` asks for, on the rank that writes them (the first of
            its model-parallel group), for the loop to write; empty otherwise.
    """

    metrics: dict[str, float]
    epochs_completed: int
    rollouts: tuple[dict, ...] = ()


def train_step(run: RunParts, state: TrainState, step: int) -> StepOutput:
    """Generate, score, prune, update and refit once (records the kept counts in ``state.ars``)."""
    cfg, ctx, timer = run.cfg, run.ctx, run.timer
    m: dict[str, float] = {}
    n = group_size(cfg, state.ars)                                           # 1. ARS group size
    geometry = step_geometry(cfg, ctx.dp_size, n)                            # DP size, kept count, cuts
    count = prompts_this_step(cfg.rollout, n)
    epochs = 0
    skipper = state.prompt_skipper                                           # pruning.method='greso'

    def rollout_round(round_index: int, seed: int) -> tuple[ScoredRollouts, dict[str, float], int]:
        nonlocal epochs
        with timer.phase("gen"):                                             # 2. rollout
            drawn_before = state.sampler.epochs_drawn
            prompts = run.prompts.next_batch(
                state.sampler, count, dp_size=geometry.dp_size, dp_rank=ctx.dp_rank, round_index=round_index
            )
            epochs += prompts.epochs_completed
            m.update(_check_epochs(state.sampler, drawn_before, cfg.trainer.epochs, step, round_index, ctx.is_logging_rank))
            if skipper is not None:                                          # GRESO: skip before generating
                kept, metrics = skip_prompts(skipper, prompts.items, seed=cfg.pruning.seed, step=step, dp_rank=ctx.dp_rank)
                prompts = dataclasses.replace(prompts, items=kept)
                m.update(metrics)
            rollouts = generate(
                run.engine, run.prompts, prompts.items, n, rollout=cfg.rollout, seed=seed, dp_rank=ctx.dp_rank,
                weight_version=run.actor.policy_version,                     # stale engine: StaleWeightsError
            )
        with timer.phase("reward"):                                          # 3. rewards
            scored, metrics = score(run.scorer, prompts, rollouts, cfg, health=state.reward_health)
        if skipper is not None:
            record_rewards(skipper, prompts.items, scored.group_ids, scored.rewards)
        return scored, metrics, len(prompts)

    def extra_round(round_index: int) -> tuple[ScoredRollouts, int]:
        scored, metrics, drawn = rollout_round(round_index, derive_seed(step, round_index))
        _add_round_counts(m, metrics)
        return scored, drawn

    def policy_batch(scored: ScoredRollouts | AdvantagedRollouts) -> PolicyBatch:
        return to_policy_batch(
            scored, range(len(scored)), pad_token_id=run.engine.pad_token_id,
            pad_to_multiple=sequence_multiple(cfg.precision, cfg.parallel),      # FP8-safe shapes
        )

    scored, metrics, _ = rollout_round(0, step)
    m.update(metrics)
    scored, metrics = dynamic_sampling(scored, alg=cfg.algorithm, step=step, more=extra_round)  # DAPO filter (+ rounds)
    m.update(metrics)
    sleep_engine(run.engine)                                                 # generation done: free the GPU
    m.update(state.reward_health.end_step(step, final=step >= state.total_steps))  # invalid rewards: stop?
    early = cfg.logprobs_before_pruning
    tolerance_note = f" ('auto' for precision.mode={cfg.precision.mode})" if cfg.rollout.mismatch_tolerance == "auto" else ""
    if early:                                                                # old/ref on the full batch,
        batch = policy_batch(scored)                                         # before the advantages
        batch, metrics = add_log_probs(batch, run.actor, run.reference, geometry=geometry, phase=timer.phase)
        m.update(metrics)
        check_rollout_mismatch(metrics, tolerance=cfg.mismatch_tolerance, step=step, setting=tolerance_note)
        rewards = None
        if cfg.algorithm.kl_in_reward:                                       # reward - beta x sum_t KL_t
            rewards, metrics = kl_in_reward(scored, batch, cfg.algorithm)
            m.update(metrics)
        advantaged, metrics = compute_advantages(scored, cfg.algorithm, step=step, rewards=rewards)  # 4. advantages
        m.update(metrics)
        batch = batch.with_tensors(advantages=advantaged.advantages.float())
    else:
        advantaged, metrics = compute_advantages(scored, cfg.algorithm, step=step)  # 4. advantages, full batch
        m.update(metrics)
        batch = policy_batch(advantaged)
    with timer.phase("prune"):                                               # 5-7. DP-global pruning,
        outcome, metrics = prune(cfg, advantaged, batch, step=step, geometry=geometry)
        m.update(metrics)
        batch, metrics = repartition_kept(batch, outcome)                    # refill, re-partition over DP
        m.update(metrics)
    logged = tuple(rollout_records(step, advantaged, outcome, dp_rank=ctx.dp_rank)) if (
        due(cfg.logging.rollouts_every, step) and writes_rollouts(ctx)) else ()
    plan = geometry.plan_update(batch.lengths, step=step)                   # updates, cuts, LR
    batch = batch.select(plan.row_order)                                     # rows grouped by length
    on_policy = plan.update_rows[0] if cfg.on_policy_first_update else 0    # its own forward: old log-probs

    def guard(metrics: dict[str, float]) -> None:                            # stale weights: stop, no update
        check_rollout_mismatch(metrics, tolerance=cfg.mismatch_tolerance, step=step, setting=tolerance_note)

    if not early:                                                            # 8. old/ref on kept rows
        batch, metrics = add_log_probs(
            batch, run.actor, run.reference, geometry=geometry, phase=timer.phase, old_from=on_policy,
            engine_old=cfg.trainer.old_log_probs == "engine",
        )
        m.update(metrics)
        if not on_policy:
            guard(metrics)
    with timer.phase("update"):                                              # 9. policy update
        m.update(update_policy(
            batch, run.actor, plan, scheduler=state.scheduler, on_policy_rows=on_policy, guard=guard,
            engine_old=cfg.trainer.old_log_probs == "engine",
        ))
    release_cached_memory(ctx.device)                                        # GPU: the activation peak
    with timer.phase("refit"):                                               # weights -> engine
        m.update(refit(run.engine, run.actor))
    f1, f2 = state.ars.record(list(outcome.kept_per_group.values()))         # ARS statistics
    m["ars/f1"], m["ars/f2"] = f1, f2
    m["rollout/n"] = float(n)
    return StepOutput(m, epochs, logged)


def _add_round_counts(m: dict[str, float], extra: dict[str, float]) -> None:
    """Add an extra DAPO round's counts (rows scored, invalid, generated tokens, generation time) to
    the step's, so that they cover every round; recompute the generation throughput."""
    for k, v in extra.items():
        if k in _ROUND_COUNTS or k.startswith(_ROUND_COUNT_PREFIXES):
            m[k] = m.get(k, 0.0) + v
    if m.get("rollout/time_s", 0.0) > 0 and "rollout/tokens_per_s" in m:
        m["rollout/tokens_per_s"] = m["rollout/generated_tokens"] / m["rollout/time_s"]


def _check_epochs(
    sampler: ResumableSampler, drawn_before: float, epochs: int, step: int, round_index: int, log: bool
) -> dict[str, float]:
    """``data/epochs_drawn`` once the prompt sampler is past ``trainer.epochs`` (DAPO's extra rounds
    draw prompts the step count did not budget for, so the sampler wraps into another epoch and
    reuses prompts), with a warning whenever a draw enters a new epoch there; nothing before."""
    drawn = sampler.epochs_drawn
    if drawn <= epochs:
        return {}
    if log and (drawn_before <= epochs or math.ceil(drawn_before) < math.ceil(drawn)):
        logger.warning(
            "step %d (generation round %d): the prompt sampler wrapped past trainer.epochs=%d (%.3f epochs of "
            "prompts drawn): prompts are reused; DAPO's extra rounds (algorithm.max_dynamic_sampling_rounds) draw "
            "prompts beyond what the step count budgets for", step, round_index, epochs, drawn,
        )
    return {"data/epochs_drawn": drawn}
