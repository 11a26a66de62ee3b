"""The stale-weights guard and the refit probe's temperature at unit level (issue 46, item 2): no
subprocess, no model cache. The whole-run versions are tests/functional/test_stale_refit_guard.py
and the refit checks of tests/vllm; the engines' own version check is tested in
tests/unit/training/test_mismatch_guard.py."""

from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest
import torch

from fastrl.data import Record
from fastrl.rollout.engine import Rollouts, StaleWeightsError, check_weight_version
from fastrl.training import step as step_module
from fastrl.training import update_phase
from fastrl.training.actor import Actor
from fastrl.training.generation import generate
from fastrl.training.prompting import PromptBatch
from fastrl.training.refit_verify import RefitVerificationError, RolloutMismatchError
from recipes.registry import get_recipe

VOCAB = 40


class _Engine:
    """An engine that checks the weight version like the real ones (``check_weight_version``) and
    scores sequences at temperature 1 under the fixed bigram model of :func:`_bigram_logits`.
    ``lose_refits``: ``update_weights`` consumes the weights but loads nothing (a lost refit)."""

    def __init__(self, *, lose_refits: bool = False, verify: bool = False) -> None:
        self.weight_version, self.lose_refits = 0, lose_refits
        self.export_to_cpu, self.refit_metrics, self.verify_due = True, {}, verify
        self.pad_token_id, self.suppressed_ids, self.verify_tolerance = 0, (), 1e-4
        self.tokenizer, self.last_group_sums = _Tokenizer(), {}
        self.requests: list[int | None] = []

    def wake(self) -> None:
        pass

    def loaded_weight_version(self) -> int:
        """What the engine loaded: ``weight_version`` here (a lost refit leaves both behind the
        trainer's policy version, which only ``generate`` compares)."""
        return self.weight_version

    def generate(self, prompts, n, sampling, *, weight_version=None) -> Rollouts:
        self.requests.append(weight_version)
        check_weight_version("the test engine", self.weight_version, weight_version)
        rows = len(prompts) * n
        return Rollouts(prompts=list(prompts), prompt_inputs=[None] * len(prompts), n_per_prompt=[n] * len(prompts),
                        prompt_index=[i for i in range(len(prompts)) for _ in range(n)],
                        response_token_ids=[torch.tensor([1, 2])] * rows, logprobs=[-torch.ones(2)] * rows,
                        finish_reasons=["stop"] * rows, response_texts=["r"] * rows)

    def update_weights(self, named) -> int:
        count = sum(1 for _ in named)
        if not self.lose_refits:
            self.weight_version += 1
        return count

    def score(self, sequences, starts):
        out = []
        for seq, start in zip(sequences, starts):
            ids = torch.tensor(seq)
            lp = torch.log_softmax(_bigram_logits(ids[:-1]), dim=-1).gather(1, ids[1:, None])[:, 0]
            out.append(lp[start - 1:])
        return out


class _Tokenizer:
    all_special_ids = [0]

    def __len__(self) -> int:
        return VOCAB

    def apply_chat_template(self, messages, *, tokenize, add_generation_prompt):
        return "user: " + messages[0]["content"] + " assistant:"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1 + ord(c) % (VOCAB - 1) for c in text]}


def _bigram_logits(prev: torch.Tensor) -> torch.Tensor:
    """float32 [len(prev), VOCAB]: the next-token logits after each token (a fixed random table)."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    return table[prev]


def _prompts():
    record = Record(question_id=0, problem="q", answer="a")
    return types.SimpleNamespace(prompt_of=lambda r: r.problem), [(0, record)]


def _actor(monkeypatch, temperature: float = 1.0) -> Actor:
    """A real :class:`Actor` (its ``log_probs``) whose policy is the bigram model of the engine,
    at the rollouts' sampling ``temperature``."""
    def compute_log_probs(chunks, batch, *, micro_batch_size, temperature, sequence_multiple):
        ids = batch.input_ids
        lp = torch.zeros(ids.shape)
        lp[:, 1:] = torch.log_softmax(_bigram_logits(ids[:, :-1]) / temperature, dim=-1).gather(2, ids[:, 1:, None])[..., 0]
        return lp

    monkeypatch.setattr("fastrl.training.actor.logprob_ops.compute_log_probs", compute_log_probs)
    monkeypatch.setattr(update_phase, "export_hf_weights", lambda policy, *, cpu: iter([("w", torch.zeros(1))]))
    actor = Actor.__new__(Actor)
    actor.policy, actor.micro_batch_size, actor.sequence_multiple = types.SimpleNamespace(chunks=None), 1, 1
    actor.temperature, actor.policy_version = temperature, 0
    return actor


