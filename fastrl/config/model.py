"""Config sections of the policy model and its hardware layout: architecture and initial weights,
tensor / pipeline / data parallel layout, numeric precision (bf16, FP8 through Transformer Engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastrl.config.fields import ConfigError, _check, _check_seed, doc, transformer_engine_available

__all__ = ["ModelConfig", "ParallelConfig", "PrecisionConfig"]

_TINY_SIZES = (
    "tiny_hidden_size", "tiny_num_layers", "tiny_num_attention_heads", "tiny_num_key_value_heads",
    "tiny_intermediate_size", "tiny_vision_depth", "tiny_vision_hidden_size",
)


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The policy architecture and where its initial weights come from."""

    source: Literal["tiny", "hf"] = doc(
        "tiny",
        "'tiny': build the small random Qwen2.5-VL-architecture model described by the tiny_* "
        "fields (CPU runs and tests); 'hf': a Hugging Face config or checkpoint directory in hf_path.",
    )
    hf_path: str | None = doc(
        None, "Hugging Face checkpoint (or config-only) directory; required when source='hf'."
    )
    architecture: Literal["qwen2_5_vl", "qwen2", "llama"] = doc(
        "qwen2_5_vl", "Model family. Text-only families go through the same megatron-bridge path."
    )
    megatron_checkpoint: str | None = doc(
        None,
        "Initial actor weights from a megatron distributed checkpoint made by "
        "tools/convert_checkpoint.py import (skips the HF conversion at start-up).",
    )
    tiny_hidden_size: int = doc(256, "Tiny model: language-model hidden size.")
    tiny_num_layers: int = doc(4, "Tiny model: language-model transformer layers.")
    tiny_num_attention_heads: int = doc(4, "Tiny model: attention heads (query).")
    tiny_num_key_value_heads: int = doc(2, "Tiny model: key/value heads (grouped-query attention).")
    tiny_intermediate_size: int = doc(512, "Tiny model: MLP intermediate size.")
    tiny_vision_depth: int = doc(2, "Tiny model: vision transformer blocks.")
    tiny_vision_hidden_size: int = doc(128, "Tiny model: vision transformer hidden size.")
    freeze_vision_tower: bool = doc(False, "Keep the vision tower (not the merger) frozen during RL.")
    seed: int = doc(1234, "Seed of the random initialization (tiny model) and of megatron's RNG tracker.")

    def __post_init__(self) -> None:
        _check(
            self.source != "hf" or bool(self.hf_path),
            "model.source='hf' needs model.hf_path (a Hugging Face checkpoint or config directory)",
        )
        for name in _TINY_SIZES:
            _check(getattr(self, name) >= 1, f"model.{name} must be >= 1, got {getattr(self, name)}")
        _check_seed(self.seed, "model.seed")
        _check(
            self.source != "tiny" or self.architecture in ("qwen2_5_vl", "qwen2"),
            f"model.source='tiny' builds a Qwen2.5-VL-architecture model (or, with architecture='qwen2', "
            f"its language model alone), but model.architecture={self.architecture!r}; use source='hf' for other models",
        )
        _check(
            self.tiny_hidden_size % self.tiny_num_attention_heads == 0,
            f"model.tiny_hidden_size ({self.tiny_hidden_size}) must be divisible by "
            f"model.tiny_num_attention_heads ({self.tiny_num_attention_heads})",
        )
        _check(
            self.tiny_num_attention_heads % self.tiny_num_key_value_heads == 0,
            f"model.tiny_num_attention_heads ({self.tiny_num_attention_heads}) must be divisible by "
            f"model.tiny_num_key_value_heads ({self.tiny_num_key_value_heads})",
        )
        if self.source == "tiny":  # the rules of fastrl.models.tiny.tiny_qwen25vl_config
            head_dim = self.tiny_hidden_size // self.tiny_num_attention_heads
            _check(
                head_dim % 8 == 0,
                f"model.tiny_hidden_size / model.tiny_num_attention_heads = {head_dim} must be a multiple "
                f"of 8 (the tiny model's multimodal RoPE sections)",
            )
            _check(
                self.tiny_vision_hidden_size % 32 == 0,
                f"model.tiny_vision_hidden_size ({self.tiny_vision_hidden_size}) must be a multiple of 32",
            )


