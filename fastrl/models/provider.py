"""megatron-core actor and reference policy built from a Hugging Face directory.

megatron-bridge's ``AutoBridge`` reads the Hugging Face config, picks the matching provider
(Qwen2.5-VL: vision tower + mrope language model; Qwen2 / Llama: GPT model) and loads the weights
with the tensor/pipeline-parallel split of this process. This module adds what FastRL needs around
it: the layer spec and precision chosen by :mod:`fastrl.models.layer_spec`, the upstream fixes of
:mod:`fastrl.compat` (CPU settings; fused kernels without their CUDA extension; ``mrope_section``
from the Hugging Face config, which the bridge leaves at its default), DDP wrapping for the trainable actor, a frozen reference policy, and the
streaming export back to Hugging Face names for the rollout engine's weight refit.

Call after :func:`fastrl.distributed.parallel_state.initialize` (the bridge reads the parallel state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from fastrl import compat
from fastrl.config import ModelConfig, ParallelConfig, PrecisionConfig
from fastrl.models.layer_spec import LayerChoice, choose_layers

#: Hugging Face ``model_type`` -> FastRL architecture name.
SUPPORTED_MODEL_TYPES = {"qwen2_5_vl": "qwen2_5_vl", "qwen2": "qwen2", "llama": "llama"}


@dataclass
class MegatronPolicy:
    """A policy as megatron-core model chunks plus what is needed to convert it back.

    Attributes:
        chunks: the model chunks of this pipeline stage (one without virtual pipelining), wrapped in
            megatron DDP when trainable (and in ``Float16Module`` for bf16).
        bridge: the megatron-bridge ``AutoBridge`` (weight mapping to and from Hugging Face names).
        config: the provider, a megatron ``TransformerConfig``.
        is_vision_language: True for Qwen2.5-VL (forward takes pixel values and image grids).
        layers: the layer spec and precision choice.
        trainable: False for the frozen reference policy.
    """

    chunks: list[torch.nn.Module]
    bridge: Any
    config: Any
    is_vision_language: bool
    layers: LayerChoice
    trainable: bool

    @property
    def vocab_size(self) -> int:
        """Padded vocabulary size of the output layer (all TP ranks together)."""
        return int(self.config.vocab_size)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        for chunk in self.chunks:
            yield from chunk.parameters()


def read_model_type(hf_dir: str | Path) -> str:
    """The FastRL architecture of a Hugging Face directory, from ``config.json``'s ``model_type``.

    Raises:
        FileNotFoundError: no ``config.json`` in ``hf_dir``.
        ValueError: a model type FastRL does not support.
    """
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; model.hf_path must be a Hugging Face model directory")
    model_type = json.loads(path.read_text()).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{path}: model_type={model_type!r} is not supported; FastRL supports "
            f"{sorted(SUPPORTED_MODEL_TYPES)}"
        )
    return SUPPORTED_MODEL_TYPES[model_type]


def _configure_provider(
    provider: Any,
    hf_config: Any,
    *,
    parallel: ParallelConfig,
    layers: LayerChoice,
    is_vision_language: bool,
    seed: int,
) -> None:
    provider.tensor_model_parallel_size = parallel.tensor_model_parallel_size
    provider.pipeline_model_parallel_size = parallel.pipeline_model_parallel_size
    provider.sequence_parallel = parallel.sequence_parallel
    provider.transformer_layer_spec = layers.spec
    provider.seed = seed
    provider.attention_dropout = 0.0
    provider.hidden_dropout = 0.0
    for key, value in layers.config_overrides.items():
        setattr(provider, key, value)
    overrides = compat.cpu_transformer_overrides() if not torch.cuda.is_available() else compat.cuda_kernel_overrides()
    for key, value in overrides.items():
        setattr(provider, key, value)
    if is_vision_language:
        compat.set_mrope_section(provider, hf_config)


def build_policy(
    hf_dir: str | Path,
    *,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    model: ModelConfig | None = None,
    trainable: bool = True,
    load_weights: bool = True,
) -> MegatronPolicy:
    """Build the actor (``trainable=True``) or the frozen reference policy from ``hf_dir``.

    Args:
        hf_dir: Hugging Face directory (config, safetensors weights).
        parallel: TP / PP layout (must match the initialized parallel state) and DDP options.
        precision: fp32 / bf16 / fp8 (fp8 needs Transformer Engine, see ``layer_spec``).
        model: seed and vision-tower freezing (defaults of :class:`ModelConfig` when None).
        trainable: wrap in megatron DDP for training; False builds a frozen model without DDP
            (the reference policy), every parameter with ``requires_grad=False``.
        load_weights: load ``hf_dir``'s weights (False: random initialization from ``model.seed``).

    Raises:
        ConfigError: fp8 without Transformer Engine.
        FileNotFoundError / ValueError: see :func:`read_model_type`.
    """
    from megatron.core.distributed import DistributedDataParallelConfig

    model = model or ModelConfig()
    arch = read_model_type(hf_dir)
    is_vl = arch == "qwen2_5_vl"
    layers = choose_layers(precision, sequence_parallel=parallel.sequence_parallel)
    AutoBridge = compat.import_auto_bridge()  # also extends active CPU patches to the modules it loaded
    bridge = AutoBridge.from_hf_pretrained(str(hf_dir), torch_dtype=torch.float32)
    provider = bridge.to_megatron_provider(load_weights=load_weights)
    # megatron-core marks tensor-parallel weights (``tensor_model_parallel``, used by the grad norm,
    # the DistributedOptimizer and checkpoints) only inside its weight initialization; the bridge
    # turns that off when it loads weights, which leaves TP shards counted as duplicates (the grad
    # norm is then wrong at TP > 1). Initialize, then let the bridge overwrite the values.
    provider.perform_initialization = True
    _configure_provider(
        provider, bridge.hf_pretrained.config, parallel=parallel, layers=layers, is_vision_language=is_vl, seed=model.seed
    )
    if is_vl:
        provider.freeze_vision_model = model.freeze_vision_tower
    provider.finalize()
    bf16 = precision.mode != "fp32"
    ddp_config = None
    if trainable:
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            use_distributed_optimizer=parallel.use_distributed_optimizer,
            check_for_nan_in_grad=False,
            bucket_size=None,
        )
    chunks = provider.provide_distributed_model(
        ddp_config=ddp_config,
        wrap_with_ddp=trainable,
        bf16=bf16,
        use_cpu_initialization=not torch.cuda.is_available(),
        data_parallel_random_init=False,
    )
    if not trainable:
        for chunk in chunks:
            chunk.eval()
            for p in chunk.parameters():
                p.requires_grad_(False)
    return MegatronPolicy(
        chunks=list(chunks),
        bridge=bridge,
        config=provider,
        is_vision_language=is_vl,
        layers=layers,
        trainable=trainable,
    )


def export_hf_weights(policy: MegatronPolicy, *, cpu: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream the policy's weights as ``(hf_name, tensor)`` pairs, full (unsharded) tensors.

    Names are the on-disk Hugging Face names (``model.layers.*``, ``visual.*``, ``lm_head.weight``).
    Every rank of the model-parallel group takes part (TP all-gathers, PP broadcasts) and receives
    every tensor; the consumer (the rollout engine's weight refit) normally uses them on one rank.
    Tensors have the model's parameter dtype.
    """
    for name, tensor in policy.bridge.export_hf_weights(policy.chunks, cpu=cpu, show_progress=False):
        yield name, tensor.detach()


def offload_to_cpu(policy: MegatronPolicy) -> None:
    """Move a frozen policy's parameters to CPU memory (between uses of the reference policy)."""
    for p in policy.parameters():
        p.data = p.data.to("cpu", non_blocking=True)


def reload_to_device(policy: MegatronPolicy, device: torch.device) -> None:
    """Move a policy's parameters back to ``device`` after :func:`offload_to_cpu`."""
    for p in policy.parameters():
        p.data = p.data.to(device, non_blocking=True)
