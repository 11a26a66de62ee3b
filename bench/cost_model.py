#!/usr/bin/env python
"""Per-step cost model of group-relative RL with and without FastRL pruning (pure Python).

One step generates ``n`` responses for each of ``B`` prompts, prunes to a kept fraction ``k`` of
the rollouts, then runs the old-policy and reference log-prob passes and the policy update on the
kept rollouts only (docs/algorithm.md, "One step"). The model counts, per step:

- tokens generated: ``B x n x L_resp`` (decode) and ``B x L_prompt`` (prefill, the prompt shared by
  its group);
- tokens in each log-prob pass and in the update: ``k x B x n x (L_prompt + L_resp)`` (x PPO epochs
  for the update);
- bytes all-gathered over the data-parallel (DP) group for DP-global pruning, as sent by
  :func:`fastrl.distributed.dp_pruning.gather_pruning_metadata`: per rollout 8 (group id) +
  8 (advantage, float64) + 8 (token length) + 8 (response length) + either 8 bytes per response
  token (exact Jaccard) or 2 bytes per MinHash bin; every rank receives the other ``D - 1`` ranks'
  share, ``(D - 1) / D`` of the batch;
- FLOPs: ``2 P`` per token forward (P = parameters; attention left out), ``3 x`` that forward +
  backward, ``4 x`` with full activation recomputation;
- seconds per phase from FLOPs, the GPUs' peak and an efficiency (model FLOPs utilization) per
  phase, calibrated on the paper's per-step table (Qwen2.5-VL-7B, H20 GPUs, Geometry3K, GRPO:
  generation 87 s, old log-probs 55 s, reference log-probs 70 s, update 319 s, step 535 s).

``python bench/cost_model.py`` prints the tables: the paper's layout (7B on 4 GPUs) and a 72B
layout on 64 GPUs, base versus FastRL, and the gather volume against the DP size.
``bench/algorithms.py`` tests the model on measured CPU runs with :func:`check_against_runs`: a
prediction made before the pruned run from the base (GRPO) run's measured per-token phase costs and
two priors (kept fraction, mean n), compared with the measured pruned run.
(:func:`predict_pruned_run` is the after-the-fact attribution: it reads the pruned run's own token
counts, so it explains a measurement but predicts nothing.)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from typing import Literal

#: Bytes per rollout in the pruning all-gather besides the response itself: group id, advantage,
#: token length (int64, float64, int64) and the response length (int64).
METADATA_BYTES_PER_ROLLOUT = 32
EXACT_BYTES_PER_TOKEN = 8
MINHASH_BYTES_PER_BIN = 2

#: The paper's per-step seconds (spec section 6: Qwen2.5-VL-7B, Geometry3K, GRPO -> FastRL).
PAPER_GRPO_PHASES = {"gen": 87.0, "old": 55.0, "ref": 70.0, "update": 319.0}
PAPER_FASTRL_PHASES = {"gen": 80.0, "old": 21.0, "ref": 27.0, "update": 121.0}
PAPER_STEP_SECONDS = (535.0, 250.0)

TERA = 1e12


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """What one training step processes.

    Attributes:
        prompts_per_step: B, prompts per step over all DP ranks.
        n: group size (responses per prompt); a mean when adaptive sampling varies it.
        kept_fraction: k in (0, 1], fraction of rollouts kept for log-probs and the update (1: no pruning).
        prompt_tokens: mean prompt length in tokens, image tokens included.
        response_tokens: mean response length in tokens.
        dp_size: D, data-parallel ranks that gather the pruning metadata.
        ppo_epochs: passes of the update over the kept rollouts.
        similarity: "exact" sends response token ids, "minhash" a fixed-size signature.
        minhash_bins: signature bins in "minhash" mode.
    """

    prompts_per_step: int
    n: float
    kept_fraction: float = 1.0
    prompt_tokens: float
    response_tokens: float
    dp_size: int = 1
    ppo_epochs: int = 1
    similarity: Literal["exact", "minhash"] = "exact"
    minhash_bins: int = 128

    def __post_init__(self) -> None:
        checks = [
            (self.prompts_per_step >= 1, f"prompts_per_step must be >= 1, got {self.prompts_per_step}"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (0 < self.kept_fraction <= 1, f"kept_fraction must be in (0, 1], got {self.kept_fraction}"),
            (self.prompt_tokens >= 0, f"prompt_tokens must be >= 0, got {self.prompt_tokens}"),
            (self.response_tokens >= 0, f"response_tokens must be >= 0, got {self.response_tokens}"),
            (self.dp_size >= 1, f"dp_size must be >= 1, got {self.dp_size}"),
            (self.ppo_epochs >= 1, f"ppo_epochs must be >= 1, got {self.ppo_epochs}"),
            (self.similarity in ("exact", "minhash"), f"similarity must be 'exact' or 'minhash', got {self.similarity!r}"),
            (self.minhash_bins >= 1, f"minhash_bins must be >= 1, got {self.minhash_bins}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"StepShape: {message}")


@dataclass(frozen=True)
class StepCost:
    """Per-step counts (tokens and bytes are over the whole DP group unless named per rank)."""

    rollouts: float
    kept_rollouts: float
    generated_tokens: float
    prefill_tokens: float
    logprob_tokens: float
    """Tokens through one log-prob pass (old or reference), prompt + response of kept rollouts."""
    update_tokens: float
    """Tokens through forward + backward of the update (x PPO epochs)."""
    gather_bytes_per_rollout: float
    gather_bytes_per_rank: float
    """Bytes each DP rank receives in the pruning all-gather."""
    gather_bytes_total: float
    """Bytes received summed over the DP ranks."""


def pruning_metadata_bytes(response_tokens: float, similarity: str = "exact", minhash_bins: int = 128) -> float:
    """Bytes one rollout contributes to the pruning all-gather.

    Exact: ``32 + 8 L_resp``; MinHash: ``32 + 2 x bins`` (int16 signature), independent of length.
    """
    if similarity == "exact":
        return METADATA_BYTES_PER_ROLLOUT + EXACT_BYTES_PER_TOKEN * response_tokens
    if similarity == "minhash":
        return METADATA_BYTES_PER_ROLLOUT + MINHASH_BYTES_PER_BIN * minhash_bins
    raise ValueError(f"similarity must be 'exact' or 'minhash', got {similarity!r}")


def step_cost(shape: StepShape) -> StepCost:
    """Token and byte counts of one step (see the module docstring for the formulas)."""
    rollouts = shape.prompts_per_step * shape.n
    kept = shape.kept_fraction * rollouts
    sequence = shape.prompt_tokens + shape.response_tokens
    per_rollout = pruning_metadata_bytes(shape.response_tokens, shape.similarity, shape.minhash_bins)
    d = shape.dp_size
    total_gathered = rollouts * per_rollout * (d - 1)  # every rank receives the other ranks' rows
    return StepCost(
        rollouts=rollouts,
        kept_rollouts=kept,
        generated_tokens=rollouts * shape.response_tokens,
        prefill_tokens=shape.prompts_per_step * shape.prompt_tokens,
        logprob_tokens=kept * sequence,
        update_tokens=kept * sequence * shape.ppo_epochs,
        gather_bytes_per_rollout=per_rollout,
        gather_bytes_per_rank=total_gathered / d,
        gather_bytes_total=total_gathered,
    )


def step_flops(cost: StepCost, params: float, *, recompute: bool = True) -> dict[str, float]:
    """FLOPs per phase: gen ``2P (decode + prefill)``, old / ref ``2P`` per token each, update
    ``6P`` per token (``8P`` with full activation recomputation). Attention FLOPs are left out."""
    fwd = 2.0 * params
    return {
        "gen": fwd * (cost.generated_tokens + cost.prefill_tokens),
        "old": fwd * cost.logprob_tokens,
        "ref": fwd * cost.logprob_tokens,
        "update": (4.0 if recompute else 3.0) * fwd * cost.update_tokens,
    }


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A cluster layout: model size, GPUs, parallelism and what one GPU and link deliver.

    Attributes:
        name: label for the tables.
        params: model parameters.
        gpus: GPUs in the job (= tp x pp x dp).
        tp, pp: tensor / pipeline parallel sizes; dp = gpus / (tp x pp).
        peak_tflops: dense bf16 peak of one GPU, TFLOP/s.
        link_gbytes_per_s: bandwidth one GPU gets in the DP all-gather, GB/s.
    """

    name: str
    params: float
    gpus: int
    tp: int = 1
    pp: int = 1
    peak_tflops: float
    link_gbytes_per_s: float

    @property
    def dp(self) -> int:
        if self.gpus % (self.tp * self.pp):
            raise ValueError(f"Layout {self.name}: gpus ({self.gpus}) is not divisible by tp x pp ({self.tp} x {self.pp})")
        return self.gpus // (self.tp * self.pp)


