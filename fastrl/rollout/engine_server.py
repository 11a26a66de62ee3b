"""The vLLM engine process: run as a script by the engine environment's interpreter.

Usage (started by :class:`fastrl.rollout.engine_process.EngineProcess`, the base of
:class:`fastrl.rollout.engine_client.EngineProcessClient`; never by hand)::

    <engine_python> fastrl/rollout/engine_server.py --fd N --spec SPEC_JSON --parent-pid PID

It imports only the standard library, torch, vllm (and two of vLLM's own dependencies: safetensors
for the initial weight sums, PIL for prompts with images) and its siblings ``engine_wire.py`` and
``engine_settings.py`` (loaded by path), never ``fastrl`` itself: the engine environment
(``.venv-vllm`` on CPU; the cluster's vLLM environment on GPU) has transformers 5 and no megatron.

Weight transports (:mod:`fastrl.rollout.refit_transport`): ``load_weights`` (shared-memory bucket
files; CPU, tested) and ``load_weights_ipc`` (CUDA IPC handles of one flat bucket buffer, one per
vLLM worker; colocated GPU engine; written against vLLM's API; CI runs its CUDA calls against the
recording fake of ``tests/rehearsal``, and ``bench/ipc_refit_check.py`` runs them on a GPU with a
stand-in for vLLM's workers). Both reload from views of one flat uint8 buffer: shared-memory files
are mapped in this process and the views handed to vLLM as a list (:meth:`Server._reload`); each
vLLM worker opens its own CUDA IPC handle (:func:`reload_ipc_bucket`), so that no CUDA tensor is
pickled to the workers of an engine with ``tensor_parallel_size > 1``.

Sleep (``enable_sleep_mode``, GPU): level 2 between steps (weights and KV cache discarded);
a refit wakes the weights alone and loads them, :meth:`Server.op_wake` brings the KV cache back.

Life cycle: on Linux the process asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``), and a watchdog thread exits when the parent pid changes (covers
non-Linux systems and a parent that died before the prctl call). The engine core runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set before vLLM is imported) so the client's process-group
kill reaches everything (with ``tensor_parallel_size > 1`` vLLM's worker processes are children
of this one).

Start-up errors are sent as the first message (``{"ok": False, "kind": "environment" | "architecture"
| "startup"}``) before the process exits with status 3.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import mmap
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _load_sibling(name: str):
    """``fastrl/rollout/<name>.py`` loaded by path (this script cannot import fastrl)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"fastrl_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"fastrl_{name}"] = module
    spec.loader.exec_module(module)
    return module


wire = _load_sibling("engine_wire")
_settings = _load_sibling("engine_settings")  # how this engine configures vLLM and its requests
VLLM_CPU_STEP_TOKENS, whole_prefills, suppression_bias = (
    _settings.VLLM_CPU_STEP_TOKENS, _settings.whole_prefills, _settings.suppression_bias)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the parent dies (Linux prctl), plus a parent-pid watchdog thread."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(4)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(4)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


#: vLLM 0.32's layerwise weight reload (its GPU runner) logs ``<Layer>: Failed to load weights`` at
#: WARNING for every module of the model that a ``reload_weights`` call did not carry
#: (``vllm/model_executor/model_loader/reload/layerwise.py``, ``finalize_layerwise_processing``):
#: with refits in buckets that is every module outside the bucket, once per bucket -- for 7B about
#: 0.7 GB of engine log over 200 steps, in the temporary folder. Whether every weight arrived is
#: what the refit's per-group sums and the probe check; this logger keeps only its errors.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


def quiet_reload_log(worker=None) -> str:
    """Set :data:`RELOAD_LOGGER` to ERROR in this process (run in every vLLM worker through
    ``collective_rpc``: with ``tensor_parallel_size > 1`` they are processes of their own). Returns
    the logger's name."""
    import logging

    logging.getLogger(RELOAD_LOGGER).setLevel(logging.ERROR)
    return RELOAD_LOGGER


