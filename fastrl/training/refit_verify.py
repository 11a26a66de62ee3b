"""Refit verification: did the engine really receive the trainer's weights?

After the first refit and every ``rollout.verify_refit_every`` refits (the engine's ``verify_due``),
the engine scores a probe -- a few fixed chat prompts, each followed by the engine's own greedy
response (:func:`make_probe`) -- and the trainer computes the same tokens' log-probs (temperature
1). Greedy tokens are where the model puts its mass, and where a bf16 rounding error moves a
log-prob least (``d log p_t = (1 - p_t) (dz_t - E_{j != t}[dz_j])``: near 0 as ``p_t -> 1``); the
earlier probe's uniformly random tokens sat at log-probs of -15 to -30, where the same rounding
moves them most, so a bound loose enough for them hid small weight errors (SmolLM2-135M, fp32
against bf16: greedy tokens 0.036 mean difference, random ones 0.064; ``bench/refit_probe_bf16.py``). Above
``rollout.verify_refit_tolerance`` (mean absolute difference over the probe's response tokens) the
run stops with :class:`RefitVerificationError`, naming the parameter group whose weights differ most
between what the trainer sent and what the engine holds (per-group sums of squares; the engine
reports what it loaded). Anchors: Megatron-LM ``--rl-verify-model-weights-swap``, slime
``--check-weight-update-equal``.

Before the probe, the engine's own count of loaded refits is compared with the refits sent to it
(:func:`check_loaded_version`): a refit that never reached the engine is named as such, instead of
being compared by the probe against older weights and blamed on numerics or the name mapping.

This check is independent of sampling and catches a stale engine even when it happens to sample
alike. Two cheaper guards run at every step:

* the weight version: every generate request carries the trainer's refit count
  (``actor.policy_version``) and an engine whose loaded weights are older refuses
  (:class:`fastrl.rollout.engine.StaleWeightsError`);
* the per-step mismatch guard, :func:`check_rollout_mismatch`: the step's measured engine/trainer
  log-prob mismatch on its sampled tokens (``mismatch/abs_diff_mean``) above
  ``rollout.mismatch_tolerance`` (per precision) stops the step before its policy update
  (:class:`RolloutMismatchError`), so stale rollouts are never trained on, whatever the
  verification schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fastrl.batch import PolicyBatch

PROBE_QUESTIONS = ("what is 3 plus 4?", "name a red shape.", "is the circle blue?")
PROBE_RESPONSE_TOKENS = 12


class RefitVerificationError(RuntimeError):
    """The engine's log-probs on the probe differ from the trainer's beyond the tolerance."""


class RolloutMismatchError(RuntimeError):
    """A step's rollouts: the engine's log-probs of the sampled tokens differ from the trainer's
    beyond ``rollout.mismatch_tolerance``; the step stopped before its policy update."""


def check_rollout_mismatch(metrics: dict[str, float], *, tolerance: float | None, step: int, setting: str = "") -> None:
    """The per-step mismatch guard (module docstring): raise when the step's
    ``mismatch/abs_diff_mean`` (already reduced over DP, so every rank decides alike) exceeds
    ``tolerance`` (None: off). ``setting`` says where the tolerance came from, for the message.

    Raises:
        RolloutMismatchError: naming the step, the measured value, the tolerance and what to do.
    """
    if tolerance is None:
        return
    mean = metrics["mismatch/abs_diff_mean"]
    if not mean > tolerance and mean == mean:  # nan fails too
        return
    worst = metrics.get("mismatch/abs_diff_max", float("nan"))
    raise RolloutMismatchError(
        f"step {step}: the rollout engine's log-probs of the sampled tokens differ from the trainer's: "
        f"mismatch/abs_diff_mean = {mean:.3g} > rollout.mismatch_tolerance = {tolerance:g}{setting} "
        f"(largest token {worst:.3g}). The step stopped before its policy update: nothing was trained on "
        f"these rollouts, and checkpoints already saved are intact. A jump like this usually means the "
        f"engine generated with stale weights (a refit that did not reach it): check the refit path and run "
        f"with rollout.verify_refit_every=1 to name the parameter group that differs; if the engine's "
        f"numerics legitimately differ more from the trainer's, raise rollout.mismatch_tolerance (none: off)"
    )


@dataclass(frozen=True)
class RefitProbe:
    """Token sequences ``prompt + response`` and, per sequence, where its response starts."""

    sequences: list[torch.Tensor]
    starts: list[int]


def make_probe(tokenizer, suppressed_ids: Sequence[int], engine) -> RefitProbe:
    """The probe: :data:`PROBE_QUESTIONS` in the chat template, each followed by ``engine``'s greedy
    response of at most :data:`PROBE_RESPONSE_TOKENS` tokens (its stop token included when it
    stopped; the engine never samples ``suppressed_ids``). One greedy ``generate`` call of three
    short prompts, with the weights being verified: a stale engine answers with its stale model's
    greedy tokens, which the trainer's new weights score differently by about the update's size.

    Raises:
        ValueError: a greedy response holds a suppressed id (the engine's suppression is broken).
    """
    from fastrl.rollout.engine import RolloutPrompt, SamplingParams

    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in PROBE_QUESTIONS]
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, max_tokens=PROBE_RESPONSE_TOKENS)
    rollouts = engine.generate([RolloutPrompt(t) for t in texts], 1, greedy)
    banned = {int(i) for i in suppressed_ids}
    sequences, starts = [], []
    for text, response in zip(texts, rollouts.response_token_ids):
        response = torch.as_tensor(response, dtype=torch.long)
        bad = sorted(banned & set(response.tolist()))
        if bad:
            raise ValueError(f"refit probe: the engine's greedy response holds suppressed token ids {bad}")
        prompt = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        sequences.append(torch.cat([prompt, response]))
        starts.append(int(prompt.numel()))
    return RefitProbe(sequences, starts)


def probe_batch(probe: RefitProbe, pad_token_id: int, *, rows_multiple: int = 1, length_multiple: int = 64) -> PolicyBatch:
    """The probe as right-padded model input (response mask on the response tokens); rows repeated
    cyclically up to a multiple of ``rows_multiple`` (the micro-batch size), length rounded up to
    ``length_multiple`` (safe for sequence-parallel and FP8 shapes; right padding changes nothing)."""
    n = -(-len(probe.sequences) // rows_multiple) * rows_multiple
    longest = max(int(s.numel()) for s in probe.sequences)
    longest = -(-longest // length_multiple) * length_multiple
    probe = RefitProbe([probe.sequences[i % len(probe.sequences)] for i in range(n)],
                       [probe.starts[i % len(probe.starts)] for i in range(n)])
    ids = torch.full((n, longest), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, longest), dtype=torch.bool)
    resp = torch.zeros((n, longest), dtype=torch.bool)
    for b, (seq, start) in enumerate(zip(probe.sequences, probe.starts)):
        ids[b, : seq.numel()] = seq
        attn[b, : seq.numel()] = True
        resp[b, start : seq.numel()] = True
    return PolicyBatch(input_ids=ids, attention_mask=attn, response_mask=resp)


def actor_probe_logprobs(actor, probe: RefitProbe, pad_token_id: int) -> list[torch.Tensor]:
    """The trainer's log-probs of each probe response (temperature 1, like the engine's score)."""
    batch = probe_batch(probe, pad_token_id, rows_multiple=actor.micro_batch_size)
    lp = actor.log_probs(batch, temperature=1.0).float().cpu()
    return [lp[b, start : seq.numel()] for b, (seq, start) in enumerate(zip(probe.sequences, probe.starts))]


def largest_group_difference(sent: dict[str, float], held: dict[str, float]) -> tuple[str | None, float]:
    """The parameter group whose sum of squares differs most (relative) between ``sent`` (the
    trainer's last refit) and ``held`` (the engine's), and that relative difference."""
    worst, worst_diff = None, 0.0
    for group, value in sent.items():
        other = held.get(group)
        diff = float("inf") if other is None else abs(value - other) / max(abs(value), 1e-12)
        if worst is None or diff > worst_diff:
            worst, worst_diff = group, diff
    return worst, worst_diff


def check_loaded_version(engine) -> None:
    """The weight-version check of a refit verification: the engine's own count of loaded refits
    (``loaded_weight_version()``) against the refits sent to it (``weight_version``).

    Raises:
        RefitVerificationError: the engine is behind, naming the first refit that did not reach it.
    """
    sent, loaded = int(engine.weight_version), int(engine.loaded_weight_version())
    if loaded >= sent:
        return
    lost = f"refit {sent}" if loaded + 1 == sent else f"refits {loaded + 1} to {sent} (at least refit {loaded + 1})"
    raise RefitVerificationError(
        f"refit verification after refit {sent}: {lost} did not reach the engine: it holds weight version "
        f"{loaded} (its last complete refit) while the trainer has sent {sent}. The probe was not run (its "
        f"log-probs and weight sums would compare refit {sent} with older weights). Check the refit path "
        f"(transport, engine log); docs/engine.md, 'Stale weights'"
    )


def verify_refit(
    engine, trainer_logprobs: Callable[[RefitProbe], list[torch.Tensor]], *, tolerance: float, probe: RefitProbe | None = None
) -> dict[str, float]:
    """Compare the engine's and the trainer's log-probs on the probe (module docstring).

    Args:
        engine: a :class:`~fastrl.rollout.engine.VerifiableEngine` (``score``, and ``group_sums()``
            with ``last_group_sums`` for the diagnosis).
        trainer_logprobs: the trainer's log-probs of each probe response.
        probe: the probe (None: :func:`make_probe` with the engine's greedy responses).

    Returns:
        ``refit_verify/abs_diff_mean``, ``refit_verify/abs_diff_max``.

    Raises:
        RefitVerificationError: the engine has loaded fewer refits than were sent to it (checked
            first, naming the first refit that did not reach it: comparing log-probs or weight sums
            with an engine on older weights would blame the wrong refit), or the mean difference
            is above ``tolerance``.
    """
    check_loaded_version(engine)
    if probe is None:
        probe = make_probe(engine.tokenizer, engine.suppressed_ids, engine)
    engine_lp = engine.score([s.tolist() for s in probe.sequences], probe.starts)
    trainer_lp = trainer_logprobs(probe)
    diffs = torch.cat([(a.float() - b.float()).abs() for a, b in zip(engine_lp, trainer_lp)])
    mean, worst = float(diffs.mean()), float(diffs.max())
    if mean > tolerance:
        detail = ""
        if engine.last_group_sums:
            group, rel = largest_group_difference(engine.last_group_sums, engine.group_sums())
            detail = (
                f"; largest mismatching parameter group: {group} (sum of squared weights differs by {rel:.3g} "
                f"relative between the trainer's refit and the engine)"
                if rel > 1e-9 else
                f"; every parameter group the engine received matches the trainer's refit (largest relative "
                f"difference {rel:.1e} in {group}): the engine's numerics or weight-name mapping differ"
            )
        raise RefitVerificationError(
            f"refit verification failed after refit {engine.weight_version}: mean |logp_engine - logp_trainer| on the probe = "
            f"{mean:.3g} > rollout.verify_refit_tolerance={tolerance:g} (max {worst:.3g}){detail}"
        )
    return {"refit_verify/abs_diff_mean": mean, "refit_verify/abs_diff_max": worst}
