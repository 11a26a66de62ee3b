"""Transformer Engine counts as available only when its PyTorch layers import."""

from __future__ import annotations

import sys

from fastrl.config.fields import transformer_engine_available

_TE = ("transformer_engine", "transformer_engine.pytorch")


def test_absent_on_this_machine():
    assert transformer_engine_available() is False


def test_core_package_without_the_torch_extension_is_not_available(tmp_path, monkeypatch):
    package = tmp_path / "transformer_engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pytorch.py").write_text("raise ImportError('transformer_engine_torch is not installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert transformer_engine_available() is False
        (package / "pytorch.py").write_text("LAYERS = True\n")
        for name in _TE:
            sys.modules.pop(name, None)
        assert transformer_engine_available() is True
    finally:  # no stand-in may leak into later tests of this process
        for name in _TE:
            sys.modules.pop(name, None)