#: The paper's layout: Qwen2.5-VL-7B on 4 H20 GPUs (148 dense bf16 TFLOP/s each, NVLink).
PAPER_7B = Layout(name="7B / 4x H20 (DP4)", params=8.3e9, gpus=4, peak_tflops=148.0, link_gbytes_per_s=450.0)
#: A 72B layout: 8 nodes x 8 H20, TP8 PP2 DP4, 400 Gb/s InfiniBand per GPU between nodes.
LARGE_72B = Layout(name="72B / 64x H20 (TP8 PP2 DP4)", params=73.4e9, gpus=64, tp=8, pp=2, peak_tflops=148.0, link_gbytes_per_s=50.0)

#: Assumed shape of a Geometry3K step in the paper: 256 prompts x 8, 300 prompt tokens (image
#: included) and 250 response tokens. The paper gives neither length; longer sequences would imply
#: utilizations above what the H20s deliver (old log-probs at 600 + 500 tokens: 115%).
PAPER_SHAPE = StepShape(prompts_per_step=256, n=8, prompt_tokens=300, response_tokens=250, dp_size=4)


def phase_seconds(cost: StepCost, layout: Layout, efficiency: dict[str, float], *, recompute: bool = True) -> dict[str, float]:
    """Seconds per phase: FLOPs / (GPUs x peak x efficiency); ``gather`` = bytes per rank / link."""
    flops = step_flops(cost, layout.params, recompute=recompute)
    peak = layout.gpus * layout.peak_tflops * TERA
    out = {phase: flops[phase] / (peak * efficiency[phase]) for phase in flops}
    out["gather"] = cost.gather_bytes_per_rank / (layout.link_gbytes_per_s * 1e9)
    return out


