"""In-process rollout engine on a Hugging Face model: the default engine of the CPU recipes.

Batched sampling with a KV cache: the distinct prompts are prefilled once (left-padded, images
encoded once per prompt), the cache is then expanded to ``n_i`` rows per prompt, and rows leave the
batch as soon as they emit a stop token. Works for Qwen2.5-VL (multimodal RoPE positions from the
model's ``get_rope_index``) and for text-only causal LMs (Qwen2, Llama).

Threads: by default the engine uses the process's torch intra-op thread count, which the trainer
sets from ``trainer.torch_threads`` -- one knob for training and sampling. Measured on a 2-core
machine (bench/rollout_bench.py; 32 prompts x 4-8 responses x 24-32 tokens, tiny Qwen2.5-VL with
images): under light load (load average ~3 on the 2 cores) two threads sampled ~1.6x faster than
one (4,400 vs 2,600 tokens/s), as earlier measurements on an idle machine found; when other jobs
kept the cores busy (load average 6-8), two threads collapsed to ~300 tokens/s against ~2,500
with one. Use ``trainer.torch_threads=1`` (or ``torch_threads=1``
here) on shared machines.

Placement: the trainer builds each rank's engine on that rank's device (``device``: its
``cuda:<LOCAL_RANK>`` under NCCL, the CPU otherwise); prompts are processed on the CPU and moved
there, the sampling stream lives there. Images are resized into ``data.min_pixels`` /
``data.max_pixels`` (:func:`fastrl.data.images.set_pixel_bounds` on the directory's processor), and
the prompt inputs the trainer trains on come from this same processor.

``sleep()`` / ``wake()`` are no-ops: on CPU there is no accelerator memory to hand back to the
trainer (host memory is shared by both anyway).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from fastrl.config import RolloutConfig
from fastrl.rollout.engine import (
    FinishReason,
    PromptInputs,
    RolloutPrompt,
    Rollouts,
    SamplingParams,
    assemble_rollouts,
    check_weight_version,
    normalize_group_sizes,
)

# Vision token names, never sampled (looked up in the tokenizer when present).
_VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
_VISION_CONFIG_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


# --------------------------------------------------------------------------------------------
# Prompt preparation and batching (shared with the teacher-forced log-probs)
# --------------------------------------------------------------------------------------------


def prepare_prompt_inputs(processor: Any, prompt: RolloutPrompt) -> PromptInputs:
    """Tokenize one prompt with the model's processor (images expanded into image tokens).

    ``processor`` is a multimodal processor (``processor(text=, images=)``) or a plain tokenizer
    for text-only models.

    Raises:
        ValueError: the prompt has images but ``processor`` cannot process images.
    """
    if hasattr(processor, "image_processor"):
        images = list(prompt.images) if prompt.images else None
        out = processor(text=[prompt.text], images=images, return_tensors="pt")
        return PromptInputs(
            input_ids=out["input_ids"][0].long(),
            pixel_values=out.get("pixel_values"),
            image_grid_thw=out.get("image_grid_thw"),
        )
    if prompt.images:
        raise ValueError(
            f"prompt has {len(prompt.images)} image(s) but the model's processor "
            f"({type(processor).__name__}) is a text tokenizer"
        )
    out = processor(prompt.text, return_tensors="pt", add_special_tokens=False)
    return PromptInputs(input_ids=out["input_ids"][0].long())


def collate_left_padded(rows: Sequence[torch.Tensor], inputs: Sequence[PromptInputs], pad_token_id: int) -> dict[str, Any]:
    """Left-pad token rows into a batch; concatenate the pixels of the prompts they come from.

    Args:
        rows: int64 [L_i] token ids, one per batch row (a prompt, or a prompt + response).
        inputs: the prompt of each row (its pixels and image grids are used in row order).

    Returns:
        ``input_ids`` int64 [B, Lmax], ``attention_mask`` int64 [B, Lmax] and, when any row has
        images, ``pixel_values`` and ``image_grid_thw``.
    """
    longest = max(int(r.numel()) for r in rows)
    ids = torch.full((len(rows), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, longest - row.numel():] = row
        mask[b, longest - row.numel():] = 1
    batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    pixels = [p.pixel_values for p in inputs if p.pixel_values is not None]
    if pixels:
        batch["pixel_values"] = torch.cat(pixels)
        batch["image_grid_thw"] = torch.cat([p.image_grid_thw for p in inputs if p.image_grid_thw is not None])
    return batch


def _is_multimodal_rope(model: torch.nn.Module) -> bool:
    return hasattr(getattr(model, "model", None), "get_rope_index")


def position_ids_and_deltas(model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position ids of a left-padded batch, and the per-row offset for later tokens.

    A token appended at absolute column ``c`` (0-based, padding included) has position
    ``c + delta[b]`` in every rotary section.

    Returns:
        ``position_ids`` int64 [3, B, L] for multimodal RoPE (Qwen2-VL / Qwen2.5-VL) or [B, L],
        and ``delta`` int64 [B].
    """
    mask = batch["attention_mask"]
    length = mask.shape[1]
    if _is_multimodal_rope(model):
        positions, deltas = model.model.get_rope_index(
            batch["input_ids"], batch.get("image_grid_thw"), None, None, mask
        )
        return positions, deltas.view(-1).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return positions, mask.sum(-1) - length


