"""The shapes of a Qwen2 / Qwen2.5-VL model that the memory plan counts parameters and activations
from (:mod:`fastrl.models.memory_plan`): a Hugging Face ``config.json``, the published
Qwen2.5-VL-Instruct configs (:data:`KNOWN_MODELS`, so plans work offline), or the tiny model's."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastrl.config import ModelConfig


@dataclass(frozen=True)
class ModelDims:
    """The shapes that decide the parameter count of a Qwen2 / Qwen2.5-VL model (Hugging Face names)."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    # vision tower (Qwen2.5-VL); depth 0: a text-only model
    vision_depth: int = 0
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    vision_patch_size: int = 14
    vision_temporal_patch_size: int = 2
    vision_in_channels: int = 3
    vision_spatial_merge_size: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: kv heads x head dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def is_vision_language(self) -> bool:
        return self.vision_depth > 0

    def layer_params(self) -> int:
        """One decoder layer: q/k/v (with bias), o (no bias), SwiGLU MLP (no bias), two RMSNorms."""
        h, kv, inter = self.hidden_size, self.kv_size, self.intermediate_size
        return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h

    def embedding_params(self) -> int:
        """The input embedding (the output layer has as many unless tied)."""
        return self.vocab_size * self.hidden_size

    def language_params(self) -> int:
        """Embedding, layers, final norm and (untied) output layer."""
        heads = 1 if self.tie_word_embeddings else 2
        return heads * self.embedding_params() + self.num_layers * self.layer_params() + self.hidden_size

    def vision_block_params(self) -> int:
        """The vision blocks and the patch embedding (``model.freeze_vision_tower`` freezes these)."""
        if not self.is_vision_language:
            return 0
        hv, iv = self.vision_hidden_size, self.vision_intermediate_size
        block = 2 * hv + (hv * 3 * hv + 3 * hv) + (hv * hv + hv) + 2 * (hv * iv + iv) + (iv * hv + hv)
        patch = self.vision_in_channels * self.vision_temporal_patch_size * self.vision_patch_size**2 * hv
        return self.vision_depth * block + patch

    def merger_params(self) -> int:
        """The patch merger: RMSNorm, then MLP (merge^2 x hv -> same -> language hidden size)."""
        if not self.is_vision_language:
            return 0
        hv, m2 = self.vision_hidden_size, self.vision_spatial_merge_size**2
        return hv + (hv * m2 * hv * m2 + hv * m2) + (hv * m2 * self.hidden_size + self.hidden_size)

    def vision_params(self) -> int:
        return self.vision_block_params() + self.merger_params()

    def total_params(self) -> int:
        return self.language_params() + self.vision_params()

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> "ModelDims":
        """From a Hugging Face ``config.json`` (Qwen2, Llama, Qwen2.5-VL with top-level or
        ``text_config`` language fields)."""
        text = dict(config)
        text.update(config.get("text_config") or {})
        vision = config.get("vision_config") or {}
        heads = int(text["num_attention_heads"])
        return cls(
            name=name or str(text.get("_name_or_path") or text.get("model_type", "model")),
            hidden_size=int(text["hidden_size"]),
            num_layers=int(text["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            vision_depth=int(vision.get("depth", 0)) if config.get("model_type") == "qwen2_5_vl" else 0,
            vision_hidden_size=int(vision.get("hidden_size", 0)),
            vision_intermediate_size=int(vision.get("intermediate_size", 0)),
            vision_patch_size=int(vision.get("patch_size", 14)),
            vision_temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            vision_in_channels=int(vision.get("in_chans", vision.get("in_channels", 3))),
            vision_spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
        )


def _qwen25_vl(name: str, hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int,
               tied: bool) -> ModelDims:
    # every Qwen2.5-VL size shares the vision tower: depth 32, hidden 1280, MLP 3420, 14 px patches
    return ModelDims(
        name=name, hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied,
        vision_depth=32, vision_hidden_size=1280, vision_intermediate_size=3420,
    )


#: The published Qwen2.5-VL-Instruct configs (config.json on the hub), so plans work offline.
KNOWN_MODELS: dict[str, ModelDims] = {
    d.name: d
    for d in (
        _qwen25_vl("Qwen/Qwen2.5-VL-3B-Instruct", 2048, 36, 16, 2, 11008, 151936, True),
        _qwen25_vl("Qwen/Qwen2.5-VL-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False),
        _qwen25_vl("Qwen/Qwen2.5-VL-32B-Instruct", 5120, 64, 40, 8, 27648, 152064, False),
        _qwen25_vl("Qwen/Qwen2.5-VL-72B-Instruct", 8192, 80, 64, 8, 29568, 152064, False),
    )
}


def _known(path_or_id: str) -> ModelDims | None:
    if path_or_id in KNOWN_MODELS:
        return KNOWN_MODELS[path_or_id]
    base = Path(path_or_id.rstrip("/")).name.lower()
    for key, dims in KNOWN_MODELS.items():
        if key.split("/")[-1].lower() == base:
            return dims
    return None


def _tiny_dims(m: ModelConfig) -> ModelDims:
    # the tiny model's word-level vocabulary is a few hundred tokens at most; 512 bounds it
    return ModelDims(
        name="tiny", hidden_size=m.tiny_hidden_size, num_layers=m.tiny_num_layers,
        num_attention_heads=m.tiny_num_attention_heads, num_key_value_heads=m.tiny_num_key_value_heads,
        intermediate_size=m.tiny_intermediate_size, vocab_size=512, vision_depth=m.tiny_vision_depth,
        vision_hidden_size=m.tiny_vision_hidden_size, vision_intermediate_size=4 * m.tiny_vision_hidden_size,
    )


def model_dims(model: ModelConfig, hf_dir: str | Path | None = None) -> ModelDims | None:
    """The shapes of the run's model, without downloading anything: ``hf_dir``'s ``config.json``;
    else ``model.hf_path`` as a local directory, a known id (:data:`KNOWN_MODELS`, also matched by
    the directory's name) or a config already in the hub cache; the ``tiny_*`` fields for
    ``source='tiny'``. None when nothing says."""
    for candidate in (hf_dir, model.hf_path if model.source == "hf" else None):
        if candidate is not None and (Path(candidate).expanduser() / "config.json").is_file():
            return _read_dims(Path(candidate).expanduser() / "config.json", str(candidate))
    if model.source == "tiny":
        return _tiny_dims(model)
    if not model.hf_path:
        return None
    known = _known(model.hf_path)
    if known is not None:
        return known
    from fastrl.models.hub import hub_cache_dir, is_hub_id

    if is_hub_id(model.hf_path):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model.hf_path, "config.json", cache_dir=str(hub_cache_dir()))
        except Exception:  # noqa: BLE001 - a plan without counts is reported, never fatal here
            cached = None
        if isinstance(cached, str):
            return _read_dims(Path(cached), model.hf_path)
    return None


def _read_dims(path: Path, name: str) -> ModelDims | None:
    """:meth:`ModelDims.from_hf_config` of a ``config.json``; None when it lacks the fields."""
    try:
        return ModelDims.from_hf_config(json.loads(path.read_text()), name)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def activation_bytes(d: ModelDims, *, tp: int, sequence_parallel: bool, element_bytes: int) -> tuple[int, int]:
    """Bytes kept for the backward pass: (per token per decoder layer, per image patch per vision block).

    Decoder layer (flash attention, no dropout, no recomputation): the inputs of the two norms and
    of the QKV and FC1 GEMMs (4 x hidden, replicated over TP unless sequence parallel), the q/k/v
    outputs and the attention output (2 x hidden + 2 x kv), the FC1 output (2 x intermediate) and
    the SwiGLU output (intermediate), split over TP. Vision block (the Hugging Face module,
    replicated over TP): 8 x hidden + 4 x intermediate per patch.
    """
    h, kv, inter = d.hidden_size, d.kv_size, d.intermediate_size
    replicated = 4 * h / (tp if sequence_parallel else 1)
    split = (2 * h + 2 * kv + 3 * inter) / tp
    vision = 8 * d.vision_hidden_size + 4 * d.vision_intermediate_size
    return math.ceil(element_bytes * (replicated + split)), element_bytes * vision
