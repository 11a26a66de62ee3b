"""Lets PyPI's torchvision wheel (a CUDA build) import beside the CPU torch of the vLLM engine
environment on CPU machines (``.venv-vllm``; installed by ``tools/setup_vllm_cpu.sh`` with a
``.pth`` line, so it runs at interpreter start and costs nothing until torchvision is imported).

The problem: PyPI's Linux torchvision wheels link torchvision's C++ ops (``_C.so``) against torch's
CUDA libraries, which the CPU build of torch lacks, so ``_C.so`` does not load; torchvision copes
with that (its ops then raise when called), except that ``torchvision/_meta_registrations.py``
registers fake kernels of two ops unconditionally (``torch.library.register_fake("torchvision::nms")``
and ``qnms``), and ``import torchvision`` fails with ``operator torchvision::nms does not exist``.
vLLM's Qwen2-VL / Qwen2.5-VL model code and the Hugging Face fast image processors import
torchvision for its transforms (plain torch operations), never for those ops.

What this does: when ``torchvision`` is first imported and its ``_C.so`` cannot be loaded, it
defines the schemas of those two ops, without kernels (calling them raises torch's "Could not run
'torchvision::nms' with arguments from the 'CPU' backend"), and lets the import go on. With a
torchvision whose ``_C.so`` loads (a GPU machine, or a build against the CPU torch) it does nothing.
``tests/vllm/test_engine_process.py`` checks that the blocker still exists without it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

#: The op schemas torchvision 0.28's ``_meta_registrations.py`` needs defined (from its ``_C``).
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library.Library that holds the definitions (kept alive)


def define_missing_ops() -> bool:
    """Define :data:`SCHEMAS` under ``torchvision::`` unless torchvision's ``_C.so`` loads (then its
    own registrations define them). Returns whether they were defined here."""
    global _library
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or _library is not None:
        return False
    import torch

    try:
        torch.ops.load_library(str(Path(spec.origin).with_name("_C.so")))
        return False
    except OSError:
        pass
    _library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS:
        _library.define(schema)
    return True


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs :func:`define_missing_ops` once, just before the first ``import torchvision``."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 - the finder protocol
        if name == "torchvision":
            sys.meta_path.remove(self)
            define_missing_ops()
        return None  # the regular finders import it


def install() -> None:
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())


install()
