"""From a dataset record to the chat-formatted prompt an engine samples from.

The record's problem is rendered with the recipe's Jinja template (:mod:`fastrl.data.prompts`);
``<image>`` markers in the problem (Geometry3K style) place the images inside the text, otherwise
the images come first, as in the Qwen2.5-VL chat format. The chat template of the model's
tokenizer then adds the system and user turns and the assistant header.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastrl.data import Record, render_prompt
from fastrl.data.images import record_images
from fastrl.rollout.engine import RolloutPrompt

IMAGE_MARKER = "<image>"


def user_content(text: str, num_images: int) -> list[dict[str, str]]:
    """Chat ``content`` list for a user turn: images at their ``<image>`` markers, else first.

    Raises:
        ValueError: the text has markers but not one per image.
    """
    markers = text.count(IMAGE_MARKER)
    if markers == 0:
        return [{"type": "image"}] * num_images + [{"type": "text", "text": text}]
    if markers != num_images:
        raise ValueError(f"prompt has {markers} {IMAGE_MARKER} markers for {num_images} images: {text[:80]!r}")
    content: list[dict[str, str]] = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i > 0:
            content.append({"type": "image"})
        if piece.strip():
            content.append({"type": "text", "text": piece.strip()})
    return content


def chat_prompt_text(tokenizer: Any, text: str, num_images: int) -> str:
    """The full prompt string (system + user turn + assistant header) from the chat template."""
    messages = [{"role": "user", "content": user_content(text, num_images)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def record_prompt(record: Record, *, template: str, tokenizer: Any, image_size: int | None = None) -> RolloutPrompt:
    """The :class:`RolloutPrompt` of one record (``image_size``: square resize, easy-vqa recipes)."""
    images = tuple(record_images(record, square_size=image_size)) if record.images else ()
    text = chat_prompt_text(tokenizer, render_prompt(template, record), len(images))
    return RolloutPrompt(text=text, images=images)


def record_prompts(
    records: Sequence[Record], *, template: str, tokenizer: Any, image_size: int | None = None
) -> list[RolloutPrompt]:
    """:func:`record_prompt` for each record."""
    return [record_prompt(r, template=template, tokenizer=tokenizer, image_size=image_size) for r in records]
