"""The trainer's side of the refit verification's numbers (:mod:`fastrl.training.refit_verify`):
which refits are verified, and the per-group sums of squares of the weights a refit sends, which
the engine computes on its side (``engine_server.py``'s ``square_sums``) for the diagnosis of a
failed verification. Used by :class:`fastrl.rollout.engine_client.EngineProcessClient` and the
model-parallel peers without an engine (:mod:`fastrl.training.engine_placement`).
"""

from __future__ import annotations

import torch


def verify_due_at(version: int, every: int) -> bool:
    """Whether refit number ``version`` (1-based) is verified: the first, then every ``every``-th
    (never with ``every = 0``)."""
    return every > 0 and version >= 1 and (version == 1 or version % every == 0)


#: elements per chunk of :func:`square_sum` (a float64 copy of 2**24 elements: 128 MiB)
SQUARE_SUM_CHUNK = 1 << 24


def square_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of squares of ``tensor``'s elements as a 0-d float64 tensor on its device, computed in
    chunks of :data:`SQUARE_SUM_CHUNK` elements (a float64 copy of a whole 7B embedding would take
    4 GiB of the GPU during the refit); no read-back to the host. The engine computes its side with
    its own ``square_sums`` (``engine_server.py`` cannot import fastrl)."""
    flat = tensor.detach().reshape(-1)
    return torch.stack([c.double().square().sum() for c in flat.split(SQUARE_SUM_CHUNK)]).sum()


def group_square_sums(squares: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """Per group, the sum of its tensors' sums of squares (0-d float64 tensors, on any device, from
    :func:`square_sum`); one read-back to the host for all groups."""
    if not squares:
        return {}
    per_group = [torch.stack(v).sum() for v in squares.values()]
    device = per_group[0].device
    return dict(zip(squares, torch.stack([t.to(device) for t in per_group]).tolist()))