class Server:
    """One vLLM ``LLM`` and the operations of :mod:`engine_wire`."""

    def __init__(self, spec: dict) -> None:
        from vllm import LLM
        from vllm.platforms import current_platform

        self.spec = spec
        kwargs = dict(spec["llm_kwargs"])
        if current_platform.is_cpu():
            kwargs = whole_prefills(kwargs)
        kwargs.update(model=spec["model"], tokenizer=spec["tokenizer"], seed=int(spec["seed"]),
                      logprobs_mode=spec["logprobs_mode"])  # the client's choice (engine_client docstring)
        self.llm = LLM(**kwargs)
        quiet_reload_log()
        self.llm.collective_rpc(quiet_reload_log)  # each worker's own logger
        print(f"engine: {RELOAD_LOGGER} kept at ERROR (one warning per module per refit bucket otherwise)", flush=True)
        self.engine_workers = int(kwargs.get("tensor_parallel_size") or 1)  # each opens its own IPC handle
        self.suppression = suppression_bias(spec["suppressed_token_ids"])
        self.sleep_enabled = bool(kwargs.get("enable_sleep_mode"))
        self.asleep = False
        self.weights_awake = True
        self._maps: dict[str, tuple[int, mmap.mmap]] = {}
        self.received: dict[str, float] = {}  # sums of squares per weight received by refits
        self.weight_version = 0  # refits loaded (set_weight_version, after each refit's last bucket)
        self.default_stop = [int(t) for t in spec["stop_token_ids"]]  # the client's, which shaped the suppression

    def _model_sums(self, skip: set[str]) -> dict[str, float]:
        """Sums of squares of the model directory's weights not in ``skip``, read when asked for
        (:meth:`op_group_sums`), not at start-up: after a refit that sent every weight nothing is
        read (a 72B checkpoint is 145 GB)."""
        from safetensors import safe_open  # a vLLM dependency

        out: dict[str, float] = {}
        for path in sorted(Path(self.spec["model"]).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name not in skip:
                        out[name] = square_sums([f.get_tensor(name)])[0]
        return out

    # ---- operations ------------------------------------------------------------------------

    def op_health(self, req: dict) -> dict:
        return {"pid": os.getpid(), "weight_version": self.weight_version}

    def op_set_weight_version(self, req: dict) -> dict:
        """The client's word that every bucket of refit ``version`` (or a restart's replay) was loaded."""
        self.weight_version = int(req["version"])
        return {}

    def op_generate(self, req: dict) -> dict:
        from vllm import SamplingParams

        stale = wire.stale_weights_message(
            f"the vLLM engine process (pid {os.getpid()})", self.weight_version, req.get("weight_version"))
        if stale is not None:  # refused before anything is generated
            return wire.error_reply(stale, wire.STALE_WEIGHTS)
        s = req["sampling"]
        stop = s["stop_token_ids"] if s["stop_token_ids"] is not None else self.default_stop
        params = [
            SamplingParams(
                n=int(n), temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"] if s["top_k"] > 0 else 0,
                max_tokens=s["max_tokens"], stop_token_ids=list(stop), ignore_eos=True, logprobs=0,
                seed=int(seed), logit_bias=self.suppression, detokenize=False,
            )
            for n, seed in zip(req["sizes"], req["seeds"])
        ]
        start = time.perf_counter()
        requests = []
        for i, text in enumerate(req["prompts"]):
            request = {"prompt": text}
            images = req.get("images", [[]] * len(req["prompts"]))[i]
            if images:  # PNG bytes (PIL comes with vLLM)
                import io

                from PIL import Image

                request["multi_modal_data"] = {"image": [Image.open(io.BytesIO(b)).convert("RGB") for b in images]}
            requests.append(request)
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        result = []
        for output in outputs:
            completions = []
            for c in sorted(output.outputs, key=lambda c: c.index):
                ids = [int(t) for t in c.token_ids]
                lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids)]
                completions.append((ids, lps, "stop" if c.finish_reason == "stop" else "length"))
            result.append({"prompt_token_ids": [int(t) for t in output.prompt_token_ids], "completions": completions})
        return {"outputs": result, "time_s": elapsed}

    def _map(self, path: str) -> mmap.mmap:
        size = os.path.getsize(path)
        cached = self._maps.get(path)
        if cached is not None and cached[0] == size:
            return cached[1]
        with open(path, "r+b") as f:
            mm = mmap.mmap(f.fileno(), size)
        self._maps[path] = (size, mm)
        return mm

    def _reload(self, buffers: list, sums: bool = True) -> int:
        """``reload_weights`` from views of flat uint8 buffers in this process (shared-memory files):
        ``buffers`` holds ``(buffer, entries)`` pairs, entries ``(name, dtype, shape, offset, nbytes)``.
        The views go to vLLM as a **list** of ``(name, tensor)`` pairs, not a generator: with
        ``tensor_parallel_size > 1`` vLLM's multiproc executor pickles ``collective_rpc``'s arguments
        (CPU tensors through its shared-memory queue), and a generator cannot be pickled. With
        ``sums`` each tensor's sum of squares is recorded (:meth:`op_group_sums`), read back once
        per call."""
        views = bucket_views(buffers)
        squares = square_sums([t for _, t in views]) if views and sums else None  # what arrived
        self._wake_weights()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": views})
        self._after_reload([name for name, _ in views], squares)
        return len(views)

    def _wake_weights(self) -> None:
        """Weights asleep (sleep level 2 discarded them) are woken, alone, before a reload."""
        if self.asleep and not self.weights_awake:
            self.llm.wake_up(tags=["weights"])
            self.weights_awake = True

    def _after_reload(self, names: list[str], squares: list[float] | None) -> None:
        """After a reload: the output layer repacked when the input embedding came (tied
        embeddings, :func:`repack_output_layer`); the encoder cache reset (vLLM keeps image
        embeddings by image hash across requests: computed by the old vision tower they would be
        stale, and its scheduler's and worker's halves fall out of step -- "Encoder cache miss" at
        the next request with an image already seen, measured with the tiny Qwen2.5-VL); the
        prefix cache reset unless the engine's KV cache sleeps (then :meth:`op_wake` does); the
        received sums of squares recorded."""
        if any("embed_tokens" in name for name in names):
            self.llm.collective_rpc(repack_output_layer)
        self.llm.llm_engine.reset_encoder_cache()
        if not self.asleep:
            self.llm.reset_prefix_cache()
        if squares is not None:
            self.received.update(zip(names, squares))

    def op_load_weights(self, req: dict) -> dict:
        """Buckets in shared-memory files (``(path, entries)`` each), memory-mapped, zero copies."""
        import torch

        start = time.perf_counter()
        buffers = [(torch.frombuffer(self._map(path), dtype=torch.uint8), entries) for path, entries in req["buckets"]]
        count = self._reload(buffers, sums=req.get("sums", True))
        return {"count": count, "time_s": time.perf_counter() - start}

    def op_load_weights_ipc(self, req: dict) -> dict:
        """One bucket through CUDA IPC handles (``reduce_tensor`` of the trainer's flat buffer, one
        per worker), opened **in each vLLM worker** (:func:`reload_ipc_bucket` through
        ``collective_rpc``): only the handles and the entry table cross to the workers. (Views of a
        buffer opened here would be pickled to the workers of an engine with
        ``tensor_parallel_size > 1``, and torch pickles a CUDA tensor by copying its whole storage
        to the host and back onto ``cuda:0`` in every worker: every tensor of a bucket carrying the
        whole bucket, eight times on one GPU.) Each worker opens its own handle: torch frees the
        trainer's buffer when every handle's counter is back to 0, and one handle opened by several
        workers never gets there (``fastrl.rollout.refit_transport.CudaIpcTransport``). The engine
        and its workers see the engine's GPUs from ``cuda:0`` (``CUDA_VISIBLE_DEVICES`` narrowed,
        the trainer's GPU first), so each handle's device index (argument 6 of
        ``rebuild_cuda_tensor``) becomes this process's current device, the same index in every
        worker.

        Raises:
            ValueError: a handle is not a CUDA tensor's (:func:`check_cuda_handle`); not one handle per
                worker (a handle no worker opens would keep its bucket allocated on the trainer's GPU).
        """
        import torch

        if len(req["handles"]) != self.engine_workers:
            raise ValueError(
                f"load_weights_ipc got {len(req['handles'])} CUDA IPC handle(s) for an engine of {self.engine_workers} "
                f"worker(s): the trainer's refit transport must send one per engine worker (consumers = the engine's "
                f"tensor_parallel_size)"
            )
        opened = [check_cuda_handle(handle) for handle in req["handles"]]
        device = torch.cuda.current_device()
        rebuild = opened[0][0]
        handle_args = [tuple(args[:6]) + (device,) + tuple(args[7:]) for _, args in opened]
        sums = req.get("sums", True)
        self._wake_weights()
        per_worker = self.llm.collective_rpc(reload_ipc_bucket, args=(rebuild, handle_args, req["entries"], sums))
        names = [entry[0] for entry in req["entries"]]
        self._after_reload(names, per_worker[0] if sums else None)
        return {"count": len(names)}

    def op_score(self, req: dict) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(seq)) for seq in req["sequences"]], sampling_params=params, use_tqdm=False
        )
        result = []
        for seq, start, output in zip(req["sequences"], req["starts"], outputs):
            plp = output.prompt_logprobs  # position 0 is None
            result.append([float(plp[t][seq[t]].logprob) for t in range(start, len(seq))])
        return {"logprobs": result}

    def op_group_sums(self, req: dict) -> dict:
        """Per parameter group, the sum of squares of the weights this engine holds as it loaded them:
        each tensor's as the last refit that carried it delivered it, else the model directory's
        (read now, for the weights no refit has sent). (vLLM on CPU repacks linear weights into
        kernels' own layouts, so its parameters cannot be read back; whether the loaded weights are
        really used is what the log-prob probe checks.)"""
        held = {**self._model_sums(skip=set(self.received)), **self.received}
        total: dict[str, float] = {}
        for name, value in held.items():
            g = wire.weight_group(name)
            total[g] = total.get(g, 0.0) + value
        return {"sums": total}

    def op_sleep(self, req: dict) -> dict:
        """vLLM sleep level 2: weights and KV cache discarded, no host copy (the next refit
        overwrites the weights: :meth:`_reload` wakes the weights alone and loads them)."""
        if self.sleep_enabled and not self.asleep:
            self.llm.sleep(level=2)
            self.asleep, self.weights_awake = True, False
        return {}

    def op_wake(self, req: dict) -> dict:
        """The KV cache back; the weights must be awake already (loaded by a refit after the last
        level-2 sleep, which discarded them).

        Raises:
            RuntimeError: a wake after a level-2 sleep with no refit since: generation would run on
                weights vLLM reallocated but never filled.
        """
        if self.sleep_enabled and self.asleep:
            if not self.weights_awake:
                raise RuntimeError(
                    "wake without a refit since the last sleep: sleep level 2 discarded the engine's weights, "
                    "and generating now would use uninitialized weights; the trainer refits before it wakes "
                    "the engine (a wake between two generation rounds of one step must not follow a sleep)"
                )
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
            self.llm.reset_prefix_cache()
        return {}

    def op_reset_prefix_cache(self, req: dict) -> dict:
        self.llm.reset_prefix_cache()
        return {}


