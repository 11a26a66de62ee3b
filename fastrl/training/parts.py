"""The components of a run, built once from its config: data, policy, actor, reference policy,
rollout engine, reward scorer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fastrl.config import RunConfig
from fastrl.data import Record
from fastrl.distributed.parallel_state import ParallelContext
from fastrl.training.prompting import PromptSource
from fastrl.training.run_data import RunData, load_run_data
from fastrl.training.timers import PhaseTimer

if TYPE_CHECKING:  # pragma: no cover
    from fastrl.models.provider import MegatronPolicy
    from fastrl.rewards import RewardScorer
    from fastrl.rollout.engine import RolloutEngine
    from fastrl.training.actor import Actor


@dataclass
class RunParts:
    """Everything a step needs besides the :class:`~fastrl.checkpoint.train_state.TrainState`.

    Attributes:
        cfg / ctx: the run's config and parallel context.
        run_dir: metrics, plots and checkpoints go here.
        policy_dir: the Hugging Face directory the run started from.
        prompts: the training prompts (records, chat rendering).
        val: the validation records.
        actor: the trainable megatron-core policy with its optimizer (the LR schedule is the train state's).
        reference: the frozen reference policy (KL), or None.
        engine: the rollout engine (:class:`fastrl.rollout.engine.RolloutEngine`) on the first rank
            of each model-parallel group; an :class:`~fastrl.training.engine_placement.EnginelessPeer`
            on the other ranks.
        scorer: the reward scorer (:class:`fastrl.rewards.RewardScorer`).
        timer: wall time per phase.
        data_metrics / start_metrics: logged once at step 0 (data report, warm start).
        test: the held-out test records (``data.test_size``; empty: no test evaluation).
    """

    cfg: RunConfig
    ctx: ParallelContext
    run_dir: Path
    policy_dir: Path
    prompts: PromptSource
    val: list[Record]
    actor: "Actor"
    reference: "MegatronPolicy | None"
    engine: "RolloutEngine"
    scorer: "RewardScorer"
    timer: PhaseTimer
    data_metrics: dict[str, float]
    start_metrics: dict[str, float]
    test: list[Record] = field(default_factory=list)

    def close(self) -> None:
        """Stop the grading workers."""
        self.scorer.close()


def total_steps(cfg: RunConfig, num_train: int) -> int:
    """Steps of the run: ``trainer.epochs`` over ``num_train`` prompts, capped by ``trainer.max_steps``."""
    t = cfg.trainer
    per_epoch = max(1, num_train // cfg.rollout.prompts_per_step)
    total = t.epochs * per_epoch
    return min(total, t.max_steps) if t.max_steps else total


def _check_memory(cfg: RunConfig, ctx: ParallelContext, policy_dir: Path) -> None:
    """On GPUs, before any model is built: refuse a memory plan that cannot fit this device
    (:func:`fastrl.models.memory_plan.startup_check`); rank 0 logs the plan."""
    if ctx.device.type != "cuda":
        return
    import logging

    from fastrl.models.memory_plan import GIB, startup_check

    device_gib = torch.cuda.get_device_properties(ctx.device).total_memory / GIB
    plan = startup_check(cfg, ctx.world_size, device_gib, policy_dir)
    if ctx.is_logging_rank:
        logging.getLogger("fastrl.memory").info("%s", plan.format() if plan else f"memory plan: no counts in {policy_dir}")


def build_parts(cfg: RunConfig, ctx: ParallelContext, run_dir: Path, data: RunData | None = None) -> RunParts:
    """Build every component of the run (collective). ``data``: the run's splits as
    :func:`~fastrl.training.run_data.load_run_data` loaded them before the process group started
    (None: loaded here)."""
    from fastrl.models.provider import build_policy
    from fastrl.rewards import RewardScorer
    from fastrl.training.actor import Actor
    from fastrl.training.engine_placement import build_rank_engine
    from fastrl.training.policy_source import prepare_policy_dir
    from fastrl.training.update_phase import refit, release_cached_memory

    timer = PhaseTimer.for_device(ctx.device)
    d = cfg.data
    data = load_run_data(cfg) if data is None else data
    train_split, val_split, test_split = data.train, data.val, data.test
    train = list(train_split.records)
    policy_dir, start_metrics = prepare_policy_dir(cfg, train=train)
    _check_memory(cfg, ctx, policy_dir)
    train, val, test = _filter_long_prompts(cfg, policy_dir, train_split, val_split, test_split)
    ckpt = cfg.model.megatron_checkpoint

    def policy(trainable: bool):
        built = build_policy(
            policy_dir, parallel=cfg.parallel, precision=cfg.precision, model=cfg.model,
            trainable=trainable, load_weights=ckpt is None,
        )
        if ckpt:
            from fastrl.checkpoint.resolve import load_megatron_checkpoint

            load_megatron_checkpoint(built.chunks, ckpt)
        return built

    alg, ro = cfg.algorithm, cfg.rollout
    actor = Actor(
        policy(True), algorithm=alg, optimizer=cfg.optimizer, parallel=cfg.parallel, precision=cfg.precision,
        temperature=ro.temperature if ro.temperature > 0 else 1.0,
    )
    reference = policy(False) if (alg.use_kl_loss and alg.kl_coef > 0 or alg.kl_in_reward) else None
    engine = build_rank_engine(cfg, ctx.device, lambda gpus: _build_engine(cfg, policy_dir, ctx.device, gpus))
    if ckpt:
        release_cached_memory(ctx.device)
        refit(engine, actor)  # the engine starts from the imported weights, not the HF directory's
    scorer = RewardScorer(cfg.reward.name, num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s)
    prompts = PromptSource(train, template=d.template, tokenizer=engine.tokenizer, image_size=d.prompt_image_size)
    return RunParts(
        cfg=cfg, ctx=ctx, run_dir=run_dir, policy_dir=policy_dir, prompts=prompts, val=val,
        actor=actor, reference=reference, engine=engine, scorer=scorer, timer=timer,
        data_metrics={
            **train_split.report.as_metrics(),
            "data/val_prompts_filtered_too_long": val_split.report.prompts_filtered_too_long,
        },
        start_metrics=start_metrics, test=test,
    )


def _filter_long_prompts(
    cfg: RunConfig, policy_dir: Path, train_split, val_split, test_split=None
) -> tuple[list[Record], list[Record], list[Record]]:
    """``rollout.max_prompt_length`` at load: the training and validation records whose prompt
    (chat template and image tokens included, with the policy's tokenizer) fits; the counts go to
    the splits' reports (start-up metrics ``data/prompts_filtered_too_long``,
    ``data/val_prompts_filtered_too_long``) and the log. Every held-out test record must fit.

    Raises:
        DataError: no training prompt fits, or a held-out test prompt does not."""
    from transformers import AutoTokenizer

    from fastrl.data import DataError
    from fastrl.training.prompting import filter_long_prompts_at_load

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    common = dict(data=cfg.data, max_prompt_length=cfg.rollout.max_prompt_length, tokenizer=tokenizer)
    train = filter_long_prompts_at_load(train_split.records, train_split.report, what="training data", **common)
    val = filter_long_prompts_at_load(val_split.records, val_split.report, what="validation data", **common)
    test = (filter_long_prompts_at_load(test_split.records, test_split.report, what="test data", **common)
            if test_split is not None else [])
    if test_split is not None and len(test) < len(test_split.records):
        kept_ids = {r.question_id for r in test}
        dropped = [test_split.report.where(r.question_id) for r in test_split.records if r.question_id not in kept_ids]
        raise DataError(
            f"{len(dropped)} of the data.test_size={len(test_split.records)} held-out test "
            f"questions are longer than rollout.max_prompt_length={cfg.rollout.max_prompt_length} tokens (image tokens "
            f"included; {', '.join(dropped[:5])}{', ...' if len(dropped) > 5 else ''}): a test evaluation without them "
            "would be reported as if on the whole split. Raise rollout.max_prompt_length, lower data.max_pixels, or "
            "remove them from the test file"
        )
    if not train:
        raise DataError(
            f"every training prompt is longer than rollout.max_prompt_length={cfg.rollout.max_prompt_length} "
            "tokens (image tokens included); raise it or lower data.max_pixels"
        )
    return train, val, test


def _build_engine(cfg: RunConfig, policy_dir: Path, device: torch.device, gpus: list[str] | None = None):
    """The engine of a generating rank (the first of its model-parallel group; the others hold an
    :class:`~fastrl.training.engine_placement.EnginelessPeer`,
    :func:`~fastrl.training.engine_placement.build_rank_engine`), on this rank's device
    (``cuda:<LOCAL_RANK>`` under NCCL, else the CPU; a vLLM engine with tensor parallelism sees
    ``gpus``, its model-parallel group's first GPUs), with
    the run's image-processor bounds ``data.min_pixels`` / ``data.max_pixels``: the Hugging Face
    engine's processor, or for vLLM both the engine process's processor and its client's
    (:func:`~fastrl.rollout.engine_factory.engine_client_from_config`), so the trainer's prompt inputs,
    which come from the engine side, match what the engine saw."""
    if cfg.rollout.engine == "vllm":
        from fastrl.rollout.engine_factory import engine_client_from_config  # vLLM in its own process

        return engine_client_from_config(cfg, policy_dir, device, gpus=gpus)
    from fastrl.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine.from_pretrained(
        policy_dir, cfg.rollout, device=device, min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels
    )
