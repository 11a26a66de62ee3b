"""Rollout generation and weight refit.

:mod:`fastrl.rollout.engine` defines the interface (:class:`RolloutEngine`, :class:`Rollouts`,
:class:`SamplingParams`); :mod:`fastrl.rollout.hf_engine` is the in-process CPU engine and
:mod:`fastrl.rollout.vllm_engine` the vLLM engine for GPU clusters (vLLM is imported only there).
"""

from fastrl.rollout.engine import PromptInputs, RolloutEngine, RolloutPrompt, Rollouts, SamplingParams

__all__ = ["PromptInputs", "RolloutEngine", "RolloutPrompt", "Rollouts", "SamplingParams"]
