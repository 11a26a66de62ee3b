"""Supervised warm start of the tiny easy-vqa policy (before RL), cached on disk.

A randomly initialized policy neither formats answers nor looks at the image, so RL from it has
nothing to reinforce. The warm start runs on the Hugging Face model and writes a new Hugging Face
directory that the actor and the rollout engine load:

1. Vision warm-up (``warm_start.vision_warmup_steps``): the vision tower and merger learn through
   two small linear heads on the mean image token that classify the shape's colour and kind.
   Without it the language model learns the per-question answer prior and the image features
   collapse toward a constant (plain SFT stalls at the question-only baseline).
2. SFT (``warm_start.sft_steps``) on formatted targets
   ``<thinking> the image shows a {color} {shape} </thinking> \\boxed{answer}<|im_end|>``, with the
   attribute-head loss kept on at ``warm_start.aux_loss_weight`` (without it the image features
   wash out again).

Attribute labels come from the training questions only (``what is the blue shape?`` -> rectangle
tells both colour and shape of that image; yes/no questions tell presence).

The result is cached under ``<cache>/warm_start/<key>`` where the key hashes the base model's
settings, the warm-start section, the template and the seed; a directory is used only when its
stamp file (written last) exists. Processes that need the same key at once (parallel test workers,
several jobs sharing a cache) build it once: the first holds an exclusive lock on
``<cache>/warm_start/.<key>.lock`` while it trains, the others wait on it and then reuse the result.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from fastrl.config import WarmStartConfig
from fastrl.data import Record
from fastrl.data.easy_vqa import SHAPES
from fastrl.models.cache_lock import exclusive_lock
from fastrl.training.prompting import record_prompt

logger = logging.getLogger(__name__)

COLORS = ("black", "blue", "brown", "gray", "green", "red", "teal", "yellow")
SHAPE_LIST = tuple(sorted(SHAPES))
_STAMP = "fastrl_warm_start.json"
_NEGATION = re.compile(r"\bnot\b|^is no\b")


@dataclass(frozen=True)
class ImageLabels:
    """Colour and shape of an easy-vqa image (None when no training question reveals it)."""

    color: str | None = None
    shape: str | None = None


def image_labels(records: Sequence[Record]) -> dict[str, ImageLabels]:
    """Colour and shape per ``image_id`` from easy-vqa training questions and answers."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for r in records:
        image_id = r.metadata.get("image_id")
        if image_id is None:
            continue
        q, a = r.problem.lower(), r.answer.lower()
        colors = [c for c in COLORS if re.search(rf"\b{c}\b", q)]
        shapes = [s for s in SHAPE_LIST if re.search(rf"\b{s}\b", q)]
        if a in ("yes", "no"):
            present = (a == "yes") != bool(_NEGATION.search(q))
            if present:
                if colors:
                    found[image_id]["color"] = colors[0]
                if shapes:
                    found[image_id]["shape"] = shapes[0]
            continue
        if a in SHAPES:
            found[image_id]["shape"] = a
            if colors:
                found[image_id]["color"] = colors[0]
        elif a in COLORS:
            found[image_id]["color"] = a
            if shapes:
                found[image_id]["shape"] = shapes[0]
    return {k: ImageLabels(v.get("color"), v.get("shape")) for k, v in found.items()}


def sft_target(record: Record, labels: ImageLabels | None) -> str:
    """The supervised response: a short description of the image, then the boxed answer."""
    color = labels.color if labels and labels.color else "colored"
    shape = labels.shape if labels and labels.shape else "shape"
    return f"<thinking> the image shows a {color} {shape} </thinking> \\boxed{{{record.answer}}}<|im_end|>"


#: The warm start always trains with one torch thread, whatever ``trainer.torch_threads`` says: fp32
#: sums differ between thread counts, and the cached weights (one per key, shared by every run on a
#: machine) must not depend on which process happened to build them first.
WARM_START_THREADS = 1


