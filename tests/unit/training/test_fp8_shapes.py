"""FP8-safe shapes: under precision.mode=fp8 the step's sequence length is padded so that every
micro-batch satisfies Transformer Engine's FP8 GEMM divisibility, and the padding changes neither
log-probs nor losses nor KL."""

from __future__ import annotations

import math

import pytest
import torch

from fastrl.algorithms.losses import gspo_loss, kl_loss, loss_denominator, ppo_clip_loss
from fastrl.config import ParallelConfig, PrecisionConfig
from fastrl.rollout.engine import PromptInputs, RolloutPrompt, Rollouts
from fastrl.training.rollout_batch import AdvantagedRollouts, ScoredRollouts, sequence_multiple, to_policy_batch

VOCAB = 64
PAD = 0


def _fp8(monkeypatch, recipe: str = "delayed", fmt: str = "hybrid") -> PrecisionConfig:
    """A real fp8 PrecisionConfig (built anywhere; only training needs Transformer Engine)."""
    return PrecisionConfig(mode="fp8", fp8_recipe=recipe, fp8_format=fmt)


def te_fp8_gemm_ok(t: torch.Tensor) -> bool:
    """Transformer Engine's ``assert_dim_for_fp8_exec``: product of leading dims % 8, last dim % 16."""
    return math.prod(t.shape[:-1]) % 8 == 0 and t.shape[-1] % 16 == 0


def scored_rollouts(prompt_lens: list[int], response_lens: list[list[int]], seed: int = 0) -> AdvantagedRollouts:
    """Prompts of the given lengths, each with responses of the given lengths (odd on purpose)."""
    g = torch.Generator().manual_seed(seed)
    inputs, n_per, index, resp, lps = [], [], [], [], []
    for p, (plen, rlens) in enumerate(zip(prompt_lens, response_lens)):
        inputs.append(PromptInputs(input_ids=torch.randint(1, VOCAB, (plen,), generator=g)))
        n_per.append(len(rlens))
        for r in rlens:
            index.append(p)
            resp.append(torch.randint(1, VOCAB, (r,), generator=g))
            lps.append(-torch.rand(r, generator=g))
    rows = len(resp)
    ro = Rollouts(
        prompts=[RolloutPrompt(text=f"p{i}") for i in range(len(inputs))], prompt_inputs=inputs,
        n_per_prompt=n_per, prompt_index=index, response_token_ids=resp, logprobs=lps,
        finish_reasons=["stop"] * rows, response_texts=[""] * rows,
    )
    return ScoredRollouts(
        ro, group_ids=torch.tensor(index), rewards=torch.rand(rows, generator=g), accuracy=torch.zeros(rows),
        valid=torch.ones(rows, dtype=torch.bool), formatted=torch.ones(rows, dtype=torch.bool),
    ).with_advantages(torch.randn(rows, generator=g))


def test_multiple_is_chosen_from_the_precision_config(monkeypatch):
    plain = ParallelConfig()
    assert sequence_multiple(PrecisionConfig(mode="fp32"), plain) == 1  # the CPU default: no padding
    assert sequence_multiple(PrecisionConfig(mode="bf16"), plain) == 1
    assert sequence_multiple(_fp8(monkeypatch), plain) == 16
    assert sequence_multiple(_fp8(monkeypatch, "tensorwise"), plain) == 16
    assert sequence_multiple(_fp8(monkeypatch, "mxfp8", "e4m3"), plain) == 32
    sp = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    assert sequence_multiple(_fp8(monkeypatch), sp) == 32
    assert sequence_multiple(PrecisionConfig(mode="bf16"), sp) == 2  # megatron's sequence split needs T % TP