def _decode_positions(model: torch.nn.Module, column: int, deltas: torch.Tensor) -> torch.Tensor:
    pos = (column + deltas).view(-1, 1)
    return pos.unsqueeze(0).expand(3, -1, -1) if _is_multimodal_rope(model) else pos


def suppressed_token_ids(
    config: Any, tokenizer: Any, *, special_tokens: bool = True, stop_token_ids: Sequence[int] = ()
) -> list[int]:
    """Token ids that sampling never produces.

    Vision tokens (image/video placeholders, vision start/end/pad) always: a response holding one
    cannot be scored, since the policy's forward pass pairs every image placeholder with image
    features ("Image features and image tokens do not match"). With ``special_tokens``
    (``rollout.suppress_special_tokens``, the default) also the bos, pad and unk tokens. The ids of
    the padded model vocabulary that the tokenizer does not have (``len(tokenizer) <= id <
    vocab_size``) always: they are no token (nothing to decode), and the vLLM engine, whose allowed
    set is the tokenizer's ids, cannot sample them either. A stop token that is also in this set (Qwen's
    ``<|endoftext|>`` is pad and eos) is never sampled; responses then end with the chat
    end-of-turn token, another of ``stop_token_ids``. When every one of ``stop_token_ids`` is a
    bos / pad / unk token (SmolLM2's ``<|im_end|>`` is its end of turn, eos and pad), they all stay
    samplable: suppressing them would leave no way to end a response, and every response would run
    to the length limit.

    Args:
        stop_token_ids: the tokens that end a response (:func:`default_stop_token_ids`).

    Raises:
        ValueError: every one of ``stop_token_ids`` is a vision or padded-vocabulary token.
    """
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    ids: set[int] = set()
    for name in _VISION_CONFIG_IDS:
        value = getattr(config, name, None)
        if value is not None:
            ids.add(int(value))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in _VISION_TOKENS if t in vocab)
    ids.update(range(len(tokenizer), text_config.vocab_size))
    stop = {int(t) for t in stop_token_ids}
    if stop and stop <= ids:
        raise ValueError(
            f"every stop token {sorted(stop)} is a vision or padded-vocabulary token, which sampling never "
            f"produces: no response could end. Check the model's generation_config.json eos_token_id")
    special: set[int] = set()
    if special_tokens:
        for value in (
            getattr(text_config, "bos_token_id", None), getattr(text_config, "pad_token_id", None),
            tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id,
        ):
            if isinstance(value, int):
                special.add(value)
        if stop and stop <= ids | special:
            special -= stop  # the only ways to end a response stay samplable
    return sorted(i for i in ids | special if 0 <= i < text_config.vocab_size)


