"""The trainer's side of a vLLM engine running as its own process (``rollout.engine='vllm'``).

vLLM and megatron-bridge cannot share one Python environment (transformers >= 5 vs < 5), so each
trainer rank (one per DP rank on CPU; see docs/engine.md for the GPU layout) starts one child
process with the engine environment's interpreter (``rollout.engine_python``; ``.venv-vllm`` on CPU,
built by ``tools/setup_vllm_cpu.sh``) running :mod:`fastrl.rollout.engine_server`, and talks to it
over a Unix socket (:mod:`fastrl.rollout.engine_wire`). :class:`EngineProcessClient` implements the
:class:`fastrl.rollout.engine.RolloutEngine` protocol.

Failure handling:

* start-up: a missing interpreter, an environment without vLLM, or a model architecture the
  engine cannot load (Qwen2.5-VL on vllm-cpu: no torchvision) raise :class:`EngineStartError`
  naming the interpreter, the reason, and the install command.
* at run time: every request waits at most ``timeout_s``; a dead engine (checked several times a
  second) or one that does not answer raises :class:`EngineError`, one line naming the engine, its
  exit status and the error its log names (stdout + stderr, kept in a file;
  :func:`fastrl.rollout.engine_log.error_excerpt`). ``restart_retries`` lets one
  :meth:`generate` call restart the engine (the current weights are replayed from the refit's
  shared-memory buckets) and retry; an engine that dies during a refit is restarted once the
  refit's buckets are written, and replays them (:meth:`_transfer`).
* the child dies with the trainer: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and a parent-pid watchdog
  in the child; :meth:`shutdown` (also at interpreter exit) kills its process group.

This is the only vLLM engine: the prompt builder (:meth:`EngineProcessClient._prompt_inputs`), the
sampling parameters (built by the server from the request) and the result assembly
(:func:`fastrl.rollout.engine.assemble_rollouts`) exist once.

Sampling: one vLLM request per prompt with ``n = n_per_prompt[i]`` (prompts with ``n = 0`` are not
sent), temperature / top-p / top-k / max tokens / stop tokens, the sampled token's log-prob, token
suppression (the few ids of :func:`fastrl.rollout.hf_engine.suppressed_token_ids`, sent once at
start-up; the server masks them with a ``logit_bias`` of -inf, :func:`check_suppression_size`), one
seed per prompt drawn here. The engine's
log-probs follow the rollouts' sampling temperature ``T`` (``sampling_temperature``, fixed when the
engine starts, since vLLM's ``logprobs_mode`` is an engine setting):

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
(``mm_processor_kwargs`` of ``vllm.LLM``) and to the Hugging Face processor that builds the trainer's
prompt inputs here, so both sides see the same image tokens.

Refit (:meth:`update_weights`): the transport is chosen by the rank's device
(:func:`fastrl.rollout.refit_transport.transport_for_device`): shared-memory buckets on CPU, CUDA
IPC for an engine on the trainer's GPU (one handle per engine worker); metrics ``refit/bytes``,
``refit/time_s``, ``refit/mb_per_s`` in :attr:`refit_metrics`.
Refit verification: :meth:`score` (the engine's log-probs of given token sequences, vLLM
``prompt_logprobs``) and :meth:`group_sums` (per parameter group, the engine's sum of squared
weights), used by :mod:`fastrl.training.refit_verify`.

Weight versions: :attr:`weight_version` counts the refits this client sent; after a refit's last
bucket was loaded the client tells the engine its new version (``set_weight_version``), and every
:meth:`generate` request carries the trainer's policy version, which the engine refuses when its
own is behind (:class:`fastrl.rollout.engine.StaleWeightsError`, not retried).
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
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
    StaleWeightsError,
    assemble_rollouts,
    check_weight_version,
    normalize_group_sizes,
)
from fastrl.rollout.engine_log import log_error_excerpt
from fastrl.rollout.refit_transport import make_transport, owned_temp_dir, remove_stale_dirs, transport_for_device

logger = logging.getLogger("fastrl.rollout")

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("engine_server.py")
INSTALL_HINT = "bash tools/setup_vllm_cpu.sh (CPU; or point rollout.engine_python at an environment with vLLM)"


class EngineError(RuntimeError):
    """The engine process died, hung, or failed a request (one-line message)."""


class EngineStartError(EngineError):
    """The engine could not start: environment, architecture, or vLLM start-up failure."""


def resolve_engine_python(python: str | os.PathLike) -> Path:
    """``rollout.engine_python`` as a path (relative paths resolve against the repository).

    Raises:
        EngineStartError: the interpreter does not exist or is not executable.
    """
    path = Path(python)
    if not path.is_absolute():
        path = REPO / path
    if not (path.exists() and os.access(path, os.X_OK)):
        raise EngineStartError(
            f"rollout engine environment missing: interpreter {path} does not exist or is not executable; "
            f"install it with: {INSTALL_HINT}"
        )
    return path


#: The most token ids one vLLM request may suppress: vLLM 0.32's GPU model runner (V2, the runner
#: of every CUDA machine) refuses a request with more ``logit_bias`` entries
#: (``vllm/v1/worker/gpu/sample/logit_bias.py``, ``MAX_NUM_LOGIT_BIAS_TOKENS``; its limit on
#: ``allowed_token_ids``, ``MAX_NUM_ALLOWED_TOKEN_IDS``, is the same 1,024, which is why the engine
#: sends the few suppressed ids rather than the ~151,600 allowed ones of a Qwen vocabulary).
#: ``tests/vllm/test_sampling_requests.py`` checks it against the installed vLLM.
MAX_SUPPRESSED_TOKEN_IDS = 1024


def check_suppression_size(suppressed_ids: Sequence[int], model_path: str | os.PathLike) -> None:
    """Refuse, before the engine starts, a model whose suppressed token ids (vision, bos / pad /
    unk, the padded vocabulary beyond the tokenizer: :func:`fastrl.rollout.hf_engine.suppressed_token_ids`)
    are more than one vLLM request can carry (:data:`MAX_SUPPRESSED_TOKEN_IDS`). The CPU runner
    (V1) has no such limit: without this check such a model would train on CPU and fail at the
    first generate on a GPU. Qwen2.5-VL-7B suppresses 401 ids (399 of them its padded vocabulary).

    Raises:
        EngineStartError: more than :data:`MAX_SUPPRESSED_TOKEN_IDS` ids, with the count and the cause.
    """
    if len(suppressed_ids) > MAX_SUPPRESSED_TOKEN_IDS:
        raise EngineStartError(
            f"{model_path}: {len(suppressed_ids)} token ids to suppress (vision, bos/pad/unk, and the padded "
            f"vocabulary between the tokenizer's length and config.json vocab_size) > {MAX_SUPPRESSED_TOKEN_IDS}, "
            f"the most logit_bias entries vLLM's GPU model runner accepts per request; use a model whose "
            f"vocab_size is within about {MAX_SUPPRESSED_TOKEN_IDS} of its tokenizer's length, or rollout.engine=hf")


class EngineProcessClient:
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
            :mod:`fastrl.rollout.refit_transport`; :func:`engine_client_from_config` picks it by device.
        min_pixels / max_pixels: image-processor bounds of both the engine's processor and the one
            building the trainer's prompt inputs (None: the model directory's).
        sampling_temperature: the temperature of the training rollouts (``rollout.temperature``;
            0 is taken as 1): the log-probs' temperature (module docstring).
        llm_kwargs: ``vllm.LLM`` arguments (``dtype``, ``max_model_len``, ``kv_cache_memory_bytes``,
            ``enforce_eager``, ``tensor_parallel_size``, ``gpu_memory_utilization``, ``enable_sleep_mode``...).
        env: extra environment variables of the child (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``).
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

        self.python = resolve_engine_python(python)
        self.model_path = Path(model_path)
        subdir = self.model_path / TOKENIZER_SUBDIR
        tokenizer_dir = subdir if (subdir / "tokenizer.json").is_file() else self.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = AutoConfig.from_pretrained(self.model_path)
        stop = default_stop_token_ids(self.model_path, config)
        self.suppressed_ids = suppressed_token_ids(config, self.tokenizer, special_tokens=suppress_special_tokens,
                                                   stop_token_ids=stop)
        check_suppression_size(self.suppressed_ids, self.model_path)
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.restart_retries = int(restart_retries)
        self.name = name
        self._generator = torch.Generator().manual_seed(seed)
        self._processor = None
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        if sampling_temperature < 0:
            raise ValueError(f"sampling_temperature must be >= 0, got {sampling_temperature}")
        self.sampling_temperature = float(sampling_temperature) if sampling_temperature > 0 else 1.0
        llm_kwargs = dict(llm_kwargs or {})
        if hasattr(config, "vision_config"):  # text-only models have no image processor
            llm_kwargs = with_pixel_bounds(llm_kwargs, min_pixels, max_pixels)
        self._spec = {
            "model": str(self.model_path), "tokenizer": str(tokenizer_dir), "seed": int(seed),
            "suppressed_token_ids": list(self.suppressed_ids), "stop_token_ids": list(stop), "llm_kwargs": llm_kwargs,
            "logprobs_mode": "raw_logprobs" if self.sampling_temperature == 1.0 else "processed_logprobs",
        }
        self._env = dict(env or {})
        self.transport = make_transport(
            transport, bucket_bytes, skip_after_first=skip_after_first,
            consumers=int(llm_kwargs.get("tensor_parallel_size") or 1),  # each engine worker opens its own IPC handle
        )
        remove_stale_dirs(Path(tempfile.gettempdir()), "fastrl-engine")  # left by SIGKILLed trainers
        self._workdir = owned_temp_dir("fastrl-engine")
        self.log_path = Path(log_path) if log_path else self._workdir / "engine.log"
        self.weight_version = 0
        self.verify_every = int(verify_every)
        self.verify_tolerance = float(verify_tolerance)
        self.refit_metrics: dict[str, float] = {}
        self.last_group_sums: dict[str, float] = {}
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._closed = False
        self._log_start = 0  # byte offset of the log after which a death's cause is looked for (_start)
        try:
            self._start()
        except BaseException:
            self._closed = True
            self.transport.close()
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        atexit.register(self.shutdown)
        stop = self.info["default_stop_token_ids"]
        self.default_stop_token_ids: tuple[int, ...] = tuple(int(t) for t in stop)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.default_stop_token_ids[0])

    # ---- process ---------------------------------------------------------------------------

    def _start(self) -> None:
        parent, child = socket.socketpair()
        spec_path = self._workdir / "spec.json"
        spec_path.write_text(json.dumps(self._spec))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(self._env)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env.setdefault("PYTHONUNBUFFERED", "1")  # the log holds every line written before the start-up reply
        self._log_start = self._log_size()  # this start's lines only (a restart appends to the same log)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [str(self.python), str(SERVER), "--fd", str(child.fileno()), "--spec", str(spec_path),
                 "--parent-pid", str(os.getpid())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=str(REPO), start_new_session=True,
            )
        except OSError as err:
            raise EngineStartError(
                f"{self.name}: cannot run the engine interpreter {self.python}: {err}; install it with: {INSTALL_HINT}"
            ) from err
        finally:
            log.close()
            child.close()
        self.sock = parent
        try:
            ready = self._receive("start-up", self.startup_timeout_s, setting="rollout.engine_startup_timeout_s")
        except EngineError as err:
            self._kill()
            raise EngineStartError(str(err)) from None
        if not ready.get("ok"):
            self._kill()
            kind = ready.get("kind")
            hint = f"; install or repair it with: {INSTALL_HINT}" if kind == "environment" else ""
            raise EngineStartError(
                f"{self.name} refused to start ({kind}): {ready.get('error')} [interpreter {self.python}]{hint}"
                + ("" if kind in ("environment", "architecture") else f"; log tail: {self._log_tail()}")
            )
        self.info = ready
        self._log_start = self._log_size()  # what it logged while starting did not stop it (engine_log)
        logger.info("%s: pid %s, vLLM %s, %s", self.name, ready["pid"], ready["vllm_version"], self.python)

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _log_tail(self, chars: int = 600) -> str:
        """The cause of the engine's death as its log tells it after its start-up (or, for a failed
        start, since it was started; :func:`fastrl.rollout.engine_log.log_error_excerpt`)."""
        where = "" if self.log_path.parent == self._workdir else f" (whole log: {self.log_path})"
        return log_error_excerpt(self.log_path, chars, start=self._log_start) + where

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _dead(self, what: str) -> EngineError:
        rc = self.proc.poll() if self.proc is not None else None
        pid = self.proc.pid if self.proc is not None else "?"
        status = f"exit status {rc}" if rc is not None and rc >= 0 else (
            f"killed by signal {-rc}" if rc is not None else "still running")
        return EngineError(f"{self.name} (pid {pid}, {self.python}) {what}: {status}; log tail: {self._log_tail()}")

    def _receive(self, op: str, timeout: float, setting: str = "rollout.engine_timeout_s") -> dict:
        deadline = time.monotonic() + timeout
        assert self.sock is not None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise self._dead(f"did not answer {op!r} within {setting}={timeout:g} s (hung; killed)")
            ready, _, _ = select.select([self.sock], [], [], min(0.2, remaining))
            if ready:
                try:
                    self.sock.settimeout(max(remaining, 1.0))
                    return wire.recv_message(self.sock)
                except (wire.WireClosed, OSError):
                    if self.proc is not None:
                        try:
                            self.proc.wait(timeout=5)
                        except subprocess.TimeoutExpired:
                            pass
                    raise self._dead(f"died during {op!r}") from None
            if self.proc is not None and self.proc.poll() is not None:
                raise self._dead(f"died during {op!r}")

    def _send(self, request: dict) -> None:
        if self._closed:
            raise EngineError(f"{self.name} was shut down")
        if self.sock is None or self.proc is None or self.proc.poll() is not None:
            raise self._dead(f"is not running (request {request['op']!r})")
        try:
            wire.send_message(self.sock, request)
        except OSError:
            raise self._dead(f"died before {request['op']!r}") from None

    def _call(self, request: dict, timeout: float | None = None) -> dict:
        self._send(request)
        reply = self._receive(request["op"], self.timeout_s if timeout is None else timeout)
        if not reply.get("ok") and reply.get("kind") == wire.STALE_WEIGHTS:
            raise StaleWeightsError(f"{self.name}: {reply.get('error')}")  # not an engine failure: no restart
        if not reply.get("ok"):
            raise EngineError(f"{self.name}: {request['op']} failed: {reply.get('error')}")
        return reply

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

    def shutdown(self) -> None:
        """Stop the engine (asks politely, then kills its process group) and remove the refit files."""
        if self._closed:
            return
        self._closed = True
        if self.proc is not None and self.proc.poll() is None and self.sock is not None:
            try:
                wire.send_message(self.sock, {"op": "shutdown"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self.transport.close()
        if self.log_path.parent == self._workdir:  # the log's tail was quoted in any error already
            shutil.rmtree(self._workdir, ignore_errors=True)

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

    def _wait_ok(self, op: str) -> None:
        reply = self._receive(op, self.timeout_s)
        if not reply.get("ok"):
            raise EngineError(f"{self.name}: {op} failed: {reply.get('error')}")

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

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass


def verify_due_at(version: int, every: int) -> bool:
    """Whether refit number ``version`` (1-based) is verified: the first, then every ``every``-th
    (never with ``every = 0``)."""
    return every > 0 and version >= 1 and (version == 1 or version % every == 0)


#: elements per chunk of :func:`square_sum` (a float64 copy of 2**24 elements: 128 MiB)
SQUARE_SUM_CHUNK = 1 << 24


def square_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of squares of ``tensor``'s elements as a 0-d float64 tensor on its device, computed in
    chunks of :data:`SQUARE_SUM_CHUNK` elements (a float64 copy of a whole 7B embedding would take
    4 GiB of the GPU during the refit); no read-back to the host. The engine computes its side with
    its own ``square_sums`` (``engine_server.py`` cannot import fastrl)."""
    flat = tensor.detach().reshape(-1)
    return torch.stack([c.double().square().sum() for c in flat.split(SQUARE_SUM_CHUNK)]).sum()


