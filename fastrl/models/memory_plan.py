"""Memory plan of a run with colocated generation: a timeline of what each kind of GPU holds in
each phase of the run, and whether it fits.

:func:`estimate_memory` is pure arithmetic on parameter counts and the layout (no GPU, no
download), under the lifecycle of ``docs/parallelism.md`` ("Memory plan"). One engine per
model-parallel group, on its source rank (pipeline stage 0, TP rank 0) and, with engine TP > 1,
the next TP ranks of stage 0: a **generating** GPU holds (a TP shard of) an engine, an **other**
GPU none. Per phase and kind, the plan adds the trainer's allocated memory, its caching
allocator's cache (reserved, not freed, until ``torch.cuda.empty_cache()`` after the update), the
engine's memory, and a fixed reserve (CUDA contexts, NCCL, fragmentation):

- **start-up**: the engine starts after the actor (weights, gradient buffer, the optimizer's fp32
  main-weight shard: ``fastrl.training.parts.build_parts`` builds the actor, then the reference,
  then the engine) and before the first optimizer step creates the Adam moments; vLLM claims
  ``rollout.gpu_memory_utilization x GPU memory`` and refuses to start when less is free; the weight
  import's buffers are still cached;
- **generation** / **validation**: the engine awake (its share: weights, KV, runtime); the trainer
  holds actor, gradients, optimizer state, reference and the refit buffers it cached;
- **old/ref log-probs**: the engine asleep (vLLM level 2: weights and KV discarded, its runtime
  stays); one micro-batch's forward activations (no grad);
- **update**: the activations of the micro-batches in flight;
- **refit**: after ``empty_cache``; the engine wakes its weights only; the trainer allocates the
  refit buffers (a bucket's gathered tensors and its flat copy);
- **resumed stage**: the checkpoint loaded (Adam moments exist), the engine started with its whole
  share, the refit.

Without ``rollout.sleep_between_steps`` the engine holds its share in every phase. The plan also
checks that each engine's KV cache holds the rollouts it generates at once (a warning with the
number of waves when fewer fit; refused when not one max-length sequence fits) and reports pinned
host memory per node (0: level-2 sleep keeps nothing on the host).

:func:`check_memory_plan` refuses a plan in which some phase does not fit, with the numbers; it runs
at start-up on GPUs (``fastrl.training.parts``) and when a config with ``parallel.world_size`` and
``parallel.gpu_memory_gib`` is resolved; ``python -m fastrl.train --dry-run`` prints the timeline.
Parameter counts come from a Hugging Face ``config.json``, or offline from :data:`KNOWN_MODELS`.
Every shipped GPU recipe keeps :func:`recipe_margin_gib` free at every phase
(``tests/unit/models/test_memory_plan.py``); ``tools/memory_table.py`` writes the table of
``docs/parallelism.md``.

The counts are exact for Qwen2 / Qwen2.5-VL (checked against the published totals); the
activation estimate is a model, documented in :func:`activation_bytes`, that errs on the high side
(every row of a micro-batch padded to ``max_prompt_length + max_response_length``, no activation
recomputation).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastrl.config import ConfigError, ModelConfig, RunConfig

__all__ = [
    "GIB", "GPU_KINDS", "H100_80GB_GIB", "H200_GIB", "KNOWN_MODELS", "KVCheck", "MemoryPlan", "ModelDims", "PHASES",
    "IPC_CONTEXT_GIB", "PhaseRow", "check_memory_plan", "estimate_memory", "model_dims", "recipe_margin_gib",
]

GIB = 2**30
#: Usable memory of one GPU as the driver reports it (nvidia-smi: 81559 MiB; 143771 MiB).
H100_80GB_GIB = 79.6
H200_GIB = 140.4
#: CUDA contexts of the trainer and engine processes, NCCL buffers, allocator fragmentation.
RESERVE_GIB = 5.0
#: vLLM's own memory besides weights and KV cache (activations of its profile run, CUDA graphs);
#: it stays on the GPU while the engine sleeps.
ENGINE_RUNTIME_GIB = 2.0
#: A CUDA context that each vLLM worker other than the first of an engine with tensor parallelism
#: opens on the trainer's GPU (the source rank's, the engine's ``cuda:0``) when it maps the refit
#: bucket's IPC handle (``engine_server.reload_ipc_bucket``); it stays for the worker's life.
IPC_CONTEXT_GIB = 0.5
#: The free memory every shipped GPU recipe keeps at every phase: 2 GiB or 3 % of the GPU.
RECIPE_MARGIN_GIB, RECIPE_MARGIN_FRACTION = 2.0, 0.03


def recipe_margin_gib(gpu_memory_gib: float) -> float:
    """The margin a shipped recipe keeps on a GPU of ``gpu_memory_gib``: the larger of 2 GiB and 3 %."""
    return max(RECIPE_MARGIN_GIB, RECIPE_MARGIN_FRACTION * gpu_memory_gib)


@dataclass(frozen=True)
class ModelDims:
    """The shapes that decide the parameter count of a Qwen2 / Qwen2.5-VL model (Hugging Face names)."""

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    # vision tower (Qwen2.5-VL); depth 0: a text-only model
    vision_depth: int = 0
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    vision_patch_size: int = 14
    vision_temporal_patch_size: int = 2
    vision_in_channels: int = 3
    vision_spatial_merge_size: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """Width of the key (and of the value) projection: kv heads x head dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def is_vision_language(self) -> bool:
        return self.vision_depth > 0

    def layer_params(self) -> int:
        """One decoder layer: q/k/v (with bias), o (no bias), SwiGLU MLP (no bias), two RMSNorms."""
        h, kv, inter = self.hidden_size, self.kv_size, self.intermediate_size
        return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h

    def embedding_params(self) -> int:
        """The input embedding (the output layer has as many unless tied)."""
        return self.vocab_size * self.hidden_size

    def language_params(self) -> int:
        """Embedding, layers, final norm and (untied) output layer."""
        heads = 1 if self.tie_word_embeddings else 2
        return heads * self.embedding_params() + self.num_layers * self.layer_params() + self.hidden_size

    def vision_block_params(self) -> int:
        """The vision blocks and the patch embedding (``model.freeze_vision_tower`` freezes these)."""
        if not self.is_vision_language:
            return 0
        hv, iv = self.vision_hidden_size, self.vision_intermediate_size
        block = 2 * hv + (hv * 3 * hv + 3 * hv) + (hv * hv + hv) + 2 * (hv * iv + iv) + (iv * hv + hv)
        patch = self.vision_in_channels * self.vision_temporal_patch_size * self.vision_patch_size**2 * hv
        return self.vision_depth * block + patch

    def merger_params(self) -> int:
        """The patch merger: RMSNorm, then MLP (merge^2 x hv -> same -> language hidden size)."""
        if not self.is_vision_language:
            return 0
        hv, m2 = self.vision_hidden_size, self.vision_spatial_merge_size**2
        return hv + (hv * m2 * hv * m2 + hv * m2) + (hv * m2 * self.hidden_size + self.hidden_size)

    def vision_params(self) -> int:
        return self.vision_block_params() + self.merger_params()

    def total_params(self) -> int:
        return self.language_params() + self.vision_params()

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "") -> "ModelDims":
        """From a Hugging Face ``config.json`` (Qwen2, Llama, Qwen2.5-VL with top-level or
        ``text_config`` language fields)."""
        text = dict(config)
        text.update(config.get("text_config") or {})
        vision = config.get("vision_config") or {}
        heads = int(text["num_attention_heads"])
        return cls(
            name=name or str(text.get("_name_or_path") or text.get("model_type", "model")),
            hidden_size=int(text["hidden_size"]),
            num_layers=int(text["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            vision_depth=int(vision.get("depth", 0)) if config.get("model_type") == "qwen2_5_vl" else 0,
            vision_hidden_size=int(vision.get("hidden_size", 0)),
            vision_intermediate_size=int(vision.get("intermediate_size", 0)),
            vision_patch_size=int(vision.get("patch_size", 14)),
            vision_temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            vision_in_channels=int(vision.get("in_chans", vision.get("in_channels", 3))),
            vision_spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
        )


def _qwen25_vl(name: str, hidden: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int,
               tied: bool) -> ModelDims:
    # every Qwen2.5-VL size shares the vision tower: depth 32, hidden 1280, MLP 3420, 14 px patches
    return ModelDims(
        name=name, hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied,
        vision_depth=32, vision_hidden_size=1280, vision_intermediate_size=3420,
    )


#: The published Qwen2.5-VL-Instruct configs (config.json on the hub), so plans work offline.
KNOWN_MODELS: dict[str, ModelDims] = {
    d.name: d
    for d in (
        _qwen25_vl("Qwen/Qwen2.5-VL-3B-Instruct", 2048, 36, 16, 2, 11008, 151936, True),
        _qwen25_vl("Qwen/Qwen2.5-VL-7B-Instruct", 3584, 28, 28, 4, 18944, 152064, False),
        _qwen25_vl("Qwen/Qwen2.5-VL-32B-Instruct", 5120, 64, 40, 8, 27648, 152064, False),
        _qwen25_vl("Qwen/Qwen2.5-VL-72B-Instruct", 8192, 80, 64, 8, 29568, 152064, False),
    )
}


def _known(path_or_id: str) -> ModelDims | None:
    if path_or_id in KNOWN_MODELS:
        return KNOWN_MODELS[path_or_id]
    base = Path(path_or_id.rstrip("/")).name.lower()
    for key, dims in KNOWN_MODELS.items():
        if key.split("/")[-1].lower() == base:
            return dims
    return None


def _tiny_dims(m: ModelConfig) -> ModelDims:
    # the tiny model's word-level vocabulary is a few hundred tokens at most; 512 bounds it
    return ModelDims(
        name="tiny", hidden_size=m.tiny_hidden_size, num_layers=m.tiny_num_layers,
        num_attention_heads=m.tiny_num_attention_heads, num_key_value_heads=m.tiny_num_key_value_heads,
        intermediate_size=m.tiny_intermediate_size, vocab_size=512, vision_depth=m.tiny_vision_depth,
        vision_hidden_size=m.tiny_vision_hidden_size, vision_intermediate_size=4 * m.tiny_vision_hidden_size,
    )


def model_dims(model: ModelConfig, hf_dir: str | Path | None = None) -> ModelDims | None:
    """The shapes of the run's model, without downloading anything: ``hf_dir``'s ``config.json``;
    else ``model.hf_path`` as a local directory, a known id (:data:`KNOWN_MODELS`, also matched by
    the directory's name) or a config already in the hub cache; the ``tiny_*`` fields for
    ``source='tiny'``. None when nothing says."""
    for candidate in (hf_dir, model.hf_path if model.source == "hf" else None):
        if candidate is not None and (Path(candidate).expanduser() / "config.json").is_file():
            return _read_dims(Path(candidate).expanduser() / "config.json", str(candidate))
    if model.source == "tiny":
        return _tiny_dims(model)
    if not model.hf_path:
        return None
    known = _known(model.hf_path)
    if known is not None:
        return known
    from fastrl.models.hub import hub_cache_dir, is_hub_id

    if is_hub_id(model.hf_path):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model.hf_path, "config.json", cache_dir=str(hub_cache_dir()))
        except Exception:  # noqa: BLE001 - a plan without counts is reported, never fatal here
            cached = None
        if isinstance(cached, str):
            return _read_dims(Path(cached), model.hf_path)
    return None


def _read_dims(path: Path, name: str) -> ModelDims | None:
    """:meth:`ModelDims.from_hf_config` of a ``config.json``; None when it lacks the fields."""
    try:
        return ModelDims.from_hf_config(json.loads(path.read_text()), name)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def activation_bytes(d: ModelDims, *, tp: int, sequence_parallel: bool, element_bytes: int) -> tuple[int, int]:
    """Bytes kept for the backward pass: (per token per decoder layer, per image patch per vision block).

    Decoder layer (flash attention, no dropout, no recomputation): the inputs of the two norms and
    of the QKV and FC1 GEMMs (4 x hidden, replicated over TP unless sequence parallel), the q/k/v
    outputs and the attention output (2 x hidden + 2 x kv), the FC1 output (2 x intermediate) and
    the SwiGLU output (intermediate), split over TP. Vision block (the Hugging Face module,
    replicated over TP): 8 x hidden + 4 x intermediate per patch.
    """
    h, kv, inter = d.hidden_size, d.kv_size, d.intermediate_size
    replicated = 4 * h / (tp if sequence_parallel else 1)
    split = (2 * h + 2 * kv + 3 * inter) / tp
    vision = 8 * d.vision_hidden_size + 4 * d.vision_intermediate_size
    return math.ceil(element_bytes * (replicated + split)), element_bytes * vision


#: Phases of the timeline, in the order a run meets them (:func:`estimate_memory`).
PHASES = ("start-up", "generation", "old/ref log-probs", "update", "refit", "validation", "resumed stage")
#: The two kinds of GPU: one that holds (a TP shard of) a rollout engine, and one that does not.
GPU_KINDS = ("generating", "other")


@dataclass(frozen=True)
class PhaseRow:
    """One phase on one kind of GPU (GiB): what the trainer has allocated, what its caching allocator
    holds beyond that (reserved, not freed), what the engine holds, the fixed reserve."""

    phase: str
    gpu: str  # "generating" or "other"
    trainer_gib: float
    cache_gib: float
    engine_gib: float
    engine_state: str
    reserve_gib: float
    gpu_memory_gib: float

    @property
    def total_gib(self) -> float:
        return self.trainer_gib + self.cache_gib + self.engine_gib + self.reserve_gib

    @property
    def margin_gib(self) -> float:
        """Free memory left on the GPU in this phase (negative: it does not fit)."""
        return self.gpu_memory_gib - self.total_gib

    def describe(self) -> str:
        where = "a generating GPU" if self.gpu == "generating" else "a GPU without an engine"
        return (
            f"{self.phase} on {where} needs trainer {self.trainer_gib:.1f} + allocator cache "
            f"{self.cache_gib:.1f} + engine {self.engine_gib:.1f} ({self.engine_state}) + reserve "
            f"{self.reserve_gib:.1f} = {self.total_gib:.1f} GiB"
        )


@dataclass(frozen=True)
class KVCheck:
    """Can each engine hold the rollouts it generates at once (one phase: training or validation)?"""

    phase: str
    rollouts_per_engine: int  # generated at once by one engine (vLLM's max_num_seqs caps it when set)
    sequence_tokens: int
    kv_cache_gib: float  # per engine GPU
    kv_bytes_per_token: int  # per engine GPU
    sequences_fit: int  # max-length sequences the KV cache holds at once

    @property
    def tokens_needed(self) -> int:
        return self.rollouts_per_engine * self.sequence_tokens

    @property
    def waves(self) -> int:
        """Rounds vLLM needs to run every rollout (0: not even one sequence fits)."""
        return math.ceil(self.rollouts_per_engine / self.sequences_fit) if self.sequences_fit > 0 else 0

    def describe(self) -> str:
        need = self.tokens_needed * self.kv_bytes_per_token / GIB
        return (
            f"{self.phase}: {self.rollouts_per_engine} rollouts per engine x {self.sequence_tokens} tokens need "
            f"{need:.1f} GiB of KV per engine GPU; {self.kv_cache_gib:.1f} GiB holds {self.sequences_fit} "
            f"({self.waves} wave{'s' if self.waves != 1 else ''})"
        )


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory (GiB) of each phase of a run on each kind of GPU; see the module docstring.

    The part fields (``weights_gib`` ...) are those of the heaviest stage of a generating GPU
    (pipeline stage 0, where the engine's GPUs are); ``timeline`` has every phase on both kinds.
    """

    model: str
    total_params: int
    gpu_memory_gib: float
    tp: int
    pp: int
    dp: int
    engine: str
    engine_tp: int
    params_per_gpu: int
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    optimizer_moments_gib: float  # the part of optimizer_gib created at the first step (Adam moments)
    reference_gib: float
    engine_gib: float
    engine_weights_gib: float
    engine_asleep_gib: float
    kv_cache_gib: float | None
    activations_gib: float
    forward_activations_gib: float
    transfer_gib: float
    reserve_gib: float
    engine_sleeps: bool
    sequence_tokens: int
    kv_bytes_per_token: int
    generating_gpus: int
    other_gpus: int
    engines: int
    timeline: tuple[PhaseRow, ...]
    kv_checks: tuple[KVCheck, ...]
    pinned_host_gib_per_node: float
    load_host_gib_per_node: float
    problems: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return not self.problems

    def row(self, phase: str, gpu: str = "generating") -> PhaseRow:
        for r in self.timeline:
            if r.phase == phase and r.gpu == gpu:
                return r
        raise KeyError((phase, gpu))

    @property
    def peak(self) -> PhaseRow:
        return max(self.timeline, key=lambda r: r.total_gib)

    @property
    def min_margin_gib(self) -> float:
        return min(r.margin_gib for r in self.timeline)

    @property
    def generation_gib(self) -> float:
        return self.row("generation").total_gib

    @property
    def training_gib(self) -> float:
        """The heavier of the old/ref and update phases on either kind of GPU."""
        return max(r.total_gib for r in self.timeline if r.phase in ("old/ref log-probs", "update"))

    @property
    def max_gpu_memory_utilization(self) -> float:
        """The largest ``rollout.gpu_memory_utilization`` (two decimals, rounded down) the phases with
        the engine's whole share have room for."""
        if self.engine != "vllm":
            return 1.0
        share = self.engine_gib
        need = max(r.total_gib - r.engine_gib for r in self.timeline if r.gpu == "generating" and r.engine_gib == share)
        return max(0.0, math.floor(100 * (self.gpu_memory_gib - need) / self.gpu_memory_gib) / 100)

    def summary(self) -> str:
        verdict = "fits" if self.fits else "DOES NOT FIT"
        p = self.peak
        return (
            f"memory plan ({self.model}, TP{self.tp} PP{self.pp} DP{self.dp}, {self.gpu_memory_gib:.1f} GiB per GPU): "
            f"peak {p.total_gib:.1f} GiB ({p.phase}, {p.gpu} GPU), smallest margin {self.min_margin_gib:.1f} GiB: {verdict}"
        )

    def format(self) -> str:
        """The timeline as a table (GiB per GPU) and the parts, KV, host-memory lines."""
        kv = "-" if self.kv_cache_gib is None else f"{self.kv_cache_gib:.1f}"
        sleep = "sleeps at level 2 between steps" if self.engine_sleeps else "never sleeps"
        lines = [
            self.summary(),
            f"  parts (stage 0): actor weights {self.weights_gib:.1f}, gradients {self.grads_gib:.1f}, optimizer "
            f"{self.optimizer_gib:.1f} (Adam moments {self.optimizer_moments_gib:.1f} of it, from the first step), "
            f"reference {self.reference_gib:.1f}, activations: update {self.activations_gib:.1f}, forward "
            f"{self.forward_activations_gib:.1f}; refit / import buffers {self.transfer_gib:.1f}; reserve {self.reserve_gib:.1f}",
            f"  engines: {self.engines} ({self.engine}, TP{self.engine_tp}) on {self.generating_gpus} generating GPUs, "
            f"{self.other_gpus} other GPUs without one; share {self.engine_gib:.1f} per engine GPU (weights "
            f"{self.engine_weights_gib:.1f}, KV {kv}); {sleep}",
            f"  {'phase':18s} {'GPU':10s} {'trainer':>8s} {'cache':>6s} {'engine':>7s} {'reserve':>7s} {'total':>6s} "
            f"{'margin':>7s}  engine state",
        ]
        for r in self.timeline:
            lines.append(
                f"  {r.phase:18s} {r.gpu:10s} {r.trainer_gib:8.1f} {r.cache_gib:6.1f} {r.engine_gib:7.1f} "
                f"{r.reserve_gib:7.1f} {r.total_gib:6.1f} {r.margin_gib:7.1f}  {r.engine_state}"
            )
        lines += [f"  KV {k.describe()}" for k in self.kv_checks]
        lines.append(
            f"  host memory per node: pinned {self.pinned_host_gib_per_node:.1f} GiB (level-2 sleep keeps nothing); "
            f"a resumed stage reads the optimizer state into {self.load_host_gib_per_node:.1f} GiB (not pinned)"
        )
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def _stage_params(d: ModelDims, *, tp: int, pp: int, stage: int, trainable: bool, freeze_vision: bool) -> float:
    """Parameters held by one TP rank of pipeline stage ``stage`` (trainable ones only if asked)."""
    layers = math.ceil(d.num_layers / pp)
    params = layers * d.layer_params() / tp
    if stage == 0:
        params += d.embedding_params() / tp
        # the vision tower is the Hugging Face module, replicated over TP, on the first stage
        params += d.merger_params() + (0 if trainable and freeze_vision else d.vision_block_params())
    if stage == pp - 1:
        params += d.hidden_size
        if not d.tie_word_embeddings or pp > 1:
            params += d.embedding_params() / tp
    return params


#: Buffers of one refit bucket on the trainer side: the gathered full tensors and their flat copy.
REFIT_BUFFERS = 2
#: GPUs per node, for the host-memory lines.
GPUS_PER_NODE = 8


def _largest_group_params(d: ModelDims) -> int:
    """The largest weight group a refit bucket carries whole (``engine_wire.weight_group``): a decoder
    layer, a vision block, the merger, or the embedding / output layer."""
    hv, iv = d.vision_hidden_size, d.vision_intermediate_size
    block = (2 * hv + hv * 3 * hv + 3 * hv + hv * hv + hv + 2 * (hv * iv + iv) + iv * hv + hv) if d.is_vision_language else 0
    return max(d.layer_params(), d.embedding_params(), block, d.merger_params())


def estimate_memory(cfg: RunConfig, world_size: int, gpu_memory_gib: float, *, dims: ModelDims | None = None,
                    reserve_gib: float = RESERVE_GIB) -> MemoryPlan:
    """The memory timeline of ``cfg`` on ``world_size`` GPUs of ``gpu_memory_gib`` each (pure).

    Args:
        cfg: the run (layout, precision, rollout engine and lengths, micro-batch, KL).
        world_size: processes (GPUs); dp = world_size / (TP x PP).
        gpu_memory_gib: memory of one GPU.
        dims: the model's shapes (default: :func:`model_dims` of ``cfg.model``).
        reserve_gib: kept free for CUDA contexts, NCCL and fragmentation.

    Raises:
        ConfigError: the layout does not divide ``world_size``, or no parameter counts are known.
    """
    dims = dims or model_dims(cfg.model)
    if dims is None:
        raise ConfigError(
            f"memory plan: no parameter counts for model.hf_path={cfg.model.hf_path!r} (not a local directory, "
            f"not a known model, not in the hub cache)"
        )
    par, pre, ro = cfg.parallel, cfg.precision, cfg.rollout
    tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
    dp = par.dp_size(world_size)
    fp32 = pre.mode == "fp32"
    param_bytes = 4 if fp32 else 2
    freeze = cfg.model.freeze_vision_tower

    # micro-batches of one update on one DP rank (the pipeline keeps up to pp of them in flight)
    rollouts = max(1, cfg.trainer.mini_batch_prompts * ro.n // dp)
    micro_batches = max(1, rollouts // par.micro_batch_size)
    seq = ro.max_prompt_length + ro.max_response_length
    tokens = par.micro_batch_size * seq
    per_token_layer, per_patch_block = activation_bytes(dims, tp=tp, sequence_parallel=par.sequence_parallel,
                                                        element_bytes=param_bytes)
    # one image per prompt at the processor's lower bound (28 x 28 pixels per merged token)
    image_tokens = min(ro.max_prompt_length, max(1, cfg.data.min_pixels // (28 * 28))) if dims.is_vision_language else 0
    patches = image_tokens * dims.vision_spatial_merge_size**2
    logit_bytes = 12 if fp32 else 10  # logits, fp32 log-softmax and its gradient
    alg = cfg.algorithm
    has_reference = (alg.use_kl_loss and alg.kl_coef > 0) or alg.kl_in_reward
    # fp32 runs: no separate main weights, Adam moments 8 B; else fp32 main weights 4 B + moments 8 B
    main_bytes, moment_bytes = (0, 8) if fp32 else (4, 8)
    shard = dp if par.use_distributed_optimizer else 1

    def stage_parts(stage: int) -> dict[str, float]:
        held = _stage_params(dims, tp=tp, pp=pp, stage=stage, trainable=False, freeze_vision=freeze)
        trainable = _stage_params(dims, tp=tp, pp=pp, stage=stage, trainable=True, freeze_vision=freeze)
        in_flight = min(pp - stage, micro_batches)
        layers = math.ceil(dims.num_layers / pp)
        act = in_flight * layers * tokens * per_token_layer
        fwd = tokens * per_token_layer  # no grad: one layer's activations at a time
        if stage == 0 and dims.is_vision_language:
            vision = par.micro_batch_size * patches * per_patch_block
            fwd += vision
            if not freeze:
                act += in_flight * vision * dims.vision_depth
        if stage == pp - 1:
            logits = tokens * dims.vocab_size / tp * logit_bytes
            act += logits
            fwd += logits
        weights = held * param_bytes / GIB
        return {
            "params": held, "weights": weights, "grads": trainable * 4 / GIB,  # megatron DDP: fp32 gradients
            "main": trainable * main_bytes / shard / GIB, "moments": trainable * moment_bytes / shard / GIB,
            "reference": weights if has_reference else 0.0, "act": act / GIB, "fwd": fwd / GIB,
        }

    stages = [stage_parts(s) for s in range(pp)]
    engine_tp = ro.engine_tensor_parallel_size
    transfer = REFIT_BUFFERS * max(ro.refit_bucket_mb * 2**20, _largest_group_params(dims) * param_bytes) / GIB
    kv_heads_per_gpu = max(1, dims.num_key_value_heads // engine_tp)
    kv_bytes_per_token = 2 * dims.num_layers * kv_heads_per_gpu * dims.head_dim * 2  # K and V, bf16
    if ro.engine == "vllm":
        engine_weights = dims.total_params() * 2 / engine_tp / GIB
        share = ro.gpu_memory_utilization * gpu_memory_gib
        kv: float | None = share - engine_weights - ENGINE_RUNTIME_GIB
        sleeps = ro.sleep_between_steps
    else:  # the in-process Hugging Face engine: a full copy of the weights; its KV cache grows per batch
        engine_weights = dims.total_params() * param_bytes / GIB
        share, kv, sleeps = engine_weights, None, False
    asleep = ENGINE_RUNTIME_GIB if sleeps else share  # level 2: weights and KV discarded, the runtime stays
    awake_state = "awake: weights + KV" if ro.engine == "vllm" else "in-process copy"

    # One engine per model-parallel group, on its source rank (pipeline stage 0, TP rank 0), spanning
    # TP ranks 0 .. engine_tp - 1 of stage 0; the other GPUs of the group hold none.
    mp = tp * pp
    engines = dp
    per_group_generating = min(engine_tp, mp)
    generating_gpus = engines * per_group_generating
    other_gpus = world_size - generating_gpus
    other_stages = ([0] if engine_tp < tp else []) + list(range(1, pp))

    def rows_for(kind: str, parts: dict[str, float]) -> list[PhaseRow]:
        gen = kind == "generating"
        start = parts["weights"] + parts["grads"] + parts["main"] + parts["reference"]
        full = start + parts["moments"]
        awake = share if gen else 0.0
        sleeping = asleep if gen else 0.0
        sleeping_state = ("asleep (level 2)" if sleeps else awake_state) if gen else "no engine"
        refit_engine = (engine_weights + ENGINE_RUNTIME_GIB if sleeps else share) if gen else 0.0
        refit_state = ("weights only" if sleeps else awake_state) if gen else "no engine"
        gen_state = awake_state if gen else "no engine"
        fwd, act = parts["fwd"], parts["act"]
        # (phase, trainer allocated, reserved transient since the last empty_cache, engine, its state)
        # from the first refit on, the engine's other TP workers hold a context on the source GPU
        contexts = (per_group_generating - 1) * IPC_CONTEXT_GIB if gen and ro.engine == "vllm" else 0.0
        spec = [
            # engine start after the actor (weights, gradient buffer, main-weight shard) and the
            # reference: the Adam moments do not exist yet; the weight import's buffers stay cached
            ("start-up", start, transfer, awake, "starting: claims its share" if gen else "no engine"),
            # after a refit (empty_cache after it, on the GPU): nothing cached; step 1's generation,
            # before any refit, holds the start-up cache but no Adam moments (below start-up + moments)
            ("generation", full, 0.0, awake + contexts, gen_state),
            ("old/ref log-probs", full + fwd, max(transfer, fwd), sleeping + contexts, sleeping_state),
            ("update", full + act, max(transfer, fwd, act), sleeping + contexts, sleeping_state),
            # empty_cache after the update: the cache drops to what is allocated; the buffers are allocated
            ("refit", full + transfer, transfer, refit_engine + contexts, refit_state),
            ("validation", full, 0.0, awake + contexts, gen_state),
            # the checkpoint loaded (Adam moments exist), the engine started and put to sleep, the refit
            ("resumed stage", full + transfer, transfer, refit_engine + contexts,
             ("started, asleep, refit: " + refit_state) if gen else "no engine"),
        ]
        out = []
        for phase, allocated, peak, engine_gib, state in spec:
            # the caching allocator keeps the largest transient since the last empty_cache reserved:
            # what it holds beyond the allocated memory is the cache
            base = start if phase == "start-up" else full
            cache = max(0.0, base + peak - allocated)
            out.append(PhaseRow(phase, kind, allocated, cache, engine_gib, state, reserve_gib, gpu_memory_gib))
        return out

    def heaviest(kind: str, candidates: list[int]) -> list[PhaseRow]:
        per_stage = [rows_for(kind, stages[s]) for s in candidates]
        return [max(rows, key=lambda r: r.total_gib) for rows in zip(*per_stage)]

    timeline = heaviest("generating", [0])
    if other_gpus > 0 and other_stages:
        timeline += heaviest("other", other_stages)
    elif other_gpus > 0:  # engine TP > TP: the engine spans TP groups (refused below)
        timeline += heaviest("other", list(range(pp)))

    kv_checks: list[KVCheck] = []
    if kv is not None:
        cap = getattr(ro, "max_num_seqs", None)
        per_token = kv_bytes_per_token
        fit = max(0, int(kv * GIB // (per_token * seq)))
        for phase, count in (("training", math.ceil(ro.prompts_per_step / engines) * ro.n),
                             ("validation", math.ceil(cfg.data.val_size / engines) * ro.val_n)):
            at_once = min(count, cap) if cap else count
            kv_checks.append(KVCheck(phase, at_once, seq, kv, per_token, fit))

    s0 = stages[0]
    # a resumed stage: each rank reads its (DP-unsharded) optimizer state into host memory, then keeps its shard
    load_host = sum((st["main"] + st["moments"]) * shard for st in stages) / pp * min(world_size, GPUS_PER_NODE)
    plan = MemoryPlan(
        model=dims.name, total_params=dims.total_params(), gpu_memory_gib=gpu_memory_gib, tp=tp, pp=pp, dp=dp,
        engine=ro.engine, engine_tp=engine_tp, params_per_gpu=int(s0["params"]), weights_gib=s0["weights"],
        grads_gib=s0["grads"], optimizer_gib=s0["main"] + s0["moments"], optimizer_moments_gib=s0["moments"],
        reference_gib=s0["reference"], engine_gib=share, engine_weights_gib=engine_weights,
        engine_asleep_gib=asleep, kv_cache_gib=kv, activations_gib=s0["act"], forward_activations_gib=s0["fwd"],
        transfer_gib=transfer, reserve_gib=reserve_gib, engine_sleeps=sleeps, sequence_tokens=seq,
        kv_bytes_per_token=kv_bytes_per_token, generating_gpus=generating_gpus, other_gpus=other_gpus,
        engines=engines, timeline=tuple(timeline), kv_checks=tuple(kv_checks), pinned_host_gib_per_node=0.0,
        load_host_gib_per_node=load_host,
    )
    return _with_problems(plan)


def _with_problems(p: MemoryPlan) -> MemoryPlan:
    problems, warnings = [], []
    for r in p.timeline:
        if r.total_gib > p.gpu_memory_gib:
            hint = (
                f"; rollout.gpu_memory_utilization must be <= {p.max_gpu_memory_utilization:.2f} here"
                if r.gpu == "generating" and p.engine == "vllm" and r.engine_gib == p.engine_gib else ""
            )
            problems.append(
                f"{r.describe()} > {p.gpu_memory_gib:.1f} GiB per GPU{hint}; lower parallel.micro_batch_size or the "
                f"rollout lengths, use more GPUs (the optimizer state is sharded over DP) or larger TP / PP"
            )
    if p.engine_tp > p.tp:
        problems.append(
            f"rollout.engine_tensor_parallel_size={p.engine_tp} > parallel.tensor_model_parallel_size={p.tp}: the "
            f"engine's GPUs would reach past its TP group onto another generating rank's"
        )
    if p.kv_cache_gib is not None:
        one = p.kv_bytes_per_token * p.sequence_tokens / GIB
        if p.kv_cache_gib < one:
            problems.append(
                f"the engine's share of {p.engine_gib:.1f} GiB holds its weights ({p.engine_weights_gib:.1f} GiB at "
                f"engine TP{p.engine_tp}) and {ENGINE_RUNTIME_GIB:.1f} GiB of runtime, leaving {p.kv_cache_gib:.1f} GiB "
                f"of KV cache, less than one sequence of {p.sequence_tokens} tokens ({one:.2f} GiB); raise "
                f"rollout.gpu_memory_utilization or rollout.engine_tensor_parallel_size"
            )
        else:
            for k in p.kv_checks:
                if k.sequences_fit < k.rollouts_per_engine:
                    warnings.append(f"KV {k.describe()}: vLLM runs them in {k.waves} waves")
    return replace(p, problems=tuple(problems), warnings=tuple(warnings))


def check_memory_plan(cfg: RunConfig, world_size: int, gpu_memory_gib: float, *, dims: ModelDims | None = None) -> MemoryPlan:
    """:func:`estimate_memory`, refused when it does not fit.

    Raises:
        ConfigError: the plan does not fit (the message names every number), or has no counts.
    """
    plan = estimate_memory(cfg, world_size, gpu_memory_gib, dims=dims)
    if not plan.fits:
        raise ConfigError(f"{plan.summary()}: " + "; ".join(plan.problems))
    return plan



def config_check(cfg: RunConfig) -> MemoryPlan | None:
    """The check when a config is resolved (``python -m fastrl.train``, also with ``--dry-run``):
    with ``parallel.world_size`` and ``parallel.gpu_memory_gib`` both set (every GPU recipe sets
    them) and parameter counts known here; None when not applicable.

    Raises:
        ConfigError: the plan does not fit (the message names every number).
    """
    par = cfg.parallel
    if par.world_size is None or par.gpu_memory_gib is None:
        return None
    dims = model_dims(cfg.model)
    if dims is None:
        return None  # checked at start-up with the downloaded config
    return check_memory_plan(cfg, par.world_size, par.gpu_memory_gib, dims=dims)


def dry_run_report(cfg: RunConfig) -> str:
    """What ``python -m fastrl.train --dry-run`` prints when ``parallel.world_size`` is set: the plan
    as comment lines (a plan that does not fit was refused by :func:`config_check` already when
    ``parallel.gpu_memory_gib`` is set; without it an H100 80GB is assumed and nothing enforced)."""
    assert cfg.parallel.world_size is not None
    dims = model_dims(cfg.model)
    if dims is None:
        return (
            f"# memory plan: not estimated (no parameter counts for model.hf_path={cfg.model.hf_path!r} here; "
            f"it is checked at start-up on the GPUs)"
        )
    gib = cfg.parallel.gpu_memory_gib or H100_80GB_GIB
    plan = estimate_memory(cfg, cfg.parallel.world_size, gib, dims=dims)
    table = "\n".join(f"# {line}" for line in plan.format().splitlines())
    if cfg.parallel.gpu_memory_gib is None:
        table += "\n# (parallel.gpu_memory_gib not set: an H100 80GB assumed, not enforced; start-up checks the device)"
    return table


def startup_check(cfg: RunConfig, world_size: int, device_gib: float, hf_dir: str | Path) -> MemoryPlan | None:
    """The check at start-up on GPUs, before any model is built: the plan on the smaller of the
    device's memory and ``parallel.gpu_memory_gib``, with the counts of ``hf_dir``'s config
    (None: a config without the fields the counts need).

    Raises:
        ConfigError: the plan does not fit.
    """
    dims = model_dims(cfg.model, hf_dir)
    if dims is None:
        return None
    gib = min(device_gib, cfg.parallel.gpu_memory_gib or device_gib)
    return check_memory_plan(cfg, world_size, gib, dims=dims)