def default_stop_token_ids(model_dir: str | Path, config: Any) -> tuple[int, ...]:
    """The tokens that end a response when a request names none: the model directory's
    ``generation_config.json`` ``eos_token_id`` (an int or a list), else the text config's
    ``eos_token_id`` -- the rule vLLM applies (``ModelConfig.try_get_generation_config``) to a local
    model directory, which is what the engines are given (a hub id is not read here).

    Raises:
        ValueError: neither names an end-of-sequence token.
    """
    path = Path(model_dir) / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    return stop_token_ids_of(eos, config, where=str(model_dir))


def stop_token_ids_of(generation_eos: int | Sequence[int] | None, config: Any, *, where: str) -> tuple[int, ...]:
    """``generation_eos`` (a generation config's ``eos_token_id``) as a tuple of ids, else the text
    config's ``eos_token_id``: the one rule both engines use (:func:`default_stop_token_ids`).

    Raises:
        ValueError: neither names an end-of-sequence token (``where`` names the model in the message).
    """
    eos = generation_eos if generation_eos is not None else config.get_text_config().eos_token_id
    if eos is None:
        raise ValueError(f"{where}: neither generation_config.json nor config.json names an eos_token_id; "
                         f"add one, or the engine cannot end a response")
    return tuple(int(t) for t in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def sample_tokens(
    logits: torch.Tensor, sampling: SamplingParams, suppress: torch.Tensor | None, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row, and its log-prob under ``softmax(logits / T)``.

    Args:
        logits: float32 [B, V] next-token logits.
        suppress: bool [V] tokens never sampled, or None.
        generator: the random stream (CPU ``torch.Generator``).

    Returns:
        ``(tokens int64 [B], logprobs float32 [B])``; the log-probs are over the full vocabulary,
        before truncation (top-k, top-p) and suppression (see :mod:`fastrl.rollout.engine`).
    """
    scaled = logits.float() / sampling.logprob_temperature
    full = torch.log_softmax(scaled, dim=-1)
    masked = scaled if suppress is None else scaled.masked_fill(suppress, float("-inf"))
    if sampling.temperature == 0:
        tokens = masked.argmax(dim=-1)
    else:
        if sampling.top_k > 0 and sampling.top_k < masked.shape[-1]:
            kth = torch.topk(masked, sampling.top_k, dim=-1).values[:, -1:]
            masked = masked.masked_fill(masked < kth, float("-inf"))
        if sampling.top_p < 1.0:
            sorted_logits, order = torch.sort(masked, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the tokens ranked above it already reach top_p (the first is kept)
            drop_sorted = (probs.cumsum(dim=-1) - probs) >= sampling.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            masked = masked.masked_fill(drop, float("-inf"))
        probs = torch.softmax(masked, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, full.gather(1, tokens.unsqueeze(1)).squeeze(1)


@contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


class HFRolloutEngine:
    """Rollout engine on an in-process Hugging Face model (see the module docstring).

    Args:
        model: a ``Qwen2_5_VLForConditionalGeneration`` or a causal LM (put in eval mode).
        processor: its processor (multimodal) or tokenizer (text-only).
        seed: seed of the engine's random stream (used when ``SamplingParams.seed`` is None).
        suppress_special_tokens: also never sample the special tokens of :func:`suppressed_token_ids`
            (vision tokens are never sampled).
        torch_threads: intra-op threads while generating (None: the process setting); see the
            module docstring for measurements.
        max_num_seqs: most rows decoded at once; larger requests run in consecutive chunks of
            whole prompts.
        device: where the model runs and samples (the trainer passes its rank's device, e.g.
            ``cuda:<LOCAL_RANK>``); None keeps the model where it is (the CPU for the CPU recipes).
            Sampling streams live on that device, so CPU and GPU draws differ for equal seeds.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        *,
        seed: int = 0,
        suppress_special_tokens: bool = True,
        torch_threads: int | None = None,
        max_num_seqs: int = 256,
        device: torch.device | str | None = None,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if device is not None:
            model = model.to(torch.device(device))
        first = next(model.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.torch_threads = torch_threads
        self.max_num_seqs = max_num_seqs
        self._generator = self._new_generator(seed)
        config = model.config
        vocab_size = config.get_text_config().vocab_size
        self.default_stop_token_ids = stop_token_ids_of(
            getattr(getattr(model, "generation_config", None), "eos_token_id", None), config,
            where=str(getattr(config, "_name_or_path", "") or "the model"))
        self.suppressed_ids = suppressed_token_ids(
            config, self.tokenizer, special_tokens=suppress_special_tokens, stop_token_ids=self.default_stop_token_ids)
        self._suppress = torch.zeros(vocab_size, dtype=torch.bool)
        self._suppress[self.suppressed_ids] = True
        self._suppress = self._suppress.to(self.device)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.default_stop_token_ids[0])
        # Hugging Face on-disk names -> this model's parameter names (transformers >= 4.52 nests
        # Qwen2.5-VL as model.language_model.* / model.visual.*).
        self._name_mapping: dict[str, str] = dict(getattr(type(model), "_checkpoint_conversion_mapping", {}) or {})
        self._params = dict(model.named_parameters(remove_duplicate=False))
        self._params.update(dict(model.named_buffers(remove_duplicate=False)))
        self.weight_version = 0
        self.refit_metrics: dict[str, float] = {}  # an in-process copy: nothing to measure
        self.verify_every, self.verify_tolerance = 0, 0.0  # never verified (verify_due)

    #: The trainer's weight export goes to the CPU (``update_weights`` copies each tensor in).
    export_to_cpu = True
    #: In-process refits share the trainer's process and numerics: never verified.
    verify_due = False

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        rollout: RolloutConfig,
        *,
        torch_threads: int | None = None,
        max_num_seqs: int = 256,
        device: torch.device | str | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> "HFRolloutEngine":
        """Load a Hugging Face model directory (Qwen2.5-VL or a text-only causal LM) in float32,
        on ``device`` (default: the CPU).

        ``min_pixels`` / ``max_pixels`` (``data.min_pixels`` / ``data.max_pixels``) replace the
        directory's image-processor bounds, so that the trainer's images (the prompt inputs this
        engine returns) are resized as the run's config says, whatever the checkpoint ships.
        """
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        config = AutoConfig.from_pretrained(path)
        if hasattr(config, "vision_config"):
            from fastrl.data.images import set_pixel_bounds
            from fastrl.models.tiny import load_processor

            model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
            processor = load_processor(path)
            set_pixel_bounds(processor.image_processor, min_pixels, max_pixels)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            processor = AutoTokenizer.from_pretrained(path)
        return cls(
            model, processor, seed=rollout.seed, suppress_special_tokens=rollout.suppress_special_tokens,
            torch_threads=torch_threads, max_num_seqs=max_num_seqs, device=device,
        )

    def _new_generator(self, seed: int) -> torch.Generator:
        """A random stream on the engine's device (``torch.multinomial`` needs one there)."""
        if self.device.type == "cpu":
            return torch.Generator().manual_seed(seed)
        return torch.Generator(device=self.device).manual_seed(seed)

    # ---- RolloutEngine -------------------------------------------------------------------

    def sleep(self) -> None:
        """No-op on CPU: there is no accelerator memory to release."""

    def wake(self) -> None:
        """No-op on CPU (see :meth:`sleep`)."""

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[RolloutPrompt], n_per_prompt: int | Sequence[int], sampling: SamplingParams,
        *, weight_version: int | None = None,
    ) -> Rollouts:
        """Sample responses (see :class:`fastrl.rollout.engine.RolloutEngine`).

        Raises:
            ValueError: bad group sizes, or a prompt with images for a text-only model.
            StaleWeightsError: ``weight_version`` is ahead of :attr:`weight_version` (a lost refit).
        """
        check_weight_version("the Hugging Face rollout engine", self.weight_version, weight_version)
        sizes = normalize_group_sizes(len(prompts), n_per_prompt)
        generator = self._new_generator(sampling.seed) if sampling.seed is not None else self._generator
        stop_ids = sampling.stop_token_ids if sampling.stop_token_ids is not None else self.default_stop_token_ids
        start = time.perf_counter()
        with _threads(self.torch_threads):
            inputs = [prepare_prompt_inputs(self.processor, p) for p in prompts]
            tokens: list[list[int]] = [[] for _ in range(sum(sizes))]
            logprobs: list[list[float]] = [[] for _ in range(sum(sizes))]
            finish: list[FinishReason] = ["length"] * sum(sizes)
            first_row = [0]
            for n in sizes:
                first_row.append(first_row[-1] + n)
            for chunk in self._chunks(sizes):
                self._generate_chunk(
                    [inputs[i] for i in chunk], [sizes[i] for i in chunk], [first_row[i] for i in chunk],
                    sampling, stop_ids, generator, tokens, logprobs, finish,
                )
        elapsed = time.perf_counter() - start
        return assemble_rollouts(
            prompts, inputs, sizes, [torch.tensor(t, dtype=torch.long) for t in tokens],
            [torch.tensor(lp, dtype=torch.float32) for lp in logprobs], finish, self.tokenizer, elapsed,
        )

    def _chunks(self, sizes: list[int]) -> list[list[int]]:
        chunks: list[list[int]] = [[]]
        rows = 0
        for i, n in enumerate(sizes):
            if n == 0:
                continue
            if chunks[-1] and rows + n > self.max_num_seqs:
                chunks.append([])
                rows = 0
            chunks[-1].append(i)
            rows += n
        return [c for c in chunks if c]

    def _generate_chunk(
        self,
        inputs: list[PromptInputs],
        sizes: list[int],
        first_rows: list[int],
        sampling: SamplingParams,
        stop_ids: tuple[int, ...],
        generator: torch.Generator,
        out_tokens: list[list[int]],
        out_logprobs: list[list[float]],
        out_finish: list[FinishReason],
    ) -> None:
        from transformers import DynamicCache

        model, device = self.model, self.device
        batch = collate_left_padded([p.input_ids for p in inputs], inputs, self.pad_token_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        positions, deltas = position_ids_and_deltas(model, batch)
        length = batch["input_ids"].shape[1]
        cache = DynamicCache()
        out = model(
            **batch, position_ids=positions, past_key_values=cache, use_cache=True,
            cache_position=torch.arange(length, device=device), logits_to_keep=1,
        )
        # one row per response: prompt i's cache row repeated n_i times
        expand = torch.repeat_interleave(torch.arange(len(inputs)), torch.tensor(sizes)).to(device)
        cache.batch_select_indices(expand)
        mask = batch["attention_mask"][expand]
        deltas = deltas.to(device)[expand]
        logits = out.logits[expand, -1, :]
        rows = torch.cat([torch.arange(f, f + n) for f, n in zip(first_rows, sizes)])  # on the CPU
        stop = torch.tensor(stop_ids, dtype=torch.long, device=device)
        suppress = self._suppress if self.suppressed_ids else None
        for step in range(sampling.max_tokens):
            next_tokens, next_logprobs = sample_tokens(logits, sampling, suppress, generator)
            for r, t, lp in zip(rows.tolist(), next_tokens.tolist(), next_logprobs.tolist()):
                out_tokens[r].append(t)
                out_logprobs[r].append(lp)
            stopped = torch.isin(next_tokens, stop)
            stopped_cpu = stopped.cpu()
            for r in rows[stopped_cpu].tolist():
                out_finish[r] = "stop"
            if step + 1 == sampling.max_tokens or bool(stopped_cpu.all()):
                break
            if bool(stopped_cpu.any()):
                keep = torch.nonzero(~stopped).view(-1)
                cache.batch_select_indices(keep)
                mask, deltas, next_tokens = mask[keep], deltas[keep], next_tokens[keep]
                rows = rows[~stopped_cpu]
            mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=device)], dim=1)
            column = mask.shape[1] - 1
            out = model(
                input_ids=next_tokens.unsqueeze(1), attention_mask=mask,
                position_ids=_decode_positions(model, column, deltas), past_key_values=cache,
                use_cache=True, cache_position=torch.tensor([column], device=device),
            )
            logits = out.logits[:, -1, :]

    # ---- weight refit ----------------------------------------------------------------------

    def parameter_name(self, hf_name: str) -> str:
        """This model's parameter name for a Hugging Face checkpoint name (e.g. ``model.layers.0.mlp.up_proj.weight``
        -> ``model.language_model.layers.0.mlp.up_proj.weight`` for Qwen2.5-VL on transformers >= 4.52)."""
        if hf_name in self._params:
            return hf_name
        for pattern, replacement in self._name_mapping.items():
            renamed, count = re.subn(pattern, replacement, hf_name)
            if count:
                return renamed
        return hf_name

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy weights in place, one tensor at a time (see ``RolloutEngine.update_weights``).

        Tensors are cast to the parameter's dtype; nothing else in the model changes.

        Raises:
            KeyError: a name that is neither a Hugging Face checkpoint name of this model nor one
                of its parameter names.
            ValueError: a tensor whose shape differs from the parameter's.
        """
        count = 0
        for name, tensor in named_tensors:
            target_name = self.parameter_name(name)
            target = self._params.get(target_name)
            if target is None:
                known = ", ".join(sorted(self._params)[:4])
                raise KeyError(f"update_weights: unknown weight {name!r} (as {target_name!r}); known names look like: {known}, ...")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"update_weights: {name!r} has shape {tuple(tensor.shape)}, the model's "
                    f"{target_name!r} has {tuple(target.shape)}"
                )
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
            count += 1
        self.weight_version += 1
        return count


# --------------------------------------------------------------------------------------------
# Teacher-forced log-probs (engine/trainer mismatch checks)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def teacher_forced_logprobs(
    model: torch.nn.Module,
    prompt_inputs: Sequence[PromptInputs],
    responses: Sequence[torch.Tensor],
    *,
    pad_token_id: int,
    temperature: float = 1.0,
    batch_size: int = 64,
) -> list[torch.Tensor]:
    """Log-probs of given responses under a Hugging Face model, in one forward per batch.

    Args:
        model: Qwen2.5-VL or a causal LM.
        prompt_inputs: per response, its prompt (``Rollouts.prompt_inputs[prompt_index[r]]``).
        responses: per response, int64 [length_r] token ids.
        pad_token_id: padding id (masked out).
        temperature: ``log softmax(logits / temperature)``; must be > 0.
        batch_size: rows per forward.

    Returns:
        Per response, float32 [length_r].

    Raises:
        ValueError: ``temperature <= 0`` or lengths of the two lists differ.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if len(prompt_inputs) != len(responses):
        raise ValueError(f"{len(prompt_inputs)} prompts for {len(responses)} responses")
    out: list[torch.Tensor] = []
    for begin in range(0, len(responses), batch_size):
        prompts = list(prompt_inputs[begin:begin + batch_size])
        resp = [r.long().view(-1) for r in responses[begin:begin + batch_size]]
        rows = [torch.cat([p.input_ids, r]) for p, r in zip(prompts, resp)]
        batch = collate_left_padded(rows, prompts, pad_token_id)
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        positions, _ = position_ids_and_deltas(model, batch)
        logits = model(**batch, position_ids=positions, use_cache=False).logits.float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        length = batch["input_ids"].shape[1]
        for b, r in enumerate(resp):
            n = r.numel()
            if n == 0:
                out.append(torch.zeros(0))
                continue
            # the token at column c is predicted by the logits at column c - 1
            cols = torch.arange(length - n - 1, length - 1, device=device)
            out.append(logp[b, cols].gather(1, r.view(-1, 1).to(device)).view(-1).cpu())
    return out