def group_square_sums(squares: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """Per group, the sum of its tensors' sums of squares (0-d float64 tensors, on any device, from
    :func:`square_sum`); one read-back to the host for all groups."""
    if not squares:
        return {}
    per_group = [torch.stack(v).sum() for v in squares.values()]
    device = per_group[0].device
    return dict(zip(squares, torch.stack([t.to(device) for t in per_group]).tolist()))


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


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def frozen_vision_weight(name: str) -> bool:
    """A weight ``model.freeze_vision_tower`` keeps fixed: the vision blocks and the patch embedding
    (not the merger); such weights are sent on the first refit only."""
    if "visual." not in name:
        return False
    return name.split("visual.", 1)[1].startswith(("blocks.", "patch_embed."))


def engine_client_from_config(
    cfg: Any, policy_dir: str | os.PathLike, device: torch.device | str | None, *, gpus: Sequence[str] | None = None,
) -> EngineProcessClient:
    """This rank's engine process for a :class:`fastrl.config.RunConfig` with ``rollout.engine='vllm'``
    (docs/engine.md): fp32 runs get an fp32 engine, bf16/fp8 runs a bf16 one; on CPU the KV cache
    is ``rollout.engine_kv_cache_mb`` and the engine uses ``rollout.engine_threads`` OMP threads; on
    a GPU the engine sees only its GPUs (``CUDA_VISIBLE_DEVICES``: ``gpus``, the first
    ``rollout.engine_tensor_parallel_size`` GPUs of the rank's model-parallel group as
    :func:`fastrl.training.engine_placement.engine_gpus` finds them, else this rank's GPU and the
    ones after it) and sleeps between steps (level 2) when ``rollout.sleep_between_steps``. The refit transport follows the device
    (:func:`fastrl.rollout.refit_transport.transport_for_device`); images are resized into
    ``data.min_pixels`` / ``data.max_pixels`` on both sides.

    Raises:
        EngineStartError: see :class:`EngineProcessClient`.
    """
    ro = cfg.rollout
    dev = torch.device(device) if device is not None else torch.device("cpu")
    llm_kwargs: dict[str, Any] = {
        "dtype": "float32" if cfg.precision.mode == "fp32" else "bfloat16",
        "max_model_len": ro.max_prompt_length + ro.max_response_length + 8,
        "tensor_parallel_size": ro.engine_tensor_parallel_size,
    }
    env: dict[str, str] = {}
    if dev.type == "cuda":
        llm_kwargs.update(gpu_memory_utilization=ro.gpu_memory_utilization, enable_sleep_mode=ro.sleep_between_steps)
        if gpus is None:
            gpus = physical_gpus(dev.index or 0, ro.engine_tensor_parallel_size, os.environ.get("CUDA_VISIBLE_DEVICES"))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    else:
        llm_kwargs.update(kv_cache_memory_bytes=ro.engine_kv_cache_mb * 2**20, enforce_eager=True)
        threads = ro.engine_threads or cfg.trainer.torch_threads
        env["OMP_NUM_THREADS"] = str(threads)
    return EngineProcessClient(
        policy_dir, python=ro.engine_python, seed=ro.seed, suppress_special_tokens=ro.suppress_special_tokens,
        timeout_s=ro.engine_timeout_s, startup_timeout_s=ro.engine_startup_timeout_s, restart_retries=ro.engine_restart_retries,
        bucket_bytes=int(ro.refit_bucket_mb * 2**20),
        # frozen weights are sent once, unless a level-2 sleep discards them between refits (GPU)
        skip_after_first=frozen_vision_weight if cfg.model.freeze_vision_tower and not (
            dev.type == "cuda" and ro.sleep_between_steps) else None,
        name=f"vllm engine process of rank pid {os.getpid()}", llm_kwargs=llm_kwargs, env=env,
        verify_every=ro.verify_refit_every, verify_tolerance=cfg.verify_refit_tolerance,
        transport=transport_for_device(dev), min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
        sampling_temperature=ro.temperature,
    )