def bucket_views(buffers: list) -> list:
    """``(name, tensor)`` views of flat uint8 buffers: ``buffers`` holds ``(buffer, entries)`` pairs,
    entries ``(name, dtype, shape, offset, nbytes)`` (:func:`fastrl.rollout.refit_transport.pack_flat`)."""
    import torch

    return [
        (name, buffer[offset : offset + nbytes].view(getattr(torch, dtype)).reshape(shape))
        for buffer, entries in buffers
        for name, dtype, shape, offset, nbytes in entries
    ]


#: elements per chunk of :func:`square_sums` (a float64 copy of 2**24 elements: 128 MiB)
SQUARE_SUM_CHUNK = 1 << 24


def square_sums(tensors: list) -> list[float]:
    """Each tensor's sum of squares in float64, computed where the tensor lives, in chunks of
    :data:`SQUARE_SUM_CHUNK` elements (a float64 copy of a whole 7B embedding would be 4 GiB),
    read back to the host once. Self-contained (torch only): it runs in vLLM's workers inside
    :func:`reload_ipc_bucket`."""
    import torch

    if not tensors:
        return []
    per_tensor = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        per_tensor.append(torch.stack([c.double().square().sum() for c in flat.split(SQUARE_SUM_CHUNK)]).sum())
    return torch.stack(per_tensor).tolist()


