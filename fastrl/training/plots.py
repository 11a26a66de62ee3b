"""Plots of a FastRL run (``tools/plot_run.py RUN_DIR`` and the end of every run).

:func:`plot` writes PNG files into ``RUN_DIR/plots`` (or another directory):

- ``reward.png``: training reward and accuracy per step, validation accuracy per step;
- ``accuracy_vs_time.png``: validation accuracy against training wall time (seconds);
- ``pruning.png``: kept fraction of rollouts and the group size n per step;
- ``time_breakdown.png``: mean seconds per step for each phase (gen, reward, prune, old, ref,
  update, refit, save);
- ``ars.png``: the adaptive sampler: the group size n per step, each step's kept counts f1 (mean
  per group) and f2 (max per group), and at every period boundary f3 and g1 (the rule moves n
  below n_max only when f3 < g1).
"""

from __future__ import annotations

from pathlib import Path

PHASES = ("gen", "reward", "prune", "old", "ref", "update", "refit", "save")


def load(run_dir: Path) -> tuple[list[dict], list[dict]]:
    from fastrl.training.metrics import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (is {run_dir} a FastRL run directory?)")
    records = read_metrics(path)
    train = [r for r in records if r.get("kind", "train") == "train"]
    val = [r for r in records if r.get("kind") == "val"]
    if not train:
        raise ValueError(f"{path} has no training steps yet")
    return train, val


def series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        if r.get(key) is not None:
            xs.append(r["step"])
            ys.append(r[key])
    return xs, ys


def phase_means(train: list[dict]) -> dict[str, float]:
    """Mean seconds per step of each phase (phases never timed are left out)."""
    out = {}
    for phase in PHASES:
        values = [r.get(f"time/{phase}", 0.0) or 0.0 for r in train]
        if any(values):
            out[phase] = sum(values) / len(train)
    return out


def plot(run_dir: Path, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, val = load(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("reward/mean", "train reward"), ("accuracy/mean", "train accuracy")):
        ax.plot(*series(train, key), label=label, alpha=0.8)
    if val:
        ax.plot(*series(val, "val/accuracy"), "o-", label="validation accuracy")
    ax.set_xlabel("step")
    ax.set_title(run_dir.name)
    ax.legend()
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.get("time/train_elapsed", 0.0) for r in val]
    ax.plot(xs, [r["val/accuracy"] for r in val], "o-")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("validation accuracy")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out_dir / "accuracy_vs_time.png"))

    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(*series(train, "prune/kept_fraction"), color="tab:blue", label="kept fraction")
    ax1.set_ylabel("kept fraction", color="tab:blue")
    ax1.set_ylim(0, 1.05)
    ax2 = ax1.twinx()
    ax2.step(*series(train, "rollout/n"), color="tab:red", where="post", label="n")
    ax2.set_ylabel("group size n", color="tab:red")
    ax1.set_xlabel("step")
    ax1.set_title(f"{run_dir.name}: pruning and group size")
    written.append(_save(fig, out_dir / "pruning.png"))

    written.append(plot_ars(train, out_dir / "ars.png", run_dir.name))

    means = phase_means(train)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(list(means), list(means.values()), color="tab:gray")
    ax.set_ylabel("seconds per step (mean)")
    ax.set_title(f"{run_dir.name}: time per phase")
    written.append(_save(fig, out_dir / "time_breakdown.png"))
    return written


def plot_ars(train: list[dict], path: Path, title: str) -> Path:
    """n per step, per-step f1 / f2, and f3 / g1 at the boundaries (``ars/*`` metrics)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.step(*series(train, "rollout/n"), color="tab:red", where="post", label="n (group size)", linewidth=2)
    ax.plot(*series(train, "ars/f1"), color="tab:blue", alpha=0.5, label="f1: mean kept per group")
    ax.plot(*series(train, "ars/f2"), color="tab:green", alpha=0.5, label="f2: max kept per group")
    ax.plot(*series(train, "ars/f3"), "o", color="tab:purple", label="f3 at a boundary")
    ax.plot(*series(train, "ars/g1"), "x", color="black", label="g1 (first boundary)")
    ax.set_xlabel("step")
    ax.set_ylabel("rollouts per group")
    ax.set_title(f"{title}: adaptive rollout sampling")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
