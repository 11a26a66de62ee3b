"""Deliberate breaks of the code, each with the tests that must catch it (``make mutants``).

The breaks are listed in ``tools/mutants.toml``: per entry an ``id``, the ``file`` it changes
(relative to the repository root), the exact ``original`` text (found exactly once in that file),
its ``replacement``, the pytest node ids (``tests``) that must fail on it, and ``what`` it breaks.

The tool copies the repository once into a temporary directory (the files git tracks plus those it
does not ignore: no ``.venv``, no ``.git``), checks that the listed tests pass there unchanged, then
applies one break at a time to the copy, runs that break's tests with ``PYTHONPATH`` set to the
copy (so ``import fastrl`` is the copy's) and restores the file. It prints one line per break:

* ``caught``: at least one of its tests failed (or could not be collected any more: the break
  makes an import fail);
* ``SURVIVED``: all of its tests passed with the break in place;
* ``STALE``: its ``original`` text is not found exactly once in ``file`` (the code moved on: update
  the entry);
* ``ERROR``: pytest ended otherwise (an internal or usage error, no test collected) or ran past
  ``--timeout``.

Exit status 0 when every break was caught, 1 otherwise (also when the unchanged tests fail).

Usage::

    python tools/mutants.py                  # every break of tools/mutants.toml
    python tools/mutants.py --only ID [ID]   # some of them
    python tools/mutants.py --list           # the entries, without running anything
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LIST = ROOT / "tools" / "mutants.toml"
#: Never copied (besides what git ignores): environments and version control.
SKIP = {".git", ".venv", ".venv-vllm", "__pycache__", ".pytest_cache", ".hypothesis"}
#: pytest's exit status when tests ran and some failed; 0: all passed.
PYTEST_FAILED = 1
#: pytest's exit statuses when a test module failed to collect (2; 4 when a node id's module did).
#: The listed tests were collected on the unchanged copy, so with a break in place the break made
#: an import fail: caught too.
PYTEST_COLLECTION_FAILED = (2, 4)


@dataclass(frozen=True)
class Mutant:
    """One deliberate break (an entry of the list)."""

    id: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    what: str = ""


def load(path: Path) -> list[Mutant]:
    """The entries of ``path`` (TOML, ``[[mutant]]`` tables).

    Raises:
        SystemExit: a missing or unknown key, an empty test list, a duplicate id.
    """
    data = tomllib.loads(path.read_text())
    fields = {"id", "file", "original", "replacement", "tests", "what"}
    out: list[Mutant] = []
    for i, entry in enumerate(data.get("mutant", [])):
        where = f"{path}: [[mutant]] #{i + 1} ({entry.get('id', 'no id')})"
        missing = sorted({"id", "file", "original", "replacement", "tests"} - entry.keys())
        unknown = sorted(entry.keys() - fields)
        if missing or unknown:
            raise SystemExit(f"{where}: missing keys {missing}, unknown keys {unknown}; keys are {sorted(fields)}")
        if not entry["tests"] or entry["original"] == entry["replacement"]:
            raise SystemExit(f"{where}: needs at least one test and a replacement that differs from the original")
        if entry["id"] in {m.id for m in out}:
            raise SystemExit(f"{where}: duplicate id {entry['id']!r}")
        out.append(Mutant(entry["id"], entry["file"], entry["original"], entry["replacement"],
                          tuple(entry["tests"]), entry.get("what", "")))
    if not out:
        raise SystemExit(f"{path}: no [[mutant]] entries")
    return out


def repository_files(root: Path) -> list[Path]:
    """The files to copy: git's tracked and untracked-but-not-ignored files, or (not a git
    checkout) every file outside :data:`SKIP` directories."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=root, capture_output=True)
    if proc.returncode == 0:
        names = [n for n in proc.stdout.decode().split("\0") if n]
        return [Path(n) for n in names if not SKIP & set(Path(n).parts) and (root / n).is_file()]
    return [p.relative_to(root) for p in sorted(root.rglob("*"))
            if p.is_file() and not SKIP & set(p.relative_to(root).parts)]


