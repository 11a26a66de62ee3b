"""Rollout generation and weight refit.

:mod:`fastrl.rollout.engine` defines the interface (:class:`RolloutEngine`, :class:`Rollouts`,
:class:`SamplingParams`); :mod:`fastrl.rollout.hf_engine` is the in-process CPU engine and
:mod:`fastrl.rollout.engine_client` the vLLM engine, run as its own process in its own environment
(:mod:`fastrl.rollout.engine_server`; vLLM is never imported by the trainer).
"""

from fastrl.rollout.engine import PromptInputs, RolloutEngine, RolloutPrompt, Rollouts, SamplingParams

__all__ = ["PromptInputs", "RolloutEngine", "RolloutPrompt", "Rollouts", "SamplingParams"]
