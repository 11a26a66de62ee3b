"""Memory plan of a run with colocated generation: will the actor, the reference policy and the
rollout engine fit on each GPU?

:func:`estimate_memory` is pure arithmetic on parameter counts and the layout (no GPU, no
download): the per-GPU memory of the heaviest rank in the two phases of a step, under the
lifecycle of ``docs/parallelism.md`` ("Memory plan"):

- **generation** (the engine awake): actor weights + gradient buffer + optimizer state (all stay on
  the GPU) + reference weights + the engine's share ``rollout.gpu_memory_utilization x GPU memory``
  (its weights and KV cache; vLLM claims it when it starts and refuses to start when less is free)
  + a reserve;
- **training** (the engine asleep with ``rollout.sleep_between_steps``: vLLM sleep level 1 moves its
  weights to host memory and drops the KV cache): actor + reference + the activations of one
  micro-batch per pipeline stage in flight + the reserve (+ the engine's share when it never sleeps).

:func:`check_memory_plan` refuses a plan that does not fit with a message that names the numbers; it
runs at start-up on GPUs (``fastrl.training.parts``) and with ``python -m fastrl.train --dry-run``
when ``parallel.world_size`` is set. Parameter counts come from a Hugging Face ``config.json``, or
offline from :data:`KNOWN_MODELS` (the Qwen2.5-VL-Instruct family).

The counts are exact for Qwen2 / Qwen2.5-VL (``tests/unit/models/test_memory_plan.py`` checks them
against the published totals); the activation estimate is a model, documented in
:func:`activation_bytes`, that errs on the high side (every row of a micro-batch padded to
``max_prompt_length + max_response_length``, no activation recomputation).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastrl.config import ConfigError, ModelConfig, RunConfig

__all__ = [
    "GIB", "H100_80GB_GIB", "H200_GIB", "KNOWN_MODELS", "MemoryPlan", "ModelDims", "check_memory_plan",
    "estimate_memory", "model_dims",
]

GIB = 2**30
#: Usable memory of one GPU as the driver reports it (nvidia-smi: 81559 MiB; 143771 MiB).
H100_80GB_GIB = 79.6
H200_GIB = 140.4
#: CUDA contexts of the trainer and engine processes, NCCL buffers, allocator fragmentation.
RESERVE_GIB = 5.0
#: vLLM's own memory besides weights and KV cache (activations of its profile run, CUDA graphs).
ENGINE_RUNTIME_GIB = 2.0


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


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of the heaviest rank (GiB) in each phase of a step; see the module docstring."""

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
    reference_gib: float
    engine_gib: float
    engine_weights_gib: float
    kv_cache_gib: float | None
    activations_gib: float
    reserve_gib: float
    engine_sleeps: bool
    sequence_tokens: int
    kv_bytes_per_token: int
    problems: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def resident_gib(self) -> float:
        """What stays on the GPU through the whole step: actor state, reference, reserve."""
        return self.weights_gib + self.grads_gib + self.optimizer_gib + self.reference_gib + self.reserve_gib

    @property
    def generation_gib(self) -> float:
        return self.resident_gib + self.engine_gib

    @property
    def training_gib(self) -> float:
        return self.resident_gib + self.activations_gib + (0.0 if self.engine_sleeps else self.engine_gib)

    @property
    def max_gpu_memory_utilization(self) -> float:
        """The largest ``rollout.gpu_memory_utilization`` the generation phase has room for."""
        return max(0.0, (self.gpu_memory_gib - self.resident_gib) / self.gpu_memory_gib)

    def summary(self) -> str:
        """One line: layout, both phases against the GPU memory."""
        verdict = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"memory plan ({self.model}, TP{self.tp} PP{self.pp} DP{self.dp}, {self.gpu_memory_gib:.1f} GiB per GPU): "
            f"generation {self.generation_gib:.1f} GiB, training {self.training_gib:.1f} GiB: {verdict}"
        )

    def format(self) -> str:
        """A small table (GiB per GPU, heaviest rank)."""
        kv = "-" if self.kv_cache_gib is None else f"{self.kv_cache_gib:.1f}"
        rows = [
            ("actor weights", self.weights_gib, self.weights_gib),
            ("actor gradients", self.grads_gib, self.grads_gib),
            ("optimizer state", self.optimizer_gib, self.optimizer_gib),
            ("reference weights", self.reference_gib, self.reference_gib),
            (f"engine ({self.engine}, TP{self.engine_tp}; weights {self.engine_weights_gib:.1f}, KV {kv})",
             self.engine_gib, 0.0 if self.engine_sleeps else self.engine_gib),
            ("activations (micro-batches in flight)", 0.0, self.activations_gib),
            ("reserve", self.reserve_gib, self.reserve_gib),
            ("total", self.generation_gib, self.training_gib),
        ]
        lines = [self.summary(), f"  {'GiB per GPU':44s} {'generation':>10s} {'training':>10s}"]
        lines += [f"  {name:44s} {gen:10.1f} {train:10.1f}" for name, gen, train in rows]
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