def calibrate_efficiency(
    cost: StepCost, layout: Layout, measured: dict[str, float], *, recompute: bool = True
) -> dict[str, float]:
    """Efficiency (model FLOPs utilization) per phase that reproduces ``measured`` seconds.

    Raises:
        ValueError: a measured phase is missing or not positive.
    """
    flops = step_flops(cost, layout.params, recompute=recompute)
    peak = layout.gpus * layout.peak_tflops * TERA
    out = {}
    for phase in flops:
        seconds = measured.get(phase)
        if seconds is None or seconds <= 0:
            raise ValueError(f"calibrate_efficiency: measured seconds for phase {phase!r} must be > 0, got {seconds}")
        out[phase] = flops[phase] / (peak * seconds)
    return out


def implied_pruning(base: dict[str, float], fastrl: dict[str, float], n_max: float) -> tuple[float, float]:
    """(kept fraction, mean n) implied by two per-phase tables: ``n`` from generation time (linear
    in n at fixed prompts per step), ``k`` (of the FastRL run's own rollouts) from the log-prob and
    update phases: ``k x n = (t_fast / t_base) x n_max``."""
    n = n_max * fastrl["gen"] / base["gen"]
    token_ratio = sum(fastrl[p] for p in ("old", "ref", "update")) / sum(base[p] for p in ("old", "ref", "update"))
    return token_ratio * n_max / n, n


def speedup(base_seconds: dict[str, float], fast_seconds: dict[str, float]) -> float:
    """Step-time ratio ``sum(base) / sum(fast)`` (> 1: FastRL faster)."""
    return sum(base_seconds.values()) / sum(fast_seconds.values())


# ---- the check against measured runs ---------------------------------------------------------

def predict_pruned_run(base: dict[str, float], pruned: dict[str, float]) -> dict[str, float]:
    """Predict the per-step phase seconds of a pruned run from its base run on the same machine.

    Both arguments are per-step means of a run (``bench/algorithms.py`` reads them from
    metrics.jsonl): ``time/<phase>``, ``gen_tokens`` (generated tokens per step),
    ``kept_tokens`` (response tokens of kept rollouts per step), ``rollouts`` (per step) and
    ``kept_rollouts``. Seconds per token are taken from the base run: generation scales with
    generated tokens, rewards with rollouts, old / ref / update with kept rollouts' tokens,
    refit and save stay; the pruned run's own prune time is added as measured (on CPU it is
    Python and numba work the model does not predict).

    Raises:
        KeyError: a required key is missing (named in the message).
    """
    def need(d: dict[str, float], key: str, which: str) -> float:
        if key not in d:
            raise KeyError(f"predict_pruned_run: the {which} run has no {key!r}")
        return float(d[key])

    gen_ratio = need(pruned, "gen_tokens", "pruned") / need(base, "gen_tokens", "base")
    rollout_ratio = need(pruned, "rollouts", "pruned") / need(base, "rollouts", "base")
    kept_ratio = need(pruned, "kept_tokens", "pruned") / need(base, "kept_tokens", "base")
    scale = {"gen": gen_ratio, "reward": rollout_ratio, "old": kept_ratio, "ref": kept_ratio, "update": kept_ratio,
             "refit": 1.0, "save": 1.0}
    out = {}
    for phase, factor in scale.items():
        if f"time/{phase}" in base:
            out[phase] = base[f"time/{phase}"] * factor
    out["prune"] = pruned.get("time/prune", 0.0)
    return out


