"""PolicyBatch.to: batches stay on the CPU and micro-batches move to the model's device."""

import torch

from fastrl.batch import PolicyBatch


def _batch() -> PolicyBatch:
    ones = torch.ones(2, 3, dtype=torch.bool)
    return PolicyBatch(
        input_ids=torch.arange(6).reshape(2, 3), attention_mask=ones, response_mask=ones,
        pixel_values=[torch.zeros(4, 8), None], image_grid_thw=[torch.tensor([[1, 2, 2]]), None],
        advantages=torch.tensor([1.0, -1.0]),
    )  # fmt: skip


def test_same_device_returns_the_batch_itself():
    b = _batch()
    assert b.to("cpu") is b


def test_every_tensor_moves():
    moved = _batch().to("meta")
    assert moved.input_ids.device.type == "meta" and moved.response_mask.device.type == "meta"
    assert moved.pixel_values[0].device.type == "meta" and moved.pixel_values[1] is None
    assert moved.image_grid_thw[0].device.type == "meta" and moved.image_grid_thw[1] is None
    assert moved.advantages.device.type == "meta"
    assert moved.input_ids.shape == (2, 3)
