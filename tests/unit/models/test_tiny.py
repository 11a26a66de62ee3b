"""The tiny Qwen2.5-VL model directory: tokenizer, config, processor, weights, caching."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from easy_vqa import get_answers, get_train_image_paths, get_train_questions
from PIL import Image
from safetensors.torch import load_file

from fastrl.config import ModelConfig
from fastrl.models import tiny, tiny_tokenizer

RESPONSE = "<thinking> the shape is red </thinking> \\boxed{red}"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.build_tiny_hf_model_dir(tmp_path_factory.mktemp("tiny") / "model", ModelConfig())


def test_pre_tokenization_splits_markup_latex_words_and_punctuation():
    assert tiny_tokenizer.pre_tokenize_words(RESPONSE + " is it?") == [
        "<thinking>", "the", "shape", "is", "red", "</thinking>", "\\boxed{", "red", "}", "is", "it", "?",
    ]
    assert tiny_tokenizer.pre_tokenize_words("<|im_start|>user\nwhat{x}") == ["user", "what", "{", "x", "}"]


def test_tokenizer_round_trips_a_template_response(tokenizer):
    ids = tokenizer(RESPONSE, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == tiny_tokenizer.pre_tokenize_words(RESPONSE)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == RESPONSE
    # with the end-of-turn token, decoding with skip_special_tokens gives the text back
    ids_end = tokenizer(RESPONSE + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids_end[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.decode(ids_end, skip_special_tokens=True) == RESPONSE


def test_vocabulary_covers_every_easy_vqa_question_and_answer(tokenizer):
    questions, answers, _ = get_train_questions()
    for text in questions[:2000] + answers[:2000] + get_answers():
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, text
        assert tokenizer.decode(ids) == text


def test_unknown_words_map_to_unk_and_extra_texts_extend_the_vocabulary_after_the_base(tokenizer):
    ids = tokenizer("the zebra", add_special_tokens=False)["input_ids"]
    assert ids[1] == tokenizer.unk_token_id
    extended = tiny_tokenizer.build_tiny_tokenizer(extra_texts=["a zebra and an okapi"])
    assert len(extended) == len(tokenizer) + 3  # an, okapi, zebra
    # base ids do not move
    for word in ("the", "red", "<thinking>", "\\boxed{", "}"):
        assert extended.convert_tokens_to_ids(word) == tokenizer.convert_tokens_to_ids(word)
    assert extended("the zebra", add_special_tokens=False)["input_ids"][1] == len(tokenizer) + 2


def test_special_tokens_and_padded_vocab(tokenizer):
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    for token in tiny_tokenizer.SPECIAL_TOKENS:
        assert tokenizer.convert_ids_to_tokens(tokenizer.convert_tokens_to_ids(token)) == token
    config = tiny.tiny_qwen25vl_config(ModelConfig(), tokenizer)
    assert config.text_config.vocab_size % 64 == 0
    assert len(tokenizer) <= config.text_config.vocab_size < len(tokenizer) + 64
    head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_scaling["mrope_section"]) == head_dim // 2
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size


def test_config_rejects_head_dim_not_multiple_of_8(tokenizer):
    with pytest.raises(ValueError, match="multiple of 8"):
        tiny.tiny_qwen25vl_config(
            ModelConfig(tiny_hidden_size=48, tiny_num_attention_heads=4, tiny_num_key_value_heads=2), tokenizer
        )


def test_model_dir_loads_back_and_runs_a_forward_on_a_real_image(model_dir):
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir).eval()
    n_params = sum(p.numel() for p in model.parameters())
    assert 3_000_000 <= n_params <= 20_000_000
    assert model.config.text_config.num_hidden_layers == 4
    assert model.config.vision_config.depth == 2

    processor = tiny.load_processor(model_dir)
    assert len(AutoTokenizer.from_pretrained(model_dir)) == len(processor.tokenizer)
    question = get_train_questions()[0][0]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    image = Image.open(get_train_image_paths()[0]).convert("RGB")
    assert image.size == (64, 64)
    batch = processor(text=[text], images=[image], return_tensors="pt")
    image_id = model.config.image_token_id
    assert int((batch["input_ids"] == image_id).sum()) == 4  # 56x56 -> 4x4 patches -> 2x2 merged
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4]]
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    # a random model is not degenerate: different images give different next-token logits
    other = Image.open(get_train_image_paths()[1]).convert("RGB")
    batch2 = processor(text=[text], images=[other], return_tensors="pt")
    with torch.no_grad():
        logits2 = model(**batch2).logits
    assert not torch.allclose(logits[0, -1], logits2[0, -1])


def test_processor_rejects_videos_without_a_video_processor(model_dir):
    from transformers.utils import is_torchvision_available

    processor = tiny.load_processor(model_dir)
    if is_torchvision_available():  # GPU clusters: the full AutoProcessor
        assert processor.video_processor is not None
    else:
        with pytest.raises(ValueError, match="video"):
            processor(text=["<|vision_start|><|video_pad|><|vision_end|>"], videos=[[Image.new("RGB", (56, 56))]])


def test_model_dir_is_cached_and_reproducible(model_dir, tmp_path):
    weights = model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert tiny.build_tiny_hf_model_dir(model_dir, ModelConfig()) == model_dir
    assert weights.stat().st_mtime_ns == mtime
    stamp = json.loads((model_dir / "fastrl_tiny_model.json").read_text())
    assert stamp["key"] == tiny.tiny_model_settings(ModelConfig()).key()

    # same settings elsewhere -> bit-identical weights; another seed -> different weights
    again = tiny.build_tiny_hf_model_dir(tmp_path / "again", ModelConfig())
    other = tiny.build_tiny_hf_model_dir(tmp_path / "other", replace(ModelConfig(), seed=7))
    a, b, c = (load_file(d / "model.safetensors") for d in (model_dir, again, other))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])
    # on-disk names are the Hugging Face checkpoint names
    assert "model.layers.0.self_attn.q_proj.weight" in a and "visual.merger.mlp.0.weight" in a

    with pytest.raises(FileExistsError, match="other settings"):
        tiny.build_tiny_hf_model_dir(model_dir, replace(ModelConfig(), seed=7))
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileExistsError, match="not a tiny model directory"):
        tiny.build_tiny_hf_model_dir(tmp_path / "plain", ModelConfig())


def test_tied_embeddings_option(tmp_path):
    from transformers import Qwen2_5_VLForConditionalGeneration

    path = tiny.build_tiny_hf_model_dir(tmp_path / "tied", ModelConfig(), tie_word_embeddings=True)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_cached_dirs_are_named_by_settings(tmp_path):
    a = tiny.cached_tiny_model_dir(tmp_path, ModelConfig(), text_only=True)
    b = tiny.cached_tiny_model_dir(tmp_path, replace(ModelConfig(), seed=9), text_only=True)
    assert a != b and a.name.startswith("tiny-qwen2-") and b.name.startswith("tiny-qwen2-")
    assert tiny.cached_tiny_model_dir(tmp_path, ModelConfig(), text_only=True) == a
    assert (a / tiny.TOKENIZER_SUBDIR / "tokenizer.json").is_file()
    config = json.loads((a / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] % 64 == 0


def test_tiny_processor_is_assembled_also_where_torchvision_is_installed(tmp_path, monkeypatch):
    """With torchvision (GPU machines) AutoProcessor refuses the tiny model's word-level tokenizer
    (TypeError: a Qwen2Tokenizer(Fast) was expected); load_processor must not call it for that
    tokenizer class."""
    import transformers
    import transformers.utils

    from fastrl.config import ModelConfig
    from fastrl.models.tiny import build_tiny_hf_model_dir, load_processor

    small = ModelConfig(
        tiny_hidden_size=64, tiny_num_layers=1, tiny_intermediate_size=64, tiny_vision_hidden_size=32, tiny_vision_depth=1
    )
    path = build_tiny_hf_model_dir(tmp_path / "tiny", small)

    def refuse(*args, **kwargs):
        raise TypeError("Received a PreTrainedTokenizerFast for argument tokenizer")

    monkeypatch.setattr(transformers.utils, "is_torchvision_available", lambda: True)
    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", refuse)
    processor = load_processor(path)
    from PIL import Image

    image = Image.new("RGB", (56, 56))
    out = processor(text=["<|vision_start|><|image_pad|><|vision_end|> what"], images=[image], return_tensors="pt")
    assert int(out["image_grid_thw"].prod()) == 16 and out["input_ids"].shape[0] == 1
