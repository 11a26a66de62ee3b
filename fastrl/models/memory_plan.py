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
- **save**: every save follows a validation (or a verified refit): the engine awake; with
  ``checkpoint.optimizer_format=fully_reshardable`` megatron-core's gather of each fp32 optimizer
  state on the GPU (:func:`save_gather_gib`), refused with the format to use when it does not fit;
- **resume load**: a resumed stage loads its checkpoint (the Adam moments appear) while its freshly
  started engine holds its whole share;
- **resumed stage**: the checkpoint loaded, the engine put to sleep, the refit.

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

import math
from dataclasses import replace
from pathlib import Path

from fastrl.config import ConfigError, RunConfig
from fastrl.models.memory_timeline import GIB, KVCheck, MemoryPlan, PhaseRow
from fastrl.models.model_dims import KNOWN_MODELS, ModelDims, activation_bytes, model_dims

__all__ = [
    "GIB", "GPU_KINDS", "H100_80GB_GIB", "H200_GIB", "KNOWN_MODELS", "KVCheck", "MemoryPlan", "ModelDims", "PHASES",
    "IPC_CONTEXT_GIB", "PhaseRow", "check_memory_plan", "estimate_memory", "model_dims", "recipe_margin_gib",
]

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


#: Phases of the timeline, in the order a run meets them (:func:`estimate_memory`).
PHASES = ("start-up", "generation", "old/ref log-probs", "update", "refit", "validation", "save", "resume load",
          "resumed stage")
#: The two kinds of GPU: one that holds (a TP shard of) a rollout engine, and one that does not.
GPU_KINDS = ("generating", "other")


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


def save_gather_gib(trainable_params: float, *, dp: int) -> float:
    """GPU memory (GiB) of megatron-core 0.16.1's ``fully_reshardable`` save gather on one rank.

    ``DistributedOptimizer.sharded_param_state_fully_reshardable`` (without
    ``distrib_optim_fully_reshardable_mem_efficient``) calls ``get_parameter_state_dp_zero(
    use_gloo_comm=False, return_on_all_ranks=True)``: for each of ``param``, ``exp_avg``,
    ``exp_avg_sq`` and each bucket of the gradient buffer (FastRL's DDP has
    ``overlap_grad_reduce=False``: one bucket, the whole buffer) every DP rank copies its fp32 shard
    to the GPU (``4 P / dp`` bytes) and ``torch.distributed.all_gather``s it into a list of ``dp``
    GPU tensors of the shard's size (``4 P``). NCCL's all-gather into a list of separate tensors
    goes through one flat output buffer that torch allocates and then copies out of
    (``ProcessGroupNCCL::allgather``): another ``4 P``, counted here, so the estimate errs high.
    The tensors are freed per state, so the peak is one state's: ``8 P + 4 P / dp`` bytes, ``P``
    the trainable parameters the rank holds. Host memory: every rank also builds the three
    world-sized fp32 tensors in host memory (``12 P``).
    """
    return (8 * trainable_params + 4 * trainable_params / dp) / GIB


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
            "trainable": trainable,
        }

    stages = [stage_parts(s) for s in range(pp)]
    ck = cfg.checkpoint
    gathers = ck.save_optimizer and ck.optimizer_format == "fully_reshardable" and par.use_distributed_optimizer
    # a load fills one tensor at a time: the largest weight group's fp32 state, TP-sharded
    load_transient = _largest_group_params(dims) * 4 / tp / GIB
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
        # dp_reshardable saves the optimizer's own tensors, copied to the host one by one: no GPU transient
        save_gather = save_gather_gib(parts["trainable"], dp=dp) if gathers else 0.0
        save_state = ("awake: weights + KV (a save follows a validation)" if ro.engine == "vllm" else awake_state) \
            if gen else "no engine"
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
            # every save follows a validation (or a verified refit), which leaves the engine awake;
            # fully_reshardable gathers each fp32 state of the rank's whole gradient buffer on the GPU
            ("save", full + save_gather, 0.0, awake + contexts, save_state),
            # a resumed stage loads the checkpoint (the Adam moments appear) before its freshly
            # started engine sleeps: the engine holds its whole share
            ("resume load", full + load_transient, transfer, awake, "started: its whole share" if gen else "no engine"),
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
        load_host_gib_per_node=load_host, save_gathers=gathers,
        save_gather_gib=save_gather_gib(s0["trainable"], dp=dp) if gathers else 0.0,
    )
    return _with_problems(plan)


def _with_problems(p: MemoryPlan) -> MemoryPlan:
    problems, warnings = [], []
    for r in p.timeline:
        if r.total_gib > p.gpu_memory_gib and r.phase == "save" and p.save_gathers:
            problems.append(
                f"{r.describe()} > {p.gpu_memory_gib:.1f} GiB per GPU: checkpoint.optimizer_format=fully_reshardable "
                f"gathers each fp32 optimizer state of the rank's gradient buffer on the GPU while saving "
                f"({p.save_gather_gib:.1f} GiB on stage 0); set checkpoint.optimizer_format=dp_reshardable (no gather; "
                f"a run then resumes at the same TP/PP sizes)")
        elif r.total_gib > p.gpu_memory_gib:
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
    from fastrl.models.stop_budget import estimate_stop_budget

    table = "\n".join(f"# {line}" for line in plan.format().splitlines())
    table += "\n# " + estimate_stop_budget(cfg, plan, dims, cfg.parallel.world_size).describe()
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
