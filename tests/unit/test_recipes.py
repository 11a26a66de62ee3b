"""Every recipe builds offline and validates (the fp8 ones too: only training them needs Transformer
Engine, checked before training starts, tests/unit/test_cli.py)."""

import dataclasses

import pytest

from fastrl import config as cfg
from recipes import DEFAULT_RECIPE, get_recipe, list_recipes, recipe_function

ALL = list_recipes()


def test_registry_has_the_required_recipes():
    for name in [
        DEFAULT_RECIPE,
        "easyvqa_tiny_grpo_cpu",
        "qwen25vl_3b_fastrl_grpo_geo3k_h100_bf16",
        "qwen25vl_7b_fastrl_grpo_geo3k_h100_fp8",
        "qwen25vl_7b_fastrl_grpo_geoqa8k_h100_bf16",
        "qwen25vl_7b_fastrl_dapo_geo3k_h100_bf16",
        "qwen25vl_7b_fastrl_gspo_geoqa8k_h100_bf16",
    ]:
        assert name in ALL


@pytest.mark.parametrize("name", ALL)
def test_recipe_builds_and_validates(name):
    doc = recipe_function(name).__doc__
    assert doc and len(doc.strip()) > 20
    config = get_recipe(name)
    assert config.recipe == name
    assert cfg.RunConfig.from_dict(config.to_dict()) == config
    if config.parallel.world_size is not None:
        dp = config.parallel.dp_size()
        assert config.update_multiple(dp) % (dp * config.parallel.micro_batch_size) == 0


def test_default_recipe_is_fastrl_on_grpo_and_twin_differs_only_in_method():
    fast, base = get_recipe(DEFAULT_RECIPE), get_recipe("easyvqa_tiny_grpo_cpu")
    assert fast.pruning.method == "fastrl_unbiased" and fast.adaptive_sampling.enabled
    assert base.pruning.method == "none" and not base.adaptive_sampling.enabled
    assert fast.model.source == "tiny" and fast.data.dataset == "easy_vqa"
    same = dataclasses.replace(fast, recipe=base.recipe, pruning=base.pruning, adaptive_sampling=base.adaptive_sampling)
    assert same == base


def test_paper_recipe_differs_from_the_default_only_in_the_importance_weights():
    fast, paper = get_recipe(DEFAULT_RECIPE), get_recipe("easyvqa_tiny_fastrl_paper_grpo_cpu")
    assert paper.pruning.method == "fastrl" and paper.pruning.semantics == "reference"
    assert paper.pruning.similarity_threshold == 0.2 and paper.adaptive_sampling.enabled
    same = dataclasses.replace(paper, recipe=fast.recipe, pruning=dataclasses.replace(paper.pruning, method="fastrl_unbiased"))
    assert same == fast


def test_paper_hyperparameters():
    c = get_recipe("qwen25vl_7b_fastrl_grpo_geo3k_h100_bf16")
    assert (c.optimizer.lr, c.optimizer.weight_decay) == (1e-6, 1e-2)
    assert (c.algorithm.kl_coef, c.algorithm.kl_estimator, c.algorithm.use_kl_loss) == (0.01, "low_var_kl", True)
    assert (c.rollout.n, c.rollout.prompts_per_step) == (8, 256)
    assert c.pruning.similarity_threshold == 0.2
    assert (c.algorithm.clip_low, c.algorithm.clip_high) == (0.2, 0.3)
    assert c.trainer.epochs == 25
    assert get_recipe("qwen25vl_7b_fastrl_grpo_geoqa8k_h100_bf16").trainer.epochs == 15
    assert (c.parallel.tensor_model_parallel_size, c.parallel.dp_size()) == (2, 4)
    d = get_recipe("qwen25vl_7b_dapo_geo3k_h100_bf16")
    assert d.algorithm.clip_high == 0.28 and d.algorithm.dynamic_sampling and not d.algorithm.use_kl_loss
    g = get_recipe("qwen25vl_3b_gspo_geo3k_h100_bf16")
    assert g.algorithm.loss_type == "gspo" and g.algorithm.loss_agg == "seq_mean_token_mean"


def test_unknown_recipe_suggests_names():
    with pytest.raises(cfg.ConfigError, match="did you mean easyvqa_tiny_fastrl_grpo_cpu"):
        get_recipe("easyvqa_tiny_fastrl_grpo")


def test_large_recipes_layouts_and_memory_plans():
    """32B / 72B (Megatron-Bridge's TP/PP layouts, vLLM's own TP8) and every GPU recipe fit the
    memory plan of the GPU they name (parallel.gpu_memory_gib), built offline."""
    from fastrl.models.memory_plan import estimate_memory

    for size, gpu, tp, pp, world in (("32b", "h100", 8, 2, 16), ("72b", "h200", 8, 4, 32)):
        for dataset in ("geo3k", "geoqa8k"):
            for precision in ("bf16", "fp8"):
                c = get_recipe(f"qwen25vl_{size}_fastrl_grpo_{dataset}_{gpu}_{precision}")
                p = c.parallel
                assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.world_size) == (tp, pp, world)
                assert c.rollout.engine == "vllm" and c.rollout.engine_tensor_parallel_size == 8
                assert c.precision.mode == precision and c.pruning.method == "fastrl" and c.adaptive_sampling.enabled
                assert c.model.hf_path == f"Qwen/Qwen2.5-VL-{size.upper()}-Instruct"
    gpu_recipes = [name for name in ALL if name.startswith("qwen25vl_")]
    assert "qwen25vl_3b_fastrl_grpo_geo3k_1xh200_bf16" in gpu_recipes
    for name in gpu_recipes:
        c = get_recipe(name)
        plan = estimate_memory(c, c.parallel.world_size, c.parallel.gpu_memory_gib)
        assert plan.fits, f"{name}: {plan.format()}"
        assert plan.kv_cache_gib > 4, f"{name}: {plan.format()}"


def test_gpu_recipes_refuse_to_run_without_a_gpu():
    """A GPU recipe asks for NCCL, so on a CPU machine it stops at start-up with "no GPU" instead of
    training a 3B-72B model on gloo."""
    from fastrl.distributed.parallel_state import resolve_backend
    from recipes import get_recipe, list_recipes

    gpu = [name for name in list_recipes() if not name.endswith("_cpu")]
    assert len(gpu) >= 8
    for name in gpu:
        assert get_recipe(name).parallel.backend == "nccl", name
    with pytest.raises(RuntimeError, match="no GPU"):
        resolve_backend(get_recipe(gpu[0]).parallel.backend)


def test_greso_recipe_redraws_every_prompt_and_its_baseline_differs_only_in_method():
    greso, base = get_recipe("easyvqa_tiny_greso_grpo_cpu"), get_recipe("easyvqa_tiny_grpo_6ep_cpu")
    assert greso.pruning.method == "greso" and base.pruning.method == "none"
    assert greso.data.max_train_samples == 640 and greso.trainer.epochs == 6
    # 120 steps x 32 prompts = 6 passes over 640 questions: every prompt has a history to skip on
    steps, prompts = greso.trainer.max_steps, greso.rollout.prompts_per_step
    assert steps * prompts == greso.data.max_train_samples * greso.trainer.epochs == 3840
    a, b = greso.to_dict(), base.to_dict()
    differing = {k for k in a if a[k] != b[k]}
    assert differing == {"recipe", "pruning"}
    assert {k for k in a["pruning"] if a["pruning"][k] != b["pruning"][k]} == {"method"}
