"""Orchestration of a run: build its parts, run the step pipeline and the loop around it.

Map (one job per module):

- ``trainer.py``: :class:`Trainer` — builds :class:`~fastrl.training.parts.RunParts` and a
  :class:`~fastrl.checkpoint.train_state.TrainState`, then runs the loop.
- ``parts.py``: the run's components (data, policy source, actor, reference, engine, scorer).
- ``policy_source.py``: the Hugging Face directory a run starts from (tiny model + warm start, or
  ``model.hf_path``).
- ``step.py``: one step as a pipeline of typed values, in the specification's order:
  group size n (ARS) -> prompts -> rollouts -> scored (DAPO: filtered, more rounds; then the
  engine sleeps) -> advantages -> policy batch (with advantages) -> prune outcome + this rank's
  kept policy batch (refilled, re-partitioned over DP) -> update plan (updates, cuts, LR; rows
  grouped by length) -> old/ref log-probs of the kept rows (no old ones for the first update's
  rows unless ``trainer.old_log_probs=recompute``: its own forward gives them) -> update -> refit
  -> the kept counts recorded for ARS. With ``trainer.logprobs_before_pruning`` or ``algorithm.kl_in_reward``
  the old/ref log-probs come after scoring and before the advantages, on the full batch
  (``step.py``'s docstring).
- ``generation.py``, ``scoring.py``, ``prune_phase.py``, ``update_phase.py``: the phases.
- ``geometry.py`` (``pruner.py``): the update geometry and the pruner dispatch.
- ``loop.py``: validation, metrics, checkpoints, stage limits and stop signals around the step.
- ``actor.py``: the megatron-core actor (optimizer, loss, update); ``build_lr_scheduler``, the train state's LR schedule.
"""
