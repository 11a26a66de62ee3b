"""Datasets, prompt templates, image processing and the resumable prompt sampler.

    from fastrl.data import load_train_val, render_prompt, ResumableSampler
    train, val = load_train_val("easy_vqa")                  # LoadedData(records, report)
    prompt = render_prompt("easy_vqa_thinking", train.records[0])
    sampler = ResumableSampler(len(train), seed=0)

``fastrl.data.images`` (Qwen2.5-VL image processor helpers) imports torch and transformers; its
names are importable from here too but are loaded on first use.
"""

from fastrl.data.canonical import write_canonical
from fastrl.data.loaders import (
    DATASETS,
    LoadedData,
    check_disjoint_question_ids,
    load_records,
    load_test,
    load_train_val,
)
from fastrl.data.prompts import filter_long_prompts, list_templates, render_prompt, resolve_template
from fastrl.data.record import VAL_ID_OFFSET, BadRow, DataError, LoadReport, Record, decode_image
from fastrl.data.sampler import ResumableSampler, SampledBatch

_IMAGE_NAMES = ("make_image_processor", "process_images", "record_images", "num_image_tokens", "resized_size")

__all__ = [
    "DATASETS",
    "VAL_ID_OFFSET",
    "BadRow",
    "DataError",
    "LoadReport",
    "LoadedData",
    "Record",
    "ResumableSampler",
    "SampledBatch",
    "check_disjoint_question_ids",
    "decode_image",
    "filter_long_prompts",
    "list_templates",
    "load_records",
    "load_test",
    "load_train_val",
    "render_prompt",
    "resolve_template",
    "write_canonical",
    *_IMAGE_NAMES,
]


def __getattr__(name: str):
    if name in _IMAGE_NAMES:
        from fastrl.data import images

        return getattr(images, name)
    raise AttributeError(f"module 'fastrl.data' has no attribute {name!r}")
