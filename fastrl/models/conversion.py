"""Checkpoint conversion: Hugging Face <-> megatron-core distributed checkpoints, through megatron-bridge.

Two directions, both collective over ``TP x PP`` processes (after
:func:`fastrl.distributed.parallel_state.initialize`):

- :func:`import_hf`: a Hugging Face directory -> an *imported checkpoint* the trainer loads directly
  (``model.megatron_checkpoint``). megatron-bridge's ``AutoBridge`` loads the weights into the
  megatron model of this layout; megatron ``dist_checkpointing`` writes them in the same format
  as the actor of a trainer checkpoint (:func:`fastrl.checkpoint.state.actor_sharded_state_dict`).
- :func:`export_hf`: a trainer checkpoint (``RUN_DIR/checkpoints``, latest complete step or a given
  one) or an imported checkpoint -> Hugging Face safetensors + ``config.json`` + tokenizer and
  processor files. The checkpoint is loaded at the layout of the exporting processes (saved at
  any TP/PP; dist_checkpointing reshards), megatron-bridge gathers each weight to its full
  Hugging Face tensor, and rank 0 streams them into safetensors shards of at most
  ``max_shard_bytes``: the only full-size tensors held besides the sharded model are those of one
  output shard.

Layout of an imported checkpoint::

    DIR/actor/              megatron dist_checkpointing of {"model": <sharded state dict>}
    DIR/hf/                 config.json, generation config, tokenizer and processor files of the
                            source model (no weights): the architecture to build before loading
    DIR/fastrl_import.json  source Hugging Face directory, model type, TP/PP and dtype written,
                            and the Hugging Face weight names (megatron-bridge needs them to export)
    DIR/COMPLETE            marker in the format of fastrl.checkpoint.manager (files + sizes)

The trainer starts from it with ``build_policy(DIR/hf, ..., load_weights=False)`` followed by
:func:`load_megatron_checkpoint` (any TP/PP: dist_checkpointing reshards).

Every checkpoint is checked with :meth:`CheckpointManager.verify` before it is read, so a
truncated or partly copied one fails with a :class:`CheckpointError` naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

import torch

from fastrl.checkpoint.manager import COMPLETE_MARKER, CheckpointError, CheckpointManager
from fastrl.checkpoint.state import TRAIN_STATE
from fastrl.distributed import world

IMPORT_INFO = "fastrl_import.json"
EXPORT_INFO = "fastrl_export.json"
HF_FILES_DIR = "hf"
ACTOR_DIR = "actor"
FORMAT_VERSION = 1

#: File name endings of weight files (never copied as "metadata" of a model directory).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
WEIGHT_INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
#: Files never copied from a model directory: the tiny model's build stamp (it describes the random
#: initialization, not these weights) and this module's own records.
SKIPPED_FILES = ("fastrl_tiny_model.json", "fastrl_import.json", "fastrl_export.json", COMPLETE_MARKER)
#: Sub-directories of a model directory copied with it (the tiny model's tokenizer-only copy).
COPIED_SUBDIRS = ("tokenizer",)

DType = Literal["auto", "float32", "bfloat16"]
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConversionError(CheckpointError):
    """A conversion that cannot be done (bad input directory, mapping mismatch, existing output)."""


# --------------------------------------------------------------------------------------------
# Model directories and checkpoints
# --------------------------------------------------------------------------------------------


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


def _precision(dtype: torch.dtype):
    from fastrl.config import PrecisionConfig

    return PrecisionConfig(mode="bf16" if dtype == torch.bfloat16 else "fp32")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified checkpoint directory to export.

    Attributes:
        path: the checkpoint directory (``step_XXXXXXXX`` or an imported checkpoint).
        kind: ``"trainer"`` (written by the trainer) or ``"import"`` (by :func:`import_hf`).
        step: training step (0 for an imported checkpoint).
    """

    path: Path
    kind: Literal["trainer", "import"]
    step: int


