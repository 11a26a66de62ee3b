"""The memory plan's result types: one phase on one kind of GPU (:class:`PhaseRow`), the KV-cache
check of one generation phase (:class:`KVCheck`) and the whole timeline (:class:`MemoryPlan`),
with the text ``--dry-run`` prints; computed by :func:`fastrl.models.memory_plan.estimate_memory`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 2**30


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
    save_gathers: bool = False  # checkpoint.optimizer_format=fully_reshardable with the optimizer saved
    save_gather_gib: float = 0.0  # its GPU transient (stage 0), :func:`save_gather_gib`
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
        gather = (f"gathered on the GPU (fully_reshardable): {self.save_gather_gib:.1f} GiB on stage 0"
                  if self.save_gathers else "not gathered (dp_reshardable, or no optimizer state saved)")
        lines.append(f"  save: optimizer state {gather}; resume load: the Adam moments load while the fresh "
                     f"engine holds its whole share")
        lines.append(
            f"  host memory per node: pinned {self.pinned_host_gib_per_node:.1f} GiB (level-2 sleep keeps nothing); "
            f"a resumed stage reads the optimizer state into {self.load_host_gib_per_node:.1f} GiB (not pinned)"
        )
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)
