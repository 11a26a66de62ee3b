"""A recording stand-in for the CUDA layer, so that GPU-only branches run on CPU in CI.

:class:`FakeCuda` replaces the ``torch.cuda`` functions the GPU path calls at the lowest level
(device count and visibility, ``set_device`` / ``current_device``, the caching allocator's memory
calls) with ones that behave like the CUDA runtime on a node with ``device_count`` visible GPUs
(``set_device`` outside that range raises CUDA's "invalid device ordinal") and record every call in
:attr:`FakeCuda.calls`, so that a test asserts what the GPU branch did.

Usage (pytest)::

    cuda = FakeCuda(device_count=1, visible="5").install(monkeypatch)
    ...                      # run the GPU branch
    assert cuda.calls == [("set_device", 0)]
"""

from __future__ import annotations

from typing import Any

import torch


class FakeCudaError(RuntimeError):
    """What the CUDA runtime raises (the message matches torch's)."""


class FakeCuda:
    """``torch.cuda`` on ``device_count`` visible GPUs of ``total_bytes`` each, recording calls.

    Args:
        device_count: GPUs this process sees.
        visible: the ``CUDA_VISIBLE_DEVICES`` value set while installed (None: unset).
        total_bytes: memory of each GPU (``mem_get_info``).
    """

    def __init__(self, device_count: int = 8, *, visible: str | None = None, total_bytes: int = 80 * 2**30) -> None:
        self.device_count_value = device_count
        self.visible = visible
        self.total_bytes = total_bytes
        self.current = 0
        self.allocated = 0
        self.reserved = 0
        self.calls: list[tuple[Any, ...]] = []

    # ---- the replaced functions -------------------------------------------------------------

    def is_available(self) -> bool:
        return self.device_count_value > 0

    def device_count(self) -> int:
        return self.device_count_value

    def set_device(self, device: int | torch.device) -> None:
        index = device.index if isinstance(device, torch.device) else int(device)
        self.calls.append(("set_device", index))
        if not 0 <= index < self.device_count_value:
            raise FakeCudaError("CUDA error: invalid device ordinal")
        self.current = index

    def current_device(self) -> int:
        return self.current

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache",))
        self.reserved = self.allocated

    def synchronize(self, device: Any = None) -> None:
        self.calls.append(("synchronize",))

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated

    def memory_reserved(self, device: Any = None) -> int:
        return self.reserved

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return self.total_bytes - self.reserved, self.total_bytes

    # ---- installing ---------------------------------------------------------------------------

    REPLACED = (
        "is_available", "device_count", "set_device", "current_device", "empty_cache", "synchronize",
        "memory_allocated", "memory_reserved", "mem_get_info",
    )

    def install(self, monkeypatch: Any) -> "FakeCuda":
        """Replace the ``torch.cuda`` functions (undone by ``monkeypatch`` at the end of the test)."""
        for name in self.REPLACED:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        if self.visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", self.visible)
        return self