def per_unit_costs(base: dict[str, float]) -> dict[str, float]:
    """The base (unpruned) run's measured cost per unit of each phase's driver: seconds per
    generated token (gen), per rollout (reward), per response token of the trained rollouts (old,
    ref, update), and the fixed seconds per step of refit and save.

    Raises:
        KeyError: a required key is missing (named in the message).
    """
    for key in ("gen_tokens", "rollouts", "kept_tokens"):
        if key not in base:
            raise KeyError(f"per_unit_costs: the base run has no {key!r}")
    out = {}
    drivers = {"gen": "gen_tokens", "reward": "rollouts", "old": "kept_tokens", "ref": "kept_tokens", "update": "kept_tokens"}
    for phase, driver in drivers.items():
        if f"time/{phase}" in base:
            out[phase] = base[f"time/{phase}"] / base[driver]
    for phase in ("refit", "save"):
        if f"time/{phase}" in base:
            out[phase] = base[f"time/{phase}"]
    return out


def predict_before_run(
    base: dict[str, float], *, kept_fraction: float, n: float, n_max: float, prune_s: float = 0.0
) -> dict[str, float]:
    """Per-step phase seconds of a pruned run, predicted BEFORE it runs: the base run's measured
    per-unit costs (:func:`per_unit_costs`) times the counts the pruned run is expected to process.

    Expected counts, from the base run's counts and two priors: the mean group size ``n`` (of
    ``n_max``; generation and rewards scale with ``n / n_max`` at fixed prompts per step and the
    base run's response length) and the kept fraction ``kept_fraction`` of the rollouts (old, ref
    and update scale with ``kept_fraction x n / n_max``, the kept responses assumed as long as the
    average one). ``prune_s``: the prior for the pruner's own seconds per step. Nothing of the
    pruned run is read: the comparison with it (:func:`check_against_runs`) is a test of the model.
    """
    if not 0.0 < kept_fraction <= 1.0:
        raise ValueError(f"kept_fraction must be in (0, 1], got {kept_fraction}")
    if not 0.0 < n <= n_max:
        raise ValueError(f"n must be in (0, n_max={n_max}], got {n}")
    unit = per_unit_costs(base)
    g = n / n_max
    counts = {"gen": base["gen_tokens"] * g, "reward": base["rollouts"] * g,
              "old": base["kept_tokens"] * g * kept_fraction, "ref": base["kept_tokens"] * g * kept_fraction,
              "update": base["kept_tokens"] * g * kept_fraction}
    out = {phase: unit[phase] * counts[phase] for phase in counts if phase in unit}
    out.update({phase: unit[phase] for phase in ("refit", "save") if phase in unit})
    out["prune"] = prune_s
    return out


def check_against_runs(
    base: dict[str, float], pruned: dict[str, float], *, kept_fraction: float, n: float, n_max: float,
    prune_s: float = 0.0,
) -> list[tuple[str, float, float]]:
    """Rows ``(quantity, predicted, measured)``: the prediction made before the pruned run
    (:func:`predict_before_run`, from the base run's per-unit costs and the priors
    ``kept_fraction`` / ``n``) against the measured pruned run: the priors themselves, each
    phase's seconds, the step time and the speedup over the base run."""
    predicted = predict_before_run(base, kept_fraction=kept_fraction, n=n, n_max=n_max, prune_s=prune_s)
    rows = [("kept fraction (prior)", kept_fraction, float(pruned.get("kept_fraction", math.nan))),
            ("mean n (prior)", n, float(pruned.get("mean_n", math.nan)))]
    for phase, seconds in predicted.items():
        if f"time/{phase}" in pruned:
            rows.append((f"{phase} s / step", seconds, pruned[f"time/{phase}"]))
    base_step = sum(base.get(f"time/{p}", 0.0) for p in ("gen", "reward", "prune", "old", "ref", "update", "refit", "save"))
    rows.append(("step s (sum of phases)", sum(predicted.values()), pruned["step_seconds"]))
    rows.append(("speedup vs base", base_step / sum(predicted.values()), base["step_seconds"] / pruned["step_seconds"]))
    return rows