@dataclass(kw_only=True, frozen=True)
class ParallelConfig:
    """Tensor / pipeline / data parallel layout of the actor (megatron-core parallel state)."""

    tensor_model_parallel_size: int = doc(1, "Tensor-parallel size (TP).")
    pipeline_model_parallel_size: int = doc(1, "Pipeline-parallel size (PP), 1F1B schedule.")
    world_size: int | None = doc(
        None,
        "Expected number of processes (GPUs). None: taken from the launcher (torchrun, srun, mpirun) "
        "at start-up. Data-parallel size dp = world_size / (TP x PP).",
    )
    micro_batch_size: int = doc(1, "Rollouts per micro-batch per data-parallel rank.")
    sequence_parallel: bool = doc(False, "Megatron sequence parallelism (needs TP > 1).")
    use_distributed_optimizer: bool = doc(
        True, "Shard optimizer state across data-parallel ranks (megatron DistributedOptimizer)."
    )
    backend: Literal["auto", "nccl", "gloo"] = doc(
        "auto", "torch.distributed backend; 'auto' is NCCL with GPUs and gloo on CPU."
    )
    gpu_memory_gib: float | None = doc(
        None,
        "Memory of one GPU (GiB) the memory plan is checked against (fastrl/models/memory_plan.py): "
        "with --dry-run and parallel.world_size set, and at start-up on GPUs, where the device's own "
        "memory is used when it is smaller or this is none. None on --dry-run: 79.6 (H100 80GB).",
    )

    @property
    def model_parallel_size(self) -> int:
        """TP x PP: processes holding one replica of the model."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    def dp_size(self, world_size: int | None = None) -> int:
        """Data-parallel size for ``world_size`` processes (default: the configured one).

        Raises:
            ConfigError: world size unknown or not divisible by TP x PP.
        """
        world = world_size if world_size is not None else self.world_size
        if world is None:
            raise ConfigError(
                "parallel.world_size is not set; pass the launcher's world size to dp_size()"
            )
        _check(
            world % self.model_parallel_size == 0,
            f"world size ({world}) must be divisible by tensor_model_parallel_size "
            f"({self.tensor_model_parallel_size}) x pipeline_model_parallel_size "
            f"({self.pipeline_model_parallel_size})",
        )
        return world // self.model_parallel_size

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size"):
            _check(getattr(self, name) >= 1, f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.world_size is not None:
            _check(
                self.world_size >= 1,
                f"parallel.world_size must be >= 1 (or none: the launcher's), got {self.world_size}",
            )
            self.dp_size()
        _check(
            not self.sequence_parallel or self.tensor_model_parallel_size > 1,
            "parallel.sequence_parallel=true needs tensor_model_parallel_size > 1",
        )
        _check(
            self.gpu_memory_gib is None or 0 < self.gpu_memory_gib < float("inf"),
            f"parallel.gpu_memory_gib must be a positive number of GiB (or none), got {self.gpu_memory_gib}",
        )


@dataclass(kw_only=True, frozen=True)
class PrecisionConfig:
    """Numeric precision of the actor: parameters, compute, and FP8 through Transformer Engine."""

    mode: Literal["fp32", "bf16", "fp8"] = doc(
        "fp32",
        "fp32: everything in fp32. bf16: bf16 parameters and compute, fp32 master weights and "
        "optimizer state (megatron mixed precision). fp8: bf16 as above plus FP8 GEMMs through "
        "Transformer Engine layers (GPU only; refused when Transformer Engine is missing).",
    )
    fp8_format: Literal["e4m3", "hybrid"] = doc(
        "hybrid", "FP8 format: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients)."
    )
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = doc(
        "delayed", "FP8 scaling recipe, as megatron-core 0.16 names them."
    )
    fp8_amax_history_len: int = doc(1024, "Delayed scaling: amax history length (steps).")
    fp8_amax_compute_algo: Literal["max", "most_recent"] = doc(
        "max", "Delayed scaling: how the scale is derived from the amax history."
    )
    fp8_margin: int = doc(0, "Delayed scaling: margin (powers of two) of the FP8 scale.")

    @property
    def params_dtype(self) -> str:
        """'float32' or 'bfloat16': dtype of model parameters."""
        return "float32" if self.mode == "fp32" else "bfloat16"

    def __post_init__(self) -> None:
        _check(self.fp8_amax_history_len >= 1, f"precision.fp8_amax_history_len must be >= 1, got {self.fp8_amax_history_len}")
        _check(self.fp8_margin >= 0, f"precision.fp8_margin must be >= 0, got {self.fp8_margin}")
        if self.mode != "fp8":
            return
        _check(
            not (self.fp8_recipe == "mxfp8" and self.fp8_format == "hybrid"),
            "precision.fp8_recipe='mxfp8' does not support precision.fp8_format='hybrid' "
            "(MXFP8 uses e4m3 block scales); set precision.fp8_format=e4m3",
        )


def check_machine_supports(precision: PrecisionConfig) -> None:
    """The check, before training starts on this machine, that it can run ``precision``: FP8 needs
    NVIDIA Transformer Engine's PyTorch layers. A property of the machine, not of the config:
    ``--dry-run`` and ``--describe`` plan and print FP8 recipes anywhere.

    Raises:
        ConfigError: ``precision.mode='fp8'`` and Transformer Engine is not importable here.
    """
    _check(
        precision.mode != "fp8" or transformer_engine_available(),
        "precision.mode='fp8' needs NVIDIA Transformer Engine, which is not importable here; "
        "install requirements/gpu.txt on a CUDA machine, or choose precision.mode=bf16. "
        "FastRL never falls back to bf16 silently when FP8 was requested.",
    )
