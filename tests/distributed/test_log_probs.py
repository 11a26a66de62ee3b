"""Log-probs of the megatron-core policy equal a plain Hugging Face forward of the same weights, and
the streamed export gives back the Hugging Face weights exactly."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from workers import hf_log_probs, image_token_id, log_probs_worker, make_batch

pytestmark = pytest.mark.distributed

LAYOUTS = [  # (world size, TP, PP): DP = world / (TP x PP)
    pytest.param(1, 1, 1, id="world1"),
    pytest.param(2, 2, 1, id="tp2"),
    pytest.param(2, 1, 2, id="pp2"),
    pytest.param(2, 1, 1, id="dp2"),
    pytest.param(4, 2, 2, id="tp2xpp2"),
]


def _assert_export_is_exact(results: list[dict], hf_dir) -> None:
    """The streamed export (rollout refit) gives back the Hugging Face weights bit for bit."""
    from safetensors.torch import load_file

    exported = results[0]["exported"]
    on_disk = load_file(str(hf_dir / "model.safetensors"))
    assert sorted(exported) == sorted(on_disk)
    for name, tensor in on_disk.items():
        assert torch.equal(exported[name], tensor), name


def _assemble(results: list[dict]) -> torch.Tensor:
    """This batch's log-probs in DP order; every TP/PP rank of a replica must agree."""
    by_dp: dict[int, torch.Tensor] = {}
    for r in results:
        if r["dp_rank"] in by_dp:
            torch.testing.assert_close(r["log_probs"], by_dp[r["dp_rank"]], rtol=0, atol=0)
        by_dp[r["dp_rank"]] = r["log_probs"]
    return torch.cat([by_dp[k] for k in sorted(by_dp)])


def _assert_micro_batches_cut(results: list[dict], batch, pp: int) -> None:
    """Each one-rollout micro-batch ran at its own row's length (5-11 tokens of T = 12), except with
    pipeline parallelism, whose stages exchange one fixed shape: there every forward got T.
    Breakage caught: micro-batches padded to the batch's longest row (the cost of issue 29, item 10),
    or cut under PP (megatron's P2P shapes would no longer match)."""
    lengths = batch.lengths.tolist()
    for r in results:
        want = [batch.seq_length] * len(r["rows"]) if pp > 1 else [lengths[i] for i in r["rows"]]
        assert r["seen_lengths"] == want, (r["dp_rank"], r["pp_rank"], r["seen_lengths"])


@pytest.mark.parametrize("world, tp, pp", LAYOUTS)
def test_qwen2_log_probs_match_hf(qwen2_path, world, tp, pp):
    batch = make_batch()
    expected = hf_log_probs(qwen2_path, batch)
    results = run_distributed(log_probs_worker, world, qwen2_path, tp, pp, False)
    _assert_export_is_exact(results, qwen2_path)
    _assert_micro_batches_cut(results, batch, pp)
    got = _assemble(results)
    assert got.shape == expected.shape
    assert (got[batch.response_mask] < 0).all()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "world, tp, pp", [pytest.param(1, 1, 1, id="world1"), pytest.param(2, 2, 1, id="tp2"), pytest.param(2, 1, 2, id="pp2")]
)
def test_qwen25vl_log_probs_with_images_match_hf(qwen25vl_path, world, tp, pp):
    batch = make_batch(image_token=image_token_id(qwen25vl_path))
    expected = hf_log_probs(qwen25vl_path, batch)
    results = run_distributed(log_probs_worker, world, qwen25vl_path, tp, pp, True)
    _assert_export_is_exact(results, qwen25vl_path)
    got = _assemble(results)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_llama_with_tied_embeddings_goes_through_the_same_path(llama_path):
    batch = make_batch()
    expected = hf_log_probs(llama_path, batch)
    results = run_distributed(log_probs_worker, 2, llama_path, 2, 1, False)
    _assert_export_is_exact(results, llama_path)
    torch.testing.assert_close(_assemble(results), expected, rtol=1e-4, atol=1e-5)
