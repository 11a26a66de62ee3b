"""tools/mutants.py on a tiny repository of its own: a break its test catches is reported caught, a
break no test sees is reported SURVIVED, an entry whose original text is gone is reported STALE,
and the exit status is non-zero unless every break was caught. Also: the committed list loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "mutants.py"

ENTRY = """
[[mutant]]
id = "{id}"
file = "toy/calc.py"
original = "{original}"
replacement = "{replacement}"
tests = ["tests/test_calc.py::test_add"]
"""


def _toy(root: Path, entries: list[tuple[str, str, str]]) -> Path:
    (root / "toy").mkdir(parents=True)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy" / "calc.py").write_text("def add(a, b):\n    return a + b\n\n\ndef unused():\n    return 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text("from toy.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    (root / ".venv").mkdir()  # never copied
    (root / ".venv" / "big").write_text("x")
    listing = root / "mutants.toml"
    listing.write_text("".join(ENTRY.format(id=i, original=o, replacement=r) for i, o, r in entries))
    return listing


def _run(root: Path, listing: Path) -> subprocess.CompletedProcess:
    # the toy's tests need no pytest plugin: without them each pytest run starts in under a second
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, str(TOOL), "--root", str(root), "--file", str(listing), "--timeout", "120"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_caught_survived_and_stale_are_reported(tmp_path):
    """catches: a tool that reports a surviving break as caught (e.g. counting any pytest exit as a
    catch), misses a stale entry, exits 0 when a break survives, or writes its breaks into the
    repository instead of a copy."""
    listing = _toy(tmp_path, [
        ("plus-as-minus", "return a + b", "return a - b"),   # test_add fails: caught
        ("unused-changed", "return 1", "return 2"),          # no test sees it: survived
        ("gone", "return a * b", "return a / b"),            # not in the file: stale
    ])
    before = (tmp_path / "toy" / "calc.py").read_text()
    proc = _run(tmp_path, listing)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    lines = {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if ln.split() and ln.split()[0] in ("caught", "SURVIVED", "STALE", "ERROR")}
    assert lines == {"plus-as-minus": "caught", "unused-changed": "SURVIVED", "gone": "STALE"}, out
    assert "by tests/test_calc.py::test_add" in out
    assert "original text occurs 0 times in toy/calc.py" in out and "update the entry" in out
    assert "mutants: 1 of 3 caught, 1 survived, 1 stale" in out
    assert (tmp_path / "toy" / "calc.py").read_text() == before  # the repository is untouched


def test_all_caught_exits_zero_and_failing_tests_stop_it(tmp_path):
    """catches: a tool that cannot exit 0, or that counts breaks as caught by tests that fail
    without any break."""
    listing = _toy(tmp_path, [("plus-as-minus", "return a + b", "return a - b")])
    proc = _run(tmp_path, listing)
    assert proc.returncode == 0 and "mutants: 1 of 1 caught" in proc.stdout, proc.stdout + proc.stderr
    (tmp_path / "tests" / "test_calc.py").write_text("def test_add():\n    assert False\n")
    proc = _run(tmp_path, listing)
    assert proc.returncode == 1 and "do not pass on the unchanged copy" in proc.stdout, proc.stdout


def test_the_committed_list_loads_and_names_existing_files(tmp_path):
    """catches: a malformed tools/mutants.toml, a stale entry or one whose file or test file moved
    (cheap: nothing is run), and a loader that accepts an entry without its keys."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import mutants
    finally:
        sys.path.remove(str(REPO / "tools"))
    entries = mutants.load(REPO / "tools" / "mutants.toml")
    assert len(entries) >= 14
    for m in entries:
        assert (REPO / m.file).read_text().count(m.original) == 1, f"{m.id}: stale entry"
        for node in m.tests:
            assert (REPO / node.split("::")[0]).is_file(), f"{m.id}: {node}"
    bad = tmp_path / "m.toml"
    bad.write_text('[[mutant]]\nid = "x"\n')
    with pytest.raises(SystemExit, match="missing keys"):
        mutants.load(bad)


def test_a_break_that_stops_the_import_is_caught(tmp_path):
    """catches: a tool that reports a break which makes the tested module fail to import (pytest
    exit 2, a collection error) as an error instead of caught."""
    listing = _toy(tmp_path, [("syntax-error", "return a + b", "return a +")])
    proc = _run(tmp_path, listing)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "caught    syntax-error" in proc.stdout and "by a collection error" in proc.stdout
