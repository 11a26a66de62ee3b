"""Rollout generation and weight refit.

:mod:`fastrl.rollout.engine` defines the interface (:class:`RolloutEngine`, :class:`Rollouts`,
:class:`SamplingParams`); :mod:`fastrl.rollout.hf_engine` is the in-process CPU engine and
:mod:`fastrl.rollout.engine_client` the vLLM engine, run as its own process in its own environment
(:mod:`fastrl.rollout.engine_server`; vLLM is never imported by the trainer). Beside the client:
:mod:`~fastrl.rollout.engine_process` (the child process's life cycle), :mod:`~fastrl.rollout.engine_wire`
(the wire protocol), :mod:`~fastrl.rollout.refit_transport` and :mod:`~fastrl.rollout.refit_checks`
(the refit and its verification's sums), :mod:`~fastrl.rollout.engine_factory` (a client from a
run's configuration).
"""

from fastrl.rollout.engine import PromptInputs, RolloutEngine, RolloutPrompt, Rollouts, SamplingParams

__all__ = ["PromptInputs", "RolloutEngine", "RolloutPrompt", "Rollouts", "SamplingParams"]