def resolve_checkpoint(ckpt: str | os.PathLike, step: int | None = None) -> ResolvedCheckpoint:
    """Find and verify the checkpoint that ``ckpt`` (and ``step``) name.

    ``ckpt`` is a checkpoint root (``RUN_DIR/checkpoints``: the newest complete step, or
    ``step_{step:08d}``), one step directory, or an imported checkpoint.

    Raises:
        CheckpointError: no such directory, no complete checkpoint, or one that fails
            :meth:`CheckpointManager.verify` (the message names the file).
    """
    path = Path(ckpt)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    if not (path / COMPLETE_MARKER).exists() and not (path / ACTOR_DIR).exists():
        manager = CheckpointManager(path)
        if step is not None:
            path = path / f"step_{step:08d}"
        else:
            latest = manager.find_latest()
            if latest is None:
                candidates = sorted(p for p in path.iterdir() if p.is_dir() and p.name.startswith("step_"))
                if candidates:
                    CheckpointManager.verify(candidates[-1])  # raises with the reason
                raise CheckpointError(
                    f"{ckpt} holds no checkpoint: expected a checkpoint root with step_XXXXXXXX "
                    f"directories, a step directory, or a directory made by convert_checkpoint.py import"
                )
            path = latest.path
    elif step is not None and (path / TRAIN_STATE).exists() and not path.name.endswith(f"{step:08d}"):
        raise CheckpointError(f"--step {step} was given but {path} is the checkpoint of another step")
    marker = CheckpointManager.verify(path)
    if not (path / ACTOR_DIR).is_dir():
        raise CheckpointError(f"checkpoint {path} has no {ACTOR_DIR}/ directory (no model weights)")
    if (path / IMPORT_INFO).exists():
        return ResolvedCheckpoint(path=path, kind="import", step=0)
    return ResolvedCheckpoint(path=path, kind="trainer", step=int(marker.get("step", 0)))


