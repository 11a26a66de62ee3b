"""A recording stand-in for the CUDA layer, so that GPU-only branches run on CPU in CI.

:class:`FakeCuda` replaces the ``torch.cuda`` functions the GPU path calls at the lowest level
(device count and visibility, ``set_device`` / ``current_device``, the caching allocator's memory
calls, the device's properties, the CUDA generator's state) with ones that behave like the CUDA
runtime on a node with ``device_count`` visible GPUs (``set_device`` outside that range raises
CUDA's "invalid device ordinal") and record the calls that act on a device in
:attr:`FakeCuda.calls` (:attr:`FakeCuda.RECORDED`), so that a test asserts what the GPU branch did.

Usage (pytest)::

    cuda = FakeCuda(device_count=1, visible="5").install(monkeypatch)
    ...                      # run the GPU branch
    assert cuda.calls == [("set_device", 0)]
"""

from __future__ import annotations

import types
from typing import Any, Sequence

import torch
from torch.multiprocessing.reductions import reduce_tensor as _real_reduce_tensor


class FakeCudaError(RuntimeError):
    """What the CUDA runtime raises (the message matches torch's)."""


class FakeCuda:
    """``torch.cuda`` on ``device_count`` visible GPUs, recording the calls that act on a device or
    ask about one by index (see :attr:`RECORDED`).

    Args:
        device_count: GPUs this process sees.
        visible: the ``CUDA_VISIBLE_DEVICES`` value set while installed (None: unset).
        total_bytes: memory of each GPU (``get_device_properties``, ``mem_get_info``): one number
            for all, or one per device.
    """

    #: What :attr:`calls` records: ``(name, device index)`` for ``set_device`` and
    #: ``get_device_properties``, ``(name,)`` for the others. Queries without side effects
    #: (``is_available``, ``device_count``, ``current_device``, the memory counters) are not recorded.
    RECORDED = ("set_device", "empty_cache", "synchronize", "stream_synchronize", "get_device_properties",
                "get_rng_state", "set_rng_state")

    def __init__(self, device_count: int = 8, *, visible: str | None = None,
                 total_bytes: int | Sequence[int] = 80 * 2**30, fragmented_bytes: int = 0) -> None:
        self.device_count_value = device_count
        self.visible = visible
        self.total_bytes = [total_bytes] * device_count if isinstance(total_bytes, int) else list(total_bytes)
        if len(self.total_bytes) != device_count:
            raise ValueError(f"total_bytes has {len(self.total_bytes)} entries for {device_count} devices")
        self.current = 0
        self.allocated = 0
        self.reserved = 0
        #: cached bytes in segments that still hold a live block: ``empty_cache`` cannot return them
        #: (torch's caching allocator releases whole segments only), as on a real GPU after a
        #: fragmenting phase; 0 models a perfect release
        self.fragmented_bytes = fragmented_bytes
        self.rng_state = torch.zeros(16, dtype=torch.uint8)
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
        self.reserved = self.allocated + min(self.fragmented_bytes, self.reserved - self.allocated)

    def synchronize(self, device: Any = None) -> None:
        self.calls.append(("synchronize",))

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated

    def memory_reserved(self, device: Any = None) -> int:
        return self.reserved

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        total = self.total_bytes[self._index(device)]
        return total - self.reserved, total

    def current_stream(self, device: Any = None) -> "_Stream":
        return _Stream(self)

    def get_device_properties(self, device: Any = None) -> types.SimpleNamespace:
        index = self._index(device)
        self.calls.append(("get_device_properties", index))
        if not 0 <= index < self.device_count_value:
            raise FakeCudaError("CUDA error: invalid device ordinal")
        return types.SimpleNamespace(name="fake GPU", total_memory=self.total_bytes[index])

    def _index(self, device: Any) -> int:
        """torch's reading of a device argument: None or an index-less ``cuda`` is the current device."""
        if device is None:
            return self.current
        if isinstance(device, (str, torch.device)):
            device = torch.device(device)
            return self.current if device.index is None else device.index
        return int(device)

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        """The generator state of the current device (a byte tensor, as torch's)."""
        self.calls.append(("get_rng_state",))
        return self.rng_state.clone()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        self.calls.append(("set_rng_state",))
        self.rng_state = new_state.clone()

    # ---- installing ---------------------------------------------------------------------------

    REPLACED = (
        "is_available", "device_count", "set_device", "current_device", "empty_cache", "synchronize",
        "memory_allocated", "memory_reserved", "mem_get_info", "current_stream", "get_device_properties",
        "get_rng_state", "set_rng_state",
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


class _Stream:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def synchronize(self) -> None:
        self.cuda.calls.append(("stream_synchronize",))


class CudaTyped(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:0`` (``.device``, ``.is_cuda``): what the GPU
    branch of the refit sees of a GPU tensor, without a GPU. Operations keep the type."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:  # type: ignore[override]
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
            return self  # already "there"
        return super().to(*args, **kwargs)


def cuda_typed(tensor: torch.Tensor) -> CudaTyped:
    return tensor.as_subclass(CudaTyped)


#: The worker whose ``rebuild_cuda_tensor`` call is running (set by :meth:`FakeWorker.opening`).
_OPENING: list = []


def rebuild_cuda_tensor(*args: Any) -> torch.Tensor:
    """Stand-in of torch's ``rebuild_cuda_tensor`` (same name; argument 6 the device index, the
    buffer itself at argument 8 here instead of a CUDA IPC memory handle, the handle's id at
    argument 9): the buffer opened on the GPU (:class:`CudaTyped`), as torch's is. The id is
    recorded on the worker that opened it (:attr:`FakeWorker.opened`)."""
    if _OPENING:
        _OPENING[-1].opened.append(args[9])
    return cuda_typed(args[8])


class FakeReduceTensor:
    """Stand-in of ``torch.multiprocessing.reductions.reduce_tensor`` recording the device type of
    each tensor it is given: a CUDA-typed tensor gets a ``rebuild_cuda_tensor`` handle (device index
    at argument 6, as torch's); a CPU tensor gets torch's real CPU handle (``rebuild_tensor``, 3
    arguments)."""

    def __init__(self) -> None:
        self.devices: list[str] = []
        self.handles: list[int] = []  # the id of each CUDA handle made, in order

    def __call__(self, tensor: torch.Tensor) -> tuple:
        self.devices.append(tensor.device.type)
        if tensor.device.type == "cuda":
            self.handles.append(len(self.handles))
            return rebuild_cuda_tensor, (type(tensor), tensor.shape, tensor.stride(), 0, None, None, 0, None,
                                         torch.Tensor(tensor).clone(), self.handles[-1])
        return _real_reduce_tensor(tensor)


class RecordingLLM:
    """Records what the engine server does to ``vllm.LLM``: sleep levels, wake-up tags, and each
    ``collective_rpc`` as vLLM's executor runs it (same signature: ``method`` a worker method's name
    or a function called with the worker first, ``args``, ``kwargs``).

    With ``tensor_parallel_size > 1`` vLLM's multiproc executor pickles the arguments to its worker
    processes, where torch pickles a CUDA tensor by copying its whole storage to the host and back
    onto ``cuda:0``: every CUDA tensor found in the arguments is counted
    (:attr:`pickled_cuda_tensors`), the arguments are pickled and each of the
    ``tensor_parallel_size`` workers (:class:`FakeWorker`) runs the method on its own unpickled
    copy. :attr:`payload_types` records the type of each ``weights_iterator`` payload;
    :attr:`encoder_cache_resets` counts ``llm_engine.reset_encoder_cache()`` calls."""

    def __init__(self, tensor_parallel_size: int = 1) -> None:
        self.tensor_parallel_size = tensor_parallel_size
        self.calls: list[tuple] = []
        # vLLM's sleep mode as the engine sees it: what is awake, and whether the weights hold data
        # (a level-2 sleep discards them: awake again they are allocated but unfilled until a reload)
        self.weights_awake = self.kv_awake = True
        self.weights_valid = True
        self.loaded: dict[str, torch.Tensor] = {}
        self.payload_types: list[type] = []
        self.pickled_cuda_tensors = 0
        self.workers = [FakeWorker(self, rank) for rank in range(tensor_parallel_size)]
        self.encoder_cache_resets = 0
        self.llm_engine = types.SimpleNamespace(reset_encoder_cache=self._reset_encoder_cache)

    def _reset_encoder_cache(self) -> None:
        self.encoder_cache_resets += 1

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))
        self.weights_awake = self.kv_awake = False
        if level == 2:
            self.weights_valid = False

    def wake_up(self, tags: Any = None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        if not tags or "weights" in tags:
            self.weights_awake = True
        if not tags or "kv_cache" in tags:
            self.kv_awake = True

    def generate(self, requests: Any = (), sampling_params: Any = None, use_tqdm: bool = False) -> list:
        """Refuses what a sleeping vLLM cannot do: generate with its KV cache or weights asleep, or
        from weights a level-2 sleep discarded and no reload refilled. Records ``("generate",)``."""
        if not (self.weights_awake and self.kv_awake):
            raise RuntimeError(f"generate while asleep (weights awake: {self.weights_awake}, KV cache awake: {self.kv_awake})")
        if not self.weights_valid:
            raise RuntimeError("generate from weights a level-2 sleep discarded, with no reload since")
        self.calls.append(("generate",))
        return []

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None) -> list:
        import pickle

        kwargs = dict(kwargs or {})
        if "weights_iterator" in kwargs:
            self.payload_types.append(type(kwargs["weights_iterator"]))
        if self.tensor_parallel_size == 1:  # the uniprocess executor: the driver worker, no pickling
            copies = [(args, kwargs)]
        else:
            self.pickled_cuda_tensors += _count_cuda_tensors((args, kwargs))
            blob = pickle.dumps((args, kwargs))
            copies = [pickle.loads(blob) for _ in self.workers]
        results = []
        for worker, (a, k) in zip(self.workers, copies):
            _OPENING.append(worker)
            try:
                results.append(getattr(worker, method)(*a, **k) if isinstance(method, str) else method(worker, *a, **k))
            finally:
                _OPENING.pop()
        return results

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