class _Group:
    """What megatron-core's sequence-parallel split reads of a process group: its size and rank."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_sequence_parallel_batches_split_over_tensor_parallel_ranks(monkeypatch, mode):
    # The shipped 32B layout (TP8, sequence parallel) in bf16 and FP8: megatron-core's own scatter
    # of the embeddings [T, b, h] to the sequence-parallel region. Breakage caught: a bf16 step with
    # an odd longest row (T = 15 here) stops at megatron's assertion in the first forward.
    from megatron.core.tensor_parallel.mappings import _split_along_first_dim

    from recipes.gpu import LAYOUTS

    parallel = LAYOUTS["32b"].parallel
    assert parallel.sequence_parallel and parallel.tensor_model_parallel_size == 8
    precision = _fp8(monkeypatch) if mode == "fp8" else PrecisionConfig(mode="bf16")
    scored = scored_rollouts([5, 7, 3], [[2, 10, 1], [4, 3], [6, 1, 8]])  # longest row 15
    raw = to_policy_batch(scored, range(len(scored)), pad_token_id=PAD)
    with pytest.raises(AssertionError, match="divisible by tensor parallel size"):
        _split_along_first_dim(torch.zeros(raw.seq_length, 1, 4), _Group(8, 0))
    batch = to_policy_batch(scored, range(len(scored)), pad_token_id=PAD,
                            pad_to_multiple=sequence_multiple(precision, parallel))
    shares = [_split_along_first_dim(torch.zeros(batch.seq_length, 1, 4), _Group(8, r)) for r in range(8)]
    assert sum(s.shape[0] for s in shares) == batch.seq_length
    if mode == "fp8":  # each rank's FP8 GEMMs see T / TP tokens
        assert all(te_fp8_gemm_ok(torch.empty(s.shape[0], 2048, device="meta")) for s in shares)


@pytest.mark.parametrize("recipe", ["delayed", "mxfp8"])
def test_fp8_batches_have_te_safe_shapes_for_every_micro_batch_size(monkeypatch, recipe):
    precision = _fp8(monkeypatch, recipe, "e4m3" if recipe == "mxfp8" else "hybrid")
    scored = scored_rollouts([5, 7, 3], [[2, 10, 1], [4, 3], [6, 1, 8]])  # odd lengths, longest row 15
    multiple = sequence_multiple(precision, ParallelConfig())
    batch = to_policy_batch(scored, range(len(scored)), pad_token_id=PAD, pad_to_multiple=multiple)
    raw = to_policy_batch(scored, range(len(scored)), pad_token_id=PAD)
    assert raw.seq_length % 2 == 1  # the unpadded length is odd: without the rounding TE would assert
    assert batch.seq_length % multiple == 0 and raw.seq_length <= batch.seq_length < raw.seq_length + multiple
    hidden = 2048
    for mbs in (1, 2, 3, 4, 5, 8):
        tokens = mbs * batch.seq_length
        activations = torch.empty(batch.seq_length, mbs, hidden, device="meta")  # megatron's [s, b, h]
        wgrad_operand = torch.empty(hidden, tokens, device="meta")  # tokens contracted in dW = dY^T X
        assert te_fp8_gemm_ok(activations) and te_fp8_gemm_ok(wgrad_operand), (mbs, batch.seq_length)
    assert not te_fp8_gemm_ok(torch.empty(3 * raw.seq_length, hidden, device="meta"))
    # padding columns are inert: pad id, no attention, no response, zero engine log-prob
    extra = slice(raw.seq_length, None)
    assert (batch.input_ids[:, extra] == PAD).all()
    assert not batch.attention_mask[:, extra].any() and not batch.response_mask[:, extra].any()
    assert (batch.engine_log_probs[:, extra] == 0).all()
    torch.testing.assert_close(batch.input_ids[:, : raw.seq_length], raw.input_ids)
    assert torch.equal(batch.response_mask[:, : raw.seq_length], raw.response_mask)


def test_default_path_is_unpadded():
    scored = scored_rollouts([4], [[3, 5]])
    batch = to_policy_batch(scored, [0, 1], pad_token_id=PAD)
    assert batch.seq_length == 9
    with pytest.raises(ValueError, match="pad_to_multiple"):
        to_policy_batch(scored, [0, 1], pad_token_id=PAD, pad_to_multiple=0)


def _causal_lm():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(config).eval()


def _log_probs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Trainer-style log-probs from logits: causal attention only (the megatron forward gets no
    padding mask), column t = log p(token t | tokens < t), column 0 = 0."""
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp, (1, 0))


def test_log_probs_losses_and_kl_equal_the_unpadded_computation():
    model, ref_model = _causal_lm(), _causal_lm()
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    scored = scored_rollouts([5, 3], [[7, 2], [4, 10]], seed=1)
    rows = range(len(scored))
    raw = to_policy_batch(scored, rows, pad_token_id=PAD)
    padded = to_policy_batch(scored, rows, pad_token_id=PAD, pad_to_multiple=16)
    t = raw.seq_length
    assert padded.seq_length == 16 and t == 13
    lp_raw, lp_pad = _log_probs(model, raw.input_ids), _log_probs(model, padded.input_ids)
    mask_raw, mask_pad = raw.response_mask, padded.response_mask
    torch.testing.assert_close(lp_pad[:, :t][mask_raw], lp_raw[mask_raw], rtol=1e-5, atol=1e-6)
    ref_raw, ref_pad = _log_probs(ref_model, raw.input_ids), _log_probs(ref_model, padded.input_ids)
    adv = padded.advantages

    def losses(lp, old, ref, mask):
        out = {}
        for agg in ("token-mean", "seq-mean-token-mean"):
            denom = loss_denominator(mask, agg)
            out[f"ppo/{agg}"] = ppo_clip_loss(lp, old, adv, mask, global_denominator=denom, agg_mode=agg)[0]
            out[f"kl/{agg}"] = kl_loss(lp, ref, mask, global_denominator=denom, agg_mode=agg)[0]
        denom = loss_denominator(mask, "seq-mean-token-mean")
        out["gspo"] = gspo_loss(lp, old, adv, mask, global_denominator=denom)[0]
        return out

    # the current policy drifts a little from the one that sampled (old = engine log-probs)
    a = losses(lp_raw + 0.01, raw.engine_log_probs, ref_raw, mask_raw)
    b = losses(lp_pad + 0.01, padded.engine_log_probs, ref_pad, mask_pad)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-7, msg=lambda m, k=key: f"{k}: {m}")
    assert loss_denominator(mask_pad, "token-mean") == loss_denominator(mask_raw, "token-mean")
