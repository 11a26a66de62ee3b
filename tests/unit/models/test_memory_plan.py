"""The memory plan (fastrl/models/memory_plan.py): exact parameter counts, one layout computed by
hand, and the refusal with the numbers (config resolution, --dry-run)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fastrl.config import ConfigError
from fastrl.models.memory_plan import GIB, KNOWN_MODELS, ModelDims, check_memory_plan, estimate_memory
from fastrl.train import main, resolve_config
from recipes import get_recipe

R7B = "qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16"

#: config.json of Qwen/Qwen2.5-VL-7B-Instruct on the hub (the fields the counts need)
HF_7B = {
    "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                      "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}


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


def test_the_7b_recipe_by_hand():
    """Qwen2.5-VL-7B, TP2 PP1 DP4, micro-batch 1, 2,048 + 2,048 tokens, vLLM TP1 at 0.3 of 79.6 GiB."""
    cfg = get_recipe(R7B)
    plan = estimate_memory(cfg, 8, 79.6)
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert layer == 233_057_792
    embed = 152064 * 3584
    params = 28 * layer // 2 + embed // 2 + embed // 2 + 3584 + 676_550_144  # vision tower: replicated over TP
    assert plan.params_per_gpu == params == 4_484_360_192
    assert plan.weights_gib == pytest.approx(2 * params / GIB)
    assert plan.grads_gib == pytest.approx(4 * params / GIB)
    assert plan.optimizer_gib == pytest.approx(12 * params / 4 / GIB)  # DistributedOptimizer over DP 4
    assert plan.reference_gib == pytest.approx(2 * params / GIB)
    assert plan.engine_gib == pytest.approx(0.3 * 79.6)
    assert plan.engine_weights_gib == pytest.approx(2 * 8_292_166_656 / GIB)
    assert plan.kv_cache_gib == pytest.approx(0.3 * 79.6 - 2 * 8_292_166_656 / GIB - 2.0)
    # activations: 28 layers x 4,096 tokens x 2 B x (4 h + (2 h + 2 kv + 3 I) / 2), one image of
    # 262,144 px = 334 tokens = 1,336 patches x 32 blocks x 2 B x (8 x 1280 + 4 x 3420), logits 10 B x V / 2
    lm = 28 * 4096 * 2 * (4 * 3584 + (2 * 3584 + 2 * 512 + 3 * 18944) // 2)
    vision = 1336 * 32 * 2 * (8 * 1280 + 4 * 3420)
    logits = 4096 * 152064 // 2 * 10
    assert (lm, vision, logits) == (10_745_806_848, 2_045_255_680, 3_114_270_720)
    assert plan.activations_gib == pytest.approx((lm + vision + logits) / GIB)
    resident = (2 + 4 + 3 + 2) * params / GIB + 5.0
    assert plan.generation_gib == pytest.approx(resident + 0.3 * 79.6)  # 74.8
    assert plan.training_gib == pytest.approx(resident + (lm + vision + logits) / GIB)  # 65.8
    assert plan.fits and round(plan.generation_gib, 1) == 74.8 and round(plan.training_gib, 1) == 65.8
    assert plan.max_gpu_memory_utilization == pytest.approx((79.6 - resident) / 79.6)


def test_refusal_names_the_numbers():
    cfg = get_recipe(R7B)
    old = replace(cfg, parallel=replace(cfg.parallel, micro_batch_size=4),
                  rollout=replace(cfg.rollout, gpu_memory_utilization=0.6))
    with pytest.raises(ConfigError) as err:
        check_memory_plan(old, 8, 79.6)
    text = str(err.value)
    assert "generation needs actor weights 8.4 + gradients 16.7 + optimizer 12.5 + reference 8.4 + reserve 5.0" in text
    assert "engine 47.8 = 98.7 GiB > 79.6 GiB per GPU" in text and "gpu_memory_utilization must be <= 0.36" in text
    assert "training needs" in text and "activations 59.3" in text
    small = replace(cfg, rollout=replace(cfg.rollout, gpu_memory_utilization=0.15))
    with pytest.raises(ConfigError, match=r"leaving -5\.5 GiB of KV cache, less than one sequence of 4096 tokens"):
        check_memory_plan(small, 8, 79.6)


def test_frozen_vision_tower_and_fp32_change_the_bytes():
    cfg = get_recipe(R7B)
    base = estimate_memory(cfg, 8, 79.6)
    frozen = estimate_memory(replace(cfg, model=replace(cfg.model, freeze_vision_tower=True)), 8, 79.6)
    blocks = KNOWN_MODELS["Qwen/Qwen2.5-VL-7B-Instruct"].vision_block_params()
    assert frozen.weights_gib == base.weights_gib
    assert base.grads_gib - frozen.grads_gib == pytest.approx(4 * blocks / GIB)
    assert base.optimizer_gib - frozen.optimizer_gib == pytest.approx(3 * blocks / GIB)
    fp32 = estimate_memory(replace(cfg, precision=replace(cfg.precision, mode="fp32")), 8, 79.6)
    assert fp32.weights_gib == pytest.approx(2 * base.weights_gib)
    assert fp32.optimizer_gib == pytest.approx(base.optimizer_gib * 8 / 12)
    awake = estimate_memory(replace(cfg, rollout=replace(cfg.rollout, sleep_between_steps=False)), 8, 79.6)
    assert awake.training_gib == pytest.approx(base.training_gib + base.engine_gib)


def test_pipeline_keeps_micro_batches_in_flight_on_the_first_stage():
    cfg = get_recipe("qwen25vl_72b_fastrl_grpo_geo3k_h200_bf16")
    plan = estimate_memory(cfg, 32, 140.4)
    d = KNOWN_MODELS["Qwen/Qwen2.5-VL-72B-Instruct"]
    first_stage = 20 * d.layer_params() / 8 + d.embedding_params() / 8 + d.vision_params()
    assert plan.params_per_gpu == int(first_stage)
    per_token = 2 * (4 * 8192 + (2 * 8192 + 2 * 1024 + 3 * 29568) / 8)
    lm = 4 * 20 * 4096 * per_token  # 4 micro-batches in flight x 20 layers
    vision = 4 * 1336 * 32 * 2 * (8 * 1280 + 4 * 3420)
    assert plan.activations_gib == pytest.approx((lm + vision) / GIB)


def test_dry_run_prints_the_plan_and_resolution_refuses(capsys):
    assert main(["--recipe", R7B, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# memory plan (Qwen/Qwen2.5-VL-7B-Instruct, TP2 PP1 DP4, 79.6 GiB per GPU): generation 74.8 GiB, " \
           "training 65.8 GiB: fits" in out
    assert main(["--recipe", R7B, "--dry-run", "rollout.gpu_memory_utilization=0.6"]) == 2
    assert "rollout.gpu_memory_utilization must be <= 0.36" in capsys.readouterr().err
    # without parallel.gpu_memory_gib nothing is enforced at resolution; the dry run says what it assumed
    resolve_config(R7B, ["parallel.gpu_memory_gib=none", "rollout.gpu_memory_utilization=0.6"])
    assert main(["--recipe", R7B, "--dry-run", "parallel.gpu_memory_gib=none", "rollout.gpu_memory_utilization=0.6"]) == 0
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "not enforced" in out
    # a run without a world size prints no plan
    assert main(["--recipe", "easyvqa_tiny_fastrl_grpo_cpu", "--dry-run"]) == 0
    assert "memory plan" not in capsys.readouterr().out
