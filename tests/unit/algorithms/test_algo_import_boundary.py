"""The algorithm package stays pure: it imports torch (not torch.distributed), numpy, numba and the
standard library only, and importing it loads nothing else (no megatron, no run config)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import fastrl.algorithms

PACKAGE = Path(fastrl.algorithms.__file__).parent
ALLOWED_THIRD_PARTY = {"torch", "numpy", "numba"}


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = "fastrl.algorithms." + (node.module or "") if node.level else node.module
            for alias in node.names:  # `from torch import distributed` is torch.distributed
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            if node.attr == "distributed":
                yield node.lineno, "torch.distributed"


def test_static_imports_are_allowed():
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 8
    bad = []
    for path in files:
        for lineno, name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("torch.distributed"):
                bad.append(f"{path.name}:{lineno} {name}")
            elif name.startswith("fastrl.") and not name.startswith("fastrl.algorithms"):
                bad.append(f"{path.name}:{lineno} {name}")
            elif top not in ALLOWED_THIRD_PARTY | {"fastrl", "__future__"} and top not in sys.stdlib_module_names:
                bad.append(f"{path.name}:{lineno} {name}")
    assert not bad, "forbidden imports in fastrl/algorithms: " + ", ".join(bad)


def test_importing_the_package_loads_nothing_else():
    code = (
        "import sys, json\n"
        "import torch, numpy\n"
        "before = set(sys.modules)\n"
        "import fastrl.algorithms\n"
        "from fastrl.algorithms import pruning\n"
        "pruning.mdap_select(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), [torch.tensor([1]), torch.tensor([2])])\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=240)
    new = json.loads(out.stdout.strip().splitlines()[-1])
    offenders = [
        m
        for m in new
        if m.split(".")[0] in {"megatron", "transformers", "vllm", "mpi4py"}
        or (m.startswith("fastrl") and not m.startswith("fastrl.algorithms") and m != "fastrl")
        or m.startswith("torch.distributed")
    ]
    assert not offenders, offenders
    assert "fastrl.algorithms.pruning" in new
