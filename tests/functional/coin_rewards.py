"""Deterministic stand-in rewards for functional runs of an untrained tiny policy (whose answers
are never right, so every DAPO group would be uninformative and every GRPO advantage 0).

Used as ``reward.name=tests/functional/coin_rewards.py:<function>``; each is a pure function of
the response text (CRC-32), so a seeded run is reproducible.
"""

import zlib


def _coin(response: str, one_in: int) -> float:
    return 1.0 if zlib.crc32(response.encode()) % one_in == 0 else 0.0


def one_in_two(response: str, ground_truth: str) -> dict:
    """Accuracy 1 for about half of the responses."""
    a = _coin(response, 2)
    return {"overall": a, "format": 0.0, "accuracy": a}


def one_in_eight(response: str, ground_truth: str) -> dict:
    """Accuracy 1 for about one response in eight: with n=4, about 41% of the groups are informative."""
    a = _coin(response, 8)
    return {"overall": a, "format": 0.0, "accuracy": a}
