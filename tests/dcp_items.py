"""Reading a torch.distributed.checkpoint directory item by item, as stored (for the checkpoint tests)."""

from __future__ import annotations

from pathlib import Path


def stored_items(actor: Path) -> dict[tuple, tuple]:
    """Every stored item of a torch.distributed.checkpoint directory: (key, chunk offset) -> (its
    metadata entry, its stored bytes)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(actor)).read_metadata()
    out = {}
    for index, info in metadata.storage_data.items():
        with open(actor / info.relative_path, "rb") as fh:
            fh.seek(info.offset)
            out[(index.fqn, tuple(index.offset or ()))] = (metadata.state_dict_metadata[index.fqn], fh.read(info.length))
    return out
