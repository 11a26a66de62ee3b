"""Fixtures of the data tests."""

from __future__ import annotations

import pytest
from _data_files import png


@pytest.fixture
def geometry_rows() -> list[dict]:
    return [
        {"images": [png(40, 30)], "problem": "<image>Find x.", "answer": "60"},
        {"images": [png(50, 50, (0, 0, 255))], "problem": "<image>Find the area.", "answer": "24\\sqrt{3}"},
        {"images": [png(28, 56)], "problem": "In the figure, find AB.", "answer": "\\frac{1}{2}"},
    ]
