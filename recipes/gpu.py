"""GPU recipes: Qwen2.5-VL-3B / 7B-Instruct on Geometry3K and GeoQA8K-R1V, one 8-GPU H100/H200 node.

Hyperparameters of the paper (arXiv 2609.36932, section 5): lr 1e-6, weight decay 1e-2, KL 0.01
(low_var_kl, as a loss), n = 8, 256 prompts per step, policy mini-batch 128 prompts, similarity
threshold 0.2 (tau = 0.8), clip 0.2 / 0.3, 25 epochs on Geometry3K and 15 on GeoQA8K.

Layouts (8 GPUs): 3B: TP1 PP1 DP8, micro-batch 4; 7B: TP2 PP1 DP4, micro-batch 4.
Precision variants: bf16 (fp32 master weights and optimizer state) and fp8 (Transformer Engine,
hybrid format, delayed scaling; refused at construction where Transformer Engine is missing).
Names: qwen25vl_{3b,7b}_[fastrl_]{grpo,dapo,gspo}_{geo3k,geoqa8k}_h100_{bf16,fp8}.

Paths: model.hf_path is the Hugging Face id or a local directory; data.train_path / val_path point
at the published parquet files (see README, "Data").
"""

from __future__ import annotations

from dataclasses import replace
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
from recipes.registry import register
from recipes.cpu import _dapo, _gspo, _with_fastrl

_MODELS = {
    "3b": ("Qwen/Qwen2.5-VL-3B-Instruct", ParallelConfig(tensor_model_parallel_size=1, world_size=8, micro_batch_size=4)),
    "7b": ("Qwen/Qwen2.5-VL-7B-Instruct", ParallelConfig(tensor_model_parallel_size=2, world_size=8, micro_batch_size=4)),
}
_DATASETS = {
    # dataset key: (loader, reward, epochs, train, val)
    "geo3k": ("geometry3k", "geo3k", 25, "data/geometry3k/train.parquet", "data/geometry3k/test.parquet"),
    "geoqa8k": ("geoqa8k", "geoqa8k", 15, "data/geoqa8k/train.parquet", "data/geoqa8k/test.parquet"),
}
_ALGORITHMS = {"grpo": lambda c: c, "dapo": _dapo, "gspo": _gspo}


def paper_base(size: str, dataset: str, precision: str, name: str) -> RunConfig:
    """GRPO on one 8-GPU node with the paper's hyperparameters (no pruning)."""
    hf_path, parallel = _MODELS[size]
    loader, reward, epochs, train, val = _DATASETS[dataset]
    return RunConfig(
        recipe=name,
        model=ModelConfig(source="hf", hf_path=hf_path, architecture="qwen2_5_vl"),
        parallel=parallel,
        precision=PrecisionConfig(mode=precision, fp8_format="hybrid", fp8_recipe="delayed"),
        rollout=RolloutConfig(
            engine="vllm", n=8, prompts_per_step=256, temperature=1.0, top_p=1.0,
            max_prompt_length=2048, max_response_length=2048, engine_tensor_parallel_size=1,
            gpu_memory_utilization=0.6,
        ),
        algorithm=AlgorithmConfig(
            name="grpo", advantage_estimator="grpo", clip_low=0.2, clip_high=0.3,
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
        checkpoint=CheckpointConfig(save_every=20, keep_last=2),
    )


def _build(size: str, algo: str, fastrl: bool, dataset: str, precision: str, name: str) -> RunConfig:
    config = _ALGORITHMS[algo](paper_base(size, dataset, precision, name))
    if algo == "dapo":
        config = replace(config, algorithm=replace(config.algorithm, overlong_cache_length=512))
    return _with_fastrl(config) if fastrl else config


for _size in _MODELS:
    for _algo in _ALGORITHMS:
        for _fastrl in (False, True):
            for _dataset in _DATASETS:
                for _precision in ("bf16", "fp8"):
                    _name = (
                        f"qwen25vl_{_size}_{'fastrl_' if _fastrl else ''}{_algo}_{_dataset}_h100_{_precision}"
                    )
                    _fn = partial(_build, _size, _algo, _fastrl, _dataset, _precision, _name)
                    _fn.__doc__ = (
                        f"Qwen2.5-VL-{_size.upper()} {_algo.upper()}{' + FastRL (MDAP + ARS per epoch)' if _fastrl else ''} "
                        f"on {_dataset}, 8x H100, {_precision}; layout TP{_MODELS[_size][1].tensor_model_parallel_size} "
                        f"PP1 DP{_MODELS[_size][1].dp_size()}, micro-batch 4, 256 prompts x 8 per step."
                    )
                    register(_name)(_fn)