def reload_ipc_bucket(worker, rebuild, handle_args: list, entries: list, sums: bool) -> list[float] | None:
    """Run in each vLLM worker (``collective_rpc``; cloudpickled by value with the helpers it calls,
    this file being the engine's ``__main__``): open the trainer's bucket from this worker's own
    CUDA IPC handle (``rebuild(*handle_args[worker.rpc_rank])``: torch's ``rebuild_cuda_tensor``;
    ``rpc_rank`` is the worker's index in the executor, the order of ``collective_rpc``'s results),
    reload the worker's weights from views of it (each tensor-parallel worker takes its shard of the
    full tensors), wait for the copies, and return each tensor's sum of squares as received
    (``sums``) or None. :meth:`Server.op_load_weights_ipc` has checked that there is one handle
    per worker."""
    import torch

    views = bucket_views([(rebuild(*handle_args[worker.rpc_rank]), entries)])
    squares = square_sums([t for _, t in views]) if sums else None
    worker.reload_weights(weights_iterator=views)
    torch.cuda.synchronize()
    return squares


def repack_output_layer(worker) -> bool:
    """Run in each vLLM worker after a reload that carried the input embedding: the output layer's
    quantization method processes its weight again (``process_weights_after_loading``).

    vLLM's CPU backend packs every GEMM weight once after loading (``dispatch_cpu_unquantized_gemm``),
    the output layer's too. With tied embeddings (SmolLM2, Qwen2.5-VL-3B) the output layer shares the
    input embedding's weight, which ``reload_weights`` updates in place, but its packed copy is not
    rebuilt: every refit left the engine sampling through the first weights' output layer (measured
    on SmolLM2-135M: after a 5% change of the embedding the engine's log-probs matched the old output
    layer to 2e-4 and the tied new one only to 1.06). On GPUs the method does nothing. Returns
    whether the model has an output layer with such a method.
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is None or method is None or not hasattr(method, "process_weights_after_loading"):
        return False
    method.process_weights_after_loading(head)
    return True


def check_cuda_handle(handle) -> tuple:
    """``(rebuild function, argument list)`` of a ``reduce_tensor`` handle of a CUDA tensor.

    Raises:
        ValueError: a handle of a CPU tensor (``reduce_tensor`` gives ``rebuild_tensor`` and 3
            arguments; the trainer exported its weights to the CPU) or anything else that is not
            ``rebuild_cuda_tensor`` with its device index at argument 6.
    """
    rebuild, args = handle
    args = list(args)
    name = getattr(rebuild, "__name__", repr(rebuild))
    if name != "rebuild_cuda_tensor" or len(args) < 7:
        raise ValueError(
            f"load_weights_ipc needs the IPC handle of a CUDA tensor, got {name} with {len(args)} arguments: "
            f"the trainer sent a CPU buffer (its weight export must stay on the GPU for the CUDA IPC refit)"
        )
    return rebuild, args


def check_environment(spec: dict) -> dict | None:
    """A start-up refusal, or None: vLLM importable, the model architecture loadable here."""
    try:
        import torch  # noqa: F401
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - reported to the client
        return wire.error_reply(f"import vllm failed in {sys.executable}: {type(err).__name__}: {err}", "environment")
    config = json.loads((Path(spec["model"]) / "config.json").read_text())
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in wire.NEEDS_TORCHVISION and importlib.util.find_spec("torchvision") is None:
            return wire.error_reply(
                f"the engine environment {sys.executable} cannot load {arch}: vLLM's model code for it needs "
                f"torchvision, which this environment lacks (install torchvision built for this torch; on CPU "
                f"tools/setup_vllm_cpu.sh installs PyPI's with tools/engine_env/_fastrl_torchvision_cpu.py)",
                "architecture",
            )
    return None


#: What the child of :func:`visible_gpu_count` runs. torch's count never raises: a driver that cannot
#: start gives 0 GPUs and a "CUDA initialization: ..." warning, which the child turns into its exit
#: status and last line, so that the engine names the cause instead of blaming the GPU binding.
GPU_COUNT_CODE = """
import sys, warnings
import torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    count = torch.cuda.device_count()
failed = [str(w.message) for w in caught if "CUDA initialization" in str(w.message)]
if failed:
    sys.exit(failed[-1].splitlines()[0])
