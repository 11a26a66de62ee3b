"""Builds this rank's vLLM engine process from a run's configuration (``rollout.engine='vllm'``):
the ``vllm.LLM`` arguments, the child's environment (its GPUs or its CPU threads), the refit
transport and which weights the refit sends once (:func:`engine_client_from_config`; docs/engine.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from fastrl.rollout.engine_client import EngineProcessClient
from fastrl.rollout.engine_process import physical_gpus
from fastrl.rollout.refit_transport import transport_for_device


def frozen_vision_weight(name: str) -> bool:
    """A weight ``model.freeze_vision_tower`` keeps fixed: the vision blocks and the patch embedding
    (not the merger); such weights are sent on the first refit only."""
    if "visual." not in name:
        return False
    return name.split("visual.", 1)[1].startswith(("blocks.", "patch_embed."))


def engine_client_from_config(
    cfg: Any, policy_dir: str | os.PathLike, device: torch.device | str | None, *, gpus: Sequence[str] | None = None,
) -> EngineProcessClient:
    """This rank's engine process for a :class:`fastrl.config.RunConfig` with ``rollout.engine='vllm'``
    (docs/engine.md): fp32 runs get an fp32 engine, bf16/fp8 runs a bf16 one; on CPU the KV cache
    is ``rollout.engine_kv_cache_mb`` and the engine uses ``rollout.engine_threads`` OMP threads; on
    a GPU the engine sees only its GPUs (``CUDA_VISIBLE_DEVICES``: ``gpus``, the first
    ``rollout.engine_tensor_parallel_size`` GPUs of the rank's model-parallel group as
    :func:`fastrl.training.engine_placement.engine_gpus` finds them, else this rank's GPU and the
    ones after it) and sleeps between steps (level 2) when ``rollout.sleep_between_steps``. The refit transport follows the device
    (:func:`fastrl.rollout.refit_transport.transport_for_device`); images are resized into
    ``data.min_pixels`` / ``data.max_pixels`` on both sides.

    Raises:
        EngineStartError: see :class:`EngineProcessClient`.
    """
    ro = cfg.rollout
    dev = torch.device(device) if device is not None else torch.device("cpu")
    llm_kwargs: dict[str, Any] = {
        "dtype": "float32" if cfg.precision.mode == "fp32" else "bfloat16",
        "max_model_len": ro.max_prompt_length + ro.max_response_length + 8,
        "tensor_parallel_size": ro.engine_tensor_parallel_size,
    }
    env: dict[str, str] = {}
    if dev.type == "cuda":
        llm_kwargs.update(gpu_memory_utilization=ro.gpu_memory_utilization, enable_sleep_mode=ro.sleep_between_steps)
        if gpus is None:
            gpus = physical_gpus(dev.index or 0, ro.engine_tensor_parallel_size, os.environ.get("CUDA_VISIBLE_DEVICES"))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    else:
        llm_kwargs.update(kv_cache_memory_bytes=ro.engine_kv_cache_mb * 2**20, enforce_eager=True)
        threads = ro.engine_threads or cfg.trainer.torch_threads
        env["OMP_NUM_THREADS"] = str(threads)
    return EngineProcessClient(
        policy_dir, python=ro.engine_python, seed=ro.seed, suppress_special_tokens=ro.suppress_special_tokens,
        timeout_s=ro.engine_timeout_s, startup_timeout_s=ro.engine_startup_timeout_s, restart_retries=ro.engine_restart_retries,
        bucket_bytes=int(ro.refit_bucket_mb * 2**20),
        # frozen weights are sent once, unless a level-2 sleep discards them between refits (GPU)
        skip_after_first=frozen_vision_weight if cfg.model.freeze_vision_tower and not (
            dev.type == "cuda" and ro.sleep_between_steps) else None,
        name=f"vllm engine process of rank pid {os.getpid()}", llm_kwargs=llm_kwargs, env=env,
        verify_every=ro.verify_refit_every, verify_tolerance=cfg.verify_refit_tolerance,
        transport=transport_for_device(dev), min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
        sampling_temperature=ro.temperature,
    )
