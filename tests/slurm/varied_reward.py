"""A deterministic reward with many levels for tests: it spreads a group's rollouts over several
advantage buckets, so MDAP keeps different counts per group (what adaptive sampling reacts to)."""

import zlib


def varied_reward(response: str, ground_truth: str) -> float:
    """``crc32(response) mod 5 / 4``: five reward levels in [0, 1], a pure function of the text."""
    return (zlib.crc32(response.encode()) % 5) / 4
