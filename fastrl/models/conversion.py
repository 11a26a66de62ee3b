"""Checkpoint conversion: Hugging Face <-> megatron-core distributed checkpoints, through megatron-bridge.

Two directions, both collective over ``TP x PP`` processes (after
:func:`fastrl.distributed.parallel_state.initialize`):

- :func:`import_hf`: a Hugging Face directory -> an *imported checkpoint* the trainer loads directly
  (``model.megatron_checkpoint``). megatron-bridge's ``AutoBridge`` loads the weights into the
  megatron model of this layout; megatron ``dist_checkpointing`` writes them in the same format
  as the actor of a trainer checkpoint (:mod:`fastrl.checkpoint.actor_state`).
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
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from fastrl.checkpoint.actor_state import load_model_weights, save_actor
from fastrl.checkpoint.layout import ACTOR_DIR, COMPLETE_MARKER, EXPORT_INFO, FORMAT_VERSION, HF_FILES_DIR, IMPORT_INFO
from fastrl.checkpoint.resolve import ResolvedCheckpoint, read_import_info, resolve_checkpoint
from fastrl.compat.bridge_export import use_weight_names
from fastrl.distributed import world
from fastrl.models.hf_dirs import (
    ConversionError,
    DType,
    copy_model_metadata,
    dtype_name,
    hf_weight_names,
    is_weight_file,
    model_template_dir,
    precision_for,
    read_hf_config,
    resolve_dtype,
    tie_word_embeddings,
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
        hf_dir, parallel=parallel, precision=precision_for(torch_dtype), model=ModelConfig(seed=seed), trainable=False
    )
    _check_tying(policy, config, hf_dir)
    staging = world.computed_on_rank0(lambda: _staging_for(out), what=f"making the staging directory of {out}")
    (staging / ACTOR_DIR).mkdir(exist_ok=True)
    world.barrier()
    save_actor(policy.chunks, None, staging / ACTOR_DIR, optimizer_format="fully_reshardable")
    world.barrier()  # every rank's part is written

    def publish() -> None:
        copy_model_metadata(hf_dir, staging / HF_FILES_DIR)
        info = {
            "format_version": FORMAT_VERSION,
            "source_hf_dir": str(hf_dir),
            "model_type": config.get("model_type"),
            "tensor_model_parallel_size": parallel.tensor_model_parallel_size,
            "pipeline_model_parallel_size": parallel.pipeline_model_parallel_size,
            "dtype": dtype_name(torch_dtype),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hf_weight_names": hf_weight_names(hf_dir),
        }
        (staging / IMPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
        _write_marker(staging, {"kind": "import"})
        os.replace(staging, out)

    world.computed_on_rank0(publish, what=f"publishing {out}")
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
        CheckpointError: the actor cannot be read (corrupted file, other model or sizes);
            :class:`ConversionError` when the template describes another model than the checkpoint holds.
    """
    from fastrl.config import ModelConfig
    from fastrl.models.provider import build_policy

    config = read_hf_config(template)
    policy = build_policy(
        template, parallel=parallel, precision=precision_for(dtype), model=ModelConfig(seed=seed),
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
        use_weight_names(policy, names)
    try:
        load_model_weights(policy.chunks, checkpoint.path / ACTOR_DIR)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as err:
        if isinstance(err, Exception):  # CheckpointError and the like: already one line naming the file
            raise
        # torch.distributed.checkpoint's CheckpointException derives from BaseException (past the
        # loader's ``except Exception``): here, the model built from the template is not the one saved
        raise ConversionError(
            f"cannot load {checkpoint.path / ACTOR_DIR} into the model {template}/config.json describes "
            f"({config.get('model_type')}): {checkpoint_failure(err)}. The checkpoint holds another model or "
            f"model size; pass --hf with the Hugging Face directory the run started from"
        ) from None
    return policy


def checkpoint_failure(err: BaseException, chars: int = 200) -> str:
    """The first rank's exception of a ``torch.distributed.checkpoint`` ``CheckpointException``
    (``"KeyError: 'visual.patch_embed...'"``, at most ``chars`` characters), else ``str(err)``'s first line."""
    failures = getattr(err, "failures", None) or {}
    for _rank, (exc, _trace) in sorted(failures.items()):
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return text if len(text) <= chars else text[: chars - 3] + "..."
    lines = str(err).strip().splitlines()
    return lines[0][:chars] if lines else type(err).__name__


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
        staging = world.computed_on_rank0(lambda: _staging_for(out), what=f"making the staging directory of {out}")
        writer = ShardWriter(Path(staging), max_shard_bytes) if world.rank() == 0 else None
        for name, tensor in _progress(
            hf_weights(policy, config, dtype=torch_dtype), enabled=progress and world.rank() == 0, desc=f"export {out.name}"
        ):
            if writer is not None:
                writer.add(name, tensor)

        def publish() -> None:
            assert writer is not None  # rank 0
            writer.close()
            copy_model_metadata(template, staging)
            config["torch_dtype"] = dtype_name(torch_dtype)
            config.pop("dtype", None)
            (Path(staging) / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            info = {
                "format_version": FORMAT_VERSION,
                "checkpoint": str(checkpoint.path.resolve()),
                "kind": checkpoint.kind,
                "step": checkpoint.step,
                "dtype": dtype_name(torch_dtype),
                "tensors": writer.count,
                "bytes": writer.total_bytes,
            }
            (Path(staging) / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
            os.replace(staging, out)

        world.computed_on_rank0(publish, what=f"publishing {out}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
