"""Refit verification under model parallelism: every rank runs the actor's forward pass (its TP /
PP collectives) before the source rank asks the engine, so an engine error cannot leave the peers
waiting inside the forward pass while the source waits in a broadcast."""

from __future__ import annotations

import types

import pytest
import torch

from fastrl.distributed import collectives
from fastrl.training import refit_verify, update_phase


def _setup(monkeypatch, *, source: bool, received: list):
    order: list = []
    monkeypatch.setattr(collectives, "model_parallel_size", lambda: 2)
    monkeypatch.setattr(collectives, "is_model_parallel_source", lambda: source)

    def broadcast(obj):
        order.append(("broadcast", type(obj).__name__))
        return received.pop(0) if received else obj

    monkeypatch.setattr(collectives, "broadcast_object_model_parallel", broadcast)
    probe = refit_verify.RefitProbe(sequences=[torch.tensor([1, 2, 3])], starts=[1])
    monkeypatch.setattr(refit_verify, "actor_probe_logprobs",
                        lambda actor, p, pad: order.append(("forward",)) or [torch.zeros(2)])
    return order, probe


def test_an_engine_error_on_the_source_comes_after_the_forward_pass(monkeypatch):
    # Breakage caught: the source scoring on the engine first; when the engine raised, it broadcast
    # the error while its peers sat in the forward pass's collectives (a hang or crossed messages).
    order, probe = _setup(monkeypatch, source=True, received=[])

    def score(*a, **k):
        order.append(("engine.score",))
        raise RuntimeError("engine died")

    monkeypatch.setattr(refit_verify, "make_probe", lambda *a: probe)
    engine = types.SimpleNamespace(score=score, pad_token_id=0, verify_tolerance=1.0, tokenizer=None, suppressed_ids=[],
                               weight_version=1, loaded_weight_version=lambda: 1)
    with pytest.raises(RuntimeError, match="engine died"):
        update_phase._verify(engine, actor=None)
    assert order == [("broadcast", "RefitProbe"), ("forward",), ("engine.score",), ("broadcast", "RuntimeError")]


def test_a_peer_runs_the_forward_pass_then_raises_the_sources_error(monkeypatch):
    probe = refit_verify.RefitProbe(sequences=[torch.tensor([1, 2, 3])], starts=[1])
    order, _ = _setup(monkeypatch, source=False, received=[probe, RuntimeError("engine died")])
    engine = types.SimpleNamespace(pad_token_id=0, verify_tolerance=1.0)
    with pytest.raises(RuntimeError, match="engine died"):
        update_phase._verify(engine, actor=None)
    assert order == [("broadcast", "NoneType"), ("forward",), ("broadcast", "NoneType")]


def test_a_probe_that_cannot_be_made_is_raised_on_every_rank(monkeypatch):
    # Breakage caught: the source raising before the probe broadcast, its peers waiting for it forever.
    order, _ = _setup(monkeypatch, source=True, received=[])
    monkeypatch.setattr(refit_verify, "make_probe", lambda *a: (_ for _ in ()).throw(ValueError("no tokens")))
    engine = types.SimpleNamespace(tokenizer=None, pad_token_id=0, verify_tolerance=1.0, suppressed_ids=[])
    with pytest.raises(ValueError, match="no tokens"):
        update_phase._verify(engine, actor=None)
    assert order == [("broadcast", "ValueError")]
