"""Moving weights from the trainer to the engine process (refit), bucketed by bytes.

The trainer streams ``(hf_name, tensor)`` pairs (megatron-bridge's export, layer by layer); a
transport packs them into buckets of about ``bucket_bytes`` that never split a parameter group
(:func:`fastrl.rollout.engine_wire.weight_group`: vLLM re-processes every layer a reload touches, so
a layer must arrive whole), and the engine loads each bucket with
``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``.

* :class:`SharedMemoryTransport` (CPU; tested): one file in ``/dev/shm`` per bucket, written by the
  trainer and memory-mapped by the engine (zero copies on the engine side until vLLM copies into its
  parameters). The files persist between refits (rewritten in place), so they always hold the
  engine's current weights: a restarted engine replays them. Bucket ``k+1`` is written while the
  engine loads bucket ``k``.
* :class:`CudaIpcTransport` (GPU, engine colocated on the trainer's GPU; written against vLLM's
  API): each bucket is flattened into one uint8 CUDA buffer whose IPC handle
  (``torch.multiprocessing.reductions.reduce_tensor``, one per engine worker) is sent; each worker
  rebuilds a view of the same memory and reloads from it (as verl / slime
  ``update_weights_from_tensor`` do). Run on an H200 by ``bench/ipc_refit_check.py``.

The transport is chosen in one place, by the trainer rank's device (:func:`transport_for_device`,
:func:`make_transport`): ``"cuda_ipc"`` on a GPU, ``"shm"`` otherwise. Both share one interface:
``send(named_tensors, request, wait)`` builds the engine requests itself (``request(dict)`` sends one
and returns a handle, ``wait(handle)`` waits for its reply), ``replay_requests()`` gives the requests
that reload the current weights into a restarted engine, ``replayable`` says whether there are
any, ``export_to_cpu`` where the trainer's weight export must put its tensors (the CPU for shared
memory, the GPU for CUDA IPC: :func:`export_to_cpu`), and ``record_sums`` whether the engine records
the per-tensor sums of squares of this refit (only refits that are verified need them). An engine
on its own GPUs (a NCCL broadcast group) is not implemented (docs/engine.md).

Frozen tensors (``model.freeze_vision_tower``) go to their own buckets, sent on the first refit only
(:attr:`SharedMemoryTransport.skip_after_first`).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastrl.rollout.engine_wire import weight_group

#: One tensor in a bucket file: (name, dtype name, shape, byte offset, byte count).
Entry = tuple[str, str, tuple[int, ...], int, int]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def group_buckets(
    items: Iterable[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of about ``max_bytes`` that never split a :func:`weight_group` (a bucket holding one
    large group may exceed ``max_bytes``).

    Raises:
        ValueError: a group's tensors are not consecutive in the stream.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size, current, done = 0, None, set()
    for name, tensor in items:
        group = weight_group(name)
        if group != current:
            if group in done:
                raise ValueError(f"refit: {name!r} arrived after other tensors of {group!r}; stream each layer consecutively")
            if current is not None:
                done.add(current)
            if bucket and size >= max_bytes:
                yield bucket
                bucket, size = [], 0
            current = group
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
    if bucket:
        yield bucket


#: Byte alignment of every tensor in a bucket. The engine views its slice of the flat uint8 buffer
#: as the tensor's dtype, which torch allows only at an offset divisible by the element size: packed
#: back to back, an fp32 tensor after a bf16 tensor of odd length could not be viewed (found on an
#: H200 by ``bench/ipc_refit_check.py``). 256 bytes is the CUDA allocator's own alignment.
ALIGN = 256


def bucket_layout(tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[Entry], int]:
    """The entry table of a bucket and its buffer size in bytes: each tensor at the next multiple of
    :data:`ALIGN` after the previous one (both transports pack by it; the engine slices by the
    entries alone)."""
    entries, offset = [], 0
    for name, t in tensors:
        offset = -(-offset // ALIGN) * ALIGN
        n = t.numel() * t.element_size()
        entries.append((name, dtype_name(t.dtype), tuple(t.shape), offset, n))
        offset += n
    return entries, offset


def pack_flat(bucket: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[Entry]]:
    """One bucket as a flat uint8 buffer on the tensors' device, and its entry table.

    Returns:
        ``(buffer, entries)``: ``buffer`` uint8 [layout bytes] holding the tensors at the offsets of
        :func:`bucket_layout`; ``entries`` one ``(name, dtype name, shape, byte offset, byte count)``
        per tensor, in order (what the engine slices its views by).
    """
    entries, total = bucket_layout(bucket)
    buffer = torch.empty(total, dtype=torch.uint8, device=bucket[0][1].device)
    for (_, t), (_, _, _, offset, n) in zip(bucket, entries):
        buffer[offset : offset + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return buffer, entries


def payload_bytes(entries: list[Entry]) -> int:
    """The tensors' bytes in a bucket (its padding not counted)."""
    return sum(entry[4] for entry in entries)


