"""Unit-aware numeric reading of short geometry answers (used by the ``geoqa8k`` reward).

``parse_quantity("2\\sqrt{3}\\text{ cm}")`` -> ``Quantity(number=3.4641..., unit="cm", ...)``.
Understood spellings:

- numbers and the operators ``+ - * / ^``, ``\\times``, ``\\cdot``, ``\\div``, ``×``, ``·``, ``÷``,
  implicit multiplication (``2\\sqrt{3}``, ``3\\pi``, ``2(1+\\sqrt{2})``);
- ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``, ``\\frac12``), ``a/b``;
- square roots: ``\\sqrt{3}``, ``\\sqrt3``, ``\\sqrt[3]{2}``, ``√3``, ``√{3}``, ``√(3)``, ``sqrt(3)``,
  ``sqrt{3}``, ``sqrt3``; pi: ``\\pi``, ``π``, ``pi``;
- one trailing unit: angles (``°``, ``^\\circ``, ``^{\\circ}``, ``\\degree``, ``degrees``, ``deg``,
  ``rad``), lengths (``mm``, ``cm``, ``dm``, ``m``, ``km`` and their spelled-out names), areas and
  volumes (``cm^2``, ``cm²``, ``square cm``, ``cm^3``, ``cubic cm``), optionally inside ``\\text{}``
  or ``\\mathrm{}``; ``units`` / ``square units`` mean no unit;
- a leading ``x =`` / ``AB =`` (the right-hand side is read).

Anything else (variables, tuples, commas, percentages, mixed numbers such as ``7 3/4``) gives
``None`` and the caller falls back to its symbolic grader. Evaluation walks a Python AST of
whitelisted nodes only (no ``eval``), with bounded exponents, so it cannot hang or run code.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass

# unit -> (dimension, factor to the base unit of that dimension: degree, metre)
_UNITS: dict[str, tuple[str, float]] = {
    "deg": ("angle", 1.0),
    "rad": ("angle", 180.0 / math.pi),
    "mm": ("length", 1e-3),
    "cm": ("length", 1e-2),
    "dm": ("length", 1e-1),
    "m": ("length", 1.0),
    "km": ("length", 1e3),
}
_UNIT_ALIASES = {
    "degree": "deg", "degrees": "deg", "deg": "deg", "radian": "rad", "radians": "rad", "rad": "rad",
    "mm": "mm", "millimeter": "mm", "millimeters": "mm", "millimetre": "mm", "millimetres": "mm",
    "cm": "cm", "centimeter": "cm", "centimeters": "cm", "centimetre": "cm", "centimetres": "cm",
    "dm": "dm", "decimeter": "dm", "decimeters": "dm", "decimetre": "dm", "decimetres": "dm",
    "m": "m", "meter": "m", "meters": "m", "metre": "m", "metres": "m",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "unit": "", "units": "",
}
_POWER_DIMENSION = {1: "", 2: "area", 3: "volume"}

_TRAILING_UNIT = re.compile(
    r"(?:(?P<prefix>square|sq\.?|cubic)\s*)?"
    r"(?P<unit>" + "|".join(sorted(_UNIT_ALIASES, key=len, reverse=True)) + r")"
    r"\s*(?:\^\s*\(?\s*(?P<power>[23])\s*\)?)?\s*\.?\s*$"
)
_TEXT_COMMAND = re.compile(r"\\(?:text|mathrm|textrm|mbox|mathit|operatorname|rm)\s*\{([^{}]*)\}")
_DEGREE_MARKS = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°|º")
_SPACING = re.compile(r"\\[,;:! ]|\\left|\\right|\\displaystyle|~|\$")
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.?\d*|\.\d+)|(?P<name>[a-z]+)|(?P<op>\*\*|[-+*/()]))")

_MAX_ABS_EXPONENT = 64
_MAX_ABS_POWER_BASE = 1e6


@dataclass(frozen=True)
class Quantity:
    """A number with an optional unit.

    Fields: ``number`` as written (in ``unit``); ``unit`` the canonical unit (``"cm"``, ``"deg"``,
    ``"cm^2"``) or ``None``; ``dimension`` (``"angle"``, ``"length"``, ``"area"``, ``"volume"``) or
    ``None``; ``base_value`` the number converted to degrees / metres / square or cubic metres
    (equal to ``number`` without a unit).
    """

    number: float
    unit: str | None = None
    dimension: str | None = None
    base_value: float = math.nan


def quantities_equal(a: Quantity, b: Quantity, *, rel_tol: float = 1e-6) -> bool:
    """Whether two quantities are equal.

    Both with units: same dimension and equal after conversion (``6 cm == 60 mm``,
    ``6 cm != 6 mm``). One side without a unit: the bare number is read in the other side's unit
    (``60 == 60°``). Numbers are compared with ``math.isclose(rel_tol=rel_tol, abs_tol=1e-9)``:
    exact values only, a rounded decimal such as ``3.46`` does not equal ``2\\sqrt{3}``.
    """
    if a.dimension is not None and b.dimension is not None:
        if a.dimension != b.dimension:
            return False
        return math.isclose(a.base_value, b.base_value, rel_tol=rel_tol, abs_tol=1e-9)
    return math.isclose(a.number, b.number, rel_tol=rel_tol, abs_tol=1e-9)


def parse_quantity(text: str) -> Quantity | None:
    """Read ``text`` as a number with an optional unit; ``None`` when it is not one (see module doc)."""
    s = _normalize(text)
    if not s:
        return None
    unit = dimension = None
    factor = 1.0
    match = _TRAILING_UNIT.search(s)
    if match is not None:
        alias = _UNIT_ALIASES[match.group("unit")]
        prefix = match.group("prefix") or ""
        power = int(match.group("power") or 1)
        if prefix.startswith(("square", "sq")):
            power = 2 if power == 1 else -1
        elif prefix == "cubic":
            power = 3 if power == 1 else -1
        if power < 0:
            return None
        s = s[: match.start()].strip()
        if alias:  # "units" / "square units" mean no unit
            base_dimension, base_factor = _UNITS[alias]
            if base_dimension == "angle" and power != 1:
                return None
            dimension = _POWER_DIMENSION[power] or base_dimension
            unit = alias if power == 1 else f"{alias}^{power}"
            factor = base_factor**power
    number = evaluate_expression(s)
    if number is None:
        return None
    base_value = number * factor if dimension is not None else number
    return Quantity(number=number, unit=unit, dimension=dimension, base_value=base_value)


def _normalize(text: str) -> str:
    s = text.strip()
    s = _SPACING.sub(" ", s)
    for _ in range(3):  # \text{...} holding \text{...} is rare; three passes are plenty
        s = _TEXT_COMMAND.sub(lambda m: f" {m.group(1)} ", s)
    s = _DEGREE_MARKS.sub(" deg ", s)
    s = s.replace("²", "^2").replace("³", "^3")
    s = re.sub(r"\^\s*\{\s*(\d)\s*\}", r"^\1", s)
    s = s.lower().strip().rstrip(".").strip()
    if s.count("=") == 1:
        lhs, rhs = (part.strip() for part in s.split("="))
        if rhs and re.fullmatch(r"(?:\\angle\s*|∠\s*)?[a-z][a-z0-9_]{0,7}", lhs):
            s = rhs
    return s


def _read_argument(s: str, i: int) -> tuple[str, int] | None:
    """One LaTeX argument at ``s[i:]``: ``{...}`` (balanced), ``\\command`` or one character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    return s[i + 1 : j], j + 1
        return None
    if s[i] == "\\":
        m = re.match(r"\\[a-z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
    return s[i], i + 1


def _read_root_argument(s: str, i: int) -> tuple[str, int] | None:
    """The argument of ``√`` / ``sqrt`` without a backslash: ``{...}``, ``(...)`` or a number."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "(":
        depth = 0
        for j in range(i, len(s)):
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            if depth == 0:
                return s[i + 1 : j], j + 1
        return None
    m = re.match(r"\d+\.?\d*|\\pi|π|pi", s[i:])
    if m:
        return m.group(0), i + len(m.group(0))
    return _read_argument(s, i)


def _latex_to_python(s: str) -> str | None:
    """Rewrite fractions and roots into Python syntax; ``None`` on malformed input."""
    out: list[str] = []
    i = 0
    while i < len(s):
        if s.startswith(("\\frac", "\\dfrac", "\\tfrac", "\\cfrac"), i):
            i = s.index("frac", i) + 4
            num = _read_argument(s, i)
            den = _read_argument(s, num[1]) if num else None
            if num is None or den is None:
                return None
            a, b = _latex_to_python(num[0]), _latex_to_python(den[0])
            if a is None or b is None:
                return None
            out.append(f"(({a})/({b}))")
            i = den[1]
        elif s.startswith("\\sqrt", i):
            i += len("\\sqrt")
            degree = None
            m = re.match(r"\s*\[([^\]]*)\]", s[i:])
            if m:
                degree = _latex_to_python(m.group(1))
                if degree is None:
                    return None
                i += len(m.group(0))
            arg = _read_argument(s, i)
            if arg is None:
                return None
            inner = _latex_to_python(arg[0])
            if inner is None:
                return None
            out.append(f"(sqrt({inner}))" if degree is None else f"(({inner})**(1/({degree})))")
            i = arg[1]
        elif s.startswith("√", i) or s.startswith("sqrt", i):
            i += 1 if s[i] == "√" else 4
            arg = _read_root_argument(s, i)
            if arg is None:
                return None
            inner = _latex_to_python(arg[0])
            if inner is None:
                return None
            out.append(f"(sqrt({inner}))")
            i = arg[1]
        else:
            out.append(s[i])
            i += 1
    text = "".join(out)
    for latex, py in (("\\pi", " pi "), ("π", " pi "), ("\\times", "*"), ("\\cdot", "*"), ("\\ast", "*"),
                      ("×", "*"), ("·", "*"), ("\\div", "/"), ("÷", "/"), ("^", "**"), ("{", "("), ("}", ")")):
        text = text.replace(latex, py)
    if "\\" in text or "," in text or "%" in text:
        return None
    return text


def _tokens_with_implicit_products(text: str) -> list[str] | None:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            return None
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "name" and value not in ("pi", "sqrt"):
            return None
        if tokens:
            prev_kind, prev = tokens[-1]
            prev_ends_value = prev_kind == "num" or prev == ")" or prev == "pi"
            starts_value = kind in ("num", "name") or value == "("
            if prev_ends_value and starts_value:
                if prev_kind == "num" and kind == "num":
                    return None  # "7 3/4": a mixed number or a typo; refuse to guess
                tokens.append(("op", "*"))
        tokens.append((kind, value))
    return [v for _, v in tokens]


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id == "pi":
        return math.pi
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_node(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_ABS_EXPONENT or abs(left) > _MAX_ABS_POWER_BASE:
                raise ValueError("power out of range")
            if left < 0 and not float(right).is_integer():
                raise ValueError("complex power")
            return left**right
        op = _BINARY.get(type(node.op))
        if op is None:
            raise ValueError("operator")
        return op(left, right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "sqrt"
        and len(node.args) == 1
        and not node.keywords
    ):
        value = _eval_node(node.args[0])
        if value < 0:
            raise ValueError("square root of a negative number")
        return math.sqrt(value)
    raise ValueError(f"unsupported syntax {type(node).__name__}")


def evaluate_expression(text: str) -> float | None:
    """Value of a constant arithmetic expression in LaTeX or plain spelling; ``None`` if it is not one."""
    python = _latex_to_python(text.strip())
    if python is None or not python.strip():
        return None
    tokens = _tokens_with_implicit_products(python)
    if not tokens:
        return None
    try:
        value = _eval_node(ast.parse(" ".join(tokens), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError):
        return None
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    return value
