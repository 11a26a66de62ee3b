"""Rank functions of the rollout placement tests (importable by spawned processes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

PROMPT = "<|im_start|>user\n{vision}what color is the shape<|im_end|>\n<|im_start|>assistant\n"
VISION = "<|vision_start|><|image_pad|><|vision_end|>"


class RankSkewedEngine:
    """An engine whose sampling differs on every global rank (its seed is shifted by the rank), as
    engines on different GPUs would; counts its generate calls."""

    def __init__(self, engine: Any, rank: int) -> None:
        self.engine, self.rank, self.calls = engine, rank, 0
        self.pad_token_id = engine.pad_token_id

    def generate(self, prompts, n, sampling, *, weight_version=None):
        self.calls += 1
        return self.engine.generate(prompts, n, replace(sampling, seed=(sampling.seed or 0) + 1000 * self.rank),
                                    weight_version=weight_version)

    def wake(self) -> None:
        pass

    def sleep(self) -> None:
        pass


class Prompts:
    """The part of PromptSource that generate() uses."""

    def __init__(self, prompts: dict[int, Any]) -> None:
        self.prompts = prompts

    def prompt_of(self, record: Any) -> Any:
        return self.prompts[record]


def tp_rollout_worker(model_dir: Path, tp: int) -> dict[str, Any]:
    import torch
    from PIL import Image

    from fastrl.config import ParallelConfig, RolloutConfig
    from fastrl.distributed import parallel_state
    from fastrl.rollout.engine import RolloutPrompt, SamplingParams
    from fastrl.rollout.hf_engine import HFRolloutEngine
    from fastrl.training.generation import generate
    from fastrl.training.rollout_batch import ScoredRollouts, to_policy_batch
    from fastrl.training.seeds import derive_seed

    ctx = parallel_state.initialize(ParallelConfig(tensor_model_parallel_size=tp), seed=1)
    rollout = RolloutConfig(seed=ctx.rank, n=4, max_response_length=8, temperature=1.0, suppress_special_tokens=True)
    engine = RankSkewedEngine(HFRolloutEngine.from_pretrained(model_dir, rollout, device=ctx.device), ctx.rank)
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    prompts = Prompts({
        0: RolloutPrompt(PROMPT.format(vision=VISION), (image,)),
        1: RolloutPrompt(PROMPT.format(vision="")),
    })
    items = [(0, 0), (1, 1)]
    # what each rank's engine samples on its own for the same call (engines seeded per global rank,
    # sampling skewed per rank): differs between the peers
    sampling = SamplingParams.for_training(rollout, seed=derive_seed(rollout.seed, 7, ctx.dp_rank))
    local = engine.generate([prompts.prompt_of(r) for _, r in items], 4, sampling)
    calls_before = engine.calls
    shared = generate(engine, prompts, items, 4, rollout=rollout, seed=7, dp_rank=ctx.dp_rank)
    rows = len(shared)
    scored = ScoredRollouts(
        shared, group_ids=torch.tensor(shared.prompt_index), rewards=torch.zeros(rows), accuracy=torch.zeros(rows),
        valid=torch.ones(rows, dtype=torch.bool), formatted=torch.ones(rows, dtype=torch.bool),
    ).with_advantages(torch.zeros(rows))
    batch = to_policy_batch(scored, range(rows), pad_token_id=engine.pad_token_id)
    return {
        "tp_rank": ctx.tp_rank,
        "local": [t.tolist() for t in local.response_token_ids],
        "shared": [t.tolist() for t in shared.response_token_ids],
        "shared_logprobs": torch.cat(shared.logprobs),
        "generate_calls": engine.calls - calls_before,
        "prompts_are_local": shared.prompts == [prompts.prompt_of(r) for _, r in items],
        "input_ids": batch.input_ids,
        "pixels": batch.pixel_values[0],
    }


def wait_group_worker(tp: int, pp: int) -> dict[str, Any]:
    """Builds the model-parallel wait group (what :func:`parallel_state.initialize` does for NCCL runs
    with model parallelism; gloo here), then lets the first rank of each model-parallel group work
    alone for a while before its broadcast: the peers must wait on the wait group's barrier first."""
    import time

    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from fastrl.config import ParallelConfig
    from fastrl.distributed import collectives, parallel_state

    ctx = parallel_state.initialize(
        ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp), seed=1
    )
    assert parallel_state.model_parallel_wait_group() is None  # gloo run: the broadcast waits on the CPU itself
    wait = parallel_state.build_model_parallel_wait_group(timeout_s=60.0)
    barriers: list = []
    real_barrier = dist.barrier
    dist.barrier = lambda group=None, **k: barriers.append(group) or real_barrier(group=group, **k)
    parallel_state._MODEL_PARALLEL_WAIT_GROUP = wait
    try:
        source = collectives.is_model_parallel_source()
        if source:
            time.sleep(1.0)  # works alone
        start = time.monotonic()
        got = collectives.broadcast_object_model_parallel({"from": ctx.rank} if source else None)
        waited = time.monotonic() - start
    finally:
        dist.barrier = real_barrier
        parallel_state._MODEL_PARALLEL_WAIT_GROUP = None
    out = {
        "rank": ctx.rank, "dp_rank": ctx.dp_rank, "source": source, "got": got, "waited": waited,
        "wait_ranks": dist.get_process_group_ranks(wait), "wait_backend": dist.get_backend(wait),
        "mp_ranks": dist.get_process_group_ranks(mpu.get_model_parallel_group()),
        "barriers_on_wait": sum(1 for g in barriers if g is wait),
    }
    parallel_state.destroy()
    return out
