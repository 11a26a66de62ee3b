"""Tiny random Hugging Face text models (Qwen2, Llama; config + safetensors) for the distributed tests.

Sizes are chosen for speed and for every parallel layout tested: 4 query / 2 key-value heads
(TP=2 splits both), 2 layers (PP=2 gives one per stage), a vocabulary divisible by TP.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 128


def qwen2_dir(path: Path, *, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """A ~60k-parameter Qwen2 causal LM written with ``save_pretrained``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie_word_embeddings,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # non-zero biases so that a wrong bias split is visible
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(path, safe_serialization=True)
    return path


def llama_dir(path: Path, *, seed: int = 0) -> Path:
    """A tiny Llama causal LM (no biases, tied embeddings) written with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path