def warm_start_key(base_model_dir: Path, cfg: WarmStartConfig, template: str, image_size: int, seed: int) -> str:
    """Cache key: base model stamp + warm-start settings + template + image size + seed."""
    stamp = ""
    for name in ("fastrl_tiny_model.json", "config.json"):
        if (base_model_dir / name).exists():
            stamp = (base_model_dir / name).read_text()
            break
    blob = json.dumps(
        {"base": stamp, "cfg": asdict(cfg), "template": template, "image_size": image_size, "seed": seed, "v": 2},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class _AttributeHeads(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.color = torch.nn.Linear(hidden, len(COLORS))
        self.shape = torch.nn.Linear(hidden, len(SHAPE_LIST))

    def loss(self, image_embeds: Sequence[torch.Tensor], labels: Sequence[ImageLabels]) -> tuple[torch.Tensor, float]:
        pooled = torch.stack([e.mean(0) for e in image_embeds])
        color_t = torch.tensor([COLORS.index(lab.color) if lab.color else -100 for lab in labels])
        shape_t = torch.tensor([SHAPE_LIST.index(lab.shape) if lab.shape else -100 for lab in labels])
        color_logits, shape_logits = self.color(pooled), self.shape(pooled)
        loss = F.cross_entropy(color_logits, color_t, ignore_index=-100) + F.cross_entropy(
            shape_logits, shape_t, ignore_index=-100
        )
        valid = color_t >= 0
        acc = (color_logits.argmax(-1)[valid] == color_t[valid]).float().mean().item() if valid.any() else 0.0
        return loss, acc


def _batch_inputs(processor, prompts, targets=None):
    texts = [p.text + (t if targets else "") for p, t in zip(prompts, targets or [""] * len(prompts))]
    images = [im for p in prompts for im in p.images]
    return processor(text=texts, images=images, return_tensors="pt", padding=True)


def run_warm_start(
    base_model_dir: str | Path,
    out_root: str | Path,
    train_records: Sequence[Record],
    cfg: WarmStartConfig,
    *,
    template: str,
    image_size: int | None,
    seed: int,
) -> tuple[Path, dict[str, float]]:
    """Warm-start the model in ``base_model_dir``; return ``(model_dir, metrics)``.

    Reuses ``out_root/<key>`` when it is complete and ``cfg.cache`` is true; otherwise trains and
    writes it (to a temporary directory renamed into place, stamp written last).

    Raises:
        ValueError: no training records.
    """
    if not train_records:
        raise ValueError("the warm start needs training records")
    base_model_dir = Path(base_model_dir)
    key = warm_start_key(base_model_dir, cfg, template, image_size or 0, seed)
    out = Path(out_root) / key
    with exclusive_lock(Path(out_root) / f".{key}.lock"):
        if cfg.cache and (out / _STAMP).exists():
            metrics = json.loads((out / _STAMP).read_text())["metrics"]
            logger.info("warm start: reusing %s", out)
            return out, {**metrics, "warm_start/cached": 1.0}
        metrics = _train_and_save(base_model_dir, out, key, train_records, cfg, template=template,
                                  image_size=image_size, seed=seed)
    return out, metrics


def _train_and_save(
    base_model_dir: Path, out: Path, key: str, train_records: Sequence[Record], cfg: WarmStartConfig,
    *, template: str, image_size: int | None, seed: int,
) -> dict[str, float]:
    """Train the warm start (module docstring) and write it to ``out``; returns its metrics."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    from fastrl.models.tiny import load_processor

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(WARM_START_THREADS)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    processor = load_processor(base_model_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(base_model_dir, dtype=torch.float32)
    model.train()
    hidden = AutoConfig.from_pretrained(base_model_dir).text_config.hidden_size
    heads = _AttributeHeads(hidden)
    labels = image_labels(train_records)
    by_image: dict[str, Record] = {}
    for r in train_records:
        by_image.setdefault(r.metadata.get("image_id", str(r.question_id)), r)
    image_records = list(by_image.values())
    prompt_cache: dict[int, object] = {}

    def prompt_of(r: Record):
        if r.question_id not in prompt_cache:
            prompt_cache[r.question_id] = record_prompt(
                r, template=template, tokenizer=processor.tokenizer, image_size=image_size
            )
        return prompt_cache[r.question_id]

    def sample(pool: Sequence[Record]) -> list[Record]:
        idx = torch.randint(len(pool), (cfg.batch_size,), generator=generator).tolist()
        return [pool[i] for i in idx]

    def label_of(r: Record) -> ImageLabels:
        return labels.get(r.metadata.get("image_id", ""), ImageLabels())

    metrics: dict[str, float] = {}
    # 1. vision warm-up: vision tower + merger + heads
    vision_params = list(model.model.visual.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(vision_params, lr=cfg.lr)
    for _ in range(cfg.vision_warmup_steps):
        batch = sample(image_records)
        prompts = [prompt_of(r) for r in batch]
        pix = processor.image_processor(images=[im for p in prompts for im in p.images], return_tensors="pt")
        embeds = model.model.get_image_features(pix["pixel_values"], pix["image_grid_thw"])
        loss, acc = heads.loss(embeds, [label_of(r) for r in batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        metrics["warm_start/vision_loss"], metrics["warm_start/vision_color_acc"] = loss.item(), acc
    metrics["warm_start/vision_seconds"] = time.perf_counter() - start
    # 2. SFT with the attribute loss kept on
    opt = torch.optim.AdamW(list(model.parameters()) + list(heads.parameters()), lr=cfg.lr)
    for _ in range(cfg.sft_steps):
        batch = sample(train_records)
        prompts = [prompt_of(r) for r in batch]
        targets = [sft_target(r, label_of(r)) for r in batch]
        inputs = _batch_inputs(processor, prompts, targets)
        target_lens = [len(processor.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in targets]
        ids = inputs["input_ids"]
        label_ids = torch.full_like(ids, -100)
        for b, n in enumerate(target_lens):  # left-padded: the target is the tail of each row
            label_ids[b, -n:] = ids[b, -n:]
        lm = model(**inputs, labels=label_ids)
        embeds = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
        aux, acc = heads.loss(embeds, [label_of(r) for r in batch])
        loss = lm.loss + cfg.aux_loss_weight * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        metrics["warm_start/sft_loss"], metrics["warm_start/sft_color_acc"] = lm.loss.item(), acc
    metrics["warm_start/seconds"] = time.perf_counter() - start
    torch.set_num_threads(previous_threads)

    tmp = out.with_name(f".tmp-{out.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(base_model_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", _STAMP))
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / _STAMP).write_text(json.dumps({"key": key, "metrics": metrics}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    logger.info("warm start: %.1f s, written to %s", metrics["warm_start/seconds"], out)
    return metrics
