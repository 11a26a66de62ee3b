"""Images through the Qwen2.5-VL image processor (transformers ``Qwen2VLImageProcessor``).

Qwen2.5-VL uses the Qwen2-VL processor: each image is resized so that both sides are multiples
of ``patch_size * merge_size`` (28) and its pixel count lies in ``[min_pixels, max_pixels]``
(``smart_resize``), then cut into 14x14 patches; every ``merge_size**2`` (4) patches become one
image token in the language model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize

from fastrl.data.record import Record


def make_image_processor(
    min_pixels: int, max_pixels: int, *, patch_size: int = 14, merge_size: int = 2, temporal_patch_size: int = 2
) -> Qwen2VLImageProcessor:
    """A Qwen2-VL / Qwen2.5-VL image processor with the given pixel bounds (no download needed).

    Raises:
        ValueError: ``min_pixels`` > ``max_pixels`` or a non-positive bound.
    """
    if min_pixels < 1 or max_pixels < min_pixels:
        raise ValueError(f"need 1 <= min_pixels ({min_pixels}) <= max_pixels ({max_pixels})")
    return Qwen2VLImageProcessor(
        min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch_size,
        merge_size=merge_size, temporal_patch_size=temporal_patch_size,
    )


def resized_size(width: int, height: int, processor: Qwen2VLImageProcessor) -> tuple[int, int]:
    """``(width, height)`` the processor will resize an image of this size to."""
    factor = processor.patch_size * processor.merge_size
    h, w = smart_resize(height, width, factor=factor, min_pixels=processor.min_pixels, max_pixels=processor.max_pixels)
    return w, h


def record_images(record: Record, *, square_size: int | None = None) -> list[Image.Image]:
    """The record's images as RGB PIL images, optionally resized to ``square_size`` x ``square_size``
    (bicubic) first (the easy-vqa recipes use 56)."""
    images = record.pil_images()
    if square_size is not None:
        images = [im.resize((square_size, square_size), Image.Resampling.BICUBIC) for im in images]
    return images


def process_images(processor: Qwen2VLImageProcessor, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
    """Run the processor on ``images``.

    Returns:
        ``pixel_values``: float32 ``[total_patches, 3 * temporal_patch_size * patch_size**2]``
        (``[sum_i t_i*h_i*w_i, 1176]`` with the defaults), and ``image_grid_thw``: int64
        ``[num_images, 3]`` (temporal, height, width patch counts per image).
    """
    if not images:
        raise ValueError("process_images needs at least one image")
    out = processor(images=list(images), return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def num_image_tokens(image_grid_thw: torch.Tensor, merge_size: int = 2) -> list[int]:
    """Language-model tokens per image: ``t * h * w / merge_size**2`` for each row of the grid."""
    return [int(t * h * w) // (merge_size**2) for t, h, w in image_grid_thw.tolist()]
