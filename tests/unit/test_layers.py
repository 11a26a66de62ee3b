"""The import layers of the project (docs/architecture.md): imports run one way, with no cycles,
and only ``fastrl/distributed`` touches ``torch.distributed``, megatron's parallel state and mpi4py.

Layers, highest first; a module may import its own package and anything in a lower layer:

    entry        fastrl.train
    cli          fastrl.cli
    recipes      recipes
    training     fastrl.training
    rollout      fastrl.rollout
    models       fastrl.models
    checkpoint   fastrl.checkpoint
    distributed  fastrl.distributed
    base         fastrl.algorithms, fastrl.data, fastrl.rewards   (each imports only the foundation)
    foundation   fastrl.config, fastrl.batch, fastrl.compat       (import nothing else of fastrl)

Every import counts, also one inside a function or under ``TYPE_CHECKING``, and a dynamic one:
``importlib.import_module``, ``importlib.util.find_spec`` or ``__import__`` of a literal name (a
module located by ``find_spec`` without being imported still ties this layer to that one).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("fastrl.train",)),
    ("cli", ("fastrl.cli",)),
    ("recipes", ("recipes",)),
    ("training", ("fastrl.training",)),
    ("rollout", ("fastrl.rollout",)),
    ("models", ("fastrl.models",)),
    ("checkpoint", ("fastrl.checkpoint",)),
    ("distributed", ("fastrl.distributed",)),
    ("base", ("fastrl.algorithms", "fastrl.data", "fastrl.rewards")),
    ("foundation", ("fastrl.config", "fastrl.batch", "fastrl.compat")),
]

#: Only these packages may import torch.distributed / megatron parallel state / mpi4py directly.
#: fastrl.compat patches megatron-core's CUDA assumptions (it must reach the modules it patches);
#: fastrl.checkpoint reads dist_checkpointing metadata through torch.distributed.checkpoint's
#: file reader (no communication).
PLUMBING = ("torch.distributed", "megatron.core.parallel_state", "megatron.core.mpu", "mpi4py")
PLUMBING_ALLOWED = {
    "fastrl.distributed": PLUMBING,
    "fastrl.compat": PLUMBING,
    "fastrl.checkpoint": ("torch.distributed.checkpoint",),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    files = sorted((REPO / "fastrl").rglob("*.py")) + sorted((REPO / "recipes").glob("*.py"))
    return {_module_name(p): p for p in files if p != REPO / "fastrl" / "__init__.py"}  # the root: a docstring and __version__


#: Calls that import or locate a module named by their first argument.
DYNAMIC_IMPORTS = ("import_module", "find_spec", "__import__")


def _dynamic_import(node: ast.Call) -> str | None:
    """The module a call such as ``importlib.util.find_spec("recipes")`` names (a literal, absolute
    name; None for any other call)."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in DYNAMIC_IMPORTS or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value and not arg.value.startswith("."):
        return arg.value
    return None


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every import (``from a import b`` gives ``a.b``), dynamic ones
    (:data:`DYNAMIC_IMPORTS`) included."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and (target := _dynamic_import(node)) is not None:
            out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def _layer_of(module: str) -> int | None:
    for rank, (_, packages) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages):
            return len(LAYERS) - rank
    return None


def _package_of(module: str) -> str:
    for _, packages in LAYERS:
        for p in packages:
            if module == p or module.startswith(p + "."):
                return p
    return module


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The project module ``target`` names (``a.b.c`` may be the name ``c`` in module ``a.b``)."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def test_every_module_has_a_layer():
    missing = [m for m in _modules() if _layer_of(m) is None]
    assert not missing, f"modules outside every layer (add them to LAYERS and docs/architecture.md): {missing}"


def _rel(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _upward_imports(modules: dict[str, Path]) -> list[str]:
    """``path:line imports module`` for every import of ``modules`` against the layer order."""
    bad = []
    for name, path in modules.items():
        here, own = _layer_of(name), _package_of(name)
        for line, target in _imports(name, path):
            dep = _resolve(target, modules)
            if dep is None or _package_of(dep) == own:
                continue
            there = _layer_of(dep)
            foundation = _layer_of("fastrl.config")
            if there >= here or (here == _layer_of("fastrl.algorithms") and there != foundation) or here == foundation:
                bad.append(f"{_rel(path)}:{line} imports {dep}")
    return bad


def test_imports_run_one_way():
    bad = _upward_imports(_modules())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycles_between_modules():
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for _, target in _imports(name, path):
            dep = _resolve(target, modules)
            if dep is not None and dep != name and not (name.startswith(dep + ".") and path.name == "__init__.py"):
                edges[name].add(dep)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in modules:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_only_the_distributed_package_touches_process_groups():
    bad = []
    for root in ("fastrl", "tools", "bench", "recipes"):
        for path in sorted((REPO / root).rglob("*.py")):
            name = _module_name(path)
            allowed = PLUMBING_ALLOWED.get(_package_of(name), ())
            for line, target in _imports(name, path):
                hit = next((p for p in PLUMBING if target == p or target.startswith(p + ".")), None)
                if hit and not any(target == a or target.startswith(a + ".") for a in allowed):
                    bad.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not bad, "only fastrl/distributed may touch torch.distributed / megatron parallel state / mpi4py:\n" + "\n".join(bad)


def test_the_rules_catch_a_violation(tmp_path):
    """The checker itself: upward imports, static and dynamic, and a plumbing import are found."""
    module = tmp_path / "fastrl" / "data" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "import importlib\nimport importlib.util\nfrom importlib.util import find_spec\n\n"
        "from fastrl.training.step import train_step\nimport torch.distributed as dist\n\n\n"
        "def reach():\n"
        "    importlib.util.find_spec('recipes')\n"
        "    importlib.import_module('fastrl.training.step')\n"
        "    find_spec('fastrl.rollout.engine')\n"
        "    __import__('fastrl.models')\n"
        "    importlib.import_module('.prompts', 'fastrl.data')  # relative: not followed\n"
        "    importlib.import_module(name)  # not a literal: not followed\n"
    )
    imports = _imports("fastrl.data.bad", module)
    assert (5, "fastrl.training.step.train_step") in imports and (6, "torch.distributed") in imports
    assert _layer_of("fastrl.training.step") > _layer_of("fastrl.data.bad")
    bad = _upward_imports({**_modules(), "fastrl.data.bad": module})
    mine = sorted(b.removeprefix(f"{module}:") for b in bad if b.startswith(f"{module}:"))
    assert mine == [
        "10 imports recipes", "11 imports fastrl.training.step", "12 imports fastrl.rollout.engine",
        "13 imports fastrl.models", "5 imports fastrl.training.step",
    ], bad
