"""Shared test set-up: one torch thread per test process (the machines have 2 cores), no hub access."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


def _expected_seconds(item) -> float:
    mark = item.get_closest_marker("long")
    return float(mark.args[0]) if mark is not None and mark.args else 0.0


def pytest_collection_modifyitems(config, items):
    """Minutes-long tests (marker ``long(seconds)``) first, longest first, the rest in collection
    order: make test's xdist workers take whole test files in this order (``--dist loadfile
    --no-loadscope-reorder``), so that no long file starts last and runs alone at the end."""
    items.sort(key=lambda item: -_expected_seconds(item))  # stable
