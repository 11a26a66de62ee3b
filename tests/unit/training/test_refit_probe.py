"""The refit probe scores the engine's greedy responses (fastrl/training/refit_verify.py::make_probe)."""

from __future__ import annotations

import types

import pytest
import torch

from fastrl.config import ModelConfig
from fastrl.models.tiny import build_tiny_text_model_dir
from fastrl.training.refit_verify import PROBE_QUESTIONS, PROBE_RESPONSE_TOKENS, make_probe


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    d = build_tiny_text_model_dir(tmp_path_factory.mktemp("probe") / "m", ModelConfig())
    return AutoTokenizer.from_pretrained(d / "tokenizer" if (d / "tokenizer").is_dir() else d)


class GreedyEngine:
    """What make_probe asks of an engine: one generate call; answers fixed 'greedy' tokens."""

    def __init__(self, responses):
        self.responses = responses
        self.calls = []

    def generate(self, prompts, n_per_prompt, sampling, **kw):
        self.calls.append((len(prompts), n_per_prompt, sampling))
        return types.SimpleNamespace(response_token_ids=[torch.tensor(r) for r in self.responses])


def test_the_probe_is_the_engines_greedy_response(tokenizer):
    """Each probe sequence is its chat prompt followed by the engine's greedy response (stop token
    included), asked for in one greedy call of at most PROBE_RESPONSE_TOKENS tokens.

    catches: the earlier probe of uniformly random tokens (log-probs of -15 to -30 in a trained
    model, where bf16 rounding moves them most), or a call at the rollout temperature."""
    responses = [[5, 6, 7], [8] * PROBE_RESPONSE_TOKENS, [9]]
    engine = GreedyEngine(responses)
    probe = make_probe(tokenizer, [0, 1], engine)
    (count, n, sampling), = engine.calls
    assert count == len(PROBE_QUESTIONS) and n == 1
    assert sampling.temperature == 0.0 and sampling.max_tokens == PROBE_RESPONSE_TOKENS
    for seq, start, response in zip(probe.sequences, probe.starts, responses):
        assert seq[start:].tolist() == response
        assert start > 0


def test_a_suppressed_id_in_the_greedy_response_is_refused(tokenizer):
    """catches: a probe built on a token the engine should never have produced (its suppression
    broken), which the trainer would then score as if it were samplable."""
    with pytest.raises(ValueError, match=r"suppressed token ids \[1\]"):
        make_probe(tokenizer, [0, 1], GreedyEngine([[5, 1], [6], [7]]))
