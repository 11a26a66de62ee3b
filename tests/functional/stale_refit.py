"""``python tests/functional/stale_refit.py MODE --recipe ... key=value ...``: the trainer with a
refit that silently does not reach the Hugging Face engine (test doubles of
tests/functional/test_stale_refit_guard.py).

MODE ``drop``: the transport drops the weights -- ``update_weights`` consumes the stream, counts the
tensors and advances the engine's weight version as if it had loaded them, but copies nothing (the
engine keeps its old weights and believes it is current: only the per-step mismatch guard can see it).
MODE ``lose``: the refit never arrives -- ``update_weights`` consumes the stream and returns as if
done, the engine's weight version stays where it was (the generate-time version check sees it).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastrl.rollout.hf_engine import HFRolloutEngine  # noqa: E402


def drop(self, named_tensors):
    count = sum(1 for _ in named_tensors)
    self.weight_version += 1
    return count


def lose(self, named_tensors):
    return sum(1 for _ in named_tensors)


if __name__ == "__main__":
    HFRolloutEngine.update_weights = {"drop": drop, "lose": lose}[sys.argv[1]]
    from fastrl.train import main

    sys.exit(main(sys.argv[2:]))