print(count)
"""


def visible_gpu_count() -> int:
    """GPUs CUDA sees in this process's environment, counted in a child process running
    :data:`GPU_COUNT_CODE`: counting here would start the CUDA driver in the engine process, whose
    forked vLLM workers then could not use CUDA (vLLM counts the same way,
    ``cuda_device_count_stateless``).

    Raises:
        RuntimeError: the child could not count: CUDA failed to start there (torch's "CUDA
            initialization" warning, as its message) or the child failed otherwise.
    """
    import subprocess

    proc = subprocess.run([sys.executable, "-c", GPU_COUNT_CODE], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"counting the GPUs in a child process ({sys.executable}) failed: {last}")
    return int(proc.stdout.strip().splitlines()[-1])


def check_gpus(spec: dict, count=visible_gpu_count) -> dict | None:
    """A start-up refusal, or None: an engine with ``tensor_parallel_size = t > 1`` must see the
    ``t`` GPUs its ``CUDA_VISIBLE_DEVICES`` names (``count``: :func:`visible_gpu_count`). A
    launcher that confines each task's processes to its own GPU (Slurm ``--gpus-per-task=1`` with a
    device cgroup, ``ConstrainDevices=yes``) lets the engine, a child of one task, open only that
    task's GPU: CUDA then counts fewer devices (or fails to start), and vLLM's workers would fail
    later with a less clear error."""
    tp = int(spec["llm_kwargs"].get("tensor_parallel_size", 1) or 1)
    if tp <= 1:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        seen = count()
        problem = None if seen >= tp else f"sees {seen}"
    except Exception as err:  # noqa: BLE001 - CUDA could not start: the same cause, reported
        problem = f"cannot start CUDA ({type(err).__name__}: {err})"
    if problem is None:
        return None
    return wire.error_reply(
        f"the rollout engine (rollout.engine_tensor_parallel_size={tp}) was given GPUs CUDA_VISIBLE_DEVICES={visible} "
        f"but {problem}: the launcher confines each task to its own GPU (Slurm --gpus-per-task with a device "
        "cgroup). Launch with --gpus-per-node=G --ntasks-per-node=G, so that every task can open its node's GPUs "
        "(slurm/train.sbatch, docs/slurm.md), or set rollout.engine_tensor_parallel_size=1",
        "environment",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args()
    die_with_parent(args.parent_pid)
    sock = socket.socket(fileno=args.fd)
    spec = json.loads(Path(args.spec).read_text())
    refusal = check_environment(spec) or check_gpus(spec)
    if refusal is not None:
        wire.send_message(sock, refusal)
        sys.exit(3)
    try:
        import vllm

        server = Server(spec)
    except Exception as err:  # noqa: BLE001 - reported to the client
        traceback.print_exc()
        wire.send_message(sock, wire.error_reply(err, "startup"))
        sys.exit(3)
    wire.send_message(sock, {"ok": True, "op": "ready", "pid": os.getpid(), "vllm_version": vllm.__version__,
                             "default_stop_token_ids": server.default_stop, "protocol": wire.PROTOCOL_VERSION})
    while True:
        try:
            req = wire.recv_message(sock)
        except wire.WireClosed:
            return
        op = req.get("op")
        if op == "shutdown":
            wire.send_message(sock, {"ok": True})
            return
        handler = getattr(server, f"op_{op}", None)
        if handler is None:
            wire.send_message(sock, wire.error_reply(f"unknown operation {op!r}", "protocol"))
            continue
        try:
            reply = {"ok": True, **handler(req)}
        except Exception as err:  # noqa: BLE001 - the client raises it
            traceback.print_exc()
            reply = wire.error_reply(err)
        wire.send_message(sock, reply)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's interpreter-exit hooks
