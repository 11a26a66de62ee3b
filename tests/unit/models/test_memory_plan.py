"""The memory plan's timeline (fastrl/models/memory_plan.py) against independent facts: published
parameter totals, the Hugging Face model's own count, one case computed by hand (numbers, with the
derivation in comments), invariants any correct plan keeps, the refusals, the shipped recipes'
margins, and the generated table of docs/parallelism.md."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fastrl.config import ConfigError
from fastrl.models.memory_plan import (
    GIB,
    IPC_CONTEXT_GIB,
    KNOWN_MODELS,
    PHASES,
    ModelDims,
    check_memory_plan,
    estimate_memory,
    recipe_margin_gib,
    save_gather_gib,
)
from fastrl.train import main, resolve_config
from recipes import get_recipe, list_recipes

R7B = "qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "parallelism.md"

#: config.json of Qwen/Qwen2.5-VL-7B-Instruct on the hub (the fields the counts need)
HF_7B = {
    "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


def plan_of(cfg, **changes):
    cfg = replace(cfg, **{section: replace(getattr(cfg, section), **values) for section, values in changes.items()})
    return estimate_memory(cfg, cfg.parallel.world_size, cfg.parallel.gpu_memory_gib)


def test_parameter_counts_of_the_qwen25_vl_family():
    # the published totals (model cards: 3.75B, 8.29B, 33.5B, 73.4B)
    totals = {name.split("-")[2]: dims.total_params() for name, dims in KNOWN_MODELS.items()}
    assert totals == {"3B": 3_754_622_976, "7B": 8_292_166_656, "32B": 33_448_292_352, "72B": 73_406_351_360}
    d = KNOWN_MODELS["Qwen/Qwen2.5-VL-7B-Instruct"]
    assert d.vision_params() == 676_550_144  # the 675M vision tower
    assert ModelDims.from_hf_config(HF_7B, d.name) == d


@pytest.mark.parametrize("tied", [False, True])
def test_counts_equal_the_hugging_face_model(tied):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=300, tie_word_embeddings=tied),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64),
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    assert ModelDims.from_hf_config(config.to_dict()).total_params() == sum(p.numel() for p in model.parameters())


def test_the_7b_recipe_generation_by_hand():
    """Qwen2.5-VL-7B, TP2 PP1 DP4, vLLM TP1 at 0.3 of 79.6 GiB; generation on a generating GPU.

    Parameters on one TP rank: 28 layers x 233,057,792 / 2 + embedding and output layer
    (152,064 x 3,584 = 545,001,472 each) / 2 + final norm 3,584 + the vision tower 676,550,144
    (replicated over TP) = 4,484,360,192. Bytes each: bf16 weights 2 + fp32 gradients 4 + optimizer
    12 / DP 4 = 3 + reference 2 = 11 -> 49,327,962,112 B = 45.94 GiB. Refit buffers: 2 x the largest
    weight group (the embedding, 545,001,472 x 2 B) = 2,180,005,888 B = 2.03 GiB, given back to the
    device after the refit (nothing cached at generation). Engine share 0.3 x 79.6 = 23.88 GiB (an
    engine of TP1: no other worker's CUDA context), reserve 5: 74.82 GiB.
    KV: the share less bf16 weights (8,292,166,656 x 2 B = 15.45 GiB) and 2 GiB runtime = 6.43 GiB;
    a token takes 28 layers x 4 KV heads x 128 x 2 (K, V) x 2 B = 57,344 B, a 4,096-token sequence
    224 MiB: 29 sequences. Each of the 4 engines (one per model-parallel group) generates
    256 / 4 x 8 = 512 rollouts: 18 waves.
    """
    plan = plan_of(get_recipe(R7B))
    gen = plan.row("generation", "generating")
    assert gen.trainer_gib == pytest.approx(45.94, abs=0.005)
    assert plan.transfer_gib == pytest.approx(2.03, abs=0.005) and gen.cache_gib == 0
    assert gen.engine_gib == pytest.approx(23.88)
    assert gen.total_gib == pytest.approx(74.82, abs=0.01) and gen.margin_gib == pytest.approx(4.78, abs=0.01)
    assert plan.kv_cache_gib == pytest.approx(6.43, abs=0.005) and plan.kv_bytes_per_token == 57_344
    train = plan.kv_checks[0]
    assert (train.rollouts_per_engine, train.sequences_fit, train.waves) == (512, 29, 18)
    assert (plan.engines, plan.generating_gpus, plan.other_gpus) == (4, 4, 4)
    # the other GPU (TP rank 1) holds the same trainer state and no engine: 45.94 + 0 + 5
    assert plan.row("generation", "other").total_gib == pytest.approx(50.94, abs=0.01)
    assert plan.pinned_host_gib_per_node == 0.0


PLANS = {name: plan_of(get_recipe(name)) for name in (
    R7B, "qwen25vl_3b_fastrl_grpo_geo3k_h100_bf16", "qwen25vl_32b_fastrl_grpo_geo3k_h100_bf16",
    "qwen25vl_72b_fastrl_grpo_geo3k_h200_bf16", "qwen25vl_3b_dapo_geo3k_h100_bf16",
)}


@pytest.mark.parametrize("name", list(PLANS))
def test_timeline_invariants(name):
    plan = PLANS[name]
    for kind in ("generating", "other"):
        rows = [r for r in plan.timeline if r.gpu == kind]
        if not rows:
            continue
        assert [r.phase for r in rows] == list(PHASES)
        row = {r.phase: r for r in rows}
        # the Adam moments appear at the first step: start-up holds less than any later generation
        assert row["start-up"].total_gib < row["generation"].total_gib
        assert row["validation"].total_gib == pytest.approx(row["generation"].total_gib)
        # the update keeps every micro-batch's activations, the old/ref pass one at a time
        assert row["update"].trainer_gib + row["update"].cache_gib >= row["old/ref log-probs"].trainer_gib
        # the trainer's reserved memory never shrinks between two empty_cache calls
        reserved = [row[p].trainer_gib + row[p].cache_gib for p in ("generation", "old/ref log-probs", "update")]
        assert reserved == sorted(reserved)
    for phase in PHASES:  # an engine only ever adds
        other = [r for r in plan.timeline if r.gpu == "other" and r.phase == phase]
        if other and plan.tp > 1 and plan.pp == 1:  # both kinds on stage 0: same trainer state
            assert plan.row(phase).total_gib >= other[0].total_gib


def test_more_work_never_needs_less():
    base = get_recipe(R7B)
    ref = plan_of(base)
    bigger = [
        plan_of(base, parallel=dict(micro_batch_size=2)),
        plan_of(base, rollout=dict(max_response_length=4096)),
        plan_of(base, rollout=dict(gpu_memory_utilization=0.35)),
        plan_of(base, rollout=dict(sleep_between_steps=False)),
        plan_of(base, trainer=dict(mini_batch_prompts=256)),
    ]
    for plan in bigger:
        for a, b in zip(ref.timeline, plan.timeline):
            assert b.total_gib >= a.total_gib - 1e-9, (a, b)
    # more DP shards the optimizer: never more per GPU
    wider = estimate_memory(base, 16, 79.6)
    assert all(b.trainer_gib <= a.trainer_gib + 1e-9 for a, b in zip(ref.timeline, wider.timeline))
    # never asleep: the engine's whole share in every phase on a generating GPU, none on the others
    awake = bigger[3]
    assert {r.engine_gib for r in awake.timeline if r.gpu == "generating"} == {awake.engine_gib}
    assert {r.engine_gib for r in awake.timeline if r.gpu == "other"} == {0.0}


def test_phases_count_what_the_lifecycle_holds():
    """Each would-be bug of a timeline, caught: the allocator cache forgotten, the refit buffers
    forgotten, an engine counted on a GPU without one, a sleeping engine counted whole, the CUDA
    contexts that the TP8 engine's workers 1-7 open on the source GPU to map the refit buckets
    forgotten, a resumed stage that refits into an awake engine."""
    plan = PLANS["qwen25vl_32b_fastrl_grpo_geo3k_h100_bf16"]
    gen, old, refit = plan.row("generation"), plan.row("old/ref log-probs"), plan.row("refit")
    assert plan.transfer_gib > 2.5
    # generation: the refit buffers freed and given back (empty_cache after the refit on the GPU)
    assert gen.cache_gib == 0
    # from the first refit on, 7 other workers' contexts on the source GPU (not at start-up)
    contexts = 7 * IPC_CONTEXT_GIB
    assert gen.engine_gib == pytest.approx(plan.engine_gib + contexts)
    assert plan.row("start-up").engine_gib == pytest.approx(plan.engine_gib)
    # old/ref: the forward's activations reuse that cache; what they do not use is still reserved
    assert old.cache_gib == pytest.approx(plan.transfer_gib - plan.forward_activations_gib) and old.cache_gib > 2
    # refit: after empty_cache nothing is cached, but the buffers are allocated on every GPU
    assert refit.cache_gib == 0 and refit.trainer_gib == pytest.approx(gen.trainer_gib + plan.transfer_gib)
    assert plan.row("refit", "other").trainer_gib == pytest.approx(plan.row("generation", "other").trainer_gib
                                                                  + plan.transfer_gib)
    # the engine wakes its weights only for the refit; level 2 keeps only its runtime while asleep
    assert refit.engine_gib == pytest.approx(plan.engine_weights_gib + 2.0 + contexts)
    assert refit.engine_gib < plan.engine_gib + contexts
    assert old.engine_gib == pytest.approx(2.0 + contexts)
    # a resumed stage puts the started engine to sleep before its refit: the weights wake alone
    assert plan.row("resumed stage").engine_gib == pytest.approx(refit.engine_gib)
    # one engine per model-parallel group (DP 1) on the 8 GPUs of its TP8, none on stage 1's 8
    assert (plan.engines, plan.generating_gpus, plan.other_gpus) == (1, 8, 8)
    assert all(r.engine_gib == 0 for r in plan.timeline if r.gpu == "other")
    big = PLANS["qwen25vl_72b_fastrl_grpo_geo3k_h200_bf16"]
    assert (big.engines, big.generating_gpus, big.other_gpus) == (1, 8, 24)


def test_kv_check_asks_for_every_rollout_of_an_engine():
    base = get_recipe(R7B)
    # 0.3 of an H100 holds 29 of the 512 rollouts an engine generates: a warning, 18 waves, no refusal
    plan = plan_of(base)
    assert plan.fits and any("18 waves" in w for w in plan.warnings)
    # fewer rollouts per engine (more engines, fewer prompts): all fit, no warning
    few = plan_of(base, rollout=dict(prompts_per_step=8, n=4), trainer=dict(mini_batch_prompts=8),
                  data=dict(val_size=16))
    assert few.kv_checks[0].rollouts_per_engine == 8 and few.kv_checks[0].waves == 1 and not few.warnings
    # a share that leaves less than one max-length sequence: refused
    with pytest.raises(ConfigError, match=r"leaving -5\.5 GiB of KV cache, less than one sequence of 4096 tokens"):
        check_memory_plan(replace(base, rollout=replace(base.rollout, gpu_memory_utilization=0.15)), 8, 79.6)


def test_refusal_names_the_numbers():
    cfg = get_recipe(R7B)
    old = replace(cfg, parallel=replace(cfg.parallel, micro_batch_size=4),
                  rollout=replace(cfg.rollout, gpu_memory_utilization=0.6))
    with pytest.raises(ConfigError) as err:
        check_memory_plan(old, 8, 79.6)
    text = str(err.value)
    assert "generation on a generating GPU needs trainer 45.9 + allocator cache 0.0 + engine 47.8" in text
    # the binding phase is now the resume load (the fresh engine's whole share beside the loaded moments)
    assert "= 98.7 GiB > 79.6 GiB per GPU; rollout.gpu_memory_utilization must be <= 0.33 here" in text
    # the update does not fit either kind of GPU, with or without an engine
    assert "update on a generating GPU needs trainer 105.2 + allocator cache 0.0 + engine 2.0" in text
    assert "update on a GPU without an engine needs trainer 105.2 + allocator cache 0.0 + engine 0.0" in text
    too_many = replace(cfg, rollout=replace(cfg.rollout, engine_tensor_parallel_size=4))
    with pytest.raises(ConfigError, match="engine_tensor_parallel_size=4 > parallel.tensor_model_parallel_size=2"):
        check_memory_plan(too_many, 8, 79.6)


def test_frozen_vision_tower_and_fp32_change_the_bytes():
    cfg = get_recipe(R7B)
    base = plan_of(cfg)
    frozen = plan_of(cfg, model=dict(freeze_vision_tower=True))
    blocks = KNOWN_MODELS["Qwen/Qwen2.5-VL-7B-Instruct"].vision_block_params()
    assert frozen.weights_gib == base.weights_gib
    assert base.grads_gib - frozen.grads_gib == pytest.approx(4 * blocks / GIB)  # fp32 gradients: 4 B
    assert base.optimizer_gib - frozen.optimizer_gib == pytest.approx(3 * blocks / GIB)  # 12 B over DP 4
    fp32 = plan_of(cfg, precision=dict(mode="fp32"))
    assert fp32.weights_gib == pytest.approx(2 * base.weights_gib)
    assert fp32.optimizer_gib == pytest.approx(base.optimizer_gib * 8 / 12)  # no separate main weights


def _gpu_recipes():
    return sorted(n for n in list_recipes() if n.startswith("qwen25vl_"))


@pytest.mark.parametrize("name", _gpu_recipes())
def test_every_shipped_gpu_recipe_fits_every_phase_with_a_margin(name):
    cfg = get_recipe(name)
    plan = plan_of(cfg)
    margin = recipe_margin_gib(cfg.parallel.gpu_memory_gib)  # 2.4 GiB on an H100, 4.2 on an H200
    assert plan.fits, plan.format()
    for row in plan.timeline:
        assert row.margin_gib >= margin, f"{name}: {row.describe()}, margin {row.margin_gib:.1f} < {margin:.1f}"


def test_docs_table_is_the_generated_one():
    from tools.memory_table import recipes_markdown

    assert recipes_markdown() in DOCS.read_text(), "regenerate it: python tools/memory_table.py"


def test_dry_run_prints_the_timeline_and_resolution_refuses(capsys):
    assert main(["--recipe", R7B, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# memory plan (Qwen/Qwen2.5-VL-7B-Instruct, TP2 PP1 DP4, 79.6 GiB per GPU): peak 76.9 GiB " \
           "(resume load, generating GPU), smallest margin 2.7 GiB: fits" in out
    for phase in PHASES:
        assert f"#   {phase:18s} generating" in out and f"#   {phase:18s} other" in out
    assert "host memory per node: pinned 0.0 GiB" in out and "18 waves" in out
    assert main(["--recipe", R7B, "--dry-run", "rollout.gpu_memory_utilization=0.6"]) == 2
    assert "rollout.gpu_memory_utilization must be <= 0.33" in capsys.readouterr().err
    # without parallel.gpu_memory_gib nothing is enforced at resolution; the dry run says what it assumed
    resolve_config(R7B, ["parallel.gpu_memory_gib=none", "rollout.gpu_memory_utilization=0.6"])
    assert main(["--recipe", R7B, "--dry-run", "parallel.gpu_memory_gib=none", "rollout.gpu_memory_utilization=0.6"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "not enforced" in out
    # a run without a world size prints no plan
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "--dry-run"]) == 0
    assert "memory plan" not in capsys.readouterr().out


def test_fully_reshardable_save_is_a_phase_and_refused_with_its_gather():
    """The save is a phase of the timeline: with ``checkpoint.optimizer_format=fully_reshardable``
    megatron-core 0.16.1 gathers each fp32 optimizer state of the rank's gradient buffer on the GPU
    (``get_parameter_state_dp_zero(use_gloo_comm=False, return_on_all_ranks=True)``: a list of dp
    shards, staged through NCCL's flat output buffer, and the sent shard), while the engine is awake
    after a validation. On 7B (TP2 DP4) that is 37.6 GiB beside 74.8: refused, naming the format to use.

    catches: the plan without a save phase (main before this change: the 7B recipe with
    fully_reshardable "fits" with 4.8 GiB to spare and its first save runs out of memory), or a
    gather counted without the NCCL staging (20.9 GiB: 95.7 GiB, still refused but the number is wrong)."""
    cfg = get_recipe(R7B)
    full = replace(cfg, checkpoint=replace(cfg.checkpoint, optimizer_format="fully_reshardable"))
    plan = estimate_memory(full, 8, 79.6)
    assert plan.save_gathers and plan.save_gather_gib == pytest.approx(37.6, abs=0.05)
    row = plan.row("save")
    assert row.engine_gib == pytest.approx(plan.engine_gib) and row.total_gib == pytest.approx(112.4, abs=0.05)
    with pytest.raises(ConfigError) as err:
        check_memory_plan(full, 8, 79.6)
    text = str(err.value)
    assert "save on a generating GPU needs trainer 83.5 + allocator cache 0.0 + engine 23.9" in text
    assert "(37.6 GiB on stage 0); set checkpoint.optimizer_format=dp_reshardable" in text
    assert "save on a GPU without an engine needs trainer 83.5" in text  # no engine to sleep would save it
    # the shipped recipe saves dp_reshardable: no gather, the save is the validation's memory
    shipped = estimate_memory(cfg, 8, 79.6)
    assert not shipped.save_gathers
    assert shipped.row("save").total_gib == pytest.approx(shipped.row("validation").total_gib)


def test_save_gather_follows_megatron_cores_exchange():
    """``save_gather_gib``: one state's list of dp fp32 shards (4 P), NCCL's flat staging buffer
    (4 P) and the sent shard (4 P / dp), P the trainable parameters of the rank.

    catches: the gather sized as the rank's shard (4 P / dp: what a DP-sharded state suggests, and
    what the gloo path of megatron-core would hold on the host), or all three states at once (12 P)."""
    assert save_gather_gib(GIB, dp=4) == pytest.approx(8 + 1)
    assert save_gather_gib(GIB, dp=1) == pytest.approx(12)
    no_optimizer = get_recipe(R7B)
    no_optimizer = replace(no_optimizer, checkpoint=replace(no_optimizer.checkpoint, optimizer_format="fully_reshardable",
                                                             save_optimizer=False))
    assert not estimate_memory(no_optimizer, 8, 79.6).save_gathers


def test_resume_load_holds_the_moments_beside_the_fresh_engines_whole_share():
    """A resumed stage loads its checkpoint (the Adam moments appear) before its freshly started
    engine sleeps: the engine holds its whole share then; on 7B this is the run's tightest phase
    (2.7 GiB left on an H100).

    catches: the load planned with the engine asleep (the resumed-stage row alone: 70.4 GiB, 9.2 GiB
    of apparent margin)."""
    plan = plan_of(get_recipe(R7B))
    load = plan.row("resume load")
    assert load.engine_gib == pytest.approx(plan.engine_gib)
    assert load.trainer_gib >= plan.row("generation").trainer_gib
    assert plan.peak.phase == "resume load" and plan.min_margin_gib == pytest.approx(2.7, abs=0.05)
