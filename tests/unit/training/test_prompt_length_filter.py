"""rollout.max_prompt_length filters over-long prompts at load (image tokens included), counted in
the start-up metrics and logged."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest
from PIL import Image

from fastrl.config import DataConfig, ModelConfig, RolloutConfig
from fastrl.data import DataError, LoadedData, LoadReport, Record
from fastrl.models.tiny import build_tiny_hf_model_dir, load_processor
from fastrl.rollout.hf_engine import prepare_prompt_inputs
from fastrl.training.parts import _filter_long_prompts
from fastrl.training.prompting import prompt_length, record_prompt


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def record(qid: int, size: tuple[int, int], problem: str = "What is the angle ABC?") -> Record:
    return Record(question_id=qid, problem=problem, answer="3", images=(png(*size),))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_hf_model_dir(tmp_path_factory.mktemp("filter") / "tiny", ModelConfig())


def data_config(**kw) -> DataConfig:
    return DataConfig(dataset="geometry3k", train_path="unused.parquet", template="geometry_thinking", **kw)


@pytest.mark.parametrize("bounds", [(56 * 56, 1024 * 28 * 28), (56 * 56, 112 * 112)])
def test_prompt_length_is_what_the_processor_produces(model_dir, bounds):
    from fastrl.data.images import set_pixel_bounds

    lo, hi = bounds
    data = data_config(min_pixels=lo, max_pixels=hi)
    processor = load_processor(model_dir)
    set_pixel_bounds(processor.image_processor, lo, hi)
    for r in (record(0, (64, 64)), record(1, (600, 340)), record(2, (90, 500), problem="x <image> y")):
        prompt = record_prompt(r, template=data.template, tokenizer=processor.tokenizer)
        actual = int(prepare_prompt_inputs(processor, prompt).input_ids.numel())
        computed = prompt_length(
            r, template=data.template, tokenizer=processor.tokenizer, image_size=None, min_pixels=lo, max_pixels=hi
        )
        assert computed == actual, (r.question_id, computed, actual)


def test_long_prompts_are_filtered_at_load_and_counted(model_dir, caplog):
    small = [record(i, (64, 64)) for i in range(3)]
    large = [record(10 + i, (560, 560)) for i in range(2)]  # 400 image tokens each
    train = LoadedData(records=[small[0], large[0], small[1], large[1], small[2]], report=LoadReport("t", [], 5, 5))
    val = LoadedData(records=[record(1_000_000_000, (560, 560)), record(1_000_000_001, (64, 64))],
                     report=LoadReport("v", [], 2, 2))
    test = LoadedData(records=[record(2_000_000_000, (64, 64)), record(2_000_000_001, (560, 560))],
                      report=LoadReport("h", [], 2, 2))
    cfg = SimpleNamespace(data=data_config(), rollout=RolloutConfig(max_prompt_length=200))
    with caplog.at_level(logging.WARNING, logger="fastrl.data.prompts"):
        kept_train, kept_val, kept_test = _filter_long_prompts(cfg, model_dir, train, val, LoadedData(test.records[:1], test.report))
    assert kept_train == small and [r.question_id for r in kept_val] == [1_000_000_001]
    metrics = train.report.as_metrics()
    assert metrics["data/prompts_filtered_too_long"] == 2 and metrics["data/rows_kept"] == 3
    assert val.report.prompts_filtered_too_long == 1
    assert [r.question_id for r in kept_test] == [2_000_000_000]
    # a held-out test question that does not fit is an error, not a smaller test split
    with pytest.raises(DataError, match=r"1 of the data.test_size=2 held-out test questions are longer than .*question id 2000000001\)"):
        _filter_long_prompts(cfg, model_dir, train, val, test)
    assert _filter_long_prompts(cfg, model_dir, train, val)[2] == []  # no test split asked for
    assert "filtered 2 of 5 prompt(s) longer than 200 tokens (training data)" in caplog.text
    # the same images fit under narrower pixel bounds: nothing is filtered
    narrow = SimpleNamespace(data=data_config(max_pixels=112 * 112), rollout=RolloutConfig(max_prompt_length=200))
    train2 = LoadedData(records=list(train.records), report=LoadReport("t", [], 5, 5))
    assert len(_filter_long_prompts(narrow, model_dir, train2, val)[0]) == 5
    # nothing fits: a clear error instead of an empty run
    tight = SimpleNamespace(data=data_config(), rollout=RolloutConfig(max_prompt_length=5))
    with pytest.raises(ValueError, match="max_prompt_length=5"):
        _filter_long_prompts(tight, model_dir, LoadedData(list(small), LoadReport("t", [], 3, 3)), val)
