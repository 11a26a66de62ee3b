"""Pure algorithm math of FastRL: advantages, losses, KL, pruning (MDAP and baselines), adaptive
rollout sampling, DAPO filters and importance-sampling correction.

Tensors and scalars in, tensors out: nothing here imports ``torch.distributed``, megatron or the
run configuration (a unit test enforces it); the trainer does the data-parallel reductions.
"""

from fastrl.algorithms.adaptive_sampling import AdaptiveRolloutSampler
from fastrl.algorithms.advantages import (
    grpo_advantages,
    rloo_advantages,
    sequence_to_token_advantages,
    token_to_sequence_advantages,
)
from fastrl.algorithms.baseline_pruners import advantage_only_select, cppo_select, random_select
from fastrl.algorithms.budget_select import budget_stratified_select, stratified_weights
from fastrl.algorithms.filters import dynamic_sampling_keep, overlong_penalty
from fastrl.algorithms.importance_sampling import truncated_importance_weights
from fastrl.algorithms.kl import k1, k2, kl_estimate, low_var_kl
from fastrl.algorithms.kl_penalty import KLPenalty, kl_penalized_rewards
from fastrl.algorithms.losses import aggregate_loss, gspo_loss, kl_loss, loss_denominator, ppo_clip_loss
from fastrl.algorithms.minhash import ResponseSketch, estimate_jaccard, minhash_sketch
from fastrl.algorithms.near_duplicates import near_duplicate_clusters
from fastrl.algorithms.peer_selectors import matched_select, max_variance_subset, pods_select, zero_advantage_select
from fastrl.algorithms.prompt_skipping import PromptSkipper
from fastrl.algorithms.pruning import PruneResult, jaccard, mdap_select, refill_need
from fastrl.algorithms.zero_advantage import kl_sample, merge_uniform_drop, zero_advantage_groups

__all__ = [
    "AdaptiveRolloutSampler",
    "KLPenalty",
    "PromptSkipper",
    "PruneResult",
    "ResponseSketch",
    "advantage_only_select",
    "aggregate_loss",
    "budget_stratified_select",
    "cppo_select",
    "dynamic_sampling_keep",
    "estimate_jaccard",
    "grpo_advantages",
    "gspo_loss",
    "jaccard",
    "k1",
    "k2",
    "kl_estimate",
    "kl_loss",
    "kl_penalized_rewards",
    "kl_sample",
    "loss_denominator",
    "low_var_kl",
    "matched_select",
    "max_variance_subset",
    "mdap_select",
    "merge_uniform_drop",
    "minhash_sketch",
    "near_duplicate_clusters",
    "overlong_penalty",
    "pods_select",
    "ppo_clip_loss",
    "random_select",
    "refill_need",
    "rloo_advantages",
    "sequence_to_token_advantages",
    "stratified_weights",
    "token_to_sequence_advantages",
    "truncated_importance_weights",
    "zero_advantage_groups",
    "zero_advantage_select",
]
