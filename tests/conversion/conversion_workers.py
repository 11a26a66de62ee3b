"""Functions run on every rank by the conversion tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def _init(tp: int, pp: int):
    from fastrl.config import ParallelConfig
    from fastrl.distributed import parallel_state

    parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, backend="gloo")
    parallel_state.initialize(parallel, seed=1)
    return parallel


def round_trip_worker(hf_dir: Path, root: Path, import_layout: tuple[int, int], export_layout: tuple[int, int]) -> dict[str, Any]:
    """Import ``hf_dir`` at ``import_layout``, load the imported checkpoint into a trainable actor
    at that layout and compute its logits of the verification input, then export the checkpoint at
    ``export_layout``."""
    import torch.distributed as dist

    from fastrl.checkpoint.resolve import load_megatron_checkpoint
    from fastrl.config import PrecisionConfig
    from fastrl.models import conversion
    from fastrl.models.logprobs import megatron_logits
    from fastrl.models.provider import build_policy
    from tools.verify_conversion import policy_batch, sample_inputs

    parallel = _init(*import_layout)
    imported = conversion.import_hf(hf_dir, root / "imported", parallel=parallel)
    # as the trainer starts from model.megatron_checkpoint: a trainable actor without weights, then the checkpoint
    policy = build_policy(
        imported / conversion.HF_FILES_DIR, parallel=parallel, precision=PrecisionConfig(mode="fp32"), load_weights=False
    )
    load_megatron_checkpoint(policy.chunks, imported)
    logits = megatron_logits(policy, policy_batch(sample_inputs(hf_dir)))
    del policy
    parallel = _init(*export_layout)
    conversion.export_hf(imported, root / "exported", parallel=parallel, progress=False)
    return {"rank": dist.get_rank(), "logits": logits}


def trained_logits_worker(ckpt: Path, inputs_dir: Path) -> torch.Tensor:
    """Logits of the verification input under the actor loaded from the trainer checkpoint ``ckpt``
    (the model rebuilt from the run's config, as the export does)."""
    import tempfile

    from fastrl.models import conversion
    from fastrl.models.logprobs import megatron_logits
    from tools.verify_conversion import policy_batch, sample_inputs

    parallel = _init(1, 1)
    checkpoint = conversion.resolve_checkpoint(ckpt)
    template = conversion.model_template_dir(checkpoint, hf=None, scratch=Path(tempfile.mkdtemp()))
    policy = conversion.load_policy(checkpoint, template, parallel=parallel)
    return megatron_logits(policy, policy_batch(sample_inputs(inputs_dir)))
