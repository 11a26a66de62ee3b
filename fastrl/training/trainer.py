"""The trainer: builds every part of a run from its config and runs the step loop.

Parts: parallel state (:mod:`fastrl.distributed`), data and prompts (:mod:`fastrl.data`), the
policy as a Hugging Face directory (tiny model + cached warm start, or a checkpoint), the actor
and the frozen reference policy (megatron-core), the rollout engine, the reward scorer, the
adaptive rollout sampler, checkpoints, metrics. :func:`fastrl.training.step.train_step` is the
step; the methods it calls are the phases, each small.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.algorithms.advantages import grpo_advantages, rloo_advantages
from fastrl.algorithms.filters import dynamic_sampling_keep, overlong_penalty
from fastrl.config import RunConfig
from fastrl.data import Record, ResumableSampler, load_train_val
from fastrl.distributed import collectives, world
from fastrl.rollout.engine import RolloutPrompt, Rollouts, SamplingParams
from fastrl.training.pruner import mini_batch_sizes, select_rollouts, trim_to_multiple
from fastrl.training.prompting import record_prompt
from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
from fastrl.training.timers import PhaseTimer

logger = logging.getLogger("fastrl.trainer")


def _seed(*parts: int) -> int:
    """A deterministic 63-bit seed from integers (per step / rank streams, resume-safe)."""
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value ^ (int(p) + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & ((1 << 63) - 1)
    return value


class Trainer:
    """A FastRL run. Build with a validated :class:`RunConfig`; call :meth:`fit`.

    Args:
        config: the run configuration.
        run_dir: where metrics, plots and checkpoints go (default ``logging.output_dir/<run name>``).
    """

    def __init__(self, config: RunConfig, *, run_dir: str | Path | None = None) -> None:
        from fastrl.distributed import parallel_state

        self.cfg = config
        self.run_dir = Path(run_dir or Path(config.logging.output_dir) / (config.logging.run_name or config.recipe))
        torch.set_num_threads(config.trainer.torch_threads)
        self.ctx = parallel_state.initialize(config.parallel, seed=config.trainer.seed)
        config.check_layout(self.ctx.world_size)
        self.timer = PhaseTimer(sync=torch.cuda.synchronize if self.ctx.device.type == "cuda" else None)
        self.step = 0
        self.best_val: float | None = None
        self.best_step: int | None = None
        self.train_seconds = 0.0
        self.start_metrics: dict[str, float] = {}
        self._build_data()
        self._build_models()
        self.ars = AdaptiveRolloutSampler(config.rollout.n, n_min=config.adaptive_sampling.n_min)
        self.sampler = ResumableSampler(len(self.train), seed=config.data.shuffle_seed)
        self.total_steps = self._total_steps()

    # ---- construction -----------------------------------------------------------------------

    def _build_data(self) -> None:
        d = self.cfg.data
        train, val = load_train_val(
            d.dataset, d.train_path, d.val_path, on_bad_row=d.on_bad_row, cache_dir=d.cache_dir,
            max_train=d.max_train_samples, max_val=d.val_size,
        )
        self.train: list[Record] = list(train.records)
        self.val: list[Record] = list(val.records)
        self.data_metrics = train.report.as_metrics()

    def _cache_dir(self) -> Path:
        from fastrl.data.easy_vqa import default_cache_dir

        return Path(self.cfg.data.cache_dir) if self.cfg.data.cache_dir else default_cache_dir()

    def _policy_dir(self) -> Path:
        """The Hugging Face directory the run starts from (tiny model + warm start, or hf_path)."""
        m = self.cfg.model
        if m.source == "hf":
            return Path(m.hf_path)
        from fastrl.models.tiny import build_tiny_hf_model_dir, tiny_model_settings

        d = self.cfg.data
        key = tiny_model_settings(m, min_pixels=d.min_pixels, max_pixels=d.max_pixels).key()
        base = self._cache_dir() / "models" / f"tiny-{key}"
        if self.ctx.rank == 0:
            build_tiny_hf_model_dir(base, m, min_pixels=d.min_pixels, max_pixels=d.max_pixels)
        world.barrier()
        if not self.cfg.warm_start.enabled:
            return base
        from fastrl.training.warm_start import run_warm_start

        out = None
        if self.ctx.rank == 0:
            out, metrics = run_warm_start(
                base, self._cache_dir() / "warm_start", self.train, self.cfg.warm_start,
                template=d.template, image_size=d.image_size if d.dataset == "easy_vqa" else None,
                seed=self.cfg.trainer.seed, torch_threads=self.cfg.trainer.torch_threads,
            )
            self.start_metrics.update(metrics)
        out = world.broadcast_object(out)
        return Path(out)

    def _build_models(self) -> None:
        from fastrl.rewards import RewardScorer
        from fastrl.rollout.hf_engine import HFRolloutEngine
        from fastrl.training.actor import Actor

        cfg = self.cfg
        self.policy_dir = self._policy_dir()
        policy = self._build_policy(trainable=True)
        self.actor = Actor(
            policy, algorithm=cfg.algorithm, optimizer=cfg.optimizer, parallel=cfg.parallel,
            precision=cfg.precision, total_steps=self._total_steps() * self._updates_per_step_estimate(),
            temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
        )
        self.reference = None
        if cfg.algorithm.use_kl_loss and cfg.algorithm.kl_coef > 0 or cfg.algorithm.kl_in_reward:
            self.reference = self._build_policy(trainable=False)
        if cfg.rollout.engine != "hf":
            from fastrl.rollout.vllm_engine import VLLMRolloutEngine

            self.engine = VLLMRolloutEngine.from_pretrained(self.policy_dir, cfg.rollout)
        else:
            self.engine = HFRolloutEngine.from_pretrained(self.policy_dir, cfg.rollout)
        self.tokenizer = self.engine.tokenizer
        if cfg.model.megatron_checkpoint:
            self.refit({})  # the engine starts from the imported weights, not the HF directory's
        self.scorer = RewardScorer(cfg.reward.name, num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s)
        self._prompt_cache: dict[int, RolloutPrompt] = {}

    def _build_policy(self, *, trainable: bool):
        """Actor or reference policy from the run's HF directory, or from ``model.megatron_checkpoint``
        (a directory written by ``tools/convert_checkpoint.py import`` or a trainer checkpoint)."""
        from fastrl.models.provider import build_policy

        cfg, ckpt = self.cfg, self.cfg.model.megatron_checkpoint
        policy = build_policy(
            self.policy_dir, parallel=cfg.parallel, precision=cfg.precision, model=cfg.model,
            trainable=trainable, load_weights=ckpt is None,
        )
        if ckpt:
            from fastrl.models.conversion import load_megatron_checkpoint

            load_megatron_checkpoint(policy, ckpt)
        return policy

    def _updates_per_step_estimate(self) -> int:
        return self.cfg.algorithm.ppo_epochs * max(1, self.cfg.rollout.prompts_per_step // self.cfg.trainer.mini_batch_prompts)

    def _total_steps(self) -> int:
        t = self.cfg.trainer
        per_epoch = max(1, len(self.train) // self.cfg.rollout.prompts_per_step)
        total = t.epochs * per_epoch
        return min(total, t.max_steps) if t.max_steps else total

    # ---- phases -------------------------------------------------------------------------------

    def group_size(self) -> int:
        """n for this step: the adaptive sampler's decision, or the configured n."""
        return self.ars.n if self.cfg.adaptive_sampling.enabled else self.cfg.rollout.n

    def prompts_this_step(self, n: int) -> int:
        r = self.cfg.rollout
        if r.keep_rollout_budget_constant and n < r.n:
            return AdaptiveRolloutSampler.prompts_for_constant_budget(r.prompts_per_step, r.n, n)
        return r.prompts_per_step

    def prompt_of(self, record: Record) -> RolloutPrompt:
        if record.question_id not in self._prompt_cache:
            d = self.cfg.data
            self._prompt_cache[record.question_id] = record_prompt(
                record, template=d.template, tokenizer=self.tokenizer,
                image_size=d.image_size if d.dataset == "easy_vqa" else None,
            )
        return self._prompt_cache[record.question_id]

    def next_prompts(self, step: int, *, round_index: int = 0) -> list[tuple[int, Record]]:
        """This DP rank's slice of the step's global prompt batch, as (group id, record).

        Group ids are positions in the global batch, offset by ``round_index x prompts`` for the
        extra generation rounds of DAPO dynamic sampling, so they never collide within a step.
        """
        count = self.prompts_this_step(self.group_size())
        batch = self.sampler.next_batch(count)
        self._epochs_completed = getattr(self, "_epochs_completed", 0) * bool(round_index) + batch.epochs_completed
        dp, rank = self.ctx.dp_size, self.ctx.dp_rank
        pairs = [(round_index * count + g, self.train[i]) for g, i in enumerate(batch.indices)]
        return pairs[rank::dp]

    def generate(self, prompts: Sequence[tuple[int, Record]], n: int, step: int) -> Rollouts:
        sampling = SamplingParams.for_training(self.cfg.rollout, seed=_seed(self.cfg.rollout.seed, step, self.ctx.dp_rank))
        self.engine.wake()
        try:
            return self.engine.generate([self.prompt_of(r) for _, r in prompts], n, sampling)
        finally:
            self.engine.sleep()

    def score(self, prompts: Sequence[tuple[int, Record]], rollouts: Rollouts, m: dict) -> ScoredRollouts:
        truths = [prompts[i][1].answer for i in rollouts.prompt_index]
        results = self.scorer.score(rollouts.response_texts, truths)
        valid = torch.tensor([r.valid for r in results])
        rewards = torch.tensor([r.overall if r.valid else 0.0 for r in results], dtype=torch.float32)
        accuracy = torch.tensor([r.accuracy if r.valid else 0.0 for r in results], dtype=torch.float32)
        formatted = torch.tensor([bool(r.valid and r.format > 0) for r in results])
        if self.cfg.algorithm.overlong_shaping:
            rewards = rewards + overlong_penalty(
                torch.tensor(rollouts.lengths), self.cfg.rollout.max_response_length, self.cfg.algorithm.overlong_cache_length
            ).float()
        group_ids = torch.tensor([prompts[i][0] for i in rollouts.prompt_index], dtype=torch.long)
        m.update(rollouts.metrics)
        m.update(self.scorer.last_stats.as_metrics())
        return ScoredRollouts(rollouts, group_ids, rewards, accuracy, valid, formatted)

    def dynamic_sampling(self, scored: ScoredRollouts, step: int, m: dict) -> ScoredRollouts:
        """DAPO dynamic sampling: drop groups whose accuracy is all 0 or all 1 (on accuracy, not
        the shaped reward) and generate more prompts, at most ``max_dynamic_sampling_rounds``
        extra rounds, until every DP rank holds as many informative groups as it had prompts.
        When the rounds are exhausted, train on what was collected (warned)."""
        if not self.cfg.algorithm.dynamic_sampling:
            return scored
        target = len(scored.rollouts.n_per_prompt)
        total_groups = target
        collected = _filter_informative(scored)
        rounds = 0
        while world.any_rank(_num_groups(collected) < target) and rounds < self.cfg.algorithm.max_dynamic_sampling_rounds:
            rounds += 1
            with self.timer.phase("gen"):
                prompts = self.next_prompts(step, round_index=rounds)
                rollouts = self.generate(prompts, self.group_size(), _seed(step, rounds))
            with self.timer.phase("reward"):
                extra = self.score(prompts, rollouts, {})
            total_groups += len(prompts)
            collected = _concat_scored(collected, _filter_informative(extra))
        have = _num_groups(collected)
        m["dapo/extra_rounds"] = float(rounds)
        m["dapo/informative_group_fraction"] = have / max(total_groups, 1)
        if world.any_rank(have < target):
            logger.warning(
                "step %d: DAPO dynamic sampling found %d of %d informative groups on this rank after %d extra "
                "round(s) (algorithm.max_dynamic_sampling_rounds); training on what was collected",
                step, have, target, rounds,
            )
        if have == 0:
            logger.warning("step %d: no informative group at all; training on the unfiltered batch", step)
            return scored
        groups = sorted(set(collected.group_ids.tolist()), key=collected.group_ids.tolist().index)[:target]
        wanted = set(groups)
        return _select_scored(collected, [r for r, g in enumerate(collected.group_ids.tolist()) if g in wanted])

    def compute_advantages(self, scored: ScoredRollouts, m: dict) -> None:
        alg = self.cfg.algorithm
        if alg.advantage_estimator == "rloo":
            adv = rloo_advantages(scored.rewards, scored.group_ids, valid=scored.valid)
        else:
            adv = grpo_advantages(
                scored.rewards, scored.group_ids, eps=alg.adv_eps, unbiased=alg.std_unbiased,
                scale=alg.advantage_estimator == "grpo", valid=scored.valid,
            )
        scored.advantages = adv.float()
        self._log_global(m, "reward", scored.rewards, scored.valid)
        self._log_global(m, "accuracy", scored.accuracy, scored.valid)
        self._log_global(m, "format", scored.formatted.float(), scored.valid)
        self._log_global(m, "advantage", adv, scored.valid)
        m["advantage/abs_mean"] = _global_mean_std(adv.abs())[0]
        m["response/length_mean"] = float(scored.response_lengths.float().mean())

    def _log_global(self, m: dict, name: str, values: torch.Tensor, valid: torch.Tensor) -> None:
        m[f"{name}/mean"], m[f"{name}/std"] = _global_mean_std(values[valid])

    def policy_batch(self, scored: ScoredRollouts, rows: Sequence[int]):
        return to_policy_batch(scored, list(rows), pad_token_id=self.engine.pad_token_id)

    def prune(self, scored: ScoredRollouts, batch, step: int, m: dict):
        """DP-global pruning: gather the metadata over DP, run the same selection on every rank."""
        from fastrl.algorithms.minhash import ResponseSketch, minhash_sketch
        from fastrl.distributed.dp_pruning import LocalPruningInputs, dp_global_prune

        cfg = self.cfg.pruning
        multiple = self.cfg.update_multiple(self.ctx.dp_size, n=self.group_size())
        whole = self.ctx.dp_size * self.cfg.parallel.micro_batch_size
        responses = list(scored.rollouts.response_token_ids)
        common = dict(group_ids=scored.group_ids, advantages=scored.advantages, lengths=batch.lengths)
        if cfg.method == "fastrl" and cfg.similarity_mode == "minhash":
            sig, lens = minhash_sketch(responses, num_bins=cfg.minhash_num_perm, ngram=cfg.ngram).to_tensors()
            local = LocalPruningInputs(**common, signatures=sig, response_lengths=lens)
        else:
            local = LocalPruningInputs(**common, responses=responses)
        generator = torch.Generator().manual_seed(_seed(cfg.seed, step))

        def select(g):
            mult = whole if len(g) < multiple else multiple  # a short batch (DAPO): whole micro-batches
            resp = g.responses
            if resp is None:
                resp = ResponseSketch.from_tensors(g.signatures, g.response_lengths, ngram=cfg.ngram, seed=0)
            result = select_rollouts(cfg, g.advantages.float(), g.group_ids, resp, multiple=mult, generator=generator)
            result, dropped = trim_to_multiple(result, g.advantages, g.group_ids, whole)
            m["prune/dropped_for_geometry"] = float(dropped)
            return result

        outcome = self._prune_outcome = dp_global_prune(local, select)
        result = outcome.result
        m.update(result.metrics())
        kept_adv = outcome.inputs.advantages[outcome.keep].double()
        self._prune_weights = None
        if cfg.weighting == "bucket_size":
            from fastrl.algorithms.prune_weights import bucket_size_weights

            g = outcome.inputs
            w = self._prune_weights = bucket_size_weights(
                g.advantages.float(), g.group_ids, outcome.keep, semantics=cfg.semantics, adv_tolerance=cfg.adv_tolerance
            )
            kept_w = w[outcome.keep].double()
            kept_adv = kept_adv * kept_w
            m["prune/weight_max"] = float(kept_w.max())
        # What the update sees: the kept set's mean advantage (0 for an unpruned GRPO batch) and response length.
        m["prune/kept_advantage_mean"] = float(kept_adv.mean())
        if result.kept_tokens is not None:
            m["prune/kept_response_length_mean"] = result.kept_tokens / max(result.num_kept, 1)
        return result

    def repartition(self, batch, prune, m: dict):
        """The kept rollouts this DP rank trains on: equal counts on every rank and near-equal
        token loads, moving as few rollouts between ranks as a balanced partition allows."""
        from fastrl.distributed.dp_pruning import repartition, scale_local_advantages

        if self._prune_weights is not None:  # pruning.weighting: each rank scales its own rows first
            batch = scale_local_advantages(batch, self._prune_outcome, self._prune_weights)
        out = repartition(batch, self._prune_outcome)
        m["prune/kept_rows_this_rank"] = float(len(out))
        return out

    def add_logprobs(self, batch, m: dict) -> None:
        from fastrl.training.logprobs import mismatch_metrics, reduce_mismatch_metrics

        with self.timer.phase("old"):
            old = self.actor.log_probs(batch)
        batch.tensors["old_log_probs"] = old
        if self.reference is not None:
            from fastrl.training import logprobs as lp_ops

            with self.timer.phase("ref"):
                batch.tensors["ref_log_probs"] = lp_ops.compute_log_probs(
                    self.reference.chunks, batch, micro_batch_size=self.cfg.parallel.micro_batch_size,
                    temperature=self.actor.temperature,
                )
        m.update(reduce_mismatch_metrics(mismatch_metrics(old, batch.tensors["engine_log_probs"], batch.response_mask)))

    def update(self, batch, m: dict) -> None:
        mini = max(1, self.cfg.trainer.mini_batch_prompts * self.group_size() // self.ctx.dp_size)
        per = mini_batch_sizes(len(batch), mini, self.cfg.parallel.micro_batch_size)
        collected: dict[str, list[float]] = {}
        for _ in range(self.cfg.algorithm.ppo_epochs):
            start = 0
            for size in per:
                out = self.actor.update(batch.select(range(start, start + size)))
                start += size
                for k, v in out.items():
                    collected.setdefault(k, []).append(v)
        m.update({k: sum(v) / len(v) for k, v in collected.items()})
        m["actor/updates"] = float(len(per) * self.cfg.algorithm.ppo_epochs)

    def refit(self, m: dict) -> None:
        from fastrl.models.provider import export_hf_weights

        count = self.engine.update_weights(export_hf_weights(self.actor.policy))
        m["refit/tensors"] = float(count)

    def record_ars(self, prune, m: dict) -> None:
        n = self.group_size()
        counts = list(prune.kept_per_group.values())
        self.ars.record(counts)
        m["rollout/n"] = float(n)

    # ---- validation, loop ---------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        from fastrl.training.validation import validate

        sampling = SamplingParams.for_validation(self.cfg.rollout, seed=_seed(self.cfg.rollout.seed, 10**9))
        prompts = [self.prompt_of(r) for r in self.val]
        self.engine.wake()
        try:
            return validate(
                self.engine, prompts, self.val, self.scorer, sampling, n=self.cfg.rollout.val_n,
                threshold=self.cfg.reward.accuracy_threshold,
            )
        finally:
            self.engine.sleep()

    def end_period_if_due(self, m: dict) -> None:
        a = self.cfg.adaptive_sampling
        if not a.enabled:
            return
        due = (a.period == "steps" and self.step % a.period_steps == 0) or (
            a.period == "epoch" and getattr(self, "_epochs_completed", 0) > 0
        )
        if due and self.ars.num_recorded > 0:
            new_n = self.ars.end_period(self.step / max(self.total_steps, 1))
            m["ars/new_n"] = float(new_n)
            m.update({f"ars/{k}": float(v) for k, v in self.ars.last_decision.items() if isinstance(v, (int, float))})
            if self.ctx.is_logging_rank:
                logger.info("step %d: adaptive sampling period ended, n -> %d", self.step, new_n)

    # ---- the loop -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the grading workers."""
        self.scorer.close()

    def fit(self) -> dict[str, Any]:
        """Train until the run (or this Slurm stage) ends; returns a summary."""
        from fastrl.checkpoint.signals import StopRequest
        from fastrl.training.loop import run_loop

        with StopRequest((self.cfg.stage.exit_signal, "TERM")) as stop:
            return run_loop(self, stop)


def _global_mean_std(values: torch.Tensor) -> tuple[float, float]:
    """Mean and standard deviation of ``values`` over every DP rank (one all-reduce of 3 floats)."""
    v = values.double()
    stats = collectives.all_reduce_sum_dp(torch.stack([v.sum(), (v * v).sum(), torch.tensor(float(v.numel()), dtype=torch.float64)]))
    count = max(float(stats[2]), 1.0)
    mean = float(stats[0]) / count
    return mean, math.sqrt(max(float(stats[1]) / count - mean * mean, 0.0))


def _num_groups(scored: ScoredRollouts | None) -> int:
    return 0 if scored is None else len(scored.rollouts.n_per_prompt)


def _filter_informative(scored: ScoredRollouts) -> ScoredRollouts | None:
    """The groups whose accuracy varies (DAPO's filter), or None when there is none."""
    keep = dynamic_sampling_keep(scored.accuracy, scored.group_ids, valid=scored.valid)
    rows = torch.nonzero(keep).view(-1).tolist()
    return _select_scored(scored, rows) if rows else None


def _concat_scored(a: ScoredRollouts | None, b: ScoredRollouts | None) -> ScoredRollouts | None:
    """``a`` followed by ``b`` (prompt indices of ``b`` shifted)."""
    if a is None or b is None:
        return a if b is None else b
    ra, rb = a.rollouts, b.rollouts
    shift = len(ra.prompts)
    rollouts = Rollouts(
        prompts=ra.prompts + rb.prompts,
        prompt_inputs=ra.prompt_inputs + rb.prompt_inputs,
        n_per_prompt=ra.n_per_prompt + rb.n_per_prompt,
        prompt_index=ra.prompt_index + [p + shift for p in rb.prompt_index],
        response_token_ids=ra.response_token_ids + rb.response_token_ids,
        logprobs=ra.logprobs + rb.logprobs,
        finish_reasons=ra.finish_reasons + rb.finish_reasons,
        response_texts=ra.response_texts + rb.response_texts,
        metrics={k: ra.metrics.get(k, 0.0) + rb.metrics.get(k, 0.0) for k in ra.metrics},
    )
    cat = lambda x, y: torch.cat([x, y])  # noqa: E731
    return ScoredRollouts(
        rollouts, cat(a.group_ids, b.group_ids), cat(a.rewards, b.rewards), cat(a.accuracy, b.accuracy),
        cat(a.valid, b.valid), cat(a.formatted, b.formatted),
    )


def _select_scored(scored: ScoredRollouts, rows: list[int]) -> ScoredRollouts:
    """The rows ``rows`` of ``scored`` (whole groups), with the rollouts regrouped."""
    ro = scored.rollouts
    keep_prompts = sorted({ro.prompt_index[r] for r in rows})
    remap = {p: i for i, p in enumerate(keep_prompts)}
    sizes = [0] * len(keep_prompts)
    for r in rows:
        sizes[remap[ro.prompt_index[r]]] += 1
    idx = torch.as_tensor(rows, dtype=torch.long)
    new = Rollouts(
        prompts=[ro.prompts[p] for p in keep_prompts],
        prompt_inputs=[ro.prompt_inputs[p] for p in keep_prompts],
        n_per_prompt=sizes,
        prompt_index=[remap[ro.prompt_index[r]] for r in rows],
        response_token_ids=[ro.response_token_ids[r] for r in rows],
        logprobs=[ro.logprobs[r] for r in rows],
        finish_reasons=[ro.finish_reasons[r] for r in rows],
        response_texts=[ro.response_texts[r] for r in rows],
        metrics=dict(ro.metrics),
    )
    return ScoredRollouts(
        new, scored.group_ids[idx], scored.rewards[idx], scored.accuracy[idx], scored.valid[idx],
        scored.formatted[idx], None if scored.advantages is None else scored.advantages[idx],
    )