class FakeWorker:
    """One vLLM worker as ``collective_rpc`` sees it (vLLM's ``WorkerWrapperBase``: ``rpc_rank`` its
    index in the executor): ``reload_weights(weights_iterator=...)`` loads full tensors (worker 0's
    are recorded in ``llm.loaded`` and ``llm.calls``; every worker counts its tensors in
    :attr:`reloaded`); :attr:`opened` the ids of the CUDA IPC handles it rebuilt;
    ``model_runner.get_model()`` has no output layer method."""

    def __init__(self, llm: RecordingLLM, rank: int) -> None:
        self.llm, self.rank, self.rpc_rank = llm, rank, rank
        self.reloaded = 0
        self.opened: list[int] = []
        self.model_runner = types.SimpleNamespace(get_model=lambda: types.SimpleNamespace())

    def reload_weights(self, weights_iterator: Any = None, **_: Any) -> None:
        if not self.llm.weights_awake:
            raise RuntimeError("reload_weights into sleeping weights (wake_up(tags=['weights']) first)")
        items = [(name, torch.Tensor(t).clone()) for name, t in weights_iterator]
        self.llm.weights_valid = True  # what the refit carries is filled (a refit carries every weight)
        self.reloaded += len(items)
        if self.rank == 0:
            self.llm.loaded.update(items)
            self.llm.calls.append(("reload_weights", [name for name, _ in items]))


def _count_cuda_tensors(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return int(obj.device.type == "cuda")
    if isinstance(obj, dict):
        return sum(_count_cuda_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_count_cuda_tensors(v) for v in obj)
    return 0
