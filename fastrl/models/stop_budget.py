"""How long a stage needs between its stop signal and its exit (``slurm/submit.sh --grace``).

Slurm's stop signal (``sbatch --signal=B:USR1@<grace>``) comes ``grace`` seconds before the time
limit; the trainer then finishes the step it is in, which may be a validation step, and saves
(``fastrl/training/loop.py``). The grace must hold all three, or the job is killed before its
checkpoint is complete and the stage's steps are lost. :func:`estimate_stop_budget` sizes them
from the memory plan's counts; every rate in it is an assumption, none measured on a GPU yet, and
each is chosen so that the estimate errs high:

- training (old / reference log-probs, update): ``(2 + 2 [reference] + 6) x P`` FLOPs per token of
  every rollout padded to ``max_prompt_length + max_response_length``, at :data:`TRAIN_MFU` of
  :data:`BF16_TFLOPS` on every GPU;
- generation and validation: vLLM's decode is bound by reading the engine's weights once per
  token (``2 P / engine TP`` bytes) at :data:`HBM_EFFICIENCY` of the GPU's memory bandwidth, for
  ``max_response_length`` tokens per wave of the memory plan's KV check (prefill not counted: it
  is compute-bound and short beside the decode);
- the save: the checkpoint (bf16 weights ``2 P``, fp32 main weights and Adam moments ``12 P``)
  written at :data:`STORAGE_GBPS` per node, all nodes writing at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastrl.config import RunConfig
from fastrl.models.memory_timeline import MemoryPlan
from fastrl.models.model_dims import ModelDims

#: Dense bf16 tensor-core peak of an H100 / H200 SXM (TFLOP/s).
BF16_TFLOPS = 989.0
#: Model FLOPs utilization assumed for the trainer's passes (Megatron-LM reports 0.4-0.5 at scale).
TRAIN_MFU = 0.3
#: HBM bandwidth (TB/s): H100 SXM 3.35, H200 4.8 (the H200 when a GPU has more than 100 GiB).
HBM_TBPS_H100, HBM_TBPS_H200 = 3.35, 4.8
#: Fraction of the bandwidth vLLM's decode reaches while reading the weights.
HBM_EFFICIENCY = 0.5
#: Checkpoint write bandwidth of the shared storage per node (GB/s): a conservative figure for a
#: parallel file system seen from one node.
STORAGE_GBPS = 1.0
#: The smallest grace FastRL asks for (slurm/submit.sh's default).
MIN_GRACE_S = 300
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class StopBudget:
    """Seconds a stop needs: one step (generation + training), a validation, a save."""

    generation_s: float
    training_s: float
    validation_s: float
    save_s: float
    checkpoint_gb: float
    nodes: int

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s + self.validation_s + self.save_s

    @property
    def grace_s(self) -> int:
        """The grace to ask for: the total rounded up to a minute, at least :data:`MIN_GRACE_S`."""
        return max(MIN_GRACE_S, 60 * math.ceil(self.total_s / 60))

    def describe(self) -> str:
        """The ``--dry-run`` line that ``slurm/submit.sh`` reads (``# stop grace: >= N s ...``)."""
        return (
            f"stop grace: >= {self.grace_s} s (one step: generation {self.generation_s:.0f} s + training "
            f"{self.training_s:.0f} s; a validation {self.validation_s:.0f} s; a save {self.save_s:.0f} s: "
            f"{self.checkpoint_gb:.0f} GB at {STORAGE_GBPS:g} GB/s per node on {self.nodes} node"
            f"{'s' if self.nodes != 1 else ''}; estimated, not measured: fastrl/models/stop_budget.py)"
        )


def estimate_stop_budget(cfg: RunConfig, plan: MemoryPlan, dims: ModelDims, world_size: int) -> StopBudget:
    """The stop budget of ``cfg`` on ``world_size`` GPUs with its memory ``plan`` (pure arithmetic;
    see the module docstring for every assumption)."""
    ro, alg = cfg.rollout, cfg.algorithm
    params = dims.total_params()
    has_reference = (alg.use_kl_loss and alg.kl_coef > 0) or alg.kl_in_reward
    tokens = ro.prompts_per_step * ro.n * (ro.max_prompt_length + ro.max_response_length)
    flops = (2 + (2 if has_reference else 0) + 6) * params * tokens
    training = flops / (world_size * BF16_TFLOPS * 1e12 * TRAIN_MFU)
    hbm = (HBM_TBPS_H200 if plan.gpu_memory_gib > 100 else HBM_TBPS_H100) * 1e12 * HBM_EFFICIENCY
    per_token = 2 * params / plan.engine_tp / hbm  # one decode step reads the engine's weight shard
    waves = {k.phase: max(1, k.waves) for k in plan.kv_checks}
    generation = waves.get("training", 1) * ro.max_response_length * per_token
    validation = waves.get("validation", 1) * ro.max_response_length * per_token
    trainable = params - (dims.vision_block_params() if cfg.model.freeze_vision_tower else 0)
    # fp32 main weights + Adam's two moments, in every precision mode (megatron's fully_reshardable
    # format stores the main weights even when they equal an fp32 model's: SmolLM2-135M's fp32
    # checkpoints take 2,154 MB, 16 bytes a parameter)
    optimizer = 12 * trainable if cfg.checkpoint.save_optimizer else 0
    checkpoint_gb = ((4 if cfg.precision.mode == "fp32" else 2) * params + optimizer) / 1e9
    nodes = max(1, math.ceil(world_size / GPUS_PER_NODE))
    return StopBudget(generation_s=generation, training_s=training, validation_s=validation,
                      save_s=checkpoint_gb / nodes / STORAGE_GBPS, checkpoint_gb=checkpoint_gb, nodes=nodes)