@dataclass
class _BucketFile:
    path: Path
    size: int = 0
    mm: mmap.mmap | None = None
    entries: list[Entry] = field(default_factory=list)

    def write(self, tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Write ``tensors`` at the offsets of :func:`bucket_layout`; returns their bytes."""
        tensors = [(name, t.detach().cpu().contiguous()) for name, t in tensors]
        entries, total = bucket_layout(tensors)
        if self.mm is None or self.size != max(total, 1):
            if self.mm is not None:
                self.mm.close()
            self.size = max(total, 1)
            with open(self.path, "w+b") as f:
                f.truncate(self.size)
                self.mm = mmap.mmap(f.fileno(), self.size)
        buf = torch.frombuffer(self.mm, dtype=torch.uint8, count=self.size)
        for (_, t), (_, _, _, offset, n) in zip(tensors, entries):
            buf[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
        self.entries = entries
        return payload_bytes(entries)

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        self.path.unlink(missing_ok=True)


def _load_request(buckets: list[tuple[str, list[Entry]]], sums: bool = True) -> dict:
    return {"op": "load_weights", "buckets": buckets, "sums": sums}


def owner_tag() -> str:
    """``<pid>@<machine>``: the process, and a digest of its host name and PID namespace, that own
    a temporary directory; ``-`` free, so it is one field of ``<prefix>-<tag>-XXXX``."""
    import hashlib
    import socket

    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "?"
    machine = hashlib.sha1(f"{socket.gethostname()}:{namespace}".encode()).hexdigest()[:10]
    return f"{os.getpid()}@{machine}"


def owned_temp_dir(prefix: str, base: Path | None = None) -> Path:
    """A new directory ``<base>/<prefix>-<owner_tag>-XXXX`` (base: the temporary directory)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{owner_tag()}-", dir=base))


def remove_stale_dirs(base: Path, prefix: str) -> list[Path]:
    """Remove the ``<prefix>-<pid>@<machine>-*`` directories (:func:`owned_temp_dir`) under
    ``base`` that this host and PID namespace own and whose process ``pid`` no longer runs (a
    trainer killed with SIGKILL cannot remove its own); returns what was removed.

    A directory of another host or PID namespace is never touched (a shared ``TMPDIR``, or a
    container whose processes this one cannot see: its ``pid`` says nothing here), nor one whose
    name carries no owner (written by an older version), nor anything where ``/proc`` is missing
    (no way to tell a live process).

    Used for the refit files (``fastrl-refit``) and the engine process's work directory
    (``fastrl-engine``: its spec and log).
    """
    import shutil

    if not Path("/proc/self").exists():
        return []
    machine = owner_tag().split("@")[1]
    removed = []
    for d in base.glob(f"{prefix}-*@*-*"):
        pid, _, owner = d.name[len(prefix) + 1:].split("-")[0].partition("@")
        if not pid.isdigit() or owner != machine or Path(f"/proc/{pid}").exists():
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


class SharedMemoryTransport:
    """Refit through one shared-memory file per bucket (module docstring).

    Args:
        bucket_bytes: bucket size target.
        directory: where the files live (``/dev/shm`` when it exists, else the temporary directory).
        skip_after_first: names (a predicate) that do not change after the first refit (a frozen
            vision tower): they go to their own buckets, sent once.
    """

    def __init__(
        self, bucket_bytes: int, *, directory: str | os.PathLike | None = None,
        skip_after_first: Callable[[str], bool] | None = None,
    ) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        base = Path(directory) if directory else (Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir()))
        remove_stale_dirs(base, "fastrl-refit")
        self.dir = owned_temp_dir("fastrl-refit", base)
        self.bucket_bytes = bucket_bytes
        self.skip_after_first = skip_after_first
        self.live: list[_BucketFile] = []
        self.frozen: list[_BucketFile] = []
        self.refits = 0
        self.record_sums = True  # the engine records per-tensor sums of squares (set per refit by the client)

    def _file(self, pool: list[_BucketFile], index: int, kind: str) -> _BucketFile:
        while len(pool) <= index:
            pool.append(_BucketFile(self.dir / f"{kind}-{len(pool):05d}.bin"))
        return pool[index]

    replayable = True
    """The bucket files keep the engine's current weights (:meth:`replay_requests`)."""

    export_to_cpu = True
    """The trainer exports its weights to the CPU for this transport (the bucket files are host memory)."""

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]],
        request: Callable[[dict], object], wait: Callable[[object], None],
    ) -> tuple[int, int]:
        """Write the buckets and have the engine load each: ``request({"op": "load_weights",
        "buckets": [(path, entries)]})`` sends a request and returns a handle, ``wait(handle)`` waits
        for its reply; bucket ``k+1`` is written between the two.

        Returns:
            ``(tensors, bytes)`` sent.
        """
        first = self.refits == 0
        skip = self.skip_after_first

        def live_stream():
            for name, t in named_tensors:
                if skip is not None and skip(name):
                    if first:
                        frozen_items.append((name, t.detach().cpu().clone()))
                    continue
                yield name, t

        frozen_items: list[tuple[str, torch.Tensor]] = []
        count = nbytes = 0
        pending = None
        index = 0
        for bucket in group_buckets(live_stream(), self.bucket_bytes):
            f = self._file(self.live, index, "live")
            nbytes += f.write(bucket)
            count += len(bucket)
            if pending is not None:
                wait(pending)
            pending = request(_load_request([(str(f.path), f.entries)], self.record_sums))
            index += 1
        if pending is not None:
            wait(pending)
        del self.live[index:]
        if frozen_items:
            for k, bucket in enumerate(group_buckets(frozen_items, self.bucket_bytes)):
                f = self._file(self.frozen, k, "frozen")
                nbytes += f.write(bucket)
                count += len(bucket)
                wait(request(_load_request([(str(f.path), f.entries)], self.record_sums)))
        self.refits += 1
        return count, nbytes

    def resident(self) -> list[tuple[str, list[Entry]]]:
        """Every bucket of the engine's current weights (to replay into a restarted engine)."""
        return [(str(f.path), f.entries) for f in self.frozen + self.live if f.entries]

    def replay_requests(self) -> list[dict]:
        """The requests that load :meth:`resident` into a restarted engine (none before the first refit)."""
        resident = self.resident()
        return [_load_request(resident)] if resident else []

    def close(self) -> None:
        for f in self.frozen + self.live:
            f.close()
        self.frozen, self.live = [], []
        try:
            self.dir.rmdir()
        except OSError:
            pass


