"""Resume rules: which config changes since a checkpoint are accepted, applied or refused."""

from __future__ import annotations

import pytest

from fastrl.checkpoint import config_diff as cd
from fastrl.cli import apply_overrides
from fastrl.config import ConfigError, RunConfig, field_docs


def _cfg(*overrides: str) -> dict:
    return apply_overrides(RunConfig(), list(overrides)).to_dict()


@pytest.mark.parametrize(
    "key",
    ["recipe", "logging.output_dir", "logging.run_name", "stage.max_steps", "stage.time_limit_s", "checkpoint.keep_last",
     "checkpoint.save_every", "checkpoint.resume", "checkpoint.allow_changed", "trainer.val_every",
     "trainer.val_before_train", "trainer.torch_threads", "reward.num_workers", "warm_start.sft_steps"],
)
def test_harmless_keys(key):
    assert cd.classify(key) == cd.HARMLESS


@pytest.mark.parametrize(
    "key",
    ["optimizer.lr", "optimizer.min_lr", "optimizer.lr_warmup_steps", "optimizer.lr_decay_style",
     "optimizer.weight_decay", "optimizer.adam_beta1", "trainer.max_steps", "trainer.epochs"],
)
def test_schedule_keys(key):
    assert cd.classify(key) == cd.SCHEDULE


@pytest.mark.parametrize(
    "key",
    ["data.train_path", "data.dataset", "data.max_train_samples", "data.shuffle_seed", cd.DATA_FINGERPRINT,
     "rollout.n", "rollout.prompts_per_step", "rollout.temperature", "algorithm.kl_coef", "algorithm.loss_type",
     "pruning.method", "adaptive_sampling.period", "parallel.micro_batch_size", "trainer.mini_batch_prompts",
     "trainer.seed", "precision.mode", "model.tiny_hidden_size", "reward.name", "checkpoint.save_optimizer",
     "a.key.nobody.knows"],
)
def test_keys_that_would_silently_make_another_run_are_refused(key):
    assert cd.classify(key) == cd.REFUSED


def test_layout_keys_are_accepted():
    assert cd.classify("parallel.tensor_model_parallel_size") == cd.LAYOUT
    assert cd.classify("parallel.pipeline_model_parallel_size") == cd.LAYOUT


def test_every_real_key_has_its_sections_class():
    for key in field_docs():
        kind = cd.classify(key)
        section = key.split(".")[0]
        if key in ("data.test_size", "data.test_path"):  # the held-out test split decides nothing
            assert kind == cd.HARMLESS, key
        elif section in ("data", "algorithm", "pruning", "adaptive_sampling", "model", "precision"):
            assert kind == cd.REFUSED, key
        elif section in ("logging", "stage", "warm_start"):
            assert kind == cd.HARMLESS, key
        elif section == "optimizer":
            assert kind == cd.SCHEDULE, key


def test_matches_is_a_key_or_a_whole_section():
    assert cd.matches("data.train_path", "data") and cd.matches("data.train_path", "data.train_path")
    assert cd.matches("data.train_path", "data.")
    assert not cd.matches("data_x.y", "data") and not cd.matches("data.train_path", "data.train")
    assert not cd.matches("data.train_path", "")


def test_unchanged_config_has_no_changes():
    assert cd.diff_configs(_cfg(), _cfg()) == []
    # lists (a JSON round trip) and tuples compare alike
    a = _cfg("checkpoint.allow_changed=[data]")
    b = {**a, "checkpoint": {**a["checkpoint"], "allow_changed": ["data"]}}
    assert cd.diff_configs(a, b) == []


def test_diff_lists_every_changed_key_with_its_class():
    old = _cfg("optimizer.lr=1e-4", "trainer.max_steps=2")
    new = _cfg("optimizer.lr=2e-4", "trainer.max_steps=4", "logging.run_name=x", "rollout.n=4", "trainer.mini_batch_prompts=4")
    changes = cd.diff_configs(old, new)
    assert [(c.key, c.old, c.new, c.kind) for c in changes] == [
        ("logging.run_name", None, "x", cd.HARMLESS),
        ("optimizer.lr", 1e-4, 2e-4, cd.SCHEDULE),
        ("rollout.n", 8, 4, cd.REFUSED),
        ("trainer.max_steps", 2, 4, cd.SCHEDULE),
        ("trainer.mini_batch_prompts", 32, 4, cd.REFUSED),
    ]
    assert [c.key for c in cd.refused(changes)] == ["rollout.n", "trainer.mini_batch_prompts"]
    assert changes[1].describe() == "optimizer.lr: 0.0001 -> 0.0002 (schedule: applied to the optimizer / LR schedule / run length)"
    assert "REFUSED" in changes[2].describe()


def test_allow_changed_accepts_named_keys_and_sections():
    old, new = _cfg(), _cfg("data.max_train_samples=48", "data.shuffle_seed=3", "rollout.n=4", "trainer.mini_batch_prompts=4")
    by_key = cd.diff_configs(old, new, allow_changed=("data.max_train_samples",))
    assert [c.key for c in cd.refused(by_key)] == ["data.shuffle_seed", "rollout.n", "trainer.mini_batch_prompts"]
    by_section = cd.diff_configs(old, new, allow_changed=("data", "rollout.n", "trainer.mini_batch_prompts"))
    assert cd.refused(by_section) == []
    assert all(c.allowed for c in by_section)
    assert "allowed by checkpoint.allow_changed" in by_section[0].describe()


