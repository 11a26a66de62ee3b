"""The data files of a run, opened and validated first in start-up order.

:func:`load_run_data` reads the training, validation and (``data.test_size``) held-out test splits
of a run's config. :func:`fastrl.training.run.run` calls it before anything heavy -- the trainer's
imports (megatron-core, megatron-bridge, transformers: tens of seconds on a loaded machine), the
process group, the policy directory and the model build -- so that a missing file, a bad row or
overlapping splits is one error line within seconds of the start (issue 45, item 8). This module
imports :mod:`fastrl.data` and the config only.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastrl.config import RunConfig
from fastrl.data import LoadedData, load_test, load_train_val


@dataclass(frozen=True)
class RunData:
    """The splits of a run as loaded (bad rows skipped or refused per ``data.on_bad_row``), before
    the prompt-length filter (which needs the policy's tokenizer)."""

    train: LoadedData
    val: LoadedData
    test: LoadedData | None


def load_run_data(cfg: RunConfig) -> RunData:
    """Load ``cfg.data``'s splits: training (at most ``data.max_train_samples``), validation
    (``data.val_size``), and the held-out test split when ``data.test_size`` > 0, disjoint by
    question id.

    Raises:
        DataError: a missing or unreadable file, a bad row (``data.on_bad_row=error``), a split with
            no usable row, too few test questions, or a question id in two splits.
    """
    d = cfg.data
    train, val = load_train_val(
        d.dataset, d.train_path, d.val_path, on_bad_row=d.on_bad_row, cache_dir=d.cache_dir,
        max_train=d.max_train_samples, max_val=d.val_size,
    )
    test = (
        load_test(d.dataset, d.test_path, size=d.test_size, others=(("training", train), ("validation", val)),
                  on_bad_row=d.on_bad_row, cache_dir=d.cache_dir)
        if d.test_size else None
    )
    return RunData(train=train, val=val, test=test)