class CudaIpcTransport:
    """Refit into an engine on the trainer's own GPU through CUDA IPC handles; written against the API
    of vLLM 0.32, the pinned release (requirements/gpu-engine.txt). CI runs it against a recording
    fake of the CUDA layer (tests/rehearsal); ``bench/ipc_refit_check.py`` runs it on a GPU between
    real processes, with a stand-in for vLLM's workers.

    Per bucket: the tensors (already on the GPU) are copied into one flat uint8 CUDA buffer; its IPC
    handles, ``torch.multiprocessing.reductions.reduce_tensor(buffer)`` once per engine worker, and
    the entry table (name, dtype, shape, offset, bytes) go to the engine (request
    ``load_weights_ipc``), whose workers each rebuild the buffer from their own handle
    (``rebuild_fn(*args)`` with the device index mapped to the engine's ``cuda:0``), slice it into
    views and reload from them (``engine_server.reload_ipc_bucket``). The trainer keeps the buffer
    alive until the engine's reply (the workers have then copied into their parameters and
    synchronized). Memory: one bucket at a time on top of the trainer's model (the
    engine must be awake for weights, ``wake_up(tags=["weights"])``, before the KV cache returns).
    Bytes per step: the whole model once (or the non-frozen part), device to device, no host copy.

    One handle per consumer (``consumers``: the engine's tensor-parallel workers, each of which opens
    the bucket itself). torch counts the users of a shared CUDA block in a counter created per
    ``reduce_tensor`` call, set to 1, and decremented by each process that releases what it
    rebuilt; the trainer's block is freed when it reaches 0. One handle opened by two workers ends
    at -1, which torch 2.11-2.13's producer side reads as a huge unsigned count, and the block is
    never freed (a signed counter would instead free it while the second worker may still read
    it): every bucket of every refit stayed allocated on the trainer's GPU (measured on an H200 by
    ``bench/ipc_refit_check.py``: 2 GiB after a 2 GiB refit into two workers, also after
    ``torch.cuda.ipc_collect()``; 0 with one handle per worker).
    """

    replayable = False
    """Nothing is kept: a restarted engine cannot be given the current weights (restart on GPU is
    refused after the first refit)."""

    def __init__(
        self, bucket_bytes: int, *, skip_after_first: Callable[[str], bool] | None = None, consumers: int = 1
    ) -> None:
        if consumers < 1:
            raise ValueError(f"consumers (the engine's workers that open each bucket) must be >= 1, got {consumers}")
        self.bucket_bytes = bucket_bytes
        self.skip_after_first = skip_after_first
        self.consumers = consumers
        self.refits = 0
        self.record_sums = True

    export_to_cpu = False
    """The trainer exports its weights on the GPU for this transport (a CPU buffer has no CUDA IPC handle)."""

    def send(self, named_tensors, request, wait) -> tuple[int, int]:
        """Like :meth:`SharedMemoryTransport.send`, one ``load_weights_ipc`` request per bucket."""
        from torch.multiprocessing.reductions import reduce_tensor

        skip = self.skip_after_first if self.refits > 0 else None
        stream = ((n, t) for n, t in named_tensors if skip is None or not skip(n))
        self.refits += 1
        count = nbytes = 0
        for bucket in group_buckets(stream, self.bucket_bytes):
            buffer, entries = pack_flat(bucket)
            total = payload_bytes(entries)
            if buffer.device.type != "cuda":
                raise ValueError(
                    f"CUDA IPC refit: the bucket holding {entries[0][0]!r} is on {buffer.device}, not a GPU; "
                    f"export the weights on the GPU (export_hf_weights(..., cpu=False)) for this transport"
                )
            torch.cuda.current_stream().synchronize()
            handles = [reduce_tensor(buffer) for _ in range(self.consumers)]  # one counter each (class docstring)
            wait(request({"op": "load_weights_ipc", "handles": handles, "entries": entries, "sums": self.record_sums}))
            count, nbytes = count + len(bucket), nbytes + total
            del buffer
        return count, nbytes

    def replay_requests(self) -> list[dict]:
        return []

    def close(self) -> None:
        pass


