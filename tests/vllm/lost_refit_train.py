"""``python tests/vllm/lost_refit_train.py --recipe ... key=value ...``: the trainer with a vLLM engine
process whose refits never arrive (test double of tests/vllm/test_vllm_training.py, test (d)).

``EngineProcessClient._transfer`` consumes the weight stream (the client still records what it
"sent", for the verification's diagnosis, and advances its own weight version) but sends nothing to
the engine, nor the new weight version: the engine keeps its old weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastrl.rollout.engine_client import EngineProcessClient  # noqa: E402


def lose(self, named_tensors):
    return sum(1 for _ in named_tensors), 0


if __name__ == "__main__":
    EngineProcessClient._transfer = lose
    from fastrl.train import main

    sys.exit(main(sys.argv[1:]))
