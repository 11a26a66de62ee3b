"""``copy_model_items`` (fastrl/checkpoint/model_only.py): a torch.distributed.checkpoint directory's
model items copied as their stored bytes, pickled objects such as Transformer Engine's ``_extra_state``
(a uint8 tensor in a list) included, without ever deserializing them."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from fastrl.checkpoint.manager import CheckpointError
from fastrl.checkpoint.model_only import copy_model_items, is_optimizer_entry
from tests.dcp_items import stored_items

EXTRA = "decoder.layers.mlp.linear_fc1._extra_state/shard_0_2"


def _write(actor: Path, *, optimizer: bool = True) -> None:
    from torch.distributed.checkpoint import FileSystemWriter, save

    extra = io.BytesIO()
    torch.save([torch.arange(7, dtype=torch.uint8)], extra)  # what Transformer Engine 2.x's get_extra_state returns
    extra.seek(0)
    state = {"embedding.word_embeddings.weight": torch.randn(5, 4), "decoder.layers.mlp.linear_fc1.weight": torch.randn(2, 8, 4),
             EXTRA: extra}  # fmt: skip
    if optimizer:
        state |= {"optimizer.state.exp_avg.embedding.word_embeddings.weight": torch.randn(5, 4),
                  "optimizer.state.param.decoder.layers.mlp.linear_fc1.weight": torch.randn(2, 8, 4)}  # fmt: skip
    save(state, storage_writer=FileSystemWriter(str(actor)), no_dist=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_model_items_are_copied_as_stored_and_read_back(tmp_path):
    """Same keys, chunks and bytes, the optimizer's gone; torch.distributed.checkpoint reads the
    tensors and the pickled ``_extra_state`` back unchanged.

    catches: tools/mutants.toml ``drop-optimizer-offsets-not-moved`` (each item keeps its old offset),
    and a copy that unpickles and saves again (a ``[tensor]`` object comes back under a new key
    ``...shard_0_2.0``, which megatron's strict load reports missing)."""
    from torch.distributed.checkpoint import FileSystemReader, load

    actor, out = tmp_path / "actor", tmp_path / "out"
    _write(actor)
    out.mkdir()
    assert copy_model_items(actor, out) == 3
    before = stored_items(actor)
    assert stored_items(out) == {k: v for k, v in before.items() if not is_optimizer_entry(k[0])}
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp"]

    reader = FileSystemReader(str(actor))
    original = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in reader.read_metadata().state_dict_metadata.items()
                if k != EXTRA and not is_optimizer_entry(k)}  # fmt: skip
    load(original, storage_reader=reader, no_dist=True)
    copied = {k: torch.empty_like(v) for k, v in original.items()}
    load(copied, storage_reader=FileSystemReader(str(out)), no_dist=True)
    for key, tensor in original.items():
        assert torch.equal(copied[key], tensor), key
    (_, extra), = [v for k, v in stored_items(out).items() if k[0] == EXTRA]
    payload = torch.load(io.BytesIO(extra), weights_only=False)  # the BytesIO the save was given, as stored
    assert torch.equal(torch.load(io.BytesIO(payload.getvalue()), weights_only=False)[0], torch.arange(7, dtype=torch.uint8))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_refusals_name_the_directory_or_file(tmp_path):
    """No optimizer entries: nothing to drop. A data file cut short: named, with the key."""
    plain, out = tmp_path / "plain", tmp_path / "out"
    _write(plain, optimizer=False)
    out.mkdir()
    with pytest.raises(CheckpointError, match=f"{plain}: holds no 'optimizer.*' entries to drop"):
        copy_model_items(plain, out)

    cut = tmp_path / "cut"
    _write(cut)
    data = next(cut.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=rf"{data}: ends before the \d+ bytes of .* \(a truncated file\)"):
        copy_model_items(cut, out)
