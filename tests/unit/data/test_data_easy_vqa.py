"""The embedded easy-vqa data: converted on first use, cached, real counts and question types."""

from __future__ import annotations

from collections import Counter

import pytest

from fastrl.data import VAL_ID_OFFSET, DataError, load_records, load_test, load_train_val
from fastrl.data.easy_vqa import CACHE_VERSION, prepare_easy_vqa, question_type


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fastrl-cache")


def test_conversion_is_cached(cache_dir):
    paths = prepare_easy_vqa(cache_dir)
    assert (cache_dir / "easy_vqa" / "VERSION").read_text().strip() == CACHE_VERSION
    mtimes = {split: p.stat().st_mtime_ns for split, p in paths.items()}
    assert prepare_easy_vqa(cache_dir) == paths
    assert {split: p.stat().st_mtime_ns for split, p in paths.items()} == mtimes  # not converted again


def test_splits_counts_ids_and_types(cache_dir):
    train, val = load_train_val("easy_vqa", cache_dir=cache_dir)
    test = load_test("easy_vqa", None, size=7673, cache_dir=cache_dir, others=(("training", train), ("validation", val)))
    # The package README: 38,575 train / 9,673 test questions; 28,407 / 7,136 of them yes/no. The
    # package's test questions are cut, in order, into validation (2,000) and held-out test (7,673).
    assert (len(train), len(val), len(test)) == (38575, 2000, 7673)
    assert [r.question_id for r in train.records[:3]] == [0, 1, 2]
    assert [r.question_id for r in val.records] == list(range(VAL_ID_OFFSET, VAL_ID_OFFSET + 2000))
    assert [r.question_id for r in test.records] == list(range(VAL_ID_OFFSET + 2000, VAL_ID_OFFSET + 9673))
    types = Counter(r.metadata["question_type"] for r in train.records)
    assert types["yes/no"] == 28407
    assert sum(Counter(r.metadata["question_type"] for r in s.records)["yes/no"] for s in (val, test)) == 7136
    with pytest.raises(DataError, match="data.test_size=7674 but easy-vqa's test split holds 7673"):
        load_test("easy_vqa", None, size=7674, cache_dir=cache_dir)
    assert len({r.answer for r in train.records}) == 13
    first = train.records[0]
    assert (first.problem, first.answer, first.metadata) == (
        "what is the blue shape?", "rectangle", {"question_type": "shape", "image_id": "0"},
    )
    image = first.pil_images()[0]
    assert image.size == (64, 64) and image.mode == "RGB"
    # Questions about the same image share one bytes object.
    assert train.records[1].images[0] is first.images[0]


def test_limit_and_question_type(cache_dir):
    assert len(load_records("easy_vqa", split="val", cache_dir=cache_dir, limit=2000)) == 2000
    assert [question_type(a) for a in ("yes", "no", "circle", "teal")] == ["yes/no", "yes/no", "shape", "color"]