def read_train_state(path: Path) -> dict[str, Any]:
    """``train_state.pt`` of a trainer checkpoint.

    Raises:
        CheckpointError: missing or unreadable (corrupted) file.
    """
    file = path / TRAIN_STATE
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path}: {TRAIN_STATE} is missing")
    try:
        return torch.load(file, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many kinds for a damaged pickle / zip
        raise CheckpointError(f"checkpoint {path}: cannot read {file.name} ({type(err).__name__}: {err}); the file is corrupted") from None


def model_template_dir(checkpoint: ResolvedCheckpoint, *, hf: str | os.PathLike | None, scratch: Path) -> Path:
    """The Hugging Face directory whose config and tokenizer/processor files describe the checkpoint's model.

    ``hf`` when given; else the ``hf/`` copy of an imported checkpoint; else, for a trainer
    checkpoint, from the run's config in ``train_state.pt``: ``model.hf_path`` (``model.source='hf'``),
    the ``hf/`` of ``model.megatron_checkpoint``, or the tiny model rebuilt from its ``model.tiny_*``
    settings into ``scratch`` (deterministic: same config and tokenizer).

    Raises:
        CheckpointError / ConversionError: nothing describes the model.
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
        read_hf_config(model["hf_path"])
        return Path(model["hf_path"])
    if model.get("megatron_checkpoint"):
        return Path(model["megatron_checkpoint"]) / HF_FILES_DIR
    if model.get("source") == "tiny":
        from fastrl.config import DataConfig, ModelConfig
        from fastrl.models.tiny import build_tiny_hf_model_dir

        fields = {k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__}
        data = config.get("data") or {}
        defaults = DataConfig()
        return build_tiny_hf_model_dir(
            scratch / "tiny-model",
            ModelConfig(**fields),
            min_pixels=data.get("min_pixels", defaults.min_pixels),
            max_pixels=data.get("max_pixels", defaults.max_pixels),
        )
    raise ConversionError(
        f"checkpoint {checkpoint.path}: its run config does not say which model it holds; pass --hf "
        f"with the Hugging Face directory the run started from"
    )


def _write_marker(directory: Path, extra: dict[str, Any]) -> None:
    files = {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}
    (directory / COMPLETE_MARKER).write_text(json.dumps({"step": 0, "files": files, **extra}, indent=1))


def _staging_for(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}.", dir=out.parent))


def _check_output(out: Path) -> None:
    if out.exists():
        raise ConversionError(f"output {out} already exists; remove it or choose another path")


# --------------------------------------------------------------------------------------------
# Distributed pieces (every rank of the model-parallel group calls them)
# --------------------------------------------------------------------------------------------


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _sharded_model_state(policy) -> dict[str, Any]:
    """The actor's sharded state dict in the trainer's checkpoint format (model only)."""
    from types import SimpleNamespace

    from fastrl.checkpoint.state import actor_sharded_state_dict

    return actor_sharded_state_dict(SimpleNamespace(policy=policy), with_optimizer=False, is_loading=False)


def _dist_checkpointing():
    from fastrl.checkpoint.state import _dist_checkpointing as loader

    return loader()


def import_hf(
    hf_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    parallel,
    dtype: DType = "auto",
    seed: int = 1234,
) -> Path:
    """Convert the Hugging Face directory ``hf_dir`` into an imported checkpoint at ``out``.

    Collective over the ``TP x PP`` processes of ``parallel`` (parallel state initialized). The
    directory is written under a temporary name and renamed into place when complete.

    Args:
        hf_dir: Hugging Face Qwen2.5-VL / Qwen2 / Llama directory (config + safetensors).
        out: the checkpoint directory to create (must not exist).
        parallel: the TP / PP layout the checkpoint is written with (any layout can load it).
        dtype: weights dtype in the checkpoint; ``auto`` keeps bfloat16 models in bfloat16.
        seed: megatron initialization seed (values are replaced by the Hugging Face weights).

    Returns:
        ``Path(out)``.

    Raises:
        ConversionError: ``out`` exists, ``hf_dir`` has no usable config, or the bridge built a
            model whose embedding tying differs from the config.
    """
    from fastrl.config import ModelConfig
    from fastrl.models.provider import build_policy

    hf_dir, out = Path(hf_dir).resolve(), Path(out)
    config = read_hf_config(hf_dir)
    _check_output(out)
    hf_weight_names(hf_dir)  # fail early on a directory without weights
    torch_dtype = resolve_dtype(dtype, config)
    policy = build_policy(
        hf_dir, parallel=parallel, precision=_precision(torch_dtype), model=ModelConfig(seed=seed), trainable=False
    )
    _check_tying(policy, config, hf_dir)
    staging = world.broadcast_object(_staging_for(out) if _rank() == 0 else None)
    (staging / ACTOR_DIR).mkdir(exist_ok=True)
    world.barrier()
    _dist_checkpointing().save(_sharded_model_state(policy), str(staging / ACTOR_DIR))
    world.barrier()
    if _rank() == 0:
        copy_model_metadata(hf_dir, staging / HF_FILES_DIR)
        info = {
            "format_version": FORMAT_VERSION,
            "source_hf_dir": str(hf_dir),
            "model_type": config.get("model_type"),
            "tensor_model_parallel_size": parallel.tensor_model_parallel_size,
            "pipeline_model_parallel_size": parallel.pipeline_model_parallel_size,
            "dtype": _dtype_name(torch_dtype),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hf_weight_names": hf_weight_names(hf_dir),
        }
        (staging / IMPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
        _write_marker(staging, {"kind": "import"})
        os.replace(staging, out)
    world.barrier()
    return out


def _check_tying(policy, config: dict[str, Any], source: Path) -> None:
    tied = tie_word_embeddings(config)
    shared = bool(getattr(policy.config, "share_embeddings_and_output_weights", False))
    if tied != shared:
        raise ConversionError(
            f"{source}/config.json has tie_word_embeddings={tied} but the megatron model was built with "
            f"share_embeddings_and_output_weights={shared}; the output layer would be silently (un)tied"
        )


def load_policy(
    checkpoint: ResolvedCheckpoint,
    template: Path,
    *,
    parallel,
    dtype: torch.dtype = torch.float32,
    seed: int = 1234,
):
    """Build the model described by ``template`` (no weights loaded) and load ``checkpoint``'s actor into it.

    Collective over the model-parallel processes. Works for any TP/PP the checkpoint was saved with.

    Returns:
        A frozen :class:`~fastrl.models.provider.MegatronPolicy`.

    Raises:
        CheckpointError: the actor cannot be read (corrupted file, other model or sizes).
    """
    from fastrl.config import ModelConfig
    from fastrl.models.provider import build_policy

    config = read_hf_config(template)
    policy = build_policy(
        template, parallel=parallel, precision=_precision(dtype), model=ModelConfig(seed=seed),
        trainable=False, load_weights=False,
    )  # fmt: skip
    _check_tying(policy, config, template)
    if not any(is_weight_file(p.name) for p in template.iterdir()):
        # the hf/ copy of an imported checkpoint (this one, or the one a trained run started from)
        names = (read_import_info(template.parent) or {}).get("hf_weight_names") if template.name == HF_FILES_DIR else None
        if not names:
            raise ConversionError(
                f"{template} holds no weight files and the checkpoint records no Hugging Face weight names; "
                f"pass --hf with the Hugging Face directory the checkpoint was made from"
            )
        _use_weight_names(policy, names)
    load_actor_weights(policy, checkpoint.path / ACTOR_DIR)
    return policy


def _use_weight_names(policy, names: list[str]) -> None:
    """Let megatron-bridge export from a model directory without weight files.

    megatron-bridge 0.3.1 builds its export tasks from the keys of the source directory's
    safetensors (a weight whose Hugging Face name is not among them is skipped) and, for tied
    embeddings, asks them whether an ``lm_head.weight`` is to be written as well. Without weight
    files it raises ``FileNotFoundError``. The names recorded at import answer both questions the
    same way (values are never read on export). Tested by the import -> export round trips of
    ``tests/conversion``.
    """
    from megatron.bridge.models.hf_pretrained.state import StateDict

    placeholder = torch.empty(0, device="meta")
    policy.bridge.hf_pretrained._state_dict_accessor = StateDict({name: placeholder for name in names})


def read_import_info(path: Path) -> dict[str, Any] | None:
    """``fastrl_import.json`` of an imported checkpoint (None when absent)."""
    file = Path(path) / IMPORT_INFO
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {path}: {IMPORT_INFO} is not valid JSON ({err}); the file is corrupted") from None


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


def load_megatron_checkpoint(policy, path: str | os.PathLike) -> ResolvedCheckpoint:
    """Load the model weights of an imported (or trainer) checkpoint into a built ``policy``.

    For ``model.megatron_checkpoint``: build the policy from ``path/hf`` with
    ``build_policy(..., load_weights=False)`` at the run's layout, then call this (collective).
    Optimizer state, if any, is not loaded.

    Raises:
        CheckpointError: incomplete, truncated or corrupted checkpoint (names the file), or one
            holding another model.
    """
    checkpoint = resolve_checkpoint(path)
    load_actor_weights(policy, checkpoint.path / ACTOR_DIR)
    return checkpoint


def load_actor_weights(policy, actor_dir: Path) -> None:
    """Load the model part of a trainer / imported checkpoint's ``actor/`` into ``policy`` (collective).

    Raises:
        CheckpointError: naming ``actor_dir`` and the cause, instead of megatron's internal error.
    """
    from megatron.core.utils import unwrap_model

    check_actor_files(actor_dir)
    sharded = _sharded_model_state(policy)
    try:
        with torch.no_grad():
            loaded = _dist_checkpointing().load(sharded, str(actor_dir))
    except Exception as err:  # megatron / torch.distributed.checkpoint raise many kinds
        cause = str(err).strip().splitlines()
        raise CheckpointError(
            f"cannot load the model from {actor_dir}: {type(err).__name__}: {cause[0] if cause else ''}. "
            f"A file in it is corrupted, or the checkpoint holds another model or model size"
        ) from None
    models = unwrap_model(list(policy.chunks))
    if len(models) == 1:
        models[0].load_state_dict(loaded["model"])
    else:
        for i, m in enumerate(models):
            m.load_state_dict(loaded[f"model{i}"])


def check_actor_files(actor_dir: Path) -> None:
    """Read the index files of a dist_checkpointing directory (``metadata.json``, ``.metadata``,
    ``common.pt``) so that a damaged one is reported by name (the tensor data files, ``*.distcp``,
    are checked by size against the ``COMPLETE`` marker).

    Raises:
        CheckpointError: a missing or unreadable index file, named.
    """
    from torch.distributed.checkpoint import FileSystemReader

    readers = {
        "metadata.json": lambda f: json.loads(f.read_text()),
        ".metadata": lambda f: FileSystemReader(str(actor_dir)).read_metadata(),
        "common.pt": lambda f: torch.load(f, map_location="cpu", weights_only=False),
    }
    for name, read in readers.items():
        file = actor_dir / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {actor_dir.parent}: {ACTOR_DIR}/{name} is missing")
        try:
            read(file)
        except Exception as err:  # json, pickle and zip readers raise many kinds
            raise CheckpointError(
                f"checkpoint {actor_dir.parent}: cannot read {ACTOR_DIR}/{name} ({type(err).__name__}: {err}); "
                f"the file is corrupted"
            ) from None


def hf_weights(policy, config: dict[str, Any], *, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor)`` pairs of ``policy`` in ``dtype`` (collective; every rank receives all).

    Checks the output layer against the config: a tied model yields no ``lm_head.weight``, an
    untied one must yield it.

    Raises:
        ConversionError: ``lm_head.weight`` missing for an untied model, or present for a tied one.
    """
    from fastrl.models.provider import export_hf_weights

    tied = tie_word_embeddings(config)
    seen_head = False
    for name, tensor in export_hf_weights(policy):
        if name == "lm_head.weight":
            if tied:
                raise ConversionError(
                    "megatron-bridge exported lm_head.weight for a model with tie_word_embeddings=true; "
                    "the exported head would be untied from the embedding"
                )
            seen_head = True
        yield name, tensor.to(dtype)
    if not tied and not seen_head:
        raise ConversionError(
            "the model has tie_word_embeddings=false but no lm_head.weight was exported; the Hugging Face "
            "model would load with a missing (randomly initialized) output layer"
        )


class ShardWriter:
    """Writes ``(name, tensor)`` pairs into safetensors shards of at most ``max_shard_bytes`` each.

    Produces ``model.safetensors`` (one shard) or ``model-0000i-of-0000N.safetensors`` plus
    ``model.safetensors.index.json``, as ``transformers`` ``save_pretrained`` does.
    """

    def __init__(self, directory: Path, max_shard_bytes: int) -> None:
        self.directory = directory
        self.max_shard_bytes = max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0
        self.count = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.pending or any(name in names for _, names in self.shards):
            raise ConversionError(f"weight {name} was exported twice")
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self.flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size
        self.count += 1

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        path = self.directory / f"part-{len(self.shards) + 1:05d}.safetensors"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Flush, give the shards their final names, write the index; returns the file names."""
        self.flush()
        if len(self.shards) == 1:
            final = self.directory / "model.safetensors"
            os.replace(self.shards[0][0], final)
            return [final.name]
        weight_map = {}
        names = []
        for i, (path, tensors) in enumerate(self.shards, start=1):
            final = self.directory / f"model-{i:05d}-of-{len(self.shards):05d}.safetensors"
            os.replace(path, final)
            names.append(final.name)
            weight_map.update({t: final.name for t in tensors})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return names


def _progress(iterable: Iterable, *, enabled: bool, desc: str) -> Iterable:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, unit=" tensors", mininterval=1.0)


def export_hf(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    *,
    parallel,
    step: int | None = None,
    hf: str | os.PathLike | None = None,
    dtype: DType = "auto",
    max_shard_bytes: int = 5 * 2**30,
    progress: bool = True,
) -> Path:
    """Export the actor of a trainer / imported checkpoint as a Hugging Face directory at ``out``.

    Collective over the ``TP x PP`` processes of ``parallel``; rank 0 writes. The output
    (written under a temporary name, renamed when complete) holds the safetensors shards, the
    template's ``config.json`` (``torch_dtype`` set to the written dtype), its tokenizer /
    processor / generation files, and ``fastrl_export.json`` (source checkpoint and step).

    Args:
        ckpt / step: see :func:`resolve_checkpoint`.
        out: the Hugging Face directory to create (must not exist).
        parallel: layout the checkpoint is loaded at (independent of the one it was saved with).
        hf: Hugging Face directory describing the model (default: see :func:`model_template_dir`).
        dtype: dtype of the written weights; ``auto`` follows the template config's ``torch_dtype``.
        max_shard_bytes: largest safetensors shard.
        progress: a progress bar on rank 0.

    Raises:
        CheckpointError: missing, incomplete, truncated or corrupted checkpoint (names the file).
        ConversionError: ``out`` exists, or the output layer does not match the config.
    """
    out = Path(out)
    checkpoint = resolve_checkpoint(ckpt, step)
    _check_output(out)
    scratch = Path(tempfile.mkdtemp(prefix="fastrl-export-"))
    try:
        template = model_template_dir(checkpoint, hf=hf, scratch=scratch)  # every rank: scratch is per process
        config = read_hf_config(template)
        torch_dtype = resolve_dtype(dtype, config)
        policy = load_policy(checkpoint, template, parallel=parallel, dtype=torch_dtype)
        staging = world.broadcast_object(_staging_for(out) if _rank() == 0 else None)
        writer = ShardWriter(Path(staging), max_shard_bytes) if _rank() == 0 else None
        for name, tensor in _progress(
            hf_weights(policy, config, dtype=torch_dtype), enabled=progress and _rank() == 0, desc=f"export {out.name}"
        ):
            if writer is not None:
                writer.add(name, tensor)
        if writer is not None:
            writer.close()
            copy_model_metadata(template, staging)
            config["torch_dtype"] = _dtype_name(torch_dtype)
            config.pop("dtype", None)
            (Path(staging) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            info = {
                "format_version": FORMAT_VERSION,
                "checkpoint": str(checkpoint.path.resolve()),
                "kind": checkpoint.kind,
                "step": checkpoint.step,
                "dtype": _dtype_name(torch_dtype),
                "tensors": writer.count,
                "bytes": writer.total_bytes,
            }
            (Path(staging) / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
            os.replace(staging, out)
        world.barrier()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


# --------------------------------------------------------------------------------------------
# Forward passes (verification)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def megatron_logits(policy, batch) -> torch.Tensor:
    """Full-vocabulary logits of ``batch`` (a :class:`~fastrl.training.policy_batch.PolicyBatch`).

    Collective over the model-parallel processes: the vocab-parallel output is gathered over TP
    and broadcast from the last pipeline stage.

    Returns:
        float32 [N, T, V] (``V`` the megatron model's padded vocabulary) on every rank.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from fastrl.distributed import collectives
    from fastrl.training.logprobs import forward_step_fn

    for chunk in policy.chunks:
        chunk.eval()
    n = len(batch)
    outputs = get_forward_backward_func()(
        forward_step_func=forward_step_fn([batch], lambda mb, logits: gather_from_tensor_model_parallel_region(logits).float()),
        data_iterator=None,
        model=policy.chunks,
        num_microbatches=1,
        seq_length=batch.seq_length,
        micro_batch_size=n,
        forward_only=True,
        collect_non_loss_data=True,
    )
    result = outputs[0] if collectives.pipeline_is_last_stage() else None
    return collectives.broadcast_from_last_pipeline_stage(
        result, (n, batch.seq_length, policy.vocab_size), torch.float32, batch.input_ids.device
    )
