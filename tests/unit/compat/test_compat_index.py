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
