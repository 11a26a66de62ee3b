"""GPU recipes: Qwen2.5-VL-3B / 7B / 32B / 72B-Instruct on Geometry3K and GeoQA8K-R1V.

Hyperparameters of the paper (arXiv 2609.36932, section 5): lr 1e-6, weight decay 1e-2, KL 0.01
(low_var_kl, as a loss), n = 8, 256 prompts per step, policy mini-batch 128 prompts, similarity
threshold 0.2 (tau = 0.8), clip 0.2 / 0.3, 25 epochs on Geometry3K and 15 on GeoQA8K.

Layouts (every one checked by the memory plan, fastrl/models/memory_plan.py; table in
docs/parallelism.md, "Memory plan"):

- one 8-GPU H100 node: 3B TP1 PP1 DP8, 7B TP2 PP1 DP4 (the paper's family);
  ``qwen25vl_{3b,7b}_[fastrl_]{grpo,dapo,gspo}_{geo3k,geoqa8k}_h100_{bf16,fp8}``;
- one H200: 3B TP1 DP1, ``qwen25vl_3b_fastrl_grpo_geo3k_1xh200_bf16``;
- multi-node, TP/PP as Megatron-Bridge's Qwen2.5-VL recipes (32B TP8 PP2, 72B TP8 PP4), generation
  with the engine's own tensor parallelism (vLLM TP8 within a node):
  ``qwen25vl_32b_fastrl_grpo_{geo3k,geoqa8k}_h100_{bf16,fp8}`` (2 nodes x 8 H100-80GB) and
  ``qwen25vl_72b_fastrl_grpo_{geo3k,geoqa8k}_h200_{bf16,fp8}`` (4 nodes x 8 H200).

32B runs with sequence parallelism (Transformer Engine layers) so that its update fits beside
the sleeping engine with the margin every recipe keeps at every phase of the memory plan's
timeline. Micro-batch 1 everywhere: the actor has no activation recomputation, and a micro-batch is padded
to its longest row (up to 2,048 + 2,048 tokens). The engine's share of each GPU
(``rollout.gpu_memory_utilization``) is what the memory plan leaves beside the actor, its optimizer
state and the reference policy (they stay on the GPU while the engine generates).
Precision variants: bf16 (fp32 master weights and optimizer state) and fp8 (Transformer Engine,
hybrid format, delayed scaling; refused at construction where Transformer Engine is missing).

Paths: model.hf_path is a Hugging Face hub id (resolved in the hub cache, see README "GPU quick
start") or a local directory; data.train_path / val_path point at the published parquet files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from fastrl.config import (
    AdaptiveSamplingConfig,
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    PruningConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)
from recipes.cpu import _dapo, _gspo, _with_fastrl
from recipes.registry import register

#: Usable GiB of one GPU (what the memory plan checks against; see fastrl/models/memory_plan.py).
H100_GIB, H200_GIB = 79.6, 140.4


@dataclass(frozen=True)
class Layout:
    """Where a model size runs: the actor's layout and the engine's share of each GPU."""

    hf_path: str
    parallel: ParallelConfig
    gpu_memory_utilization: float
    engine_tensor_parallel_size: int
    hardware: str  # for the docstrings: nodes x GPUs

    def describe(self) -> str:
        p = self.parallel
        return (
            f"{self.hardware}; layout TP{p.tensor_model_parallel_size} PP{p.pipeline_model_parallel_size} "
            f"DP{p.dp_size()}{' SP' if p.sequence_parallel else ''}, micro-batch {p.micro_batch_size}; vLLM TP{self.engine_tensor_parallel_size} "
            f"at {self.gpu_memory_utilization:g} of each GPU"
        )


def _layout(hf: str, tp: int, pp: int, world: int, gib: float, util: float, engine_tp: int, hardware: str,
            sequence_parallel: bool = False) -> Layout:
    parallel = ParallelConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, world_size=world, micro_batch_size=1,
        gpu_memory_gib=gib, backend="nccl",  # a GPU recipe never falls back to gloo on a CPU machine
        sequence_parallel=sequence_parallel,
    )
    return Layout(hf, parallel, util, engine_tp, hardware)


LAYOUTS = {
    "3b": _layout("Qwen/Qwen2.5-VL-3B-Instruct", 1, 1, 8, H100_GIB, 0.4, 1, "1 node x 8 H100-80GB"),
    "7b": _layout("Qwen/Qwen2.5-VL-7B-Instruct", 2, 1, 8, H100_GIB, 0.3, 1, "1 node x 8 H100-80GB"),
    "3b_1xh200": _layout("Qwen/Qwen2.5-VL-3B-Instruct", 1, 1, 1, H200_GIB, 0.2, 1, "1 H200"),
    # sequence parallel: without it the update on pipeline stage 0 (vision tower, two micro-batches in
    # flight) beside the sleeping engine left 2.1 GiB of an H100, under the shipped margin
    # (memory_plan.RECIPE_MARGIN); it splits the layers' replicated activations over TP8
    "32b": _layout("Qwen/Qwen2.5-VL-32B-Instruct", 8, 2, 16, H100_GIB, 0.22, 8, "2 nodes x 8 H100-80GB",
                   sequence_parallel=True),
    "72b": _layout("Qwen/Qwen2.5-VL-72B-Instruct", 8, 4, 32, H200_GIB, 0.4, 8, "4 nodes x 8 H200"),
}
_DATASETS = {
    # dataset key: (loader, reward, epochs, train, val)
    "geo3k": ("geometry3k", "geo3k", 25, "data/geometry3k/train.parquet", "data/geometry3k/test.parquet"),
    "geoqa8k": ("geoqa8k", "geoqa8k", 15, "data/geoqa8k/train.parquet", "data/geoqa8k/test.parquet"),
}
_ALGORITHMS = {"grpo": lambda c: c, "dapo": _dapo, "gspo": _gspo}


def paper_base(size: str, dataset: str, precision: str, name: str) -> RunConfig:
    """GRPO with the paper's hyperparameters (no pruning) on the layout ``LAYOUTS[size]``."""
    layout = LAYOUTS[size]
    loader, reward, epochs, train, val = _DATASETS[dataset]
    return RunConfig(
        recipe=name,
        model=ModelConfig(source="hf", hf_path=layout.hf_path, architecture="qwen2_5_vl"),
        parallel=layout.parallel,
        precision=PrecisionConfig(mode=precision, fp8_format="hybrid", fp8_recipe="delayed"),
        rollout=RolloutConfig(
            engine="vllm", n=8, prompts_per_step=256, temperature=1.0, top_p=1.0,
            max_prompt_length=2048, max_response_length=2048,
            engine_tensor_parallel_size=layout.engine_tensor_parallel_size,
            gpu_memory_utilization=layout.gpu_memory_utilization,
            engine_python=".venv-engine/bin/python",  # the engine environment of the README's GPU quick start
            # one generate request carries a step's rollouts (32B: 2,048 per engine in 34 KV waves of
            # 4,096-token sequences), and a 72B engine loads 145 GB before it is ready; a dead engine
            # is still reported at once (its exit), these bound a hung one
            engine_timeout_s=3600.0, engine_startup_timeout_s=1800.0,
        ),
        algorithm=AlgorithmConfig(
            advantage_estimator="grpo", clip_low=0.2, clip_high=0.3,
            use_kl_loss=True, kl_coef=0.01, kl_estimator="low_var_kl", overlong_cache_length=512,
        ),
        pruning=PruningConfig(method="none"),
        adaptive_sampling=AdaptiveSamplingConfig(enabled=False, period="epoch"),
        data=DataConfig(
            dataset=loader, train_path=train, val_path=val, template="geometry_thinking",
            min_pixels=262144, max_pixels=4194304, val_size=601,
        ),
        reward=RewardConfig(name=reward, num_workers=16),
        optimizer=OptimizerConfig(lr=1e-6, weight_decay=1e-2, clip_grad=1.0),
        trainer=TrainerConfig(epochs=epochs, mini_batch_prompts=128, val_every=5, torch_threads=8),
        # dp_reshardable: megatron-core 0.16.1's fully_reshardable save gathers each fp32 optimizer
        # state of a rank's whole gradient buffer on its GPU (8 P + 4 P / dp bytes), which no shipped
        # layout has room for beside its engine (memory plan, "save" phase; docs/parallelism.md)
        checkpoint=CheckpointConfig(save_every=20, keep_last=2, optimizer_format="dp_reshardable"),
    )


