"""The update geometry: how a step's kept rollouts are cut into mini-batches and micro-batches.

One place for every rule (see docs/parallelism.md, "Micro-batches and the loss"), and the one
value a step computes from them once and every later phase reads: :class:`StepGeometry`
(:func:`step_geometry`: the data-parallel size, what the kept count must satisfy, the cuts of the
old / reference log-prob passes, and what builds this rank's :class:`UpdatePlan` of updates,
micro-batch cuts and LR positions, :meth:`StepGeometry.plan_update`):

- every DP rank trains on whole micro-batches of ``parallel.micro_batch_size`` rollouts where
  micro-batches must be equal, so the kept count is a multiple of :func:`kept_unit`;
- MDAP's Phase-2 refill rounds the kept count up to :func:`refill_multiple` (the actor mini-batch
  in rollouts, ``trainer.mini_batch_prompts x n``, and whole micro-batches; spec 2.3);
- what refill could not round (no pruning, a short DAPO batch) is trimmed by
  :func:`trim_to_multiple`; a kept set smaller than one micro-batch per DP rank (a short DAPO
  batch) is padded with zero-weight rows instead (:func:`fit_to_micro_batches`);
- each rank splits its rows into :func:`mini_batch_sizes`, one optimizer update each
  (``algorithm.ppo_epochs`` passes), :func:`rank_mini_batch_rows` rollouts per update;
- the LR schedule is sized by :func:`updates_per_step_estimate` units per step and scheduled on
  the RL step (:func:`lr_positions`): the ``j``-th of the ``u`` updates of step ``s`` sets the
  schedule to ``(s - 1 + j / u) x U``, so every step ends at ``s x U`` and the decay completes
  at the last step whatever number of updates the steps make.

Two geometries (``pruning.refill_to``; docs/algorithm.md, "Update geometry"):

- ``"mini_batch"`` (the reference implementation and the paper): the rules above. Pruning is
  quantized: with 32 prompts x 8 and mini-batches of 16 prompts the kept count is 128 or 256.
- ``"free"`` (default): the kept count is rounded only to what data parallelism needs
  (:func:`kept_unit`: dp_size, or dp_size x micro_batch_size with pipeline parallelism);
  each step makes a fixed number of optimizer updates, :func:`updates_per_pass` per
  ``ppo_epochs`` pass (prompts_per_step / mini_batch_prompts, as an unpruned step), each over an
  equal share of the kept rollouts (:func:`update_shares`), cut into micro-batches by a token
  budget (:func:`token_micro_batches`, ``trainer.micro_batch_tokens``) or by
  ``parallel.micro_batch_size`` rows (the last may be shorter). The loss is a token mean over the
  GLOBAL token count of the update (:class:`~fastrl.training.actor.Actor`), so neither the cut
  nor the DP split changes the loss or the gradient. The LR schedule has
  ``steps x updates_per_step_estimate`` units, one per update of a step that makes them all; a
  step whose ranks hold fewer rows than updates makes fewer, each advancing the schedule by more
  (:func:`lr_positions`), so a linear/cosine decay completes whatever MDAP keeps or ARS chooses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fastrl.algorithms import pruning as P
from fastrl.config import RunConfig

#: Rows of one old / reference log-prob micro-batch cut by a token budget
#: (``trainer.micro_batch_tokens``), per row of an update micro-batch (``parallel.micro_batch_size``):
#: the log-prob passes run forward only, keeping no activations for a backward pass, so one of their
#: micro-batches may hold this many times the rows of an update's; the cap bounds what one forward
#: materializes (its float32 logits, ``rows x T x vocabulary``) when the rollouts are short and many
#: fit the token budget. :attr:`StepGeometry.log_prob_max_rows`.
LOG_PROB_MICRO_BATCH_FACTOR = 8


def free_geometry(cfg: RunConfig) -> bool:
    """True for ``pruning.refill_to='free'`` (the kept count is not quantized by the mini-batch)."""
    return cfg.pruning.refill_to == "free"


def equal_micro_batches(cfg: RunConfig) -> bool:
    """Whether every micro-batch must hold ``parallel.micro_batch_size`` rollouts
    (:attr:`RunConfig.equal_micro_batches`: the mini-batch geometry, or pipeline parallelism)."""
    return cfg.equal_micro_batches


def kept_unit(cfg: RunConfig, dp_size: int) -> int:
    """The kept count is trimmed to a multiple of this, and padded up to it when fewer are kept:
    one micro-batch of ``parallel.micro_batch_size`` rollouts per DP rank where micro-batches must
    be equal (the mini-batch geometry, pipeline parallelism), one rollout per DP rank otherwise
    (every rank the same count). In the free geometry it is also the Phase-2 refill multiple."""
    return dp_size * cfg.parallel.micro_batch_size if equal_micro_batches(cfg) else dp_size


def refill_multiple(cfg: RunConfig, dp_size: int, n: int) -> int:
    """Phase-2 refill multiple at group size ``n`` (:meth:`RunConfig.update_multiple`); in the
    free geometry only :func:`kept_unit` (Phase 2 adds at most ``unit - 1`` rollouts)."""
    if free_geometry(cfg):
        return kept_unit(cfg, dp_size)
    return cfg.update_multiple(dp_size, n=n)


@dataclass(frozen=True)
class UpdatePlan:
    """One DP rank's policy update of one step (computed once, :meth:`StepGeometry.plan_update`).

    Attributes:
        row_order: the rank's rows in the order the updates consume them (indices into the rank's
            batch, a permutation): with ``trainer.group_by_length`` (default) each update's share
            of rows (consecutive in the rank's batch) sorted by length, longest first
            (:func:`length_grouped_order`), so that every
            micro-batch holds rows of similar length and the padding each pass computes on is
            small. Every update keeps its rows: only their order, and so the micro-batch
            grouping, changes (the loss of an update is a token sum over the update's global token
            count, the same for every grouping). Otherwise the identity.
        update_rows: rows of each optimizer update of one pass, consecutive over the rows in
            ``row_order`` (their sum is the rank's row count).
        micro_batches: per update, the sizes of its consecutive micro-batches (a token budget,
            :func:`token_micro_batches`, over the lengths in ``row_order``), or None for
            micro-batches of ``parallel.micro_batch_size``.
        passes: ``algorithm.ppo_epochs`` passes over the rows.
        lr_positions: the LR-schedule position of each update, in order (``passes x
            len(update_rows)`` of them, :func:`lr_positions`).
        dp_size: the DP ranks that run this plan alike (:attr:`StepGeometry.dp_size`; the actor
            undoes megatron's average of the losses and gradients over them).
    """

    row_order: tuple[int, ...]
    update_rows: tuple[int, ...]
    micro_batches: tuple[tuple[int, ...] | None, ...]
    passes: int
    lr_positions: tuple[int | float, ...]
    dp_size: int

    @property
    def updates(self) -> int:
        """Optimizer updates of the step (``actor/updates``)."""
        return self.passes * len(self.update_rows)


@dataclass(frozen=True, kw_only=True)
class StepGeometry:
    """The one value that decides a step's cuts and its data-parallel size (:func:`step_geometry`,
    computed once per step at the step's group size): the pruning phase reads the kept-count rules,
    the DP pruning bookkeeping and the re-partition its ``dp_size``, the old / reference log-prob
    passes their cut (:meth:`log_prob_cut`), and the update its :class:`UpdatePlan`
    (:meth:`plan_update`), which hands ``dp_size`` on to the actor.

    Attributes:
        dp_size: data-parallel ranks (each holds its own rollouts; TP / PP peers share them).
        n: rollouts per prompt this step (ARS's group size).
        refill_multiple: MDAP's Phase-2 refill rounds the kept count up to a multiple of this
            (:func:`refill_multiple`).
        kept_unit: the kept count is trimmed to a multiple of this, or padded up to it when fewer
            are kept (:func:`kept_unit`, :func:`fit_to_micro_batches`).
        micro_batch_size: rows of an update micro-batch (``parallel.micro_batch_size``); the
            largest one of a token budget.
        equal_micro_batches: every micro-batch holds ``micro_batch_size`` rows (the mini-batch
            geometry, pipeline parallelism; :attr:`RunConfig.equal_micro_batches`).
        micro_batch_tokens: token budget of a micro-batch (``trainer.micro_batch_tokens``), 0 for
            micro-batches of ``micro_batch_size`` rows; always 0 with equal micro-batches.
        log_prob_max_rows: rows of one old / reference log-prob micro-batch cut by the token
            budget, at most (``micro_batch_size x`` :data:`LOG_PROB_MICRO_BATCH_FACTOR`).
        updates_per_pass: optimizer updates per pass in the free geometry
            (:func:`updates_per_pass`); None in the mini-batch geometry.
        mini_batch_rows: rows of one optimizer update on one rank in the mini-batch geometry
            (:func:`rank_mini_batch_rows`); None in the free geometry.
        passes: ``algorithm.ppo_epochs``.
        lr_units_per_step: LR-schedule units per RL step (:func:`updates_per_step_estimate`).
        group_by_length: ``trainer.group_by_length``.

    Raises:
        ValueError: a size below 1, a token budget with equal micro-batches, or not exactly one of
            ``updates_per_pass`` / ``mini_batch_rows``.
    """

    dp_size: int
    n: int
    refill_multiple: int
    kept_unit: int
    micro_batch_size: int
    equal_micro_batches: bool
    micro_batch_tokens: int
    log_prob_max_rows: int
    updates_per_pass: int | None
    mini_batch_rows: int | None
    passes: int
    lr_units_per_step: int
    group_by_length: bool

    def __post_init__(self) -> None:
        for name in ("dp_size", "n", "refill_multiple", "kept_unit", "micro_batch_size", "log_prob_max_rows",
                     "passes", "lr_units_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"StepGeometry.{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_tokens < 0 or (self.equal_micro_batches and self.micro_batch_tokens):
            raise ValueError(
                f"StepGeometry.micro_batch_tokens={self.micro_batch_tokens}: must be >= 0, and 0 with equal micro-batches"
            )
        if (self.updates_per_pass is None) == (self.mini_batch_rows is None):
            raise ValueError("StepGeometry needs exactly one of updates_per_pass (free) and mini_batch_rows (mini-batch)")
        for name in ("updates_per_pass", "mini_batch_rows"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"StepGeometry.{name} must be >= 1 or None, got {getattr(self, name)}")

    def log_prob_cut(self, lengths: list[int] | torch.Tensor) -> list[int] | None:
        """Rows of each consecutive micro-batch of an old / reference log-prob pass over rows of
        ``lengths`` tokens (in the order given): a token budget of ``micro_batch_tokens``, at most
        ``log_prob_max_rows`` rows each (:func:`token_micro_batches`); None without a token budget
        (micro-batches of ``micro_batch_size`` rows, the batch padded to a whole number of them)."""
        if self.micro_batch_tokens <= 0:
            return None
        return token_micro_batches(lengths, self.micro_batch_tokens, self.log_prob_max_rows)

    def plan_update(self, lengths: list[int] | torch.Tensor, *, step: int) -> UpdatePlan:
        """The :class:`UpdatePlan` of a rank holding rows of ``lengths`` tokens (prompt + response) at
        RL step ``step`` (1-based).

        Mini-batch geometry: one optimizer update per mini-batch (:func:`mini_batch_sizes`),
        micro-batches of ``micro_batch_size``. Free geometry: ``updates_per_pass`` updates per pass
        over equal shares (:func:`update_shares`), each cut into micro-batches by
        ``micro_batch_tokens`` (:func:`token_micro_batches`) unless micro-batches must be equal.
        The LR positions share the step's ``lr_units_per_step`` units (:func:`lr_positions`).
        Within each update the rows are grouped by length (:attr:`UpdatePlan.row_order`) unless
        ``group_by_length`` is off.

        Raises:
            ValueError: no rows, ``step < 1``, or rows that do not split into whole micro-batches.
        """
        raw = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
        mbs = self.micro_batch_size
        if self.updates_per_pass is not None:
            per = update_shares(len(raw), self.updates_per_pass, mbs if self.equal_micro_batches else 1)
        else:
            per = mini_batch_sizes(len(raw), self.mini_batch_rows, mbs)
        order = length_grouped_order(raw, per) if self.group_by_length else list(range(len(raw)))
        lens = [raw[i] for i in order]
        micro: list[tuple[int, ...] | None] = []
        start = 0
        for size in per:
            cut = None if self.equal_micro_batches else token_micro_batches(lens[start : start + size], self.micro_batch_tokens, mbs)
            micro.append(None if cut is None else tuple(cut))
            start += size
        positions = lr_positions(step, len(per) * self.passes, self.lr_units_per_step)
        return UpdatePlan(
            row_order=tuple(order), update_rows=tuple(per), micro_batches=tuple(micro), passes=self.passes,
            lr_positions=tuple(positions), dp_size=self.dp_size,
        )


def step_geometry(cfg: RunConfig, dp_size: int, n: int) -> StepGeometry:
    """The :class:`StepGeometry` of a step at group size ``n`` on ``dp_size`` DP ranks.

    Raises:
        ValueError: ``dp_size`` or ``n`` below 1.
    """
    if dp_size < 1 or n < 1:
        raise ValueError(f"a step geometry needs dp_size >= 1 and n >= 1, got dp_size={dp_size}, n={n}")
    equal = equal_micro_batches(cfg)
    free = free_geometry(cfg)
    mbs = cfg.parallel.micro_batch_size
    return StepGeometry(
        dp_size=dp_size, n=n, refill_multiple=refill_multiple(cfg, dp_size, n), kept_unit=kept_unit(cfg, dp_size),
        micro_batch_size=mbs, equal_micro_batches=equal,
        micro_batch_tokens=0 if equal else cfg.trainer.micro_batch_tokens,
        log_prob_max_rows=mbs * LOG_PROB_MICRO_BATCH_FACTOR,
        updates_per_pass=updates_per_pass(cfg) if free else None,
        mini_batch_rows=None if free else rank_mini_batch_rows(cfg, dp_size, n),
        passes=cfg.algorithm.ppo_epochs, lr_units_per_step=updates_per_step_estimate(cfg),
        group_by_length=cfg.trainer.group_by_length,
    )


def length_grouped_order(lengths: list[int], shares: list[int] | tuple[int, ...]) -> list[int]:
    """A permutation of ``range(len(lengths))`` that sorts each consecutive share of rows (sizes
    ``shares``, summing to ``len(lengths)``) by length, longest first (ties keep their order): rows
    never leave their share (an optimizer update keeps its rows), and consecutive micro-batches cut
    from a share hold rows of similar length, so trimming each micro-batch to its longest row
    (:func:`fastrl.models.logprobs.fit_micro_batches`) leaves little padding. Longest first: the
    activation peak of the update comes at its first micro-batch.

    Raises:
        ValueError: the shares do not sum to the row count, or one is negative.
    """
    if sum(shares) != len(lengths) or min(shares, default=0) < 0:
        raise ValueError(f"update shares {list(shares)} do not split {len(lengths)} rows")
    order: list[int] = []
    start = 0
    for size in shares:
        order.extend(sorted(range(start, start + size), key=lambda i: -lengths[i]))
        start += size
    return order


def padded_token_share(
    lengths: list[int] | torch.Tensor, micro_batches: list[int] | tuple[int, ...], multiple: int = 1
) -> tuple[int, int]:
    """``(real, computed)`` tokens of consecutive micro-batches of ``micro_batches`` rows over rows
    of ``lengths`` tokens, each micro-batch run at its own longest row rounded up to ``multiple``
    (the FP8 / sequence-parallel multiple, :func:`fastrl.models.logprobs.fit_micro_batches`):
    ``1 - real / computed`` is the share of the computed tokens that is padding.

    Raises:
        ValueError: the micro-batch sizes do not sum to the row count.
    """
    lens = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    if sum(micro_batches) != len(lens):
        raise ValueError(f"micro-batch sizes {list(micro_batches)} do not split {len(lens)} rows")
    real = computed = start = 0
    for size in micro_batches:
        part = lens[start : start + size]
        real += sum(part)
        computed += size * -(-max(part, default=0) // multiple) * multiple
        start += size
    return real, computed


def updates_per_pass(cfg: RunConfig) -> int:
    """Optimizer updates per ``ppo_epochs`` pass of the free geometry:
    ``prompts_per_step // mini_batch_prompts`` (>= 1), whatever the kept count."""
    return max(1, cfg.rollout.prompts_per_step // cfg.trainer.mini_batch_prompts)


def update_shares(rows: int, updates: int, micro: int = 1) -> list[int]:
    """Rows of each optimizer update of one pass in the free geometry: ``updates`` near-equal
    consecutive shares of ``rows`` (the first ``rows % updates`` one larger), fewer when there are
    fewer than ``updates`` units of ``micro`` rows; each share a whole number of ``micro``-row units.

    Raises:
        ValueError: ``rows`` is not a positive multiple of ``micro``, or ``updates < 1``.
    """
    if updates < 1 or micro < 1 or rows < 1 or rows % micro:
        raise ValueError(f"cannot split {rows} rollouts into {updates} updates of whole units of {micro}")
    units = rows // micro
    count = min(updates, units)
    base, extra = divmod(units, count)
    return [(base + (1 if i < extra else 0)) * micro for i in range(count)]


def token_micro_batches(lengths: list[int] | torch.Tensor, budget: int, max_rows: int | None = None) -> list[int]:
    """Sizes of consecutive micro-batches holding at most ``budget`` real tokens each (a rollout
    longer than the budget gets a micro-batch of its own); ``max_rows`` caps the rows of one
    micro-batch. ``budget <= 0``: micro-batches of ``max_rows`` rows (the last may be shorter).

    The order of the rows is kept, so the micro-batches concatenate back to the input. With a
    budget the cut is :func:`fewest_padded_cut`: the fewest micro-batches (as many as the greedy
    fill makes), and among those the fewest padded tokens, no micro-batch padded to more tokens
    than the greedy fill's largest: on length-sorted rows the greedy fill joins the tail of one
    length class to the head of the next, which this cut avoids at no extra micro-batch and no
    higher peak.
    """
    lens = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    if not lens:
        return []
    cap = max_rows if max_rows and max_rows > 0 else len(lens)
    if budget <= 0:
        return [min(cap, len(lens) - i) for i in range(0, len(lens), cap)]
    return fewest_padded_cut(lens, budget, cap)


def greedy_fill(lengths: list[int], budget: int, max_rows: int) -> list[int]:
    """Sizes of the greedy fill: rows (in the order given) join the current micro-batch while it
    stays within ``budget`` real tokens and ``max_rows`` rows (a longer row alone); the fewest
    consecutive micro-batches within those limits (:func:`fewest_padded_cut`)."""
    sizes: list[int] = []
    rows = tokens = 0
    for length in lengths:
        if rows and (tokens + length > budget or rows >= max_rows):
            sizes.append(rows)
            rows = tokens = 0
        rows += 1
        tokens += length
    return [*sizes, rows] if rows else sizes


def fewest_padded_cut(lengths: list[int], budget: int, max_rows: int) -> list[int]:
    """Sizes of consecutive micro-batches of rows of ``lengths`` tokens (in the order given), each
    at most ``max_rows`` rows and ``budget`` real tokens (or one row), and padded (rows x longest
    row) to at most the largest padded micro-batch of the greedy fill: the fewest such
    micro-batches, then the fewest padded tokens in total, then the larger earlier micro-batches.

    The greedy fill (rows join the current micro-batch while it stays within the budget and the
    cap) makes the fewest micro-batches any consecutive cut can: a sub-range of an allowed
    micro-batch is allowed, so each greedy boundary lies at or beyond the same boundary of any
    other cut; it therefore meets every limit above, and the fewest count is the same with the
    peak limit. The peak limit keeps the activation memory a budget was sized for (minimizing the
    total alone can raise one micro-batch's padded tokens).

    Exact dynamic programme over the suffixes: ``best[i]`` = the lexicographically least
    (micro-batches, padded tokens) of rows ``i:``; ``O(rows x w)`` time and ``O(rows)`` memory,
    ``w`` the most rows a micro-batch can hold.
    """
    n = len(lengths)
    peak, start = 0, 0  # the greedy fill's largest padded micro-batch
    for size in greedy_fill(lengths, budget, max_rows):
        peak = max(peak, size * max(lengths[start : start + size]))
        start += size
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    take = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        choice, longest, tokens = None, 0, 0
        for size in range(1, min(max_rows, n - i) + 1):
            tokens += lengths[i + size - 1]
            longest = max(longest, lengths[i + size - 1])
            if size > 1 and (tokens > budget or size * longest > peak):
                break
            count, padded = best[i + size]
            candidate = (count + 1, padded + size * longest)
            if choice is None or candidate <= choice:  # ties: the larger first micro-batch
                choice, take[i] = candidate, size
        best[i] = choice
    sizes, i = [], 0
    while i < n:
        sizes.append(take[i])
        i += take[i]
    return sizes


def rank_mini_batch_rows(cfg: RunConfig, dp_size: int, n: int) -> int:
    """Rollouts of one optimizer update on one DP rank: ``mini_batch_prompts x n / dp_size`` (>= 1)."""
    return max(1, cfg.trainer.mini_batch_prompts * n // dp_size)


def updates_per_step_estimate(cfg: RunConfig) -> int:
    """Units of the LR schedule per RL step, ``U = ppo_epochs x prompts_per_step //
    mini_batch_prompts`` (the optimizer updates of an unpruned step; the schedule has
    ``steps x U`` units, warm-up included, :func:`lr_positions`).

    The updates a step really makes: exactly ``U`` in the free geometry unless a rank holds fewer
    rows than ``U / ppo_epochs`` (then one per row and pass); in the mini-batch geometry one per
    mini-batch and pass, fewer than ``U`` on a pruned step. Either way the step still advances the
    schedule by exactly ``U`` units (:func:`lr_positions`), so the decay completes."""
    return cfg.algorithm.ppo_epochs * max(1, cfg.rollout.prompts_per_step // cfg.trainer.mini_batch_prompts)


def lr_positions(step: int, updates: int, per_step: int) -> list[int | float]:
    """LR-schedule positions of the ``updates`` optimizer updates of RL step ``step`` (1-based):
    the ``j``-th (``j = 1..updates``) sits at ``(step - 1) x per_step + j x per_step / updates``
    schedule units (``per_step``: :func:`updates_per_step_estimate`).

    The schedule is thus defined on the RL step: step ``s`` of ``S`` ends at ``s x per_step``
    whatever number of updates it makes, and the last step of the run ends at the schedule's
    horizon ``S x per_step`` (the configured minimum LR of a linear or cosine decay). A step that
    makes ``per_step`` updates gets the integer positions ``(s - 1) x per_step + 1 ..`` (the
    positions one increment per update gives: runs whose steps all make ``per_step`` updates are
    unchanged bit for bit); a position is an int whenever it is a whole number.

    Raises:
        ValueError: ``step``, ``updates`` or ``per_step`` is < 1.
    """
    if step < 1 or updates < 1 or per_step < 1:
        raise ValueError(f"LR positions need step, updates and per_step >= 1, got {step}, {updates}, {per_step}")
    base = (step - 1) * per_step
    out: list[int | float] = []
    for j in range(1, updates + 1):
        whole, rest = divmod(j * per_step, updates)
        out.append(base + whole if rest == 0 else base + j * per_step / updates)
    return out


def trim_to_multiple(
    result: P.PruneResult, advantages: torch.Tensor, group_ids: torch.Tensor, multiple: int
) -> tuple[P.PruneResult, int]:
    """Drop the kept rollouts with the smallest ``|a|`` (latest first on ties) until the kept
    count is a multiple of ``multiple`` (whole micro-batches on every DP rank).

    Only needed when nothing could be refilled (no pruning, or a batch shorter than the update
    geometry after DAPO filtering). Returns the new result and the number dropped.

    Raises:
        ValueError: fewer kept rollouts than ``multiple``.
    """
    kept = result.num_kept
    excess = kept % multiple
    if excess == 0:
        return result, 0
    if kept < multiple:
        raise ValueError(
            f"only {kept} rollouts are left for the update, fewer than dp_size x micro_batch_size = {multiple}; "
            f"raise rollout.prompts_per_step or algorithm.max_dynamic_sampling_rounds"
        )
    idx = result.indices
    order = sorted(idx.tolist(), key=lambda i: (abs(float(advantages[i])), -i))
    keep = result.keep.clone()
    keep[torch.tensor(order[:excess])] = False
    ids, counts = torch.unique(group_ids[keep], return_counts=True)
    per_group = {int(g): 0 for g in result.kept_per_group}
    per_group.update({int(g): int(c) for g, c in zip(ids, counts)})
    values = list(per_group.values())
    return (
        dataclasses.replace(
            result, keep=keep, kept_per_group=per_group,
            f1=sum(values) / max(len(values), 1), f2=max(values, default=0),
        ),
        excess,
    )


def fit_to_micro_batches(
    result: P.PruneResult, advantages: torch.Tensor, group_ids: torch.Tensor, whole: int
) -> tuple[P.PruneResult, int, int]:
    """Make the kept count fill whole micro-batches on every DP rank (``whole`` = dp_size x
    micro_batch_size): trim (:func:`trim_to_multiple`) when at least ``whole`` rollouts are kept,
    otherwise keep them all and report the zero-weight padding rows the caller must add.

    A kept set smaller than ``whole`` (a DAPO step that collected few informative groups) cannot be
    trimmed without dropping everything; the caller pads it with ``whole - kept`` copies of kept
    rows whose response mask is 0 (no loss, no gradient; :func:`fastrl.training.rollout_batch.padding_rows`).

    Returns:
        ``(result, dropped, padding)``: the (possibly trimmed) result, with ``num_padding`` set to
        the padding rows the caller adds (``prune/num_padding``), the rollouts dropped and that
        padding (at most one of the two is non-zero).

    Raises:
        ValueError: nothing is kept, or ``whole < 1``.
    """
    if whole < 1:
        raise ValueError(f"dp_size x micro_batch_size must be >= 1, got {whole}")
    kept = result.num_kept
    if kept == 0:
        raise ValueError("no rollout is left for the update")
    if kept < whole:
        return dataclasses.replace(result, num_padding=whole - kept), 0, whole - kept
    result, dropped = trim_to_multiple(result, advantages, group_ids, whole)
    return dataclasses.replace(result, num_padding=0), dropped, 0


def mini_batch_sizes(rows: int, mini: int, micro: int) -> list[int]:
    """Sizes of the policy-update mini-batches of ``rows`` rollouts on one rank.

    About ``rows / mini`` mini-batches (at least one), as equal as possible, each a whole number of
    micro-batches of ``micro`` rollouts: exactly ``mini`` each when ``rows`` is a multiple of
    ``mini`` and ``mini`` a multiple of ``micro`` (the usual case; the adaptive sampler's odd group
    sizes and DAPO's short batches give the others).

    Raises:
        ValueError: ``rows`` is not a multiple of ``micro``.
    """
    if rows % micro:
        raise ValueError(f"{rows} rollouts cannot be split into micro-batches of {micro}")
    units = rows // micro
    count = max(1, min(units, round(rows / mini)))
    base, extra = divmod(units, count)
    return [(base + (1 if i < extra else 0)) * micro for i in range(count)]
