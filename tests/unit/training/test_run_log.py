"""The run's log file is written only once the run directory's lock is taken
(fastrl/training/run.py: ``_setup_logging(hold=True)``, ``open_run_log``)."""

from __future__ import annotations

import logging

from fastrl.training.run import _setup_logging, open_run_log


def test_held_start_up_lines_reach_the_log_file_once_it_is_opened(tmp_path):
    """catches: the held records dropped when the file opens (the start-up lines missing from
    train.log), or written before it opens (a trainer refused by the lock writing into the holder's log)."""
    root = logging.getLogger()
    before = list(root.handlers)
    log = tmp_path / "run" / "train.log"
    try:
        _setup_logging(0, log, hold=True)
        logging.getLogger("fastrl.trainer").warning("loaded the data")
        assert not log.exists()
        open_run_log()
        logging.getLogger("fastrl.trainer").warning("first step")
        for h in root.handlers:
            h.flush()
        text = log.read_text()
        assert "loaded the data" in text and "first step" in text
        assert text.index("loaded the data") < text.index("first step")
    finally:
        for h in [h for h in root.handlers if h not in before]:
            root.removeHandler(h)
            h.close()