def copy_tree(root: Path, dest: Path) -> None:
    for rel in repository_files(root):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    """pytest on ``tests`` in ``copy`` (``PYTHONPATH=copy``); the exit status (None: timed out) and
    the output."""
    env = dict(os.environ, PYTHONPATH=str(copy), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rf", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    return proc.returncode, proc.stdout + proc.stderr


def check_imports_from(copy: Path) -> None:
    """The copy's packages are the ones imported (an installed package must not shadow them)."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    for pkg in sorted({p.parent.name for p in copy.glob("*/__init__.py")} - {"tests", "tools"}):
        proc = subprocess.run([sys.executable, "-c", f"import {pkg}; print({pkg}.__file__)"], cwd=copy, env=env,
                              capture_output=True, text=True)
        if proc.returncode == 0 and not Path(proc.stdout.strip()).resolve().is_relative_to(copy.resolve()):
            raise SystemExit(f"mutants: `import {pkg}` resolves to {proc.stdout.strip()}, not to the copy {copy}")


def apply(copy: Path, m: Mutant) -> str | None:
    """Write ``m``'s break into the copy; returns why it is stale (None: applied)."""
    path = copy / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    text = path.read_text()
    found = text.count(m.original)
    if found != 1:
        return f"its original text occurs {found} times in {m.file} (must be exactly once): {m.original!r}"
    path.write_text(text.replace(m.original, m.replacement))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", type=Path, default=DEFAULT_LIST, help="the list of breaks (default: tools/mutants.toml)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository to copy (default: this one)")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run these entries only")
    ap.add_argument("--list", action="store_true", help="print the entries and exit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (default 900)")
    args = ap.parse_args(argv)
    mutants = load(args.file)
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            raise SystemExit(f"mutants: no entries {unknown} in {args.file}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id}: {m.file}: {m.what}\n    tests: {' '.join(m.tests)}")
        return 0
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="fastrl-mutants-") as tmp:
        copy = Path(tmp) / "repo"
        copy_tree(root, copy)
        check_imports_from(copy)
        every = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        rc, tail = run_tests(copy, every, args.timeout)
        if rc != 0:
            print(f"mutants: the listed tests do not pass on the unchanged copy (pytest exit {rc}); "
                  f"nothing can be caught:\n{tail[-3000:]}")
            return 1
        counts: dict[str, int] = {}
        for m in mutants:
            start = time.monotonic()
            saved = (copy / m.file).read_text() if (copy / m.file).is_file() else None
            stale = apply(copy, m)
            if stale is not None:
                status, detail = "STALE", f"{stale}; update the entry in {args.file.name}"
            else:
                try:
                    rc, tail = run_tests(copy, m.tests, args.timeout)
                finally:
                    (copy / m.file).write_text(saved)
                if rc == PYTEST_FAILED:
                    failed = [ln.split()[1] for ln in tail.splitlines() if ln.startswith("FAILED ")]
                    status, detail = "caught", f"by {failed[0]}" if failed else ""
                elif rc in PYTEST_COLLECTION_FAILED and "ERROR collecting" in tail:
                    status, detail = "caught", "by a collection error (the break makes an import fail)"
                elif rc == 0:
                    status, detail = "SURVIVED", f"every test passed: {' '.join(m.tests)}"
                elif rc is None:
                    status, detail = "ERROR", f"{tail} (--timeout)"
                else:
                    status, detail = "ERROR", f"pytest exit {rc}: the tests did not run as listed\n{tail[-3000:]}"
            counts[status] = counts.get(status, 0) + 1
            print(f"{status:<9} {m.id}  ({time.monotonic() - start:.1f} s){'  ' + detail if detail else ''}", flush=True)
    bad = len(mutants) - counts.get("caught", 0)
    print(f"mutants: {counts.get('caught', 0)} of {len(mutants)} caught"
          + "".join(f", {counts[s]} {s.lower()}" for s in ("SURVIVED", "STALE", "ERROR") if counts.get(s)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
