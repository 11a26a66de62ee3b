"""Errors of the model sources, in a module of their own so that :mod:`fastrl.models.hub` and
:mod:`fastrl.models.packaged` (which the hub resolves ``packaged:`` names through) both raise them
without importing each other."""

from __future__ import annotations


class ModelNotAvailableError(FileNotFoundError):
    """``model.hf_path`` is neither a local directory nor a hub id (or packaged model) whose files can be had."""
