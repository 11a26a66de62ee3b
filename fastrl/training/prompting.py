"""From a dataset record to the chat-formatted prompt an engine samples from.

The record's problem is rendered with the recipe's Jinja template (:mod:`fastrl.data.prompts`);
``<image>`` markers in the problem (Geometry3K style) place the images inside the text, otherwise
the images come first, as in the Qwen2.5-VL chat format. The chat template of the model's
tokenizer then adds the system and user turns and the assistant header. :class:`PromptSource`
draws the training prompts of each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastrl.config import DataConfig
from fastrl.data import LoadReport, Record, ResumableSampler, render_prompt
from fastrl.data.images import image_token_count, record_image_sizes, record_images
from fastrl.data.prompts import filter_records_by_length, prompt_renderer
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
    """The full prompt string (system + user turn + assistant header) from the chat template.

    A prompt without images is a plain string ``content``, the form every chat template takes (text
    models' templates, SmolLM2's among them, concatenate ``message['content']`` as a string; the
    Qwen2.5-VL templates render a string as they render a single text part)."""
    content = user_content(text, num_images) if num_images or IMAGE_MARKER in text else text
    messages = [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def record_prompt(record: Record, *, template: str, tokenizer: Any, image_size: int | None = None) -> RolloutPrompt:
    """The :class:`RolloutPrompt` of one record (``image_size``: square resize, easy-vqa recipes)."""
    images = tuple(record_images(record, square_size=image_size)) if record.images else ()
    text = chat_prompt_text(tokenizer, render_prompt(template, record), len(images))
    return RolloutPrompt(text=text, images=images)


def prompt_length(
    record: Record, *, template: str, tokenizer: Any, image_size: int | None, min_pixels: int, max_pixels: int
) -> int:
    """Tokens of ``record``'s chat prompt as the model sees it: text tokens plus each image's tokens
    after the processor's resize into ``[min_pixels, max_pixels]`` (Qwen2.5-VL: one token per 28 x 28
    pixels), computed from the image headers without processing pixels."""
    sizes = record_image_sizes(record, square_size=image_size) if record.images else []
    text = chat_prompt_text(tokenizer, render_prompt(template, record), len(sizes))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # each image placeholder token expands into the image's tokens
    extra = sum(image_token_count(w, h, min_pixels=min_pixels, max_pixels=max_pixels) - 1 for w, h in sizes)
    return len(ids) + extra


def filter_long_prompts_at_load(
    records: Sequence[Record], report: LoadReport | None, *, data: DataConfig, max_prompt_length: int,
    tokenizer: Any, what: str,
) -> list[Record]:
    """``rollout.max_prompt_length``: the records whose :func:`prompt_length` fits, counted in
    ``report`` (metric ``data/prompts_filtered_too_long``) and logged. Text token counts are
    memoized per rendered prompt (datasets such as easy-vqa repeat few question texts)."""
    text_tokens: dict[tuple[str, int], int] = {}
    render = prompt_renderer(data.template)

    def length(record: Record) -> int:
        sizes = record_image_sizes(record, square_size=data.prompt_image_size) if record.images else []
        key = (render(record), len(sizes))
        if key not in text_tokens:
            text = chat_prompt_text(tokenizer, key[0], key[1])
            text_tokens[key] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return text_tokens[key] + sum(
            image_token_count(w, h, min_pixels=data.min_pixels, max_pixels=data.max_pixels) - 1 for w, h in sizes
        )

    return filter_records_by_length(records, length, max_prompt_length, report=report, what=what)


@dataclass(frozen=True)
class PromptBatch:
    """This DP rank's slice of a step's global prompt batch.

    Attributes:
        items: ``(group id, record)`` pairs; group ids are positions in the global batch, offset
            by ``round_index x prompts`` for DAPO's extra generation rounds (unique within a step).
        epochs_completed: data epochs the sampler finished while drawing this batch.
    """

    items: list[tuple[int, Record]]
    epochs_completed: int

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, Record]:
        return self.items[i]


class PromptSource:
    """Training prompts: draws global batches from a resumable sampler, slices them per DP rank,
    and renders (and caches) each record's chat prompt.

    Args:
        records: the training records.
        template: the prompt template (``data.template``).
        tokenizer: the engine's tokenizer (its chat template).
        image_size: square resize of images (``data.prompt_image_size``), or None.
    """

    def __init__(self, records: Sequence[Record], *, template: str, tokenizer: Any, image_size: int | None) -> None:
        self.records = list(records)
        self.template = template
        self.tokenizer = tokenizer
        self.image_size = image_size
        self._cache: dict[int, RolloutPrompt] = {}

    def prompt_of(self, record: Record) -> RolloutPrompt:
        """The (cached) rendered prompt of ``record``."""
        if record.question_id not in self._cache:
            self._cache[record.question_id] = record_prompt(
                record, template=self.template, tokenizer=self.tokenizer, image_size=self.image_size
            )
        return self._cache[record.question_id]

    def next_batch(
        self, sampler: ResumableSampler, count: int, *, dp_size: int, dp_rank: int, round_index: int = 0
    ) -> PromptBatch:
        """Draw ``count`` prompts (the global batch) and return this DP rank's slice."""
        batch = sampler.next_batch(count)
        pairs = [(round_index * count + g, self.records[i]) for g, i in enumerate(batch.indices)]
        return PromptBatch(pairs[dp_rank::dp_size], batch.epochs_completed)
