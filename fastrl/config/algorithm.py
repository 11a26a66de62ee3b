"""Config sections of the RL algorithm: rollout generation, advantages / loss / KL, rollout
pruning (MDAP and baselines) and adaptive rollout sampling (spec sections 1-4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fastrl.config.fields import _check, _check_finite, _check_seed, doc

__all__ = ["MISMATCH_TOLERANCE_AUTO", "VERIFY_REFIT_TOLERANCE_AUTO", "AdaptiveSamplingConfig", "AlgorithmConfig", "PruningConfig", "RolloutConfig"]

#: ``rollout.mismatch_tolerance='auto'``: the per-step mismatch guard's bound for each
#: ``precision.mode`` (mean |logp_engine - logp_trainer| over a step's sampled tokens). fp32: every
#: healthy step measured in this repository is <= 2.2e-7 (6,720 steps of bench/results, HF engine;
#: ~1e-7 with the vLLM engine process, docs/engine.md), the largest single token 1.7e-5, and the
#: fp32 tests bound even the per-token maximum by 1e-4 -- so 1e-4 is ~500x above healthy and
#: ~1,000x below the stale-weight step of issue 33 (0.134). bf16: a bf16 actor against fp32 log-probs
#: of the same weights stays below 5e-2 (tests/distributed/test_precision_and_reference.py), the
#: bound rollout.verify_refit_tolerance's documentation gives for bf16. fp8: FP8 GEMMs in the actor
#: against a bf16 engine add their own rounding; not measured here (no GPU), so twice the bf16 bound.
MISMATCH_TOLERANCE_AUTO: dict[str, float] = {"fp32": 1e-4, "bf16": 5e-2, "fp8": 1e-1}

#: ``rollout.verify_refit_tolerance='auto'``: the refit probe's bound for each ``precision.mode``
#: (mean |logp_engine - logp_trainer| on the fixed probe). fp32: ~1e-6 measured (docs/engine.md),
#: 1e-3 as before; bf16 and fp8: a bf16 engine (vLLM TP1) against a bf16 / FP8 megatron actor at
#: another TP differs by rounding alone up to the bf16 bound of MISMATCH_TOLERANCE_AUTO, so the same
#: bounds (1e-3 stopped every bf16 GPU run at its first check).
VERIFY_REFIT_TOLERANCE_AUTO: dict[str, float] = {"fp32": 1e-3, "bf16": 5e-2, "fp8": 1e-1}


@dataclass(kw_only=True, frozen=True)
class RolloutConfig:
    """Generation of the rollout groups."""

    engine: Literal["hf", "vllm"] = doc(
        "hf",
        "Rollout engine: 'hf' is the in-process Hugging Face engine (CPU, tests); 'vllm' a vLLM "
        "engine process per trainer rank, run by rollout.engine_python (docs/engine.md).",
    )
    n: int = doc(8, "Responses per prompt (group size); the adaptive sampler's n_max.")
    prompts_per_step: int = doc(32, "Prompts per training step (global, over all DP ranks).")
    temperature: float = doc(1.0, "Sampling temperature of training rollouts.")
    top_p: float = doc(1.0, "Nucleus sampling threshold of training rollouts.")
    top_k: int = doc(-1, "Top-k sampling of training rollouts (-1 or 0: off).")
    max_prompt_length: int = doc(512, "Longest prompt in tokens (image tokens included); longer prompts are filtered at load.")
    max_response_length: int = doc(64, "Most tokens generated per response.")
    val_temperature: float = doc(0.0, "Validation decoding temperature (0: greedy).")
    val_n: int = doc(1, "Responses per validation question (pass@k with k = val_n).")
    engine_tensor_parallel_size: int = doc(1, "vLLM: tensor parallel size inside the engine.")
    gpu_memory_utilization: float = doc(0.6, "vLLM: fraction of GPU memory for weights and KV cache.")
    sleep_between_steps: bool = doc(
        True, "vLLM: release the engine's GPU memory during training (sleep/wake)."
    )
    suppress_special_tokens: bool = doc(
        True,
        "Never sample bos, pad or unk tokens. Vision tokens (image/video placeholders, vision "
        "start/end/pad) and the padded vocabulary's ids (no token of the tokenizer) are never "
        "sampled whatever this setting: a response holding an image placeholder cannot be scored "
        "by the policy's forward pass, and both engines sample only the tokenizer's ids.",
    )
    keep_rollout_budget_constant: bool = doc(
        False,
        "When the adaptive sampler lowers n, raise prompts per step to keep prompts x n constant "
        "(beyond the paper; off reproduces it).",
    )
    seed: int = doc(0, "Seed of rollout sampling.")
    engine_python: str | None = doc(
        ".venv-vllm/bin/python",
        "vLLM: interpreter of the engine environment; the engine runs as a child process of each "
        "trainer rank with it (docs/engine.md). Relative paths resolve against the repository (CPU: "
        ".venv-vllm from tools/setup_vllm_cpu.sh); on a cluster, the vLLM environment's bin/python. "
        "None is refused with rollout.engine='vllm' (vLLM always runs in its own process).",
    )
    engine_timeout_s: float = doc(
        600.0, "vLLM process: longest wait for any engine reply before the run stops with the engine's "
        "exit status and log tail (a dead engine is reported at once).",
    )
    engine_startup_timeout_s: float = doc(
        600.0, "vLLM process: longest wait for the engine to start (vLLM import, model load, warm-up).",
    )
    engine_restart_retries: int = doc(
        0, "vLLM process: engine restarts one generate call may use after the engine died or hung "
        "(the current weights are replayed); >= 1 also restarts an engine that dies during a refit "
        "(once, the refit's weights replayed).",
    )
    engine_kv_cache_mb: int = doc(256, "vLLM process on CPU: KV-cache size in MiB (GPU: gpu_memory_utilization).")
    engine_threads: int = doc(0, "vLLM process on CPU: OMP threads of the engine (0: trainer.torch_threads).")
    refit_bucket_mb: float = doc(64.0, "vLLM process: refit bucket size in MiB (one shared-memory file each on CPU).")
    verify_refit_every: int = doc(
        10, "Refit verification: the engine scores a fixed probe after the first refit and every this "
        "many refits, compared with the trainer's log-probs (0: off).",
    )
    verify_refit_tolerance: float | Literal["auto"] = doc(
        "auto", "Refit verification: largest allowed mean |logp_engine - logp_trainer| on the probe; "
        "above it the run stops naming the parameter group that differs most. 'auto': by "
        "precision.mode, fp32 1e-3 (~1e-6 seen), bf16 5e-2, fp8 1e-1 "
        "(fastrl/config/algorithm.py::VERIFY_REFIT_TOLERANCE_AUTO); a number: that bound (> 0).",
    )
    mismatch_tolerance: float | Literal["auto"] | None = doc(
        "auto",
        "Per-step guard on the engine/trainer log-prob mismatch of the step's sampled tokens "
        "(mismatch/abs_diff_mean: mean |logp_engine - logp_trainer| over every response token of "
        "every DP rank, measured before the policy update): above it the step stops with "
        "RolloutMismatchError before training on those rollouts (a refit that did not reach the "
        "engine makes the next step's rollouts come from stale weights; checkpoints already saved "
        "are kept). 'auto': by precision.mode, fp32 1e-4, bf16 5e-2, fp8 1e-1 "
        "(fastrl/config/algorithm.py::MISMATCH_TOLERANCE_AUTO says what each rests on; healthy fp32 "
        "steps measure ~1e-7). A number: that bound (> 0), e.g. higher for an engine whose numerics "
        "differ more from the trainer's; None: off.",
    )

    def __post_init__(self) -> None:
        _check_finite(self, "rollout")
        _check(
            self.engine != "vllm" or self.engine_python is not None,
            "rollout.engine='vllm' runs vLLM as its own process and needs rollout.engine_python, the engine "
            "environment's interpreter (.venv-vllm/bin/python on CPU, built by tools/setup_vllm_cpu.sh; the vLLM "
            "environment's bin/python on a cluster); got None",
        )
        _check(self.engine_timeout_s > 0, f"rollout.engine_timeout_s must be > 0, got {self.engine_timeout_s}")
        _check(self.engine_startup_timeout_s > 0, f"rollout.engine_startup_timeout_s must be > 0, got {self.engine_startup_timeout_s}")
        _check(self.engine_restart_retries >= 0, f"rollout.engine_restart_retries must be >= 0, got {self.engine_restart_retries}")
        _check(self.engine_kv_cache_mb >= 1, f"rollout.engine_kv_cache_mb must be >= 1, got {self.engine_kv_cache_mb}")
        _check(0 <= self.engine_threads <= 4096, f"rollout.engine_threads must be in [0, 4096], got {self.engine_threads}")
        _check(self.refit_bucket_mb > 0, f"rollout.refit_bucket_mb must be > 0, got {self.refit_bucket_mb}")
        _check(self.verify_refit_every >= 0, f"rollout.verify_refit_every must be >= 0, got {self.verify_refit_every}")
        _check(
            self.verify_refit_tolerance == "auto" or (
                isinstance(self.verify_refit_tolerance, (int, float)) and self.verify_refit_tolerance > 0),
            f"rollout.verify_refit_tolerance must be 'auto' or a number > 0, got {self.verify_refit_tolerance!r}",
        )
        tol = self.mismatch_tolerance
        _check(
            tol is None or tol == "auto" or (isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol > 0),
            f"rollout.mismatch_tolerance must be 'auto', a number > 0, or none (guard off), got {tol!r}",
        )
        _check(self.n >= 1, f"rollout.n must be >= 1, got {self.n}")
        _check(self.prompts_per_step >= 1, f"rollout.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        _check(self.temperature >= 0, f"rollout.temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"rollout.top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= -1, f"rollout.top_k must be >= 1, or -1 / 0 for off, got {self.top_k}")
        _check(self.max_prompt_length >= 1, f"rollout.max_prompt_length must be >= 1, got {self.max_prompt_length}")
        _check(
            self.max_response_length >= 1, f"rollout.max_response_length must be >= 1, got {self.max_response_length}"
        )
        _check(self.val_temperature >= 0, f"rollout.val_temperature must be >= 0, got {self.val_temperature}")
        if self.engine == "vllm":  # the engine's log-probs have one temperature, fixed at start (docs/engine.md)
            tempered = self.temperature not in (0.0, 1.0)
            _check(
                not tempered or (self.top_p == 1.0 and self.top_k <= 0),
                f"rollout.engine='vllm' at rollout.temperature={self.temperature} reports log-probs after vLLM's "
                f"processing, which top-p / top-k would truncate (got top_p={self.top_p}, top_k={self.top_k}): "
                f"use top_p=1.0 and top_k=-1 with that temperature, or temperature 1.0",
            )
            engine_t = self.temperature if self.temperature > 0 else 1.0
            _check(
                self.val_temperature in (0.0, engine_t),
                f"rollout.engine='vllm' samples greedily or at the engine's temperature {engine_t} "
                f"(rollout.temperature={self.temperature}); rollout.val_temperature={self.val_temperature} is "
                f"neither: use 0 (greedy) or {engine_t}",
            )
        _check(self.val_n >= 1, f"rollout.val_n must be >= 1, got {self.val_n}")
        _check(
            self.engine_tensor_parallel_size >= 1,
            f"rollout.engine_tensor_parallel_size must be >= 1, got {self.engine_tensor_parallel_size}",
        )
        _check(
            0 < self.gpu_memory_utilization <= 1,
            f"rollout.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _check_seed(self.seed, "rollout.seed")


@dataclass(kw_only=True, frozen=True)
class AlgorithmConfig:
    """Advantage estimator, policy loss and KL (spec section 4)."""

    advantage_estimator: Literal["grpo", "drgrpo", "rloo"] = doc(
        "grpo", "grpo: (r - mean) / (std + eps) per group; drgrpo: r - mean; rloo: leave-one-out baseline."
    )
    std_unbiased: bool = doc(True, "GRPO: unbiased (N-1) standard deviation.")
    adv_eps: float = doc(1e-6, "GRPO: epsilon added to the group standard deviation.")
    loss_type: Literal["ppo", "gspo", "gspo_token"] = doc(
        "ppo", "Policy loss: per-token PPO clipped surrogate, or GSPO (sequence ratio) / GSPO-token."
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = doc(
        "token_mean", "Loss aggregation over the mini-batch (denominator reduced once over DP)."
    )
    clip_low: float = doc(0.2, "PPO: lower clip range (ratio >= 1 - clip_low).")
    clip_high: float = doc(0.3, "PPO: upper clip range (ratio <= 1 + clip_high); DAPO clip-higher.")
    dual_clip_c: float | None = doc(3.0, "Dual clip constant c (> 1) for negative advantages; None: off.")
    gspo_clip_low: float = doc(3e-4, "GSPO: lower clip of the sequence ratio.")
    gspo_clip_high: float = doc(4e-4, "GSPO: upper clip of the sequence ratio.")
    use_kl_loss: bool = doc(True, "KL to the reference policy as a loss term.")
    kl_in_reward: bool = doc(
        False,
        "Fold KL into the reward instead (EasyR1/verl apply_kl_penalty): each reward minus kl_coef x "
        "the sum over its response of the per-token kl_estimator KL between the old and the "
        "reference policy, before the advantages; old/reference log-probs are then computed on the "
        "full batch before pruning. Logged as kl_penalty/*.",
    )
    kl_coef: float = doc(0.01, "KL coefficient (beta) of the KL loss or of the reward penalty.")
    kl_estimator: Literal["k1", "k2", "low_var_kl"] = doc("low_var_kl", "KL estimator (k3 = low_var_kl).")
    dynamic_sampling: bool = doc(
        False, "DAPO: drop groups whose accuracy is all 0 or all 1 and sample more prompts."
    )
    max_dynamic_sampling_rounds: int = doc(
        3, "DAPO: extra generation rounds at most; when exhausted, train on what was collected (warned)."
    )
    overlong_shaping: bool = doc(False, "DAPO: soft overlong punishment of long responses.")
    overlong_cache_length: int = doc(16, "DAPO: L_cache of the overlong punishment, in tokens.")
    ppo_epochs: int = doc(1, "Passes of policy updates over each step's batch.")
    tis_cap: float | None = doc(
        2.0,
        "Truncated importance sampling of the engine/trainer log-prob mismatch: cap of the ratio "
        "exp(logp_old - logp_engine); None: no correction.",
    )
    tis_level: Literal["token", "sequence"] = doc("token", "Truncated IS per token or per sequence.")

    @property
    def group_relative(self) -> bool:
        """True for estimators that compare responses within a group (need n >= 2)."""
        return self.advantage_estimator in ("grpo", "drgrpo", "rloo")

    def __post_init__(self) -> None:
        _check_finite(self, "algorithm")
        _check(self.adv_eps >= 0, f"algorithm.adv_eps must be >= 0, got {self.adv_eps}")
        _check(0 <= self.clip_low < 1, f"algorithm.clip_low must be in [0, 1), got {self.clip_low}")
        _check(self.clip_high >= 0, f"algorithm.clip_high must be >= 0, got {self.clip_high}")
        _check(
            self.dual_clip_c is None or self.dual_clip_c > 1,
            f"algorithm.dual_clip_c must be > 1 or None, got {self.dual_clip_c}",
        )
        _check(
            0 <= self.gspo_clip_low < 1, f"algorithm.gspo_clip_low must be in [0, 1), got {self.gspo_clip_low}"
        )
        _check(self.gspo_clip_high >= 0, f"algorithm.gspo_clip_high must be >= 0, got {self.gspo_clip_high}")
        _check(
            not (self.use_kl_loss and self.kl_in_reward),
            "algorithm.use_kl_loss and algorithm.kl_in_reward are both true; choose one place for KL",
        )
        _check(self.kl_coef >= 0, f"algorithm.kl_coef must be >= 0, got {self.kl_coef}")
        _check(
            self.loss_type == "ppo" or self.loss_agg == "seq_mean_token_mean",
            f"algorithm.loss_type={self.loss_type!r} aggregates per sequence; "
            f"set algorithm.loss_agg=seq_mean_token_mean (got {self.loss_agg!r})",
        )
        _check(
            self.max_dynamic_sampling_rounds >= 0,
            f"algorithm.max_dynamic_sampling_rounds must be >= 0, got {self.max_dynamic_sampling_rounds}",
        )
        _check(
            self.overlong_cache_length >= 1,
            f"algorithm.overlong_cache_length must be >= 1, got {self.overlong_cache_length}",
        )
        _check(self.ppo_epochs >= 1, f"algorithm.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        _check(self.tis_cap is None or self.tis_cap >= 1, f"algorithm.tis_cap must be >= 1 or None, got {self.tis_cap}")


@dataclass(kw_only=True, frozen=True)
class PruningConfig:
    """Rollout pruning after advantage estimation (MDAP and baselines; spec section 2)."""

    method: Literal[
        "none", "fastrl", "fastrl_unbiased", "cppo", "random", "advantage_only", "pods", "zero_adv_skip", "greso",
        "matched_random", "matched_top_abs", "matched_pods", "budget_stratified",
    ] = doc(
        "fastrl",
        "none: train on every rollout; fastrl: MDAP (advantage buckets + Jaccard diversity); "
        "fastrl_unbiased: MDAP with each kept rollout's advantage reweighted by the inverse of its "
        "bucket's keep share (an importance-weighted estimate of the full-group gradient; "
        "fastrl/algorithms/prune_weights.py::inverse_keep_weights); "
        "cppo: top-k |advantage| per group; random: random subset; advantage_only: one random "
        "rollout per advantage bucket; pods: PODS max-variance down-sampling (keep_ratio of each "
        "group); zero_adv_skip: drop the rollouts whose advantage is 0; greso: GRESO-style "
        "pre-rollout prompt skipping from each prompt's zero-variance history (no generation for "
        "the skipped prompts; every generated rollout trains; fastrl/algorithms/prompt_skipping.py); "
        "matched_random / matched_top_abs / matched_pods: the matched-ratio peers of MDAP: run MDAP, "
        "then keep in every group exactly as many rollouts as MDAP kept there, chosen uniformly at "
        "random, by largest |advantage| (CPPO's rule) or by PODS's max-variance rule "
        "(fastrl/algorithms/peer_selectors.py::matched_select); pruning.weighting applies as for MDAP; "
        "budget_stratified: a per-step budget (pruning.budget_fraction of the rollouts or tokens) spent on "
        "the informative rows first, at least pruning.min_per_bucket per advantage bucket, uniformly at "
        "random within a bucket, near-copies merged first (pruning.dedup_threshold), each kept rollout "
        "weighted members / kept of its bucket (fastrl/algorithms/budget_select.py).",
    )
    apply: bool = doc(
        True,
        "False: run the pruner for its statistics only (the adaptive sampler's kept counts, the "
        "prune/* metrics) and train on every rollout: the 'ARS only' ablation.",
    )
    greso_explore_prob: float = doc(
        0.5, "greso: a prompt zero-variance the last z times it was drawn is generated with probability this ** z."
    )
    greso_max_skip_fraction: float = doc(0.5, "greso: at most this fraction of a step's prompts is skipped.")
    refill_to: Literal["free", "mini_batch"] = doc(
        "free",
        "Update geometry of the kept set. free (default): the kept count is only rounded to what data "
        "parallelism needs (a multiple of dp_size; of dp_size x micro_batch_size with pipeline "
        "parallelism), each step makes a fixed number of optimizer updates "
        "(ppo_epochs x prompts_per_step / mini_batch_prompts) over equal shares of the kept "
        "rollouts, and the LR schedule counts exactly those updates. mini_batch: the reference "
        "implementation and paper (spec 2.3): Phase 2 refills the kept count to a multiple of the "
        "mini-batch (mini_batch_prompts x n) and one update runs per mini-batch (the LR schedule "
        "is sized as before: steps x prompts / mini-batch).",
    )
    semantics: Literal["reference", "paper"] = doc(
        "reference", "MDAP semantics: the released reference code (default) or the paper's text."
    )
    similarity_threshold: float = doc(0.2, "MDAP: Jaccard similarity threshold (paper tau = 1 - this).")
    ngram: int = doc(1, "MDAP: token n-gram size of the Jaccard sets.")
    adv_tolerance: float = doc(1e-4, "MDAP 'paper' semantics: advantage bucket tolerance.")
    refill: Literal["round_robin", "global_abs_adv"] = doc(
        "round_robin", "Phase-2 refill order up to the update geometry's multiple."
    )
    similarity_mode: Literal["exact", "minhash"] = doc(
        "exact",
        "exact: DP ranks exchange response token ids; minhash: a MinHash signature per rollout "
        "(approximate, a few hundred bytes per rollout).",
    )
    minhash_num_perm: int = doc(
        128, "MinHash sketch size (bins, a power of two in [16, 4096]); 2 bytes per bin per rollout."
    )
    keep_ratio: float = doc(0.5, "cppo / random / pods: fraction of each group kept.")
    allow_padding: bool = doc(
        False,
        "When too few pruned rollouts exist to refill to a multiple, pad instead of failing.",
    )
    seed: int = doc(0, "Seed of the random and advantage-only pruners.")
    weighting: Literal["none", "bucket_size", "inverse_keep"] = doc(
        "none",
        "none: kept rollouts train with weight 1 (paper and reference); bucket_size: each kept "
        "rollout's advantage is scaled by (members / kept) of its advantage bucket, normalized to "
        "mean 1, so every bucket weighs what it did before pruning (beyond the paper; see "
        "fastrl/algorithms/prune_weights.py); inverse_keep: the importance weights of "
        "method=fastrl_unbiased (members / kept of the bucket, token-renormalized; any method). "
        "budget_stratified always applies its own weights (none or inverse_keep: the same).",
    )
    drop_uniform_groups: bool = doc(
        False,
        "Remove the uniform groups (every advantage rounds to 0: all responses got the same reward) before "
        "the selector runs, so they skip the old / reference log-prob passes and the update; any method. "
        "What stays of their KL term: pruning.zero_adv_kl. Counted per step as prune/uniform_*.",
    )
    zero_adv_kl: Literal["drop", "sample"] = doc(
        "drop",
        "With drop_uniform_groups. drop: the uniform groups leave the KL term and the loss denominator "
        "(the KL term covers the kept rows only; each kept token weighs 1 / kept tokens). sample: "
        "zero_adv_kl_samples of their rollouts (seeded, uniform over them) stay in the update with advantage "
        "0 and KL weight U / s (U uniform rollouts, s sampled), so the KL sum's expectation over the draw is "
        "the sum over all U; their tokens count U / s times in the loss denominator too (a ratio estimator of the "
        "per-token KL over the kept and the uniform rows, as an unpruned token-mean loss counts them). Needs "
        "algorithm.use_kl_loss.",
    )
    zero_adv_kl_samples: int = doc(4, "zero_adv_kl=sample: uniform-group rollouts kept per step (global) for the KL term.")
    budget_fraction: float = doc(
        0.25,
        "budget_stratified: per-step budget, a fraction in (0, 1] of the rollouts or of the response tokens "
        "(with drop_uniform_groups: of the mixed groups' rollouts or tokens, what the rule sees).",
    )
    budget_unit: Literal["rollouts", "tokens"] = doc(
        "rollouts", "budget_stratified: what budget_fraction counts, rollouts or response tokens."
    )
    min_per_bucket: int = doc(
        2,
        "budget_stratified: rollouts kept in every informative advantage bucket while the budget lasts "
        "(fewer when the bucket has fewer); one per bucket always, even past the budget.",
    )
    dedup_threshold: float | None = doc(
        0.8,
        "budget_stratified: token dedup_ngram-gram Jaccard at or above which responses of one advantage "
        "bucket are merged as near-copies before the budget is spent (one representative, weighted by "
        "the cluster's size); None: no merging. 0.8 (5-gram shingles, the near-duplicate literature's "
        "0.7-0.8) was chosen on the training rollouts of the six committed SmolLM2 runs: it flags 1.0% of "
        "same-prompt pairs, 98.6% of them with the same final answer and 84% identical texts, where 0.7 "
        "flags 1.4% with 97.1% / 61% (bench/results/word_arith/prune_text.md).",
    )
    dedup_ngram: int = doc(5, "budget_stratified: n-gram size of the near-duplicate Jaccard sets (token ids).")

    def __post_init__(self) -> None:
        _check_finite(self, "pruning")
        _check(
            0 <= self.similarity_threshold <= 1,
            f"pruning.similarity_threshold must be in [0, 1], got {self.similarity_threshold}",
        )
        _check(self.adv_tolerance >= 0, f"pruning.adv_tolerance must be >= 0, got {self.adv_tolerance}")
        _check(self.ngram >= 1, f"pruning.ngram must be >= 1, got {self.ngram}")
        _check(0 < self.greso_explore_prob <= 1, f"pruning.greso_explore_prob must be in (0, 1], got {self.greso_explore_prob}")
        _check(
            0 <= self.greso_max_skip_fraction < 1,
            f"pruning.greso_max_skip_fraction must be in [0, 1), got {self.greso_max_skip_fraction}",
        )
        _check(0 < self.keep_ratio <= 1, f"pruning.keep_ratio must be in (0, 1], got {self.keep_ratio}")
        _check(
            16 <= self.minhash_num_perm <= 4096 and self.minhash_num_perm & (self.minhash_num_perm - 1) == 0,
            f"pruning.minhash_num_perm must be a power of two in [16, 4096], got {self.minhash_num_perm}",
        )
        _check_seed(self.seed, "pruning.seed")
        _check(
            self.zero_adv_kl == "drop" or self.drop_uniform_groups,
            f"pruning.zero_adv_kl={self.zero_adv_kl!r} acts on the groups pruning.drop_uniform_groups removes; "
            "set pruning.drop_uniform_groups=true or leave pruning.zero_adv_kl at 'drop'",
        )
        _check(self.zero_adv_kl_samples >= 1, f"pruning.zero_adv_kl_samples must be >= 1, got {self.zero_adv_kl_samples}")
        _check(
            self.zero_adv_kl == "sample" or self.zero_adv_kl_samples == 4,
            f"pruning.zero_adv_kl_samples={self.zero_adv_kl_samples} is used by pruning.zero_adv_kl='sample' only "
            f"(got {self.zero_adv_kl!r})",
        )
        _check(0 < self.budget_fraction <= 1, f"pruning.budget_fraction must be in (0, 1], got {self.budget_fraction}")
        _check(self.min_per_bucket >= 1, f"pruning.min_per_bucket must be >= 1, got {self.min_per_bucket}")
        _check(
            self.dedup_threshold is None or 0 <= self.dedup_threshold <= 1,
            f"pruning.dedup_threshold must be in [0, 1] or None, got {self.dedup_threshold}",
        )
        _check(self.dedup_ngram >= 1, f"pruning.dedup_ngram must be >= 1, got {self.dedup_ngram}")
        budget_set = {
            name: getattr(self, name) for name, default in (
                ("budget_fraction", 0.25), ("budget_unit", "rollouts"), ("min_per_bucket", 2),
                ("dedup_threshold", 0.8), ("dedup_ngram", 5),
            ) if getattr(self, name) != default
        }
        _check(
            self.method == "budget_stratified" or not budget_set,
            f"pruning.{', pruning.'.join(budget_set)} set to {list(budget_set.values())} configure "
            f"pruning.method=budget_stratified, but pruning.method={self.method!r}",
        )
        if self.method == "budget_stratified":
            _check(
                self.weighting in ("none", "inverse_keep"),
                f"pruning.method=budget_stratified applies its own members / kept weights; "
                f"pruning.weighting={self.weighting!r} would replace them: use 'none' (or 'inverse_keep', the same)",
            )
            _check(
                self.similarity_mode == "exact",
                "pruning.method=budget_stratified merges near-copies on the exchanged token ids; "
                f"pruning.similarity_mode={self.similarity_mode!r} is MDAP's option: leave it at 'exact'",
            )


@dataclass(kw_only=True, frozen=True)
class AdaptiveSamplingConfig:
    """Adaptive rollout sampling (ARS, spec section 3): the group size shrinks from pruning history."""

    enabled: bool = doc(True, "Re-decide the group size n at period boundaries.")
    period: Literal["epoch", "steps", "stage"] = doc(
        "epoch", "Period boundary: every epoch (paper), every period_steps steps, or each Slurm stage end."
    )
    period_steps: int = doc(50, "Steps per period when period='steps'.")
    n_min: int = doc(2, "Smallest group size (a group needs two members).")

    def __post_init__(self) -> None:
        _check(self.n_min >= 2, f"adaptive_sampling.n_min must be >= 2, got {self.n_min}")
        _check(self.period_steps >= 1, f"adaptive_sampling.period_steps must be >= 1, got {self.period_steps}")