#: The transports by name (:func:`transport_for_device` picks the name).
TRANSPORTS: dict[str, type] = {"shm": SharedMemoryTransport, "cuda_ipc": CudaIpcTransport}


def transport_for_device(device: torch.device | str | None) -> str:
    """The refit transport of an engine colocated with a trainer rank on ``device``: CUDA IPC on a
    GPU (the engine sees the same GPU), shared-memory files otherwise."""
    return "cuda_ipc" if device is not None and torch.device(device).type == "cuda" else "shm"


def export_to_cpu(device: torch.device | str | None) -> bool:
    """Whether a trainer rank on ``device`` exports its weights to the CPU for the refit: yes for the
    shared-memory transport, no for CUDA IPC (which needs GPU tensors; an engine-less peer rank on a
    GPU also keeps them there, it only takes part in the export's collectives)."""
    return TRANSPORTS[transport_for_device(device)].export_to_cpu


def make_transport(
    name: str, bucket_bytes: int, *, skip_after_first: Callable[[str], bool] | None = None, consumers: int = 1
) -> SharedMemoryTransport | CudaIpcTransport:
    """The transport called ``name`` (a key of :data:`TRANSPORTS`). ``consumers``: the engine's
    worker processes (its tensor-parallel size), which each open a CUDA IPC handle of their own;
    shared-memory files are mapped by any number of processes and need no count.

    Raises:
        ValueError: an unknown name; ``consumers < 1``.
    """
    if name not in TRANSPORTS:
        raise ValueError(f"refit transport must be one of {sorted(TRANSPORTS)}, got {name!r}")
    if name == "cuda_ipc":
        return CudaIpcTransport(bucket_bytes, skip_after_first=skip_after_first, consumers=consumers)
    if consumers < 1:
        raise ValueError(f"consumers must be >= 1, got {consumers}")
    return TRANSPORTS[name](bucket_bytes, skip_after_first=skip_after_first)
