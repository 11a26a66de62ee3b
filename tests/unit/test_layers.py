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
``importlib.import_module``, ``importlib.util.find_spec`` or ``__import__`` (also under an alias:
``from importlib import import_module as load``, ``load = importlib.import_module``, a parameter
defaulting to one), ``importlib.util.spec_from_file_location`` of a file of the project, and a
read of ``sys.modules[...]``; the name may be a literal, a module constant, the literal head of an
f-string (its package) or relative with a literal package (a module located by ``find_spec``
without being imported still ties this layer to that one). A dynamic import whose module the
source does not name is refused unless :data:`UNRESOLVED_ALLOWED` says why it is no layer question.
"""

from __future__ import annotations

import ast
import functools
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


#: Calls that import or locate a module named by their first argument (also under another name:
#: ``from importlib import import_module as load``, ``load = importlib.import_module``).
DYNAMIC_IMPORTS = ("import_module", "find_spec", "__import__")
#: Calls that load a module from a file: the file is the import (second argument, or ``location=``).
FILE_IMPORTS = ("spec_from_file_location",)
#: What an unresolved dynamic import stands for: the names that cannot be read from the source.
UNRESOLVED = "<unresolved>"

#: Dynamic imports whose module the checker cannot name from the source, each with why it is no
#: layer question (keyed by file and call); any other unresolved one fails
#: :func:`test_every_dynamic_import_is_named`.
UNRESOLVED_ALLOWED = {
    ("fastrl/rollout/engine_server.py", "spec_from_file_location"): "its siblings loaded by path (the engine environment has no fastrl; standard library only)",
    ("fastrl/rollout/engine_server.py", "sys.modules"): "its siblings loaded by path (the engine environment has no fastrl; standard library only)",
    ("fastrl/rewards/registry.py", "spec_from_file_location"): "the user's custom reward file (reward.name=FILE.py:FN)",
    ("fastrl/compat/megatron_cpu.py", "import_module"): "megatron-core modules it patches (third-party names)",
    ("fastrl/compat/megatron_cpu.py", "sys.modules"): "megatron-core modules it patches (third-party names)",
    ("fastrl/compat/megatron_bridge.py", "import_module"): "megatron-bridge modules (third-party names)",
    ("fastrl/compat/megatron_bridge.py", "sys.modules"): "megatron-bridge's stand-in modules (third-party names)",
    ("fastrl/compat/megatron_bridge.py", "find_spec"): "the optional packages megatron-bridge needs",
    ("fastrl/compat/megatron_kernels.py", "find_spec"): "megatron's CUDA softmax extensions (third-party names)",
}


class _Source:
    """What a module's source says statically: single assignments (``NAME = value``, in any
    scope), and the local names bound to the dynamic-import functions."""

    def __init__(self, tree: ast.AST, path: Path) -> None:
        self.path = path
        assigned: dict[str, list[ast.AST]] = defaultdict(list)
        self.aliases: dict[str, str] = {}
        self.path_types = {"Path", "PurePath"}  # and their local names: from pathlib import Path as P
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id].append(node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.value:
                assigned[node.target.id].append(node.value)
            elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "importlib.util"):
                for a in node.names:
                    if a.name in DYNAMIC_IMPORTS + FILE_IMPORTS:
                        self.aliases[a.asname or a.name] = a.name
            elif isinstance(node, ast.ImportFrom) and node.module == "pathlib":
                self.path_types |= {a.asname for a in node.names if a.asname and a.name in ("Path", "PurePath")}
        self.single = {k: v[0] for k, v in assigned.items() if len(v) == 1}
        for name, value in self.single.items():  # load = importlib.import_module
            called = _called_name(value)
            if called in DYNAMIC_IMPORTS + FILE_IMPORTS and not isinstance(value, ast.Call):
                self.aliases[name] = called
        for node in ast.walk(tree):  # def f(find_spec=importlib.util.find_spec): a parameter default
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args.posonlyargs + node.args.args
                for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults):
                    if _called_name(default) in DYNAMIC_IMPORTS + FILE_IMPORTS:
                        self.aliases[arg.arg] = _called_name(default)

    def function(self, node: ast.Call) -> str | None:
        """The dynamic-import function ``node`` calls, under whatever name."""
        name = _called_name(node.func)
        if name in self.aliases:
            return self.aliases[name]
        return name if name in DYNAMIC_IMPORTS + FILE_IMPORTS else None

    def text(self, node: ast.AST, seen: int = 0) -> str | None:
        """A module name the expression holds: a literal, a single-assigned name (a module
        constant), or the literal head of an f-string (``f"fastrl.training.{x}"``: the package
        ``fastrl.training``); None when the source does not say."""
        if seen > 10:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.single:
            return self.text(self.single[node.id], seen + 1)
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and "." in head.value:
                return head.value.rpartition(".")[0]
        return None

    def file(self, node: ast.AST, seen: int = 0) -> Path | None:
        """A file path the expression holds: a literal, ``Path(__file__)`` with ``.parent``,
        ``.with_name(..)``, ``.resolve()`` and ``/ "name"``, through single-assigned names."""
        if seen > 10:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return (self.path.parent / node.value).resolve()
        if isinstance(node, ast.Name):
            return self.file(self.single[node.id], seen + 1) if node.id in self.single else None
        if isinstance(node, ast.Call) and _called_name(node.func) in self.path_types and len(node.args) == 1:
            arg = node.args[0]
            return self.path if isinstance(arg, ast.Name) and arg.id == "__file__" else self.file(arg, seen + 1)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            base = self.file(node.value, seen + 1)
            return base.parent if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = self.file(node.func.value, seen + 1)
            if base is not None and node.func.attr == "resolve":
                return base
            name = self.text(node.args[0]) if node.args else None
            if base is not None and node.func.attr == "with_name" and name:
                return base.with_name(name)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            base, name = self.file(node.left, seen + 1), self.text(node.right)
            return base / name if base is not None and name else None
        return None


def _called_name(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _is_sys_modules(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys"


def _dynamic_import(node: ast.AST, src: _Source) -> tuple[str, str] | None:
    """``(how, module)`` for a call or ``sys.modules`` access that imports, locates or reads a
    module: ``how`` is the function (or ``"sys.modules"``), ``module`` the absolute name or
    :data:`UNRESOLVED`; None for anything else. ``"x" in sys.modules`` and iterating over it
    import nothing."""
    if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
        return "sys.modules", src.text(node.slice) or UNRESOLVED
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") and _is_sys_modules(func.value):
        return "sys.modules", (src.text(node.args[0]) if node.args else None) or UNRESOLVED
    how = src.function(node)
    if how is None:
        return None
    if how in FILE_IMPORTS:
        location = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "location"), None)
        file = src.file(location) if location is not None else None
        if file is None or not file.is_relative_to(REPO) or file.suffix != ".py":
            return how, UNRESOLVED if file is None else f"<file {file}>"
        return how, _module_name(file)
    if not node.args:
        return how, UNRESOLVED
    name = src.text(node.args[0])
    if name and name.startswith("."):  # import_module(".prompts", "fastrl.data")
        package = src.text(node.args[1]) if len(node.args) > 1 else None
        if not package:
            return how, UNRESOLVED
        dots = len(name) - len(name.lstrip("."))
        base = package.split(".")[: len(package.split(".")) - dots + 1]
        return how, ".".join(base + [name.lstrip(".")]) if name.lstrip(".") else ".".join(base)
    return how, name or UNRESOLVED


@functools.lru_cache(maxsize=None)  # each file is scanned once per process (several tests read every module)
def _scan(name: str, path: Path, text: str | None = None) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """``(imports, unresolved)``: ``(line, dotted name)`` of every import (``from a import b``
    gives ``a.b``), dynamic ones included (:func:`_dynamic_import`); ``(line, how)`` of each
    dynamic import whose module the source does not name. ``text``: the source (None: the file's)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    src = _Source(tree, path)
    out, unresolved = [], []
    for node in ast.walk(tree):
        if (found := _dynamic_import(node, src)) is not None:
            how, target = found
            if target == UNRESOLVED:
                unresolved.append((node.lineno, how))
            elif not target.startswith("<file "):
                out.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out, unresolved


def _imports(name: str, path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every import of the module (:func:`_scan`)."""
    return _scan(name, path, text)[0]


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


def _upward_imports(modules: dict[str, Path], texts: dict[Path, str] | None = None) -> list[str]:
    """``path:line imports module`` for every import of ``modules`` against the layer order
    (``texts``: sources that are not read from their files)."""
    bad = []
    for name, path in modules.items():
        here, own = _layer_of(name), _package_of(name)
        for line, target in _imports(name, path, (texts or {}).get(path)):
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


def test_every_dynamic_import_is_named():
    """catches: a dynamic import the layer rules cannot see (a computed name, an alias the checker
    does not follow) added without saying why it is no layer question."""
    found = set()
    bad = []
    for root in ("fastrl", "recipes"):
        for path in sorted((REPO / root).rglob("*.py")):
            for line, how in _scan(_module_name(path), path, None)[1]:
                key = (str(path.relative_to(REPO)), how)
                found.add(key)
                if key not in UNRESOLVED_ALLOWED:
                    bad.append(f"{key[0]}:{line} {how}(...) of a name the source does not give")
    assert not bad, "dynamic imports the layer test cannot follow (name the module, or add to UNRESOLVED_ALLOWED):\n" + "\n".join(bad)
    assert not set(UNRESOLVED_ALLOWED) - found, f"UNRESOLVED_ALLOWED entries no longer needed: {set(UNRESOLVED_ALLOWED) - found}"


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
        "    importlib.import_module('.prompts', 'fastrl.data')  # relative, its own package: allowed\n"
        "    importlib.import_module(name)  # not in the source: unresolved\n"
    )
    imports = _imports("fastrl.data.bad", module)
    assert (5, "fastrl.training.step.train_step") in imports and (6, "torch.distributed") in imports
    assert (14, "fastrl.data.prompts") in imports
    assert _scan("fastrl.data.bad", module)[1] == [(15, "import_module")]
    assert _layer_of("fastrl.training.step") > _layer_of("fastrl.data.bad")
    bad = _upward_imports({**_modules(), "fastrl.data.bad": module})
    mine = sorted(b.removeprefix(f"{module}:") for b in bad if b.startswith(f"{module}:"))
    assert mine == [
        "10 imports recipes", "11 imports fastrl.training.step", "12 imports fastrl.rollout.engine",
        "13 imports fastrl.models", "5 imports fastrl.training.step",
    ], bad


def test_the_rules_see_through_aliases_and_computed_names():
    """catches (issue 46): a layer violation hidden behind a module constant or an f-string name,
    an aliased ``import_module``, ``spec_from_file_location`` of a project file, or a read of
    ``sys.modules``; each of these lines must be reported."""
    module = REPO / "fastrl" / "data" / "_alias_probe.py"  # never written: the scan reads the text below
    text = (
        "import importlib\nimport importlib.util as iu\nimport sys\nfrom importlib import import_module as load\n"
        "from pathlib import Path as P\n\n"
        "STEP = 'fastrl.training.step'\n"
        "grab = importlib.import_module\n"
        "HERE = P(__file__).parent\n\n\n"
        "def reach(part, lookup=iu.find_spec):\n"
        "    importlib.import_module(STEP)\n"                                      # 13: a module constant
        "    importlib.import_module(f'fastrl.rollout.{part}')\n"                  # 14: an f-string's package
        "    load('fastrl.models.hub')\n"                                          # 15: from-import alias
        "    grab('fastrl.checkpoint')\n"                                          # 16: assigned alias
        "    lookup('recipes')\n"                                                  # 17: parameter default
        "    iu.spec_from_file_location('x', HERE.parent / 'training' / 'loop.py')\n"  # 18: a project file
        "    sys.modules['fastrl.training.actor']\n"                               # 19: sys.modules[...]
        "    sys.modules.get('fastrl.rollout.engine')\n"                          # 20: sys.modules.get
        "    'fastrl.models' in sys.modules\n"                                     # 21: a membership test: no import
        "    load(part)\n"                                                         # 22: unresolved
    )
    imports, unresolved = _scan("fastrl.data._alias_probe", module, text)
    bad = _upward_imports({**_modules(), "fastrl.data._alias_probe": module}, {module: text})
    assert sorted(i for i in imports if i[0] > 12) == [
        (13, "fastrl.training.step"), (14, "fastrl.rollout"), (15, "fastrl.models.hub"), (16, "fastrl.checkpoint"),
        (17, "recipes"), (18, "fastrl.training.loop"), (19, "fastrl.training.actor"), (20, "fastrl.rollout.engine"),
    ], imports
    assert unresolved == [(22, "import_module")]
    mine = sorted(int(b.split(":")[1].split()[0]) for b in bad if b.startswith(f"{_rel(module)}:"))
    assert mine == list(range(13, 21)), bad
