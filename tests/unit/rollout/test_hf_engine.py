"""The in-process Hugging Face rollout engine on the tiny Qwen2.5-VL with real easy-vqa images."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from fastrl.config import ModelConfig, RolloutConfig
from fastrl.models.tiny import build_tiny_text_model_dir
from fastrl.rollout.engine import RolloutEngine, RolloutPrompt, SamplingParams
from fastrl.rollout.hf_engine import HFRolloutEngine, sample_tokens, teacher_forced_logprobs


def params(**overrides) -> SamplingParams:
    values = dict(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=10, seed=11)
    values.update(overrides)
    return SamplingParams(**values)


#: fp32 log-probs of KV-cached decoding against one teacher-forced forward: the rounding error
#: grows with |log p| (2.2e-5 seen at log p = -8.5 after a random refit of the output layer).
KV_CACHE_TOL = dict(atol=2e-5, rtol=1e-5)


def teacher_forced(engine, rollouts, temperature=1.0):
    return teacher_forced_logprobs(
        engine.model, [rollouts.prompt_inputs[i] for i in rollouts.prompt_index], rollouts.response_token_ids,
        pad_token_id=engine.pad_token_id, temperature=temperature,
    )


def test_engine_satisfies_the_protocol(engine):
    assert isinstance(engine, RolloutEngine)
    engine.sleep()  # no-ops on CPU
    engine.wake()


def test_variable_group_sizes_with_real_images(engine, easy_vqa_prompts):
    sizes = [3, 0, 1, 2, 4, 1]
    rollouts = engine.generate(easy_vqa_prompts, sizes, params())
    assert len(rollouts) == 11
    assert rollouts.n_per_prompt == sizes
    assert rollouts.prompt_index == [0, 0, 0, 2, 3, 3, 4, 4, 4, 4, 5]
    assert [s.stop - s.start for s in rollouts.group_slices()] == sizes
    image_id = engine.model.config.image_token_id
    for inputs in rollouts.prompt_inputs:
        assert int((inputs.input_ids == image_id).sum()) == 4
        assert inputs.image_grid_thw.tolist() == [[1, 4, 4]]
    for ids, lps, reason in zip(rollouts.response_token_ids, rollouts.logprobs, rollouts.finish_reasons):
        assert 1 <= ids.numel() <= 10 and lps.shape == ids.shape
        assert (lps <= 0).all() and torch.isfinite(lps).all()
        assert reason == ("stop" if int(ids[-1]) in engine.default_stop_token_ids else "length")
        assert not set(ids.tolist()) & set(engine.suppressed_ids)
    tok = engine.tokenizer
    assert rollouts.response_texts == [tok.decode(t.tolist(), skip_special_tokens=True) for t in rollouts.response_token_ids]
    ids, lps, mask = rollouts.padded(engine.pad_token_id)
    assert ids.shape == (11, max(rollouts.lengths)) and mask.sum().item() == sum(rollouts.lengths)
    # the same call with another group size per prompt (the adaptive sampler changes n)
    again = engine.generate(easy_vqa_prompts[:2], 2, params())
    assert again.n_per_prompt == [2, 2] and len(again) == 4


def test_seeded_sampling_is_reproducible(engine, tiny_vl_dir, easy_vqa_prompts):
    first = engine.generate(easy_vqa_prompts, 3, params(seed=7))
    second = engine.generate(easy_vqa_prompts, 3, params(seed=7))
    other = engine.generate(easy_vqa_prompts, 3, params(seed=8))
    assert all(torch.equal(a, b) for a, b in zip(first.response_token_ids, second.response_token_ids))
    assert all(torch.equal(a, b) for a, b in zip(first.logprobs, second.logprobs))
    assert any(not torch.equal(a, b) for a, b in zip(first.response_token_ids, other.response_token_ids))
    # without a per-call seed, two engines with the same engine seed give the same stream
    twin = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(seed=5))
    for _ in range(2):
        a = engine.generate(easy_vqa_prompts[:3], 2, params(seed=None))
        b = twin.generate(easy_vqa_prompts[:3], 2, params(seed=None))
        assert all(torch.equal(x, y) for x, y in zip(a.response_token_ids, b.response_token_ids))
    # and the stream moves on between calls
    c = engine.generate(easy_vqa_prompts[:3], 2, params(seed=None))
    assert any(not torch.equal(x, y) for x, y in zip(a.response_token_ids, c.response_token_ids))


def test_stop_token_ends_generation(engine, easy_vqa_prompts):
    greedy = params(temperature=0.0, max_tokens=12)
    full = engine.generate(easy_vqa_prompts[:1], 1, greedy).response_token_ids[0].tolist()
    assert len(full) == 12
    stop = full[4]
    first = full.index(stop)
    stopped = engine.generate(easy_vqa_prompts[:1], 1, SamplingParams(**{**greedy.__dict__, "stop_token_ids": (stop,)}))
    assert stopped.response_token_ids[0].tolist() == full[: first + 1]
    assert stopped.finish_reasons == ["stop"]
    # with sampling and several rows: a stopped response ends at its first stop token
    sampled = engine.generate(easy_vqa_prompts, 4, params(stop_token_ids=(stop,), max_tokens=12))
    for ids, reason in zip(sampled.response_token_ids, sampled.finish_reasons):
        ids = ids.tolist()
        assert (stop in ids) == (reason == "stop")
        if reason == "stop":
            assert ids.index(stop) == len(ids) - 1
        else:
            assert len(ids) == 12
    assert "stop" in sampled.finish_reasons


@pytest.mark.parametrize(
    "sampling",
    [params(), params(temperature=0.7, top_p=0.9), params(temperature=1.3, top_k=5), params(temperature=0.0)],
    ids=["t1", "t0.7-top_p", "t1.3-top_k", "greedy"],
)
def test_engine_logprobs_equal_a_teacher_forced_forward(engine, easy_vqa_prompts, sampling):
    rollouts = engine.generate(easy_vqa_prompts, [2, 1, 3, 1, 2, 1], sampling)
    reference = teacher_forced(engine, rollouts, sampling.logprob_temperature)
    for engine_lp, forced_lp in zip(rollouts.logprobs, reference):
        torch.testing.assert_close(engine_lp, forced_lp, **KV_CACHE_TOL)


def test_sampling_filters():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 5.0]]).repeat(200, 1)
    suppress = torch.tensor([False, False, False, False, True])
    tokens, lps = sample_tokens(logits, params(top_k=1), suppress, gen)
    assert (tokens == 1).all()  # token 4 is the largest but suppressed
    torch.testing.assert_close(lps, torch.log_softmax(logits, -1)[:, 1])  # log-prob before suppression
    tokens, _ = sample_tokens(logits, params(top_k=2), suppress, gen)
    assert set(tokens.tolist()) == {1, 2}
    tokens, _ = sample_tokens(logits, params(top_p=0.3), suppress, gen)
    assert set(tokens.tolist()) == {1}  # token 1 alone holds > 30% of the allowed mass
    tokens, _ = sample_tokens(logits, params(), suppress, gen)
    assert 4 not in tokens.tolist() and {0, 1, 2} <= set(tokens.tolist())
    tokens, lps = sample_tokens(logits, params(temperature=0.5), None, gen)
    torch.testing.assert_close(lps, torch.log_softmax(logits / 0.5, -1).gather(1, tokens[:, None]).squeeze(1))


def test_suppressed_tokens_cover_vision_bos_pad_and_padded_vocab(engine):
    config, tok = engine.model.config, engine.tokenizer
    for token_id in (config.image_token_id, config.video_token_id, config.vision_start_token_id,
                     config.vision_end_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id):
        assert token_id in engine.suppressed_ids
    assert set(range(len(tok), config.text_config.vocab_size)) <= set(engine.suppressed_ids)
    assert tok.convert_tokens_to_ids("<|im_end|>") not in engine.suppressed_ids


def test_update_weights_changes_outputs_and_refit_of_same_weights_is_exact(engine, tiny_vl_dir, easy_vqa_prompts):
    on_disk = load_file(tiny_vl_dir / "model.safetensors")
    assert any(k.startswith("model.layers.") for k in on_disk) and any(k.startswith("visual.") for k in on_disk)
    sampling = params(seed=3)
    before = engine.generate(easy_vqa_prompts, 2, sampling)

    # a refit of the same weights (streamed tensor by tensor): bit-identical rollouts
    assert engine.update_weights(iter(on_disk.items())) == len(on_disk)
    same = engine.generate(easy_vqa_prompts, 2, sampling)
    assert all(torch.equal(a, b) for a, b in zip(before.response_token_ids, same.response_token_ids))
    assert all(torch.equal(a, b) for a, b in zip(before.logprobs, same.logprobs))

    # new weights for the output layer, a language-model layer and the vision merger
    gen = torch.Generator().manual_seed(0)
    changed = {
        name: on_disk[name] + 0.5 * torch.randn(on_disk[name].shape, generator=gen)
        for name in ("lm_head.weight", "model.layers.3.mlp.down_proj.weight", "visual.merger.mlp.2.weight")
    }
    assert engine.update_weights(changed.items()) == 3
    model_params = dict(engine.model.named_parameters())
    assert torch.equal(model_params["lm_head.weight"], changed["lm_head.weight"])
    assert torch.equal(model_params["model.language_model.layers.3.mlp.down_proj.weight"],
                       changed["model.layers.3.mlp.down_proj.weight"])
    assert torch.equal(model_params["model.visual.merger.mlp.2.weight"], changed["visual.merger.mlp.2.weight"])
    after = engine.generate(easy_vqa_prompts, 2, sampling)
    assert any(not torch.equal(a, b) for a, b in zip(before.response_token_ids, after.response_token_ids))
    # the engine's log-probs follow the new weights: they equal a teacher-forced forward now
    for engine_lp, forced_lp in zip(after.logprobs, teacher_forced(engine, after)):
        torch.testing.assert_close(engine_lp, forced_lp, **KV_CACHE_TOL)
    # and the old responses are scored differently
    rescored = teacher_forced(engine, before)
    assert max((a - b).abs().max().item() for a, b in zip(rescored, before.logprobs)) > 1e-2

    # refit back to the initial weights: the first rollouts again, exactly
    engine.update_weights(on_disk.items())
    restored = engine.generate(easy_vqa_prompts, 2, sampling)
    assert all(torch.equal(a, b) for a, b in zip(before.logprobs, restored.logprobs))


def test_update_weights_rejects_unknown_names_and_bad_shapes(engine):
    with pytest.raises(KeyError, match="model.layers.99.mlp.up_proj.weight"):
        engine.update_weights([("model.layers.99.mlp.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="lm_head.weight"):
        engine.update_weights([("lm_head.weight", torch.zeros(3, 3))])


def test_bad_requests_are_rejected(engine, easy_vqa_prompts):
    with pytest.raises(ValueError, match="2 entries for 6 prompts"):
        engine.generate(easy_vqa_prompts, [1, 2], params())
    with pytest.raises(ValueError, match="n=-1"):
        engine.generate(easy_vqa_prompts[:1], [-1], params())
    with pytest.raises(ValueError, match="at least one prompt"):
        engine.generate([], 2, params())
    with pytest.raises(ValueError, match="top_p"):
        params(top_p=0.0)


def test_sampling_params_from_rollout_config():
    rollout = RolloutConfig(temperature=0.9, top_p=0.8, top_k=7, max_response_length=33, val_temperature=0.0)
    train = SamplingParams.for_training(rollout)
    assert (train.temperature, train.top_p, train.top_k, train.max_tokens) == (0.9, 0.8, 7, 33)
    val = SamplingParams.for_validation(rollout, seed=1)
    assert (val.temperature, val.top_p, val.top_k, val.seed, val.logprob_temperature) == (0.0, 1.0, -1, 1, 1.0)


def test_text_only_model_and_chunked_batches(tmp_path):
    path = build_tiny_text_model_dir(tmp_path / "tiny_text", ModelConfig())
    engine = HFRolloutEngine.from_pretrained(path, RolloutConfig(), max_num_seqs=3)
    tok = engine.tokenizer
    texts = ["what color is the shape?", "is there a red circle in the image?", "does the image contain a triangle?"]
    prompts = [RolloutPrompt(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                     add_generation_prompt=True)) for t in texts]
    rollouts = engine.generate(prompts, [2, 3, 1], params())  # rows 2 | 3 | 1 in three chunks
    assert len(rollouts) == 6 and rollouts.prompt_index == [0, 0, 1, 1, 1, 2]
    for engine_lp, forced_lp in zip(rollouts.logprobs, teacher_forced(engine, rollouts)):
        torch.testing.assert_close(engine_lp, forced_lp, **KV_CACHE_TOL)
    whole = HFRolloutEngine.from_pretrained(path, RolloutConfig(), max_num_seqs=64).generate(
        prompts, [2, 3, 1], params(temperature=0.0))
    chunked = engine.generate(prompts, [2, 3, 1], params(temperature=0.0))
    assert all(torch.equal(a, b) for a, b in zip(whole.response_token_ids, chunked.response_token_ids))
    with pytest.raises(ValueError, match="text tokenizer"):
        engine.generate([RolloutPrompt("what?", (object(),))], 1, params())


def test_padded_vocabulary_ids_are_suppressed_whatever_the_setting():
    # Breakage caught: with rollout.suppress_special_tokens=false the Hugging Face engine could
    # sample the padded vocabulary's ids (no token: nothing to decode) where the vLLM engine, whose
    # allowed set is the tokenizer's ids, could not: two engines, two samplers.
    from types import SimpleNamespace

    from fastrl.rollout.hf_engine import suppressed_token_ids

    class Tok:
        bos_token_id, pad_token_id, unk_token_id = 0, 1, None

        def __len__(self):
            return 6

        def get_vocab(self):
            return {"<s>": 0, "<pad>": 1, "a": 2, "b": 3, "c": 4, "<|image_pad|>": 5}

    config = SimpleNamespace(vocab_size=8, bos_token_id=0, pad_token_id=1)
    assert suppressed_token_ids(config, Tok(), special_tokens=False) == [5, 6, 7]
    assert suppressed_token_ids(config, Tok(), special_tokens=True) == [0, 1, 5, 6, 7]


def test_the_only_stop_token_stays_samplable_when_it_is_also_the_pad_token(tmp_path):
    # SmolLM2-135M-Instruct: <|im_end|> is its end of turn, eos and pad. Breakage caught (seen):
    # suppressing pad suppressed the only stop token, so every rollout of the SmolLM2 recipes ran to
    # the length limit (1,280 of 1,280 rollouts of a 20-step run finished by length) and the policy was
    # trained on what it wrote after the answer. Qwen's shape (stop tokens <|im_end|> and
    # <|endoftext|>, pad <|endoftext|>) keeps <|endoftext|> suppressed: <|im_end|> ends responses.
    import json
    from types import SimpleNamespace

    from fastrl.rollout.hf_engine import default_stop_token_ids, suppressed_token_ids

    class Tok:
        def __init__(self, bos, pad):
            self.bos_token_id, self.pad_token_id, self.unk_token_id = bos, pad, None

        def __len__(self):
            return 6

        def get_vocab(self):
            return {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "a": 3, "b": 4, "<|image_pad|>": 5}

    smol = SimpleNamespace(vocab_size=8, bos_token_id=1, pad_token_id=2)
    assert suppressed_token_ids(smol, Tok(1, 2), stop_token_ids=(2,)) == [1, 5, 6, 7]
    assert suppressed_token_ids(smol, Tok(1, 2)) == [1, 2, 5, 6, 7]  # no stop tokens named: the old rule
    qwen = SimpleNamespace(vocab_size=8, bos_token_id=None, pad_token_id=0)
    assert suppressed_token_ids(qwen, Tok(None, 0), stop_token_ids=(2, 0)) == [0, 5, 6, 7]
    with pytest.raises(ValueError, match=r"every stop token \[5\]"):
        suppressed_token_ids(qwen, Tok(None, 0), stop_token_ids=(5,))

    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(eos_token_id=2))
    assert default_stop_token_ids(tmp_path, config) == (2,)  # no generation_config.json: config.json's
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert default_stop_token_ids(tmp_path, config) == (2, 0)
    with pytest.raises(ValueError, match="names an eos_token_id"):
        default_stop_token_ids(tmp_path / "none", SimpleNamespace(get_text_config=lambda: SimpleNamespace(eos_token_id=None)))


def test_vision_tokens_are_never_sampled_even_without_special_token_suppression(tiny_vl_dir, easy_vqa_prompts):
    # rollout.suppress_special_tokens=false: bos / pad / unk become sampleable, vision tokens never.
    # The output layer is biased so that the image placeholder is the most likely token. Breakage
    # caught: the build where the setting also un-suppressed vision tokens, whose sampled
    # placeholder then failed the step's forward pass ("Image features and image tokens do not
    # match", issue 33, item 2).
    engine = HFRolloutEngine.from_pretrained(tiny_vl_dir, RolloutConfig(seed=5, suppress_special_tokens=False))
    config, tok = engine.model.config, engine.tokenizer
    vision = {config.image_token_id, config.video_token_id, config.vision_start_token_id, config.vision_end_token_id}
    assert vision <= set(engine.suppressed_ids)
    assert tok.pad_token_id not in engine.suppressed_ids and tok.bos_token_id not in engine.suppressed_ids
    head = engine.model.lm_head
    with torch.no_grad():
        head.weight[config.image_token_id] = head.weight[config.image_token_id] * 0 + 1.0
        head.weight[config.image_token_id] *= 50.0 / head.weight[config.image_token_id].norm()
    rollouts = engine.generate(easy_vqa_prompts, 4, params(temperature=2.0))
    sampled = set(torch.cat(rollouts.response_token_ids).tolist())
    assert not sampled & vision
    lps = teacher_forced(engine, rollouts, temperature=2.0)  # the forward pass that failed
    assert all(torch.isfinite(lp).all() for lp in lps)
