"""The trainer's client of a vLLM engine running as its own process (``rollout.engine='vllm'``):
:class:`EngineProcessClient` implements the :class:`fastrl.rollout.engine.RolloutEngine` protocol
with requests to :mod:`fastrl.rollout.engine_server` (operations: :mod:`fastrl.rollout.engine_wire`).

The child process itself -- start-up, deadlines, death detection, shutdown -- is
:class:`fastrl.rollout.engine_process.EngineProcess`, this client's base; the refit verification's
numbers are :mod:`fastrl.rollout.refit_checks`; :func:`fastrl.rollout.engine_factory.engine_client_from_config`
builds a client from a run's configuration.

Restarts: ``restart_retries`` lets one :meth:`EngineProcessClient.generate` call restart the engine
(the current weights are replayed from the refit's shared-memory buckets) and retry; an engine that
dies during a refit is restarted once the refit's buckets are written, and replays them
(:meth:`EngineProcessClient._transfer`).

This is the only vLLM engine: the prompt builder (:meth:`EngineProcessClient._prompt_inputs`), the
sampling parameters (built by the server from the request) and the result assembly
(:func:`fastrl.rollout.engine.assemble_rollouts`) exist once.

Sampling: one vLLM request per prompt with ``n = n_per_prompt[i]`` (prompts with ``n = 0`` are not
sent), temperature / top-p / top-k / max tokens / stop tokens, the sampled token's log-prob, token
suppression (the few ids of :func:`fastrl.rollout.hf_engine.suppressed_token_ids`, sent once at
start-up; the server masks them with a ``logit_bias`` of -inf,
:func:`fastrl.rollout.engine_process.check_suppression_size`), one seed per prompt drawn here. The
engine's log-probs follow the rollouts' sampling temperature ``T`` (``sampling_temperature``, fixed
when the engine starts, since vLLM's ``logprobs_mode`` is an engine setting):

* ``T = 1``: ``logprobs_mode="raw_logprobs"``, ``log softmax(logits)`` before truncation and
  suppression -- the project's definition (:mod:`fastrl.rollout.engine`).
* ``T`` other than 0 and 1: ``logprobs_mode="processed_logprobs"``, ``log softmax(logits / T)`` after
  vLLM's logits processors, whose -inf ``logit_bias`` on the suppressed ids makes it a softmax over
  the tokens sampling may produce. That differs from the project's full-vocabulary definition by
  ``-log(1 - q)``, ``q`` the tempered probability of the suppressed tokens (about 0 for a model that
  does not emit them; ``mismatch/*`` measures it). top-k / top-p would truncate it too: with such a
  temperature they are refused (here and by ``RolloutConfig``).

A call may sample greedily (validation) or at the engine's ``T``; any other temperature is refused.

Images: ``min_pixels`` / ``max_pixels`` (``data.*``) go to the engine's processor
(``mm_processor_kwargs`` of ``vllm.LLM``, :func:`with_pixel_bounds`) and to the Hugging Face
processor that builds the trainer's prompt inputs here, so both sides see the same image tokens.

Refit (:meth:`EngineProcessClient.update_weights`): the transport is chosen by the rank's device
(:func:`fastrl.rollout.refit_transport.transport_for_device`): shared-memory buckets on CPU, CUDA
IPC for an engine on the trainer's GPU (one handle per engine worker); metrics ``refit/bytes``,
``refit/time_s``, ``refit/mb_per_s`` in ``refit_metrics``.
Refit verification: :meth:`EngineProcessClient.score` (the engine's log-probs of given token
sequences, vLLM ``prompt_logprobs``) and :meth:`EngineProcessClient.group_sums` (per parameter
group, the engine's sum of squared weights), used by :mod:`fastrl.training.refit_verify`.

Weight versions: ``weight_version`` counts the refits this client sent; after a refit's last
bucket was loaded the client tells the engine its new version (``set_weight_version``), and every
:meth:`EngineProcessClient.generate` request carries the trainer's policy version, which the engine
refuses when its own is behind (:class:`fastrl.rollout.engine.StaleWeightsError`, not retried).
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from fastrl.rollout import engine_wire as wire
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
from fastrl.rollout.engine_process import EngineError, EngineProcess, check_suppression_size
from fastrl.rollout.refit_checks import group_square_sums, square_sum, verify_due_at
from fastrl.rollout.refit_transport import make_transport

logger = logging.getLogger("fastrl.rollout")


class EngineProcessClient(EngineProcess):
    """A vLLM engine in a child process (see the module docstring).

    Args:
        model_path: Hugging Face model directory (the engine's initial weights).
        python: the engine environment's interpreter.
        seed: engine seed; per-prompt request seeds are drawn from it when a call has no seed.
        suppress_special_tokens: never sample bos, pad, unk or padded-vocabulary tokens (vision tokens
            are never sampled).
        timeout_s: longest wait for any reply after start-up.
        startup_timeout_s: longest wait for the engine to start (vLLM import and model load).
        restart_retries: engine restarts one :meth:`generate` call may use; with >= 1 a refit
            during which the engine dies restarts it once and replays the refit (:meth:`_transfer`).
        bucket_bytes: refit bucket size.
        skip_after_first: names that never change after the first refit (frozen vision tower).
        name: the engine's name in messages.
        log_path: the engine's stdout/stderr file (default: a temporary file).
        verify_every / verify_tolerance: refit verification schedule and bound (:attr:`verify_due`,
            :mod:`fastrl.training.refit_verify`).
        transport: ``"shm"`` (shared-memory buckets; CPU) or ``"cuda_ipc"`` (colocated GPU engine),
            :mod:`fastrl.rollout.refit_transport`; :func:`~fastrl.rollout.engine_factory.engine_client_from_config`
            picks it by device.
        min_pixels / max_pixels: image-processor bounds of both the engine's processor and the one
            building the trainer's prompt inputs (None: the model directory's).
        sampling_temperature: the temperature of the training rollouts (``rollout.temperature``;
            0 is taken as 1): the log-probs' temperature (module docstring).
        llm_kwargs: ``vllm.LLM`` arguments (``dtype``, ``max_model_len``, ``kv_cache_memory_bytes``,
            ``enforce_eager``, ``tensor_parallel_size``, ``gpu_memory_utilization``, ``enable_sleep_mode``...).
        env: extra environment variables of the child (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``).

    Raises:
        EngineStartError: see :class:`~fastrl.rollout.engine_process.EngineProcess` and
            :func:`~fastrl.rollout.engine_process.check_suppression_size`.
        ValueError: ``sampling_temperature < 0``.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        python: str | os.PathLike,
        seed: int = 0,
        suppress_special_tokens: bool = True,
        timeout_s: float = 600.0,
        startup_timeout_s: float = 600.0,
        restart_retries: int = 0,
        bucket_bytes: int = 64 * 2**20,
        skip_after_first: Callable[[str], bool] | None = None,
        name: str = "vllm engine",
        log_path: str | os.PathLike | None = None,
        llm_kwargs: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        verify_every: int = 0,
        verify_tolerance: float = 1e-3,
        transport: str = "shm",
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        sampling_temperature: float = 1.0,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        from fastrl.models.tiny import TOKENIZER_SUBDIR
        from fastrl.rollout.hf_engine import default_stop_token_ids, suppressed_token_ids

        super().__init__(python, name=name, timeout_s=timeout_s, startup_timeout_s=startup_timeout_s, env=env)
        self.model_path = Path(model_path)
        subdir = self.model_path / TOKENIZER_SUBDIR
        tokenizer_dir = subdir if (subdir / "tokenizer.json").is_file() else self.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = AutoConfig.from_pretrained(self.model_path)
        stop = default_stop_token_ids(self.model_path, config)
        self.suppressed_ids = suppressed_token_ids(config, self.tokenizer, special_tokens=suppress_special_tokens,
                                                   stop_token_ids=stop)
        check_suppression_size(self.suppressed_ids, self.model_path)
        self.restart_retries = int(restart_retries)
        self._generator = torch.Generator().manual_seed(seed)
        self._processor = None
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        if sampling_temperature < 0:
            raise ValueError(f"sampling_temperature must be >= 0, got {sampling_temperature}")
        self.sampling_temperature = float(sampling_temperature) if sampling_temperature > 0 else 1.0
        llm_kwargs = dict(llm_kwargs or {})
        if hasattr(config, "vision_config"):  # text-only models have no image processor
            llm_kwargs = with_pixel_bounds(llm_kwargs, min_pixels, max_pixels)
        spec = {
            "model": str(self.model_path), "tokenizer": str(tokenizer_dir), "seed": int(seed),
            "suppressed_token_ids": list(self.suppressed_ids), "stop_token_ids": list(stop), "llm_kwargs": llm_kwargs,
            "logprobs_mode": "raw_logprobs" if self.sampling_temperature == 1.0 else "processed_logprobs",
        }
        self.transport = make_transport(
            transport, bucket_bytes, skip_after_first=skip_after_first,
            consumers=int(llm_kwargs.get("tensor_parallel_size") or 1),  # each engine worker opens its own IPC handle
        )
        self.weight_version = 0
        self.verify_every = int(verify_every)
        self.verify_tolerance = float(verify_tolerance)
        self.refit_metrics: dict[str, float] = {}
        self.last_group_sums: dict[str, float] = {}
        self._launch(spec, log_path)  # a failed start closes the transport (_release) and raises
        stop = self.info["default_stop_token_ids"]
        self.default_stop_token_ids: tuple[int, ...] = tuple(int(t) for t in stop)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.default_stop_token_ids[0])

    def _release(self) -> None:
        """The refit files (shared-memory buckets) go with the engine."""
        self.transport.close()

    # ---- restart and health ----------------------------------------------------------------

    def restart(self, version: int | None = None) -> None:
        """Kill and start the engine again, then replay the current weights (refit buckets) and
        give the engine their weight version (``version``, default :attr:`weight_version`; a
        refit interrupted by the engine's death passes its own, its buckets being written).

        Raises:
            EngineError: the CUDA IPC transport after a refit (it keeps no copy of the weights).
        """
        version = self.weight_version if version is None else int(version)
        if not self.transport.replayable and version > 0:
            raise EngineError(f"{self.name}: cannot restart: the CUDA IPC refit keeps no copy of the current weights")
        self._kill()
        self._start()
        replay = self.transport.replay_requests()
        for request in replay:
            self._call(request)
        if replay:
            self._call({"op": "set_weight_version", "version": version})

    def health(self) -> dict:
        """The engine's pid and loaded weight version (raises :class:`EngineError` when it is dead or hung)."""
        return self._call({"op": "health"})

    def loaded_weight_version(self) -> int:
        """The weight version the engine process says it has loaded (its ``set_weight_version``
        count; :attr:`weight_version` is what this client sent)."""
        return int(self.health()["weight_version"])

    # ---- RolloutEngine ---------------------------------------------------------------------

    def sleep(self) -> None:
        """vLLM sleep level 2 (weights and KV cache discarded; the next refit reloads the weights)
        when the engine was built with ``enable_sleep_mode`` (GPU); else a no-op."""
        self._call({"op": "sleep"})

    def wake(self) -> None:
        self._call({"op": "wake"})

    def reset_prefix_cache(self) -> None:
        self._call({"op": "reset_prefix_cache"})

    def generate(
        self, prompts: Sequence[RolloutPrompt], n_per_prompt: int | Sequence[int], sampling: SamplingParams,
        *, weight_version: int | None = None,
    ) -> Rollouts:
        """Sample responses (see :class:`fastrl.rollout.engine.RolloutEngine`): greedily, or at the
        engine's ``sampling_temperature`` (module docstring). ``weight_version`` goes
        with the request: the engine process refuses it (:class:`StaleWeightsError`) when the weights
        it has loaded (``set_weight_version`` after each refit) are older.

        Raises:
            ValueError: a temperature other than 0 and the engine's; top-k / top-p at a temperature
                other than 0 and 1.
        """
        check_weight_version(self.name, self.weight_version, weight_version)  # refits this client never sent
        sizes = normalize_group_sizes(len(prompts), n_per_prompt)
        if sampling.temperature not in (0.0, self.sampling_temperature):
            raise ValueError(
                f"{self.name} reports log-probs at temperature {self.sampling_temperature} (set when it "
                f"started); temperature={sampling.temperature} would make engine and trainer log-probs "
                f"disagree. Sample at {self.sampling_temperature} or greedily, or start the engine with "
                f"sampling_temperature={sampling.temperature}")
        if sampling.temperature not in (0.0, 1.0) and (sampling.top_p < 1.0 or sampling.top_k > 0):
            raise ValueError(
                f"{self.name} reports log-probs after vLLM's processing at temperature {sampling.temperature}, "
                f"which top_p={sampling.top_p} / top_k={sampling.top_k} would truncate: use top_p=1 and top_k=-1")
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else self._generator
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        asked = [i for i, n in enumerate(sizes) if n > 0]
        request = {
            "op": "generate",
            "prompts": [prompts[i].text for i in asked],
            "images": [[_png(im) for im in prompts[i].images] for i in asked],
            "sizes": [sizes[i] for i in asked], "seeds": [int(seeds[i]) for i in asked],
            "weight_version": None if weight_version is None else int(weight_version),
            "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                         "max_tokens": sampling.max_tokens,
                         "stop_token_ids": list(sampling.stop_token_ids) if sampling.stop_token_ids is not None else None},
        }
        attempts = self.restart_retries
        start = time.perf_counter()
        while True:
            try:
                reply = self._call(request) if asked else {"outputs": [], "time_s": 0.0}
                break
            except EngineError as err:
                if attempts <= 0 or self._closed:
                    raise
                attempts -= 1
                logger.warning("%s; restarting the engine and retrying generate", err)
                self.restart()
        elapsed = time.perf_counter() - start
        prompt_ids = {i: out["prompt_token_ids"] for i, out in zip(asked, reply["outputs"])}
        completions = {i: out["completions"] for i, out in zip(asked, reply["outputs"])}
        tokens, logprobs, finish = [], [], []
        for i, n in enumerate(sizes):
            for ids, lps, reason in completions.get(i, [])[:n]:
                tokens.append(torch.tensor(ids, dtype=torch.long))
                logprobs.append(torch.tensor(lps, dtype=torch.float32))
                r: FinishReason = "stop" if reason == "stop" else "length"
                finish.append(r)
        return assemble_rollouts(
            prompts, self._prompt_inputs(prompts, prompt_ids), sizes, tokens, logprobs, finish, self.tokenizer, elapsed,
            engine_time_s=float(reply["time_s"]),
        )

    def _prompt_inputs(self, prompts: Sequence[RolloutPrompt], prompt_ids: dict[int, list[int]]) -> list[PromptInputs]:
        """What the trainer needs per prompt: the engine's prompt token ids for text prompts; for
        prompts with images, the Hugging Face processor's output (token ids with image tokens
        expanded, pixel values, image grid; resized into ``min_pixels`` / ``max_pixels`` like the
        engine's), which vLLM does not return."""
        from fastrl.rollout.hf_engine import prepare_prompt_inputs

        out = []
        for i, prompt in enumerate(prompts):
            if prompt.images:
                if self._processor is None:
                    from fastrl.data.images import set_pixel_bounds
                    from fastrl.models.tiny import load_processor

                    self._processor = load_processor(self.model_path)
                    set_pixel_bounds(self._processor.image_processor, self.min_pixels, self.max_pixels)
                out.append(prepare_prompt_inputs(self._processor, prompt))
            elif i in prompt_ids:
                out.append(PromptInputs(input_ids=torch.tensor(prompt_ids[i], dtype=torch.long)))
            else:  # a prompt with n = 0 was not sent to the engine
                ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
                out.append(PromptInputs(input_ids=torch.tensor(ids, dtype=torch.long)))
        return out

    # ---- refit -----------------------------------------------------------------------------

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Refit through the transport (:mod:`fastrl.rollout.refit_transport`). Records
        :attr:`refit_metrics` and, on a refit that will be verified (:attr:`verify_due` after it),
        per parameter group the sum of squares of what was sent (:attr:`last_group_sums`, for the
        verification's diagnosis; computed where the tensors live, on the GPU for CUDA IPC, and read
        back once per refit), and has the engine record its side; other refits compute no sums."""
        squares: dict[str, list[torch.Tensor]] = {}
        due = self._verify_due_at(self.weight_version + 1)

        def tracked():
            for name, t in named_tensors:
                t = t.detach()
                if due:
                    squares.setdefault(wire.weight_group(name), []).append(square_sum(t))
                yield name, t

        self.transport.record_sums = due
        start = time.perf_counter()
        count, nbytes = self._transfer(tracked())
        elapsed = time.perf_counter() - start
        self.last_group_sums.update(group_square_sums(squares))
        self.weight_version += 1
        self.refit_metrics = {
            "refit/bytes": float(nbytes), "refit/time_s": elapsed,
            "refit/mb_per_s": nbytes / 2**20 / elapsed if elapsed > 0 else 0.0,
        }
        return count

    def _transfer(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, int]:
        """Send every bucket, wait until each was loaded, then tell the engine its new weight
        version. Returns ``(tensors, bytes)`` sent.

        An engine that dies or hangs during the refit (:class:`EngineError`), with
        ``restart_retries >= 1`` and a replayable transport (shared memory): the rest of the weight
        stream is still consumed and written into the bucket files (the export is collective: every
        rank reads it to its end), then the engine is restarted and the files -- now this refit's
        weights -- replayed, as :meth:`generate`'s restart does, and the engine is given this
        refit's version. Otherwise the error is raised."""
        version = self.weight_version + 1
        failed: list[EngineError] = []

        def request(req: dict) -> str | None:
            if failed:
                return None  # the engine is gone: the transport only writes its files
            try:
                self._send(req)
            except EngineError as err:
                failed.append(err)
                return None
            return req["op"]

        def wait(op: str | None) -> None:
            if op is None or failed:
                return
            try:
                self._wait_ok(op)
            except EngineError as err:
                failed.append(err)

        count, nbytes = self.transport.send(named_tensors, request=request, wait=wait)
        if not failed:
            try:
                self._call({"op": "set_weight_version", "version": version})  # every bucket loaded
            except EngineError as err:
                failed.append(err)
        if failed:
            if self.restart_retries < 1 or self._closed or not self.transport.replayable:
                raise failed[0]
            logger.warning("%s; restarting the engine and replaying refit %d", failed[0], version)
            self.restart(version=version)
        return count, nbytes

    @property
    def verify_due(self) -> bool:
        """Whether the refit just done is to be verified: the first, then every ``verify_every``-th."""
        return self._verify_due_at(self.weight_version)

    def _verify_due_at(self, v: int) -> bool:
        return verify_due_at(v, self.verify_every)

    @property
    def export_to_cpu(self) -> bool:
        """Where the trainer's weight export must put its tensors for this client's transport."""
        return self.transport.export_to_cpu

    # ---- verification ----------------------------------------------------------------------

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[torch.Tensor]:
        """The engine's log-probs (temperature 1) of tokens ``starts[i]:`` of each sequence, given
        the tokens before them (vLLM ``prompt_logprobs``)."""
        reply = self._call({"op": "score", "sequences": [list(map(int, s)) for s in sequences],
                            "starts": [int(s) for s in starts]})
        return [torch.tensor(lp, dtype=torch.float32) for lp in reply["logprobs"]]

    def group_sums(self) -> dict[str, float]:
        """Per parameter group, the sum of squares of the engine's weights."""
        return self._call({"op": "group_sums"})["sums"]


def with_pixel_bounds(llm_kwargs: dict[str, Any], min_pixels: int | None, max_pixels: int | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments with the image-processor bounds added to ``mm_processor_kwargs``
    (arguments given there already win)."""
    bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
    if not bounds:
        return dict(llm_kwargs)
    mm = {**bounds, **dict(llm_kwargs.get("mm_processor_kwargs") or {})}
    return {**llm_kwargs, "mm_processor_kwargs": mm}


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()