def _build(size: str, algo: str, fastrl: bool, dataset: str, precision: str, name: str) -> RunConfig:
    config = _ALGORITHMS[algo](paper_base(size, dataset, precision, name))
    if algo == "dapo":
        config = replace(config, algorithm=replace(config.algorithm, overlong_cache_length=512))
    return _with_fastrl(config) if fastrl else config


def _register(name: str, size: str, algo: str, fastrl: bool, dataset: str, precision: str) -> None:
    fn = partial(_build, size, algo, fastrl, dataset, precision, name)
    fn.__doc__ = (
        f"Qwen2.5-VL-{size.split('_')[0].upper()} {algo.upper()}{' + FastRL (MDAP + ARS per epoch)' if fastrl else ''} "
        f"on {dataset}, {precision}; {LAYOUTS[size].describe()}; 256 prompts x 8 per step."
    )
    register(name)(fn)


# the paper's family on one 8-GPU node: every algorithm, with and without FastRL
for _size in ("3b", "7b"):
    for _algo in _ALGORITHMS:
        for _fastrl in (False, True):
            for _dataset in _DATASETS:
                for _precision in ("bf16", "fp8"):
                    _register(f"qwen25vl_{_size}_{'fastrl_' if _fastrl else ''}{_algo}_{_dataset}_h100_{_precision}",
                              _size, _algo, _fastrl, _dataset, _precision)

# a single H200 (3B; 7B does not fit one GPU with its optimizer state, see docs/parallelism.md)
_register("qwen25vl_3b_fastrl_grpo_geo3k_1xh200_bf16", "3b_1xh200", "grpo", True, "geo3k", "bf16")

# large models on several nodes: GRPO + FastRL, bf16 and fp8
for _size, _gpu in (("32b", "h100"), ("72b", "h200")):
    for _dataset in _DATASETS:
        for _precision in ("bf16", "fp8"):
            _register(f"qwen25vl_{_size}_fastrl_grpo_{_dataset}_{_gpu}_{_precision}",
                      _size, "grpo", True, _dataset, _precision)
