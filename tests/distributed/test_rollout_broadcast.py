"""With TP=2 the rollouts are generated once per model-parallel group and broadcast, so both TP
peers train on identical token ids even when their local engines sample differently."""

from __future__ import annotations

import pytest
import torch
from launcher import run_distributed
from rollout_workers import tp_rollout_worker

pytestmark = pytest.mark.distributed


def test_tp_peers_train_on_the_first_ranks_rollouts(qwen25vl_path):
    first, peer = run_distributed(tp_rollout_worker, 2, qwen25vl_path, 2)
    assert (first["tp_rank"], peer["tp_rank"]) == (0, 1)
    assert first["local"] != peer["local"]  # the engines really would sample differently
    assert first["shared"] == peer["shared"] == first["local"]  # everyone gets the first rank's rollouts
    torch.testing.assert_close(first["shared_logprobs"], peer["shared_logprobs"], rtol=0, atol=0)
    assert torch.equal(first["input_ids"], peer["input_ids"])
    torch.testing.assert_close(first["pixels"], peer["pixels"], rtol=0, atol=0)
    assert (first["generate_calls"], peer["generate_calls"]) == (1, 0)  # the peer's engine is not used
    assert first["prompts_are_local"] and peer["prompts_are_local"]
