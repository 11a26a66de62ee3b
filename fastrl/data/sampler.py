"""A seeded, resumable prompt sampler with epoch-based shuffling.

    sampler = ResumableSampler(len(dataset), seed=0)
    batch = sampler.next_batch(256)      # indices into the dataset
    state = sampler.state_dict()         # into the checkpoint
    ...
    sampler.load_state_dict(state)       # after a restart: continues with the next prompt

Epoch ``e`` visits every index once, in the order ``numpy.random.default_rng([seed, e])
.permutation(num_items)`` (PCG64, stable across NumPy versions). The state is the epoch and the
position in it, so resuming never repeats or skips a prompt, and the batch size may change between
calls (the adaptive sampler changes prompts per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_STATE_VERSION = 1


@dataclass(frozen=True)
class SampledBatch:
    """Indices of one batch.

    Fields: ``indices`` (dataset indices, in order); ``epoch`` (the epoch of the first index);
    ``epochs_completed`` (epochs finished by this batch: 1 when it took the last index of an epoch,
    more only when the batch is larger than the dataset).
    """

    indices: list[int]
    epoch: int
    epochs_completed: int


class ResumableSampler:
    """Seeded epoch shuffling with a checkpointable position.

    Args:
        num_items: dataset size (> 0).
        seed: shuffling seed.
        shuffle: ``False`` visits indices in order every epoch.

    A batch that crosses an epoch boundary takes the rest of the current epoch and continues with
    the next one, so such a batch may hold an index twice (once per epoch);
    ``SampledBatch.epochs_completed`` tells the caller that an epoch ended (adaptive rollout
    sampling reacts to it).
    """

    def __init__(self, num_items: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if num_items < 1:
            raise ValueError(f"num_items ({num_items}) must be >= 1")
        self.num_items = int(num_items)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The visiting order of ``epoch`` (int64 array of length ``num_items``)."""
        if epoch != self._order_epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_items)
            else:
                self._order = np.arange(self.num_items, dtype=np.int64)
            self._order_epoch = epoch
        return self._order

    @property
    def epochs_drawn(self) -> float:
        """Epochs of indices handed out so far: ``epoch + position / num_items`` (1.0 right after the
        last index of the first epoch; above ``trainer.epochs`` when a run wraps past its budget)."""
        return self.epoch + self.position / self.num_items


    def next_batch(self, batch_size: int) -> SampledBatch:
        """The next ``batch_size`` indices; advances the position."""
        if batch_size < 1:
            raise ValueError(f"batch_size ({batch_size}) must be >= 1")
        first_epoch = self.epoch
        indices: list[int] = []
        completed = 0
        while len(indices) < batch_size:
            order = self.epoch_order(self.epoch)
            take = min(batch_size - len(indices), self.num_items - self.position)
            indices.extend(int(i) for i in order[self.position : self.position + take])
            self.position += take
            if self.position == self.num_items:
                self.epoch += 1
                self.position = 0
                completed += 1
        return SampledBatch(indices=indices, epoch=first_epoch, epochs_completed=completed)

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state: ``version``, ``num_items``, ``seed``, ``shuffle``, ``epoch``, ``position``."""
        return {
            "version": _STATE_VERSION,
            "num_items": self.num_items,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`.

        Raises:
            ValueError: the state belongs to a different dataset size, seed or shuffle setting
                (resuming would then repeat or skip prompts), or is malformed.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"sampler state version {state.get('version')!r} is not {_STATE_VERSION}")
        for key in ("num_items", "seed", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state.get(key)!r} but this run has {key}={getattr(self, key)!r}; "
                    "the dataset or the shuffle seed changed since the checkpoint (check data filtering "
                    "settings such as max_prompt_length, on_bad_row and max_train_samples)"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.num_items:
            raise ValueError(f"sampler state has epoch={epoch}, position={position} outside [0, {self.num_items})")
        self.epoch, self.position = epoch, position