def test_a_lost_refit_is_refused_at_the_next_generate(monkeypatch):
    """catches: the stale-weights guard broken in the trainer: ``generate()`` not passing the
    policy version to the engine (``fastrl/training/generation.py``), or ``refit()`` not counting
    the refit (``actor.policy_version``)."""
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    prompts, items = _prompts()
    for lose, fails in ((False, False), (True, True)):
        engine, actor = _Engine(lose_refits=lose), _actor(monkeypatch)
        kw = dict(rollout=cfg.rollout, seed=1, dp_rank=0)
        generate(engine, prompts, items, 2, weight_version=actor.policy_version, **kw)
        update_phase.refit(engine, actor)
        assert actor.policy_version == 1 and engine.requests == [0]
        if fails:
            with pytest.raises(StaleWeightsError, match="holds weight version 0 but the trainer asked to generate with policy version 1"):
                generate(engine, prompts, items, 2, weight_version=actor.policy_version, **kw)
        else:
            assert len(generate(engine, prompts, items, 2, weight_version=actor.policy_version, **kw)) == 2
        assert engine.requests == [0, 1]


def test_train_step_generates_with_the_actors_policy_version(monkeypatch):
    """catches: ``train_step`` calling ``generate()`` without ``weight_version=run.actor.policy_version``
    (``fastrl/training/step.py``): every request would be unchecked."""
    seen: dict = {}

    class _Stop(Exception):
        pass

    def fake_generate(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(step_module, "generate", fake_generate)
    monkeypatch.setattr(step_module, "group_size", lambda cfg, ars: 2)
    monkeypatch.setattr(step_module, "prompts_this_step", lambda rollout, n: 1)
    monkeypatch.setattr(step_module, "_check_epochs", lambda *a: {})
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    run = types.SimpleNamespace(
        cfg=cfg, ctx=types.SimpleNamespace(dp_size=1, dp_rank=0, is_logging_rank=True),
        timer=types.SimpleNamespace(phase=lambda name: contextlib.nullcontext()),
        prompts=types.SimpleNamespace(next_batch=lambda *a, **k: types.SimpleNamespace(items=[], epochs_completed=0)),
        engine=None, actor=types.SimpleNamespace(policy_version=7),
    )
    state = types.SimpleNamespace(ars=None, sampler=types.SimpleNamespace(epochs_drawn=0.0), prompt_skipper=None)
    with pytest.raises(_Stop):
        step_module.train_step(run, state, 3)
    assert seen["weight_version"] == 7


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_refit_probe_compares_at_temperature_one(monkeypatch, temperature):
    """catches: the trainer's probe log-probs computed at the rollouts' sampling temperature instead
    of 1, the engine's scoring temperature (``temperature=1.0`` dropped in
    ``fastrl/training/refit_verify.py``): every verified refit of a run at T != 1 would fail."""
    engine, actor = _Engine(verify=True), _actor(monkeypatch, temperature)
    metrics = update_phase.refit(engine, actor)
    assert metrics["refit_verify/abs_diff_mean"] < 1e-6 and metrics["refit/tensors"] == 1.0


def test_refit_probe_stops_a_refit_the_engine_did_not_load(monkeypatch):
    """catches: a probe that cannot fail (the fake above agreeing by construction): an engine whose
    model differs from the trainer's is refused."""
    engine, actor = _Engine(verify=True), _actor(monkeypatch, 1.0)
    real = engine.score
    engine.score = lambda seqs, starts: [lp + 0.01 for lp in real(seqs, starts)]
    with pytest.raises(RefitVerificationError, match="refit verification failed after refit 1"):
        update_phase.refit(engine, actor)


@pytest.mark.parametrize(
    ("early", "old_log_probs"), [(False, "recompute"), (False, "auto"), (True, "auto")],
    ids=["logprobs-after-pruning", "on-policy-first-update", "logprobs-before-pruning"],
)
def test_a_stale_step_stops_before_its_update(monkeypatch, early, old_log_probs):
    """catches: ``train_step`` not reading the step's measured mismatch (the
    ``check_rollout_mismatch`` call after the old/ref log-probs in ``fastrl/training/step.py``,
    in either order of the phases, or the guard it hands to ``update_policy`` for the on-policy
    first update, which measures the mismatch from its own forward pass): rollouts of a stale
    engine would be trained on."""
    calls: list[str] = []
    batch = types.SimpleNamespace(lengths=[5], with_tensors=lambda **k: batch, select=lambda order: batch)
    advantaged = type("Advantaged", (list,), {"advantages": torch.zeros(0)})()  # no rows
    scored: list = []  # the rollouts' stand-in: only its length is read
    stale = {"mismatch/abs_diff_mean": 0.3}

    def update_policy(*a, guard=None, on_policy_rows=0, **k):
        if on_policy_rows:  # the first update measured the mismatch: the guard decides before its step
            guard(stale)
        calls.append("update")
        return {}

    for name, fn in {
        "group_size": lambda cfg, ars: 2, "prompts_this_step": lambda rollout, n: 1, "_check_epochs": lambda *a: {},
        "generate": lambda *a, **k: None, "score": lambda *a, **k: (scored, {}), "dynamic_sampling": lambda s, **k: (s, {}),
        "sleep_engine": lambda engine: None, "compute_advantages": lambda s, alg, **k: (advantaged, {}),
        "to_policy_batch": lambda *a, **k: batch, "prune": lambda *a, **k: (None, {}),
        "repartition_kept": lambda b, o: (b, {}),
        "add_log_probs": lambda b, *a, old_from=0, **k: calls.append("log_probs") or (b, {} if old_from else stale),
        "update_policy": update_policy,
    }.items():
        monkeypatch.setattr(step_module, name, fn)
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    cfg = dataclasses.replace(
        cfg, trainer=dataclasses.replace(cfg.trainer, logprobs_before_pruning=early, old_log_probs=old_log_probs)
    )
    assert cfg.logprobs_before_pruning is early and cfg.mismatch_tolerance == 1e-4
    assert cfg.on_policy_first_update is (old_log_probs == "auto" and not early)
    prompts = PromptBatch([], epochs_completed=0)
    run = types.SimpleNamespace(
        cfg=cfg, ctx=types.SimpleNamespace(dp_size=1, dp_rank=0, is_logging_rank=True, device=torch.device("cpu")),
        timer=types.SimpleNamespace(phase=lambda name: contextlib.nullcontext()),
        prompts=types.SimpleNamespace(next_batch=lambda *a, **k: prompts),
        engine=types.SimpleNamespace(pad_token_id=0), actor=types.SimpleNamespace(policy_version=1), reference=None,
        scorer=None,
    )
    state = types.SimpleNamespace(ars=None, sampler=types.SimpleNamespace(epochs_drawn=0.0), prompt_skipper=None,
                                  scheduler=None, total_steps=3, reward_health=types.SimpleNamespace(end_step=lambda *a, **k: {}))
    with pytest.raises(RolloutMismatchError, match=r"step 2: .*mismatch/abs_diff_mean = 0.3 > rollout.mismatch_tolerance = 0.0001"):
        step_module.train_step(run, state, 2)
    assert calls == ["log_probs"]  # stopped before the update


def test_train_step_hands_the_train_states_lr_schedule_to_the_update(monkeypatch):
    """The LR schedule belongs to the train state (saved with it); the step hands it to the update,
    which sets each optimizer update's position on it (``Actor.step``).

    catches: ``train_step`` handing ``update_policy`` another schedule than ``state.scheduler``
    (``scheduler=state.scheduler`` in ``fastrl/training/step.py``)."""

    class _Stop(Exception):
        pass

    seen: dict = {}

    def update_policy(*a, scheduler, **k):
        seen["scheduler"] = scheduler
        raise _Stop

    batch = types.SimpleNamespace(lengths=[5], with_tensors=lambda **k: batch, select=lambda order: batch)
    advantaged = type("Advantaged", (list,), {"advantages": torch.zeros(0)})()
    for name, fn in {
        "group_size": lambda cfg, ars: 2, "prompts_this_step": lambda rollout, n: 1, "_check_epochs": lambda *a: {},
        "generate": lambda *a, **k: None, "score": lambda *a, **k: ([], {}), "dynamic_sampling": lambda s, **k: (s, {}),
        "sleep_engine": lambda engine: None, "compute_advantages": lambda s, alg, **k: (advantaged, {}),
        "to_policy_batch": lambda *a, **k: batch, "prune": lambda *a, **k: (None, {}),
        "repartition_kept": lambda b, o: (b, {}),
        "add_log_probs": lambda b, *a, **k: (b, {"mismatch/abs_diff_mean": 0.0}),
        "update_policy": update_policy,
    }.items():
        monkeypatch.setattr(step_module, name, fn)
    cfg = get_recipe("easyvqa_tiny_fastrl_grpo_cpu")
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, old_log_probs="recompute"))
    run = types.SimpleNamespace(
        cfg=cfg, ctx=types.SimpleNamespace(dp_size=1, dp_rank=0, is_logging_rank=True, device=torch.device("cpu")),
        timer=types.SimpleNamespace(phase=lambda name: contextlib.nullcontext()),
        prompts=types.SimpleNamespace(next_batch=lambda *a, **k: PromptBatch([], epochs_completed=0)),
        engine=types.SimpleNamespace(pad_token_id=0), actor=types.SimpleNamespace(policy_version=1), reference=None,
        scorer=None,
    )
    schedule = object()
    state = types.SimpleNamespace(ars=None, sampler=types.SimpleNamespace(epochs_drawn=0.0), prompt_skipper=None,
                                  scheduler=schedule, total_steps=3, reward_health=types.SimpleNamespace(end_step=lambda *a, **k: {}))
    with pytest.raises(_Stop):
        step_module.train_step(run, state, 2)
    assert seen["scheduler"] is schedule