def test_data_fingerprint_takes_part_like_a_data_key():
    old, new = _cfg(), _cfg()
    old["data"]["fingerprint"], new["data"]["fingerprint"] = "aaaa", "bbbb"
    changes = cd.diff_configs(old, new)
    assert [c.key for c in cd.refused(changes)] == [cd.DATA_FINGERPRINT]
    message = cd.refusal_message("ckpt/step_00000002", cd.refused(changes))
    assert "data.fingerprint" in message and "training records differ" in message
    assert "checkpoint.allow_changed=[data.fingerprint]" in message
    assert cd.refused(cd.diff_configs(old, new, allow_changed=("data",))) == []
    # a checkpoint written before fingerprints: nothing to compare, nothing listed
    del old["data"]["fingerprint"]
    assert cd.diff_configs(old, new) == []


def test_keys_of_another_version_are_listed_and_accepted():
    old, new = _cfg(), _cfg()
    del old["reward"]["timeout_s"]
    old["algorithm"]["retired_knob"] = 1
    changes = cd.diff_configs(old, new)
    assert [(c.key, c.kind, c.accepted) for c in changes] == [
        ("algorithm.retired_knob", cd.HARMLESS, True), ("reward.timeout_s", cd.HARMLESS, True),
    ]
    assert changes[0].describe().startswith("algorithm.retired_knob: 1 -> <absent>")


def test_refusal_message_names_the_keys_and_the_override():
    changes = cd.refused(cd.diff_configs(_cfg(), _cfg("data.max_train_samples=48", "pruning.method=random")))
    message = cd.refusal_message("/runs/x/checkpoints/step_00000004", changes)
    assert "data.max_train_samples: None -> 48" in message and "pruning.method: 'fastrl' -> 'random'" in message
    assert "checkpoint.allow_changed=[data.max_train_samples,pruning.method]" in message


def test_unknown_allow_changed_entries():
    keys = list(field_docs())
    assert cd.unknown_patterns(("data", "rollout.n", "data.fingerprint", "optimizer."), keys) == []
    assert cd.unknown_patterns(("dat", "rollout.nn"), keys) == ["dat", "rollout.nn"]


def test_allow_changed_on_the_command_line():
    cfg = apply_overrides(RunConfig(), ["checkpoint.allow_changed=[data, rollout.n]"])
    assert cfg.checkpoint.allow_changed == ("data", "rollout.n")
    assert apply_overrides(RunConfig(), ["checkpoint.allow_changed=data.train_path"]).checkpoint.allow_changed == ("data.train_path",)
    assert apply_overrides(RunConfig(), ["checkpoint.allow_changed=[]"]).checkpoint.allow_changed == ()
    assert RunConfig.from_dict(cfg.to_dict()) == cfg  # a config stored in a checkpoint reads back
    with pytest.raises(ConfigError, match="allow_changed"):
        RunConfig.from_dict({"checkpoint": {"allow_changed": ["data", " "]}})


def test_records_fingerprint_sees_content_and_order():
    rows = [(0, "What color?", "red"), (1, "What shape?", "circle")]
    fp = cd.records_fingerprint(rows)
    assert fp == cd.records_fingerprint(list(rows)) and len(fp) == 16
    assert fp != cd.records_fingerprint([(0, "What color?", "blue"), rows[1]])
    assert fp != cd.records_fingerprint(rows[::-1])
    assert fp != cd.records_fingerprint(rows[:1])
    assert cd.records_fingerprint([("a", "b")]) != cd.records_fingerprint([("ab",)])


def test_images_fingerprint_sees_each_image_and_its_record():
    # Breakage caught: a digest that ignores the bytes, concatenates them without the record
    # boundaries, or drops the image count.
    imgs = [(b"png-a",), (b"png-b", b"png-c"), ()]
    fp = cd.images_fingerprint(imgs)
    assert fp == cd.images_fingerprint([tuple(g) for g in imgs]) and len(fp) == 16
    assert fp != cd.images_fingerprint([(b"png-a",), (b"png-b", b"png-X"), ()])
    assert fp != cd.images_fingerprint([(b"png-a", b"png-b"), (b"png-c",), ()])
    assert fp != cd.images_fingerprint(imgs[:2])
    assert fp != cd.images_fingerprint([imgs[1], imgs[0], imgs[2]])
    with pytest.raises(TypeError, match="record 0: an image is str"):
        cd.images_fingerprint([("not bytes",)])


def test_images_fingerprint_takes_part_like_a_data_key():
    saved = {"data": {"fingerprint": "t", "images_fingerprint": "a"}}
    changes = cd.diff_configs(saved, {"data": {"fingerprint": "t", "images_fingerprint": "b"}})
    assert [c.key for c in cd.refused(changes)] == [cd.IMAGES_FINGERPRINT]
    assert "the training images differ" in cd.refusal_message("ckpt", cd.refused(changes))
    # a checkpoint written before the image fingerprint: nothing to compare, nothing refused
    assert cd.diff_configs({"data": {"fingerprint": "t"}}, {"data": {"fingerprint": "t", "images_fingerprint": "b"}}) == []
    assert cd.unknown_patterns(["data.images_fingerprint"], []) == []
