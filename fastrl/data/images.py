"""Images through the Qwen2.5-VL image processor (transformers ``Qwen2VLImageProcessor``).

Qwen2.5-VL uses the Qwen2-VL processor: each image is resized so that both sides are multiples
of ``patch_size * merge_size`` (28) and its pixel count lies in ``[min_pixels, max_pixels]``
(``smart_resize``), then cut into 14x14 patches; every ``merge_size**2`` (4) patches become one
image token in the language model.
"""

from __future__ import annotations

import io
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


def set_pixel_bounds(image_processor, min_pixels: int | None, max_pixels: int | None) -> None:
    """Make a loaded Qwen2-VL / Qwen2.5-VL image processor (slow or fast) resize images into
    ``[min_pixels, max_pixels]`` (``data.min_pixels`` / ``data.max_pixels``), whatever bounds its
    checkpoint directory shipped. A bound given as None keeps the processor's own.

    Raises:
        ValueError: the resulting bounds are not ``1 <= min_pixels <= max_pixels``.
    """
    if min_pixels is None and max_pixels is None:
        return
    size = getattr(image_processor, "size", None)

    def current(name: str, key: str) -> int:
        value = getattr(image_processor, name, None)
        if value is None and size is not None:
            value = size[key] if isinstance(size, dict) else getattr(size, key, None)
        return int(value)

    lo = int(min_pixels) if min_pixels is not None else current("min_pixels", "shortest_edge")
    hi = int(max_pixels) if max_pixels is not None else current("max_pixels", "longest_edge")
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= min_pixels ({lo}) <= max_pixels ({hi})")
    image_processor.min_pixels = lo
    image_processor.max_pixels = hi
    if isinstance(size, dict) or size is None:
        image_processor.size = {**(size or {}), "shortest_edge": lo, "longest_edge": hi}
    else:  # the fast processor's SizeDict
        image_processor.size = type(size)(shortest_edge=lo, longest_edge=hi)


def image_token_count(
    width: int, height: int, *, min_pixels: int, max_pixels: int, patch_size: int = 14, merge_size: int = 2
) -> int:
    """Language-model tokens of one ``width`` x ``height`` image after the processor's resize
    (``smart_resize`` into ``[min_pixels, max_pixels]``): ``(h / patch) * (w / patch) / merge**2``.
    Computed from the size alone, without processing pixels (prompt-length filtering at load)."""
    factor = patch_size * merge_size
    h, w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return (h // patch_size) * (w // patch_size) // (merge_size**2)


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


def record_image_sizes(record: Record, *, square_size: int | None = None) -> list[tuple[int, int]]:
    """``(width, height)`` of each image of ``record`` as the processor receives it
    (:func:`record_images`), read from the image headers without decoding pixels."""
    if square_size is not None:
        return [(square_size, square_size)] * len(record.images)
    sizes = []
    for data in record.images:
        with Image.open(io.BytesIO(data)) as image:
            sizes.append(image.size)
    return sizes


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