# ---- tables ----------------------------------------------------------------------------------

def _fmt_bytes(b: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


def scaling_table(
    shape: StepShape = PAPER_SHAPE, layouts: tuple[Layout, ...] = (PAPER_7B, LARGE_72B)
) -> tuple[str, dict[str, dict[str, float]]]:
    """Markdown tables: the calibration on the paper's numbers and the extrapolation per layout.

    Efficiencies are calibrated on the paper's GRPO step at 7B; the FastRL shape uses the kept
    fraction and mean n implied by the paper's FastRL step. The same efficiencies are assumed for
    every layout (an assumption: decode efficiency in particular changes with model size and TP).
    Returns the text and, per layout, the predicted seconds (for tests and the results page).
    """
    base_cost = step_cost(replace(shape, dp_size=PAPER_7B.dp))
    eff = calibrate_efficiency(base_cost, PAPER_7B, PAPER_GRPO_PHASES)
    k, n_fast = implied_pruning(PAPER_GRPO_PHASES, PAPER_FASTRL_PHASES, shape.n)
    lines = [
        "Calibration on the paper's GRPO step (7B, 4x H20, Geometry3K; assumed "
        f"{shape.prompt_tokens:.0f} prompt / {shape.response_tokens:.0f} response tokens):",
        "",
        "| phase | paper s | FLOPs | efficiency (MFU) |",
        "| --- | ---: | ---: | ---: |",
    ]
    flops = step_flops(base_cost, PAPER_7B.params)
    for phase in ("gen", "old", "ref", "update"):
        lines.append(f"| {phase} | {PAPER_GRPO_PHASES[phase]:.0f} | {flops[phase]:.3g} | {eff[phase]:.1%} |")
    lines += [
        "",
        f"Implied by the paper's FastRL step: kept fraction k = {k:.3f}, mean n = {n_fast:.2f}.",
        "",
        "| layout | algorithm | gen s | old s | ref s | update s | gather | gather s | step s | speedup |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    results: dict[str, dict[str, float]] = {}
    for layout in layouts:
        seconds = {}
        for label, kept, n, sim in (("GRPO", 1.0, shape.n, "exact"), ("FastRL (exact)", k, n_fast, "exact"),
                                    ("FastRL (minhash)", k, n_fast, "minhash")):
            s = replace(shape, kept_fraction=kept, n=n, dp_size=layout.dp, similarity=sim)
            cost = step_cost(s)
            sec = phase_seconds(cost, layout, eff)
            if label == "GRPO":
                sec["gather"] = 0.0  # no pruning, nothing gathered
                cost = replace(cost, gather_bytes_per_rank=0.0)
            seconds[label] = sec
            ratio = speedup(seconds["GRPO"], sec)
            lines.append(
                f"| {layout.name} | {label} | {sec['gen']:.1f} | {sec['old']:.1f} | {sec['ref']:.1f} | {sec['update']:.1f} "
                f"| {_fmt_bytes(cost.gather_bytes_per_rank)} | {sec['gather']:.2g} | {sum(sec.values()):.1f} | {ratio:.2f}x |"
            )
        results[layout.name] = {label: sum(sec.values()) for label, sec in seconds.items()}
    what = f"{shape.prompts_per_step} prompts x {shape.n:g}, {shape.response_tokens:.0f} response tokens"
    lines += ["", f"Pruning all-gather per DP rank against the DP size ({what}):", "",
              "| DP size | exact | minhash (128 bins) |", "| ---: | ---: | ---: |"]
    for d in (1, 2, 4, 8, 16, 64, 256):
        exact = step_cost(replace(shape, dp_size=d)).gather_bytes_per_rank
        mh = step_cost(replace(shape, dp_size=d, similarity="minhash")).gather_bytes_per_rank
        lines.append(f"| {d} | {_fmt_bytes(exact)} | {_fmt_bytes(mh)} |")
    return "\n".join(lines), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=float, default=PAPER_SHAPE.prompt_tokens)
    parser.add_argument("--response-tokens", type=float, default=PAPER_SHAPE.response_tokens)
    args = parser.parse_args(argv)
    shape = replace(PAPER_SHAPE, prompt_tokens=args.prompt_tokens, response_tokens=args.response_tokens)
    text, _ = scaling_table(shape)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
