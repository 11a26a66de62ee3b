"""The Hugging Face directory a run starts from, as the recipe chose it.

- ``model.source='hf'``: ``model.hf_path``, a local directory or a hub id resolved to its snapshot in the
  Hugging Face cache (:func:`fastrl.models.hub.resolve_model_dir`).
- ``model.source='tiny'``: the small random Qwen2.5-VL-architecture model described by the
  ``model.tiny_*`` fields, built once into the cache (rank 0), then, with ``warm_start.enabled``,
  its supervised warm start (cached by a key of everything it depends on). With
  ``model.architecture='qwen2'``: its language model alone as a text-only Qwen2 (no warm start).

``model.megatron_checkpoint`` (weights from an imported or trainer checkpoint) is loaded on top of
the directory's architecture by :func:`fastrl.training.parts.build_parts`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from fastrl.config import RunConfig
from fastrl.data import Record
from fastrl.distributed import world


def cache_dir(cfg: RunConfig) -> Path:
    """``data.cache_dir`` or the default cache (``~/.cache/fastrl``)."""
    from fastrl.data.easy_vqa import default_cache_dir

    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else default_cache_dir()


def hf_policy_dir(hf_path: str) -> Path:
    """``model.hf_path`` (a local directory or a hub id) as a local directory, on every rank.

    Rank 0 resolves first (it may download into the hub cache, see :mod:`fastrl.models.hub`); its
    error, if any, is raised on every rank (:func:`fastrl.distributed.world.computed_on_rank0`), so
    that no rank waits for a model that will not come. Then each rank resolves in its own cache (a
    look-up when the cache is on shared storage). Collective.

    Raises:
        ModelNotAvailableError: see :func:`fastrl.models.hub.resolve_model_dir`.
    """
    from fastrl.models.hub import resolve_model_dir

    world.computed_on_rank0(lambda: resolve_model_dir(hf_path), what=f"resolving model.hf_path={hf_path!r}")
    return resolve_model_dir(hf_path)


def prepare_policy_dir(cfg: RunConfig, *, train: Sequence[Record]) -> tuple[Path, dict[str, float]]:
    """The run's starting Hugging Face directory and the start-up metrics of building it
    (the warm start's, when one ran). Collective: global rank 0 builds (tiny model, warm start),
    every rank gets its directory, and an error there is raised on every rank
    (:func:`fastrl.distributed.world.computed_on_rank0`)."""
    m = cfg.model
    if m.source == "hf":
        return hf_policy_dir(m.hf_path), {}
    from fastrl.models.tiny import build_tiny_hf_model_dir, tiny_model_settings

    d = cfg.data
    if m.architecture == "qwen2":  # the tiny model's language model alone (vLLM-on-CPU recipes)
        from fastrl.models.tiny import build_tiny_text_model_dir

        text_dir = cache_dir(cfg) / "models" / f"tiny-qwen2-{tiny_model_settings(m, architecture='qwen2').key()}"
        world.computed_on_rank0(lambda: build_tiny_text_model_dir(text_dir, m), what="building the tiny text model")
        return text_dir, {}
    key = tiny_model_settings(m, min_pixels=d.min_pixels, max_pixels=d.max_pixels).key()
    base = cache_dir(cfg) / "models" / f"tiny-{key}"
    world.computed_on_rank0(
        lambda: build_tiny_hf_model_dir(base, m, min_pixels=d.min_pixels, max_pixels=d.max_pixels),
        what="building the tiny model")
    if not cfg.warm_start.enabled:
        return base, {}
    from fastrl.training.warm_start import run_warm_start

    out, metrics = world.computed_on_rank0(
        lambda: run_warm_start(
            base, cache_dir(cfg) / "warm_start", train, cfg.warm_start,
            template=d.template, image_size=d.prompt_image_size, seed=cfg.trainer.seed,
        ),
        what="the warm start")
    return Path(out), dict(metrics)
