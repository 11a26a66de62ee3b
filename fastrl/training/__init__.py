"""Orchestration of a run: build its parts, run the step pipeline and the loop around it.

Map (one job per module):

- ``trainer.py``: :class:`Trainer` — builds :class:`~fastrl.training.parts.RunParts` and a
  :class:`~fastrl.checkpoint.train_state.TrainState`, then runs the loop.
- ``parts.py``: the run's components (data, policy source, actor, reference, engine, scorer).
- ``policy_source.py``: the Hugging Face directory a run starts from (tiny model + warm start, or
  ``model.hf_path``).
- ``step.py``: one step as a pipeline of typed values, in the specification's order:
  prompts -> rollouts -> scored (DAPO: filtered, more rounds) -> advantages -> policy batch (with
  advantages) -> prune outcome + this rank's kept policy batch -> old/ref log-probs -> update ->
  refit (with ``trainer.logprobs_before_pruning`` or ``algorithm.kl_in_reward`` the old/ref
  log-probs come before the advantages, on the full batch; ``step.py``'s docstring).
- ``generation.py``, ``scoring.py``, ``prune_phase.py``, ``update_phase.py``: the phases.
- ``geometry.py`` (``pruner.py``): the update geometry and the pruner dispatch.
- ``loop.py``: validation, metrics, checkpoints, stage limits and stop signals around the step.
- ``actor.py``: the megatron-core actor (optimizer, loss, update); ``build_lr_scheduler``, the train state's LR schedule.
"""
