"""megatron-core 0.16.x optimizer checkpoints with torch's Adam: the per-parameter ``step``.

Written against megatron-core 0.16.1. Without Apex or Transformer Engine (CPU, and GPU machines
without them) megatron-core uses ``torch.optim.Adam``/``AdamW``, which keeps a ``step`` count in every
parameter's state (FusedAdam keeps it per group). megatron-core's DistributedOptimizer does not
handle that key when it loads a checkpoint:

- the ``fully_reshardable`` loader copies every key of the destination state from the checkpoint,
  whose per-parameter entries never hold ``step``: a ``KeyError: 'step'``
  (:func:`torch_adam_step_tolerated` avoids it);
- neither format restores the count (``dp_reshardable`` assigns one tensor shared by every parameter,
  which torch's Adam then increments once per parameter; ``fully_reshardable`` skips it), so the
  bias correction of a resumed run would drift from an uninterrupted one. The trainer saves the
  count in its train state (:func:`adam_steps`) and puts it back (:func:`restore_adam_steps`).

:func:`ensure_optimizer_state` gives a fresh optimizer (its state is created lazily by the first
step) placeholder tensors to load into. With Apex or Transformer Engine (FusedAdam: no
per-parameter ``step``) these functions change nothing. Tested in ``tests/unit/compat/test_megatron_optimizer.py``; the exact-resume functional test
checks the whole.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def _optimizers(optimizer: Any) -> list[Any]:
    """The megatron optimizers inside ``optimizer`` (a ChainedOptimizer holds several)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def ensure_optimizer_state(optimizer: Any) -> None:
    """Give a fresh megatron optimizer state tensors to load into (its state is created lazily by
    the first step; the checkpoint's values replace these placeholders in place)."""
    for opt in _optimizers(optimizer):
        if len(opt.optimizer.state) > 0:
            continue
        if hasattr(opt, "_init_optimizer_states_with_dummy_values"):
            opt._init_optimizer_states_with_dummy_values()
        else:
            opt.init_state_fn(opt.optimizer, opt.config)


def adam_steps(optimizer: Any) -> list[float]:
    """The Adam ``step`` count of every parameter state (all equal in a healthy optimizer)."""
    out = []
    for opt in _optimizers(optimizer):
        for state in opt.optimizer.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                out.append(float(state["step"]))
    return out


@contextlib.contextmanager
def torch_adam_step_tolerated(optimizer: Any) -> Iterator[None]:
    """Let megatron's ``fully_reshardable`` loader fill a torch Adam state that has ``step``.

    megatron-core 0.16 copies every key of the destination state (``param``, ``exp_avg``,
    ``exp_avg_sq`` and, with torch's Adam -- no Apex / Transformer Engine -- the per-parameter
    ``step``) from the checkpoint, whose per-parameter entries never hold ``step``: a KeyError.
    Within this block the loader is handed the destination's own ``step`` for that key (a no-op
    copy); :func:`restore_adam_steps` then sets the count from the train state. With Apex or
    Transformer Engine (``step`` kept per group) nothing changes.
    """
    patched = []
    for opt in _optimizers(optimizer):
        if not hasattr(opt, "_set_main_param_and_optimizer_states"):
            continue
        original = opt._set_main_param_and_optimizer_states

        def setter(model_param, tensors, _opt=opt, _original=original):
            current = _opt._get_main_param_and_optimizer_states(model_param)
            if "step" in current and "step" not in tensors:
                tensors = {**tensors, "step": current["step"]}
            _original(model_param, tensors)

        opt._set_main_param_and_optimizer_states = setter
        patched.append(opt)
    try:
        yield
    finally:
        for opt in patched:
            del opt._set_main_param_and_optimizer_states


def restore_adam_steps(optimizer: Any, step: float) -> None:
    """Set every parameter's Adam ``step`` to ``step``, each in its own tensor.

    Without Apex / Transformer Engine, megatron-core 0.16's DistributedOptimizer does not restore
    torch Adam's per-parameter ``step`` from a checkpoint in either format (``dp_reshardable``
    keeps the placeholder's and assigns one shared tensor that torch's Adam then increments once
    per parameter; ``fully_reshardable`` skips it), so the bias correction of a resumed run would
    drift from an uninterrupted one. The count is saved in the train state instead. The
    exact-resume test catches both.

    Only states that hold a per-parameter ``step`` (torch's Adam) are touched: Transformer
    Engine's and Apex's FusedAdam keep the count per group, and a ``step`` key added to their
    per-parameter state breaks their ``state_dict()`` (TE 2.11's ``get_unscaled_state`` knows only
    ``exp_avg``, ``exp_avg_sq`` and ``master_param``: ``KeyError: 'step'`` at the first save after a
    resume).
    """
    for opt in _optimizers(optimizer):
        for state in opt.optimizer.state.values():
            if "exp_avg" in state and "step" in state:
                state["step"] = torch.tensor(float(step), dtype=torch.float32)