def estimate_memory(cfg: RunConfig, world_size: int, gpu_memory_gib: float, *, dims: ModelDims | None = None,
                    reserve_gib: float = RESERVE_GIB) -> MemoryPlan:
    """The memory plan of ``cfg`` on ``world_size`` GPUs of ``gpu_memory_gib`` each (pure).

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
    stages = [0] if pp == 1 else [0, pp - 1]

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

    best: tuple[float, dict[str, float]] | None = None
    for stage in stages:
        held = _stage_params(dims, tp=tp, pp=pp, stage=stage, trainable=False, freeze_vision=freeze)
        trainable = _stage_params(dims, tp=tp, pp=pp, stage=stage, trainable=True, freeze_vision=freeze)
        in_flight = min(pp - stage, micro_batches)
        act = in_flight * math.ceil(dims.num_layers / pp) * tokens * per_token_layer
        if stage == 0 and dims.is_vision_language and not freeze:
            act += in_flight * par.micro_batch_size * patches * dims.vision_depth * per_patch_block
        if stage == pp - 1:
            act += tokens * dims.vocab_size / tp * logit_bytes
        optimizer_bytes = (8 if fp32 else 12) / (dp if par.use_distributed_optimizer else 1)
        parts = {
            "params": held,
            "weights": held * param_bytes / GIB,
            "grads": trainable * 4 / GIB,  # megatron DDP reduces gradients in fp32
            "optimizer": trainable * optimizer_bytes / GIB,
            "activations": act / GIB,
        }
        total = parts["weights"] + parts["grads"] + parts["optimizer"] + parts["activations"]
        if best is None or total > best[0]:
            best = (total, parts)
    assert best is not None
    parts = best[1]

    alg = cfg.algorithm
    has_reference = (alg.use_kl_loss and alg.kl_coef > 0) or alg.kl_in_reward
    reference = parts["weights"] if has_reference else 0.0
    engine_tp = ro.engine_tensor_parallel_size
    kv_heads_per_gpu = max(1, dims.num_key_value_heads // engine_tp)
    kv_bytes_per_token = 2 * dims.num_layers * kv_heads_per_gpu * dims.head_dim * 2  # K and V, bf16
    if ro.engine == "vllm":
        engine_weights = dims.total_params() * 2 / engine_tp / GIB
        engine = ro.gpu_memory_utilization * gpu_memory_gib
        kv: float | None = engine - engine_weights - ENGINE_RUNTIME_GIB
        sleeps = ro.sleep_between_steps
    else:  # the in-process Hugging Face engine: a full copy of the weights; its KV cache grows per batch
        engine_weights = dims.total_params() * param_bytes / GIB
        engine, kv, sleeps = engine_weights, None, False

    plan = MemoryPlan(
        model=dims.name, total_params=dims.total_params(), gpu_memory_gib=gpu_memory_gib, tp=tp, pp=pp, dp=dp,
        engine=ro.engine, engine_tp=engine_tp, params_per_gpu=int(parts["params"]), weights_gib=parts["weights"],
        grads_gib=parts["grads"], optimizer_gib=parts["optimizer"], reference_gib=reference, engine_gib=engine,
        engine_weights_gib=engine_weights, kv_cache_gib=kv, activations_gib=parts["activations"],
        reserve_gib=reserve_gib, engine_sleeps=sleeps, sequence_tokens=seq, kv_bytes_per_token=kv_bytes_per_token,
    )
    return _with_problems(plan)


def _with_problems(p: MemoryPlan) -> MemoryPlan:
    problems = []
    held = (
        f"actor weights {p.weights_gib:.1f} + gradients {p.grads_gib:.1f} + optimizer {p.optimizer_gib:.1f} + "
        f"reference {p.reference_gib:.1f} + reserve {p.reserve_gib:.1f}"
    )
    if p.generation_gib > p.gpu_memory_gib:
        problems.append(
            f"generation needs {held} + engine {p.engine_gib:.1f} = {p.generation_gib:.1f} GiB > {p.gpu_memory_gib:.1f} GiB "
            f"per GPU; rollout.gpu_memory_utilization must be <= {p.max_gpu_memory_utilization:.2f} here, or use more "
            f"GPUs (the optimizer state is sharded over DP) or larger TP / PP"
        )
    if p.training_gib > p.gpu_memory_gib:
        engine = "" if p.engine_sleeps else f" + engine {p.engine_gib:.1f} (awake: rollout.sleep_between_steps=false)"
        problems.append(
            f"training needs {held} + activations {p.activations_gib:.1f}{engine} = {p.training_gib:.1f} GiB > "
            f"{p.gpu_memory_gib:.1f} GiB per GPU; lower parallel.micro_batch_size or the rollout lengths, or raise TP / PP"
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
    return MemoryPlan(**{**p.__dict__, "problems": tuple(problems)})


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
