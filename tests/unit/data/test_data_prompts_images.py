"""Prompt templates, long-prompt filtering and the Qwen2.5-VL image processor helpers."""

from __future__ import annotations

import logging

import jinja2
import pytest
import torch
from _data_files import png

from fastrl.data import Record, filter_long_prompts, list_templates, render_prompt
from fastrl.data.images import make_image_processor, num_image_tokens, process_images, record_images, resized_size
from fastrl.data.record import LoadReport


def _record(problem="<image>Find the measure of angle x.", images=()):
    return Record(question_id=0, problem=problem, answer="SECRET-ANSWER", images=tuple(images))


def test_builtin_templates_ask_for_thinking_then_boxed():
    assert {"geometry_thinking", "easy_vqa_thinking", "math_thinking"} <= set(list_templates())
    for name in ("geometry_thinking", "easy_vqa_thinking", "math_thinking"):
        prompt = render_prompt(name, _record())
        assert prompt.startswith("<image>Find the measure of angle x.")
        assert "<thinking> </thinking>" in prompt and "\\boxed{}" in prompt
        assert prompt.index("<thinking>") < prompt.index("\\boxed{}")
        assert "SECRET-ANSWER" not in prompt


def test_template_cannot_use_the_answer_and_custom_paths(tmp_path):
    leaky = tmp_path / "leaky.jinja"
    leaky.write_text("{{ problem }} (answer: {{ answer }})")
    with pytest.raises(jinja2.UndefinedError, match="answer"):
        render_prompt(leaky, _record())
    custom = tmp_path / "custom.jinja"
    custom.write_text("Q{{ num_images }}: {{ problem | trim }} [{{ metadata.get('kind', '-') }}]\n")
    assert render_prompt(str(custom), _record(problem="  why?  ", images=[png()])) == "Q1: why? [-]"
    with pytest.raises(FileNotFoundError, match="unknown prompt template 'nope'; known: .*geometry_thinking"):
        render_prompt("nope", _record())


def test_filter_long_prompts_counts_and_logs(caplog):
    records = [_record(problem="short"), _record(problem=" ".join(["word"] * 100)), _record(problem="also short")]
    report = LoadReport(source="test", paths=[], rows_kept=3)
    with caplog.at_level(logging.WARNING, logger="fastrl.data.prompts"):
        kept = filter_long_prompts(records, "geometry_thinking", lambda text: len(text.split()), 80, report=report)
    assert kept == [records[0], records[2]]
    assert report.prompts_filtered_too_long == 1 and report.rows_kept == 2
    assert "filtered 1 of 3 prompt(s) longer than 80" in caplog.text


def test_image_processor_bounds_and_token_counts():
    processor = make_image_processor(56 * 56, 56 * 56)
    small = _record(images=[png(64, 64)])
    out = process_images(processor, record_images(small, square_size=56))
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert out["pixel_values"].shape == (16, 3 * 2 * 14 * 14) and out["pixel_values"].dtype == torch.float32
    assert num_image_tokens(out["image_grid_thw"]) == [4]

    bounded = make_image_processor(28 * 28, 112 * 112)
    out = process_images(bounded, record_images(_record(images=[png(300, 200), png(10, 10)])))
    grids = out["image_grid_thw"].tolist()
    for t, h, w in grids:
        assert 28 * 28 <= h * w * 14 * 14 <= 112 * 112
    assert grids == [[1, 6, 8], [1, 2, 2]]
    assert resized_size(300, 200, bounded) == (112, 84)
    assert out["pixel_values"].shape[0] == sum(t * h * w for t, h, w in grids)
    with pytest.raises(ValueError, match="min_pixels"):
        make_image_processor(100, 10)
