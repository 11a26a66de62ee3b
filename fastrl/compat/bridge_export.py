"""megatron-bridge 0.3.x export from a model directory without weight files.

Written against megatron-bridge 0.3.1; applies to every export (CPU and GPU). megatron-bridge builds
its export tasks from the keys of the source directory's safetensors (a weight whose Hugging Face
name is not among them is skipped) and, for tied embeddings, asks them whether an
``lm_head.weight`` is to be written as well. An imported checkpoint keeps only the Hugging Face
config and tokenizer files, no weights: there ``state.source.get_all_keys()`` raises
``FileNotFoundError``. :func:`use_weight_names` answers both questions from the names recorded at
import. Tested in ``tests/unit/compat/test_bridge_export.py`` and by the import -> export round
trips of ``tests/conversion``.
"""

from __future__ import annotations

from typing import Any


def use_weight_names(policy: Any, names: list[str]) -> None:
    """Let megatron-bridge export ``policy`` (its ``bridge``) as if its Hugging Face directory held
    weights named ``names`` (values are never read on export)."""
    import torch
    from megatron.bridge.models.hf_pretrained.state import StateDict

    placeholder = torch.empty(0, device="meta")
    policy.bridge.hf_pretrained._state_dict_accessor = StateDict({name: placeholder for name in names})
