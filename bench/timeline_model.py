"""The model and the rollouts of the memory-timeline check (``bench/gpu_memory_timeline.py``).

The Qwen2.5-VL-3B-Instruct architecture from its published ``config.json`` dimensions, built in
code (nothing is downloaded; the weights are random: the policy is built with
``build_policy(..., load_weights=False)``), or the CPU smoke run's tiny shapes with the same
structure (tied embeddings, a vision tower with window attention and a 2x2 patch merger). Both are
written as a Hugging Face directory that holds only ``config.json``; megatron-bridge's export, which
asks the directory's weight files for the names to export under, is given the names of
:func:`hf_weight_names` instead (``fastrl.compat.bridge_export.use_weight_names``, the path of an
imported checkpoint, whose directory holds no weights either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from fastrl.models.model_dims import KNOWN_MODELS, ModelDims


@dataclass(frozen=True)
class Shapes:
    """A Qwen2.5-VL model to write as ``config.json``: the dimensions that decide its parameter count
    (``dims``, :class:`fastrl.models.model_dims.ModelDims`, as the memory plan reads them) and what
    the config holds beyond them (Hugging Face ``config.json`` names): positions, the vision tower's
    heads and full-attention blocks, and the special token ids."""

    name: str
    dims: ModelDims
    max_position_embeddings: int
    rope_theta: float
    vision_num_heads: int
    fullatt_block_indexes: tuple[int, ...]
    bos_token_id: int
    eos_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    image_token_id: int
    video_token_id: int

    @property
    def first_special_id(self) -> int:
        """Token ids below this are ordinary tokens (the rollouts' random text is drawn from them)."""
        return min(self.bos_token_id, self.eos_token_id, self.vision_start_token_id, self.vision_end_token_id,
                   self.image_token_id, self.video_token_id)


#: Qwen2.5-VL-3B-Instruct: the published dimensions the memory plan counts (``KNOWN_MODELS``: 3.75B
#: parameters) and the rest of its published config.json (hub revision of 2025-02).
QWEN25_VL_3B = Shapes(
    name="Qwen2.5-VL-3B-Instruct architecture (random weights)", dims=KNOWN_MODELS["Qwen/Qwen2.5-VL-3B-Instruct"],
    max_position_embeddings=128000, rope_theta=1000000.0, vision_num_heads=16, fullatt_block_indexes=(7, 15, 23, 31),
    bos_token_id=151643, eos_token_id=151645, vision_start_token_id=151652, vision_end_token_id=151653,
    image_token_id=151655, video_token_id=151656,
)

#: The CPU smoke run's shapes: the same structure, tiny (the gpu_check training smoke's sizes).
SMOKE = Shapes(
    name="tiny Qwen2.5-VL (CPU smoke)",
    dims=ModelDims(name="tiny Qwen2.5-VL (CPU smoke)", hidden_size=64, num_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=128, vocab_size=512, tie_word_embeddings=True,
                   vision_depth=1, vision_hidden_size=32, vision_intermediate_size=128),
    max_position_embeddings=4096, rope_theta=10000.0, vision_num_heads=1, fullatt_block_indexes=(0,),
    bos_token_id=500, eos_token_id=501, vision_start_token_id=502, vision_end_token_id=503, image_token_id=504,
    video_token_id=505,
)


def mrope_section(head_dim: int) -> list[int]:
    """Multimodal RoPE sections (temporal, height, width) of the rotary half-dimension: 1/4, 3/8, 3/8
    (Qwen2.5-VL's [16, 24, 24] at head_dim 128; as ``fastrl.models.tiny`` splits it)."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def hf_config(s: Shapes):
    """``transformers.Qwen2_5_VLConfig`` of ``s`` (text and vision sub-configs, as the tiny model writes them)."""
    from transformers import Qwen2_5_VLConfig

    d = s.dims
    ids = dict(bos_token_id=s.bos_token_id, eos_token_id=s.eos_token_id, pad_token_id=s.bos_token_id)
    text_config = dict(
        vocab_size=d.vocab_size, hidden_size=d.hidden_size, intermediate_size=d.intermediate_size,
        num_hidden_layers=d.num_layers, num_attention_heads=d.num_attention_heads,
        num_key_value_heads=d.num_key_value_heads, max_position_embeddings=s.max_position_embeddings,
        max_window_layers=d.num_layers, rope_theta=s.rope_theta,
        rope_scaling={"type": "mrope", "mrope_section": mrope_section(d.head_dim)}, rms_norm_eps=1e-6,
        hidden_act="silu", tie_word_embeddings=d.tie_word_embeddings, initializer_range=0.02, use_cache=True, **ids,
    )
    vision_config = dict(
        depth=d.vision_depth, hidden_size=d.vision_hidden_size, intermediate_size=d.vision_intermediate_size,
        num_heads=s.vision_num_heads, in_channels=d.vision_in_channels, patch_size=d.vision_patch_size,
        spatial_merge_size=d.vision_spatial_merge_size, temporal_patch_size=d.vision_temporal_patch_size,
        window_size=112, fullatt_block_indexes=list(s.fullatt_block_indexes), out_hidden_size=d.hidden_size,
        tokens_per_second=2, hidden_act="silu", initializer_range=0.02,
    )
    config = Qwen2_5_VLConfig(
        text_config=text_config, vision_config=vision_config, image_token_id=s.image_token_id,
        video_token_id=s.video_token_id, vision_start_token_id=s.vision_start_token_id,
        vision_end_token_id=s.vision_end_token_id, tie_word_embeddings=d.tie_word_embeddings, **ids,
    )
    # transformers 4.57 reads ``architectures`` of this config from its text config (as a saved
    # model writes it: both); megatron-bridge refuses a config without it
    config.architectures = config.text_config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def write_model_dir(path: Path, s: Shapes) -> Path:
    """A Hugging Face directory at ``path`` holding ``config.json`` of ``s`` only (no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    hf_config(s).save_pretrained(str(path))
    return path


_LAYER = ("input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "post_attention_layernorm.weight", "self_attn.k_proj.bias", "self_attn.k_proj.weight",
          "self_attn.o_proj.weight", "self_attn.q_proj.bias", "self_attn.q_proj.weight", "self_attn.v_proj.bias",
          "self_attn.v_proj.weight")
_BLOCK = ("attn.proj.bias", "attn.proj.weight", "attn.qkv.bias", "attn.qkv.weight", "mlp.down_proj.bias",
          "mlp.down_proj.weight", "mlp.gate_proj.bias", "mlp.gate_proj.weight", "mlp.up_proj.bias",
          "mlp.up_proj.weight", "norm1.weight", "norm2.weight")
_VISION = ("visual.merger.ln_q.weight", "visual.merger.mlp.0.bias", "visual.merger.mlp.0.weight",
           "visual.merger.mlp.2.bias", "visual.merger.mlp.2.weight", "visual.patch_embed.proj.weight")


def hf_weight_names(s: Shapes) -> list[str]:
    """The weight names a Qwen2.5-VL checkpoint of ``s`` holds on disk (transformers' ``save_pretrained``:
    ``model.*`` for the language model, ``visual.*`` for the vision tower, ``lm_head.weight`` unless
    tied), sorted."""
    names = ["model.embed_tokens.weight", "model.norm.weight", *_VISION]
    if not s.dims.tie_word_embeddings:
        names.append("lm_head.weight")
    names += [f"model.layers.{i}.{suffix}" for i in range(s.dims.num_layers) for suffix in _LAYER]
    names += [f"visual.blocks.{i}.{suffix}" for i in range(s.dims.vision_depth) for suffix in _BLOCK]
    return sorted(names)


def image_grid(min_pixels: int) -> tuple[int, int, int]:
    """(temporal, height, width) patches of a square image at the processor's lower pixel bound: the
    Qwen2.5-VL processor scales an image below ``min_pixels`` up to sides that are multiples of 28
    (``smart_resize``), 14-pixel patches."""
    side = 2 * math.ceil(math.sqrt(min_pixels) / 28)
    return 1, side, side


def rollout_batch(s: Shapes, *, rollouts: int, prompt_len: int, response_len: int, grid: tuple[int, int, int],
                  multiple: int = 1, seed: int = 0):
    """``rollouts`` rollouts on the CPU: each prompt one image of ``grid`` patches (random pixels)
    between the vision start and end tokens, then random ordinary tokens up to ``prompt_len``;
    ``response_len`` random response tokens; the width rounded up to ``multiple`` (masked padding);
    one random advantage per rollout (float32 [N]).

    Raises:
        ValueError: the prompt cannot hold the image's tokens and its two markers.
    """
    import torch

    from fastrl.batch import PolicyBatch

    t, h, w = grid
    image_tokens = t * h * w // 4  # the 2x2 patch merger
    if prompt_len < image_tokens + 3:
        raise ValueError(f"--prompt-len {prompt_len} cannot hold the image's {image_tokens} tokens and 3 more")
    g = torch.Generator().manual_seed(seed)
    total = prompt_len + response_len
    width = -(-total // multiple) * multiple
    ids = torch.full((rollouts, width), s.bos_token_id, dtype=torch.long)
    ids[:, :total] = torch.randint(0, s.first_special_id, (rollouts, total), generator=g)
    ids[:, 0] = s.vision_start_token_id
    ids[:, 1 : 1 + image_tokens] = s.image_token_id
    ids[:, 1 + image_tokens] = s.vision_end_token_id
    attention = torch.zeros(rollouts, width, dtype=torch.bool)
    attention[:, :total] = True
    response = torch.zeros(rollouts, width, dtype=torch.bool)
    response[:, prompt_len:total] = True
    d = s.dims  # one flattened patch: channels x temporal patch x patch x patch (3 x 2 x 14 x 14)
    patch = d.vision_in_channels * d.vision_temporal_patch_size * d.vision_patch_size**2
    pixels = [torch.randn(t * h * w, patch, generator=g) for _ in range(rollouts)]
    grids = [torch.tensor([[t, h, w]], dtype=torch.long) for _ in range(rollouts)]
    return PolicyBatch(input_ids=ids, attention_mask=attention, response_mask=response, pixel_values=pixels,
                       image_grid_thw=grids, advantages=torch.randn(rollouts, generator=g))
