"""fastrl.compat is cheap to import, and its index names every patch module with its upstream version."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import fastrl.compat

PACKAGE = Path(fastrl.compat.__file__).parent
REPO = PACKAGE.parents[1]
TESTS = Path(__file__).parent


def test_importing_the_package_imports_neither_torch_nor_megatron():
    code = "import sys, fastrl.compat; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_every_patch_module_is_indexed_versioned_and_tested():
    index = fastrl.compat.__doc__
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and ("megatron-core 0." in doc or "megatron-bridge 0." in doc), f"{path.name}: name the upstream version"
        assert f"``{path.stem}" in index, f"{path.name} is missing from the fastrl.compat index"
        assert (TESTS / f"test_{path.stem}.py").is_file(), f"{path.name} has no tests/unit/compat/test_{path.stem}.py"


def _names(tree: ast.AST) -> set[str]:
    """Every identifier a module uses: names, attributes and what it imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.name.split(".")[-1] for alias in node.names)
    return names


def test_every_patch_function_is_exercised_by_its_test_file():
    # A test file per module is not a test per patch: each public function of a patch module must be
    # called by name in tests/unit/compat/test_<module>.py, directly or through the fastrl.compat
    # entry point that wraps it (apply_cpu_patches -> megatron_cpu.apply), and the file must hold
    # tests. Breakage caught: a new patch function added to a module whose test file exists but
    # never calls it (checked by adding a `def new_patch(): ...` to bridge_export.py).
    wrappers: dict[str, set[str]] = {}  # patch function -> entry points of fastrl.compat calling it
    for node in ast.parse((PACKAGE / "__init__.py").read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for name in _names(node):
                wrappers.setdefault(name, set()).add(node.name)
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        public = [
            n.name for n in ast.parse(path.read_text()).body
            if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
        ]
        test_tree = ast.parse((TESTS / f"test_{path.stem}.py").read_text())
        tests = [n for n in test_tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert public and tests, f"{path.name}: no public patch function or no test"
        used = _names(test_tree)
        untested = [f for f in public if f not in used and not (wrappers.get(f, set()) & used)]
        assert untested == [], f"{path.name}: {untested} never called by test_{path.stem}.py"
