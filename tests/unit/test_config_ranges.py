"""Every range a config section states in its refusal message is enforced at its boundaries.

The cases are generated from the source of ``fastrl/config``: each ``_check(condition, message)``
whose message states a range for one field (``"algorithm.tis_cap must be >= 1 or None, got ..."``,
``"rollout.top_p must be in (0, 1], got ..."``, also inside ``for name in ...`` loops) gives a value
just outside the stated range, which the section must refuse with a :class:`ConfigError` naming
the key, and the boundary value inside it, which must not be refused by that check. The message is
the contract a user reads; a condition that drifts from it (a relaxed ``>= 1``) fails here. A new
range check is covered as soon as it is written in this form.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest

from fastrl.config import ConfigError

CONFIG_MODULES = ("fastrl.config.algorithm", "fastrl.config.model", "fastrl.config.run", "fastrl.config.training")
_NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
_RANGE = re.compile(
    rf"^(?P<key>[\w.{{}}]+) must be (?:(?P<op>>=|>) (?P<bound>{_NUMBER})|in (?P<lo_br>[\[(])(?P<lo>{_NUMBER}), "
    rf"(?P<hi>{_NUMBER})(?P<hi_br>[\])]))(?P<none> or [Nn]one| \(or none[^)]*\))?(?:, got .*)?$"
)


@dataclasses.dataclass(frozen=True)
class RangeCheck:
    cls: type
    field: str
    key: str
    message: str

    def cases(self) -> tuple[list, list]:
        """(refused values, accepted values) at the stated range's boundaries, in the field's type."""
        m = _RANGE.match(self.message)
        assert m is not None
        integer = _is_int(self.cls, self.field)
        step = 1 if integer else 0.5
        num = int if integer else float
        if m["op"]:
            bound = num(float(m["bound"]))
            if m["op"] == ">=":
                return [bound - step], [bound]
            return [bound], [bound + step if integer else bound + 1e-3]
        lo, hi = num(float(m["lo"])), num(float(m["hi"]))
        refused = [lo if m["lo_br"] == "(" else lo - step, hi if m["hi_br"] == ")" else hi + step]
        accepted = [lo if m["lo_br"] == "[" else (lo + step if integer else lo + 1e-3),
                    hi if m["hi_br"] == "]" else (hi - step if integer else hi - 1e-3)]
        return refused, accepted


def _is_int(cls: type, name: str) -> bool:
    hint = typing.get_type_hints(cls)[name]
    args = typing.get_args(hint) or (hint,)
    return int in args and float not in args


def _render(node: ast.AST, loop_var: str | None) -> str | None:
    """A message's text: constants as written, the loop variable as ``{}``, other values as ``…``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part.value, ast.Name) and part.value.id == loop_var:
                out.append("{}")
            else:
                out.append("…")
        return "".join(out)
    return None


def _loop_names(loop: ast.For, module) -> tuple[str, ...]:
    if isinstance(loop.iter, (ast.Tuple, ast.List)):
        return tuple(e.value for e in loop.iter.elts)
    if isinstance(loop.iter, ast.Name):
        return tuple(getattr(module, loop.iter.id))
    raise AssertionError(f"cannot read the names of the loop at line {loop.lineno}")


def _checks_of(module) -> list[RangeCheck]:
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
    out: list[RangeCheck] = []

    def visit(node: ast.AST, cls, loop: ast.For | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, getattr(module, child.name, None), None)
                continue
            if isinstance(child, ast.For) and isinstance(child.target, ast.Name):
                visit(child, cls, child)
                continue
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "_check"
                    and len(child.args) == 2 and cls is not None and dataclasses.is_dataclass(cls)):
                text = _render(child.args[1], loop.target.id if loop else None)
                m = _RANGE.match(text or "")
                if m:
                    names = _loop_names(loop, module) if "{}" in m["key"] else (m["key"].rsplit(".", 1)[1],)
                    for name in names:
                        field_names = {f.name for f in dataclasses.fields(cls) if f.init}
                        assert name in field_names, f"{cls.__name__}: `{text}` names no field of the section"
                        out.append(RangeCheck(cls, name, m["key"].replace("{}", name), text.replace("{}", name)))
            visit(child, cls, loop)

    visit(tree, None, None)
    return out


CHECKS = [c for name in CONFIG_MODULES for c in _checks_of(importlib.import_module(name))]


def test_the_generator_finds_the_range_checks():
    """catches: a generator that silently finds nothing (a message format it no longer parses)."""
    keys = {c.key for c in CHECKS}
    assert len(CHECKS) >= 60, len(CHECKS)
    assert {"algorithm.tis_cap", "rollout.top_p", "optimizer.adam_beta2", "model.tiny_num_layers",
            "parallel.micro_batch_size", "pruning.keep_ratio", "trainer.torch_threads", "optimizer.lr"} <= keys


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.key)
def test_each_stated_range_is_enforced_at_its_boundary(check: RangeCheck):
    """catches: a range check relaxed or tightened against its own message (issue 46: ``tis_cap``'s
    ``>= 1`` relaxed, so ``algorithm.tis_cap=0.5`` was accepted and shrank every token's weight)."""
    refused, accepted = check.cases()
    for value in refused:
        with pytest.raises(ConfigError, match=re.escape(check.key)):
            check.cls(**{check.field: value})
    for value in accepted:
        try:
            check.cls(**{check.field: value})
        except ConfigError as err:  # another rule of the section may refuse it; this one must not
            assert not str(err).startswith(check.message.split(", got")[0]), (value, str(err))


def test_tis_cap_below_one_is_refused():
    """catches: ``algorithm.tis_cap``'s ``>= 1`` check relaxed (issue 46, break 5), by name."""
    from fastrl.config import AlgorithmConfig

    with pytest.raises(ConfigError, match=r"algorithm.tis_cap must be >= 1 or None, got 0.5"):
        AlgorithmConfig(tis_cap=0.5)
    assert AlgorithmConfig(tis_cap=1.0).tis_cap == 1.0 and AlgorithmConfig(tis_cap=None).tis_cap is None
