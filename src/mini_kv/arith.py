"""Bounded arithmetic over named integers: axis expressions of a definition.json, a card's bytes/flops.

These expressions are data, never code: numbers, names, + - * / // % **, unary minus and
min, max, ceil, floor, log2. Everything is bounded before it is computed, so no expression can
hang the loader (`9**9**9**9`), exhaust memory or overflow (`h * 1e308 * 10`): at most
MAX_CHARS characters and MAX_NODES syntax nodes, and every intermediate value, every constant and
every name's value within +-MAX_MAGNITUDE (2**63, the largest tensor size torch can hold).
Booleans are not numbers here (`True` is not 1). Integer arithmetic stays exact.
"""

from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 256
MAX_NODES = 100
MAX_MAGNITUDE = 2**63

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}
_FUNCS = {
    "min": (min, None),
    "max": (max, None),
    "ceil": (math.ceil, 1),
    "floor": (math.floor, 1),
    "log2": (math.log2, 1),
}  # name -> (function, exact argument count or None for one or more)
GRAMMAR = (
    "numbers, axis names, + - * / // % **, unary minus, and min(...), max(...), ceil(x), floor(x), "
    f"log2(x); at most {MAX_CHARS} characters"
)


class ExpressionError(ValueError):
    """The expression is not in the grammar, or a value leaves the bounds."""


def parse(expr: str) -> ast.Expression:
    """The syntax tree of `expr`, checked against the grammar (names are not resolved here)."""
    if not isinstance(expr, str):
        raise ExpressionError(f"expected a string, got {type(expr).__name__}")
    if len(expr) > MAX_CHARS:
        raise ExpressionError(f"longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExpressionError(
            f"not an expression ({type(exc).__name__}: {getattr(exc, 'msg', exc)})"
        ) from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExpressionError(f"more than {MAX_NODES} terms")
    for node in nodes:
        _check_node(node)
    return tree


def _check_node(node: ast.AST) -> None:
    if isinstance(node, (ast.Expression, ast.Name, ast.Load, ast.USub, ast.UAdd)) or type(node) in _BINOPS:
        return
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ExpressionError(f"{node.value!r} is not a number")
        _bounded(node.value)
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        _check_call(node)
    elif not (
        isinstance(node, ast.BinOp)
        and type(node.op) in _BINOPS
        or isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
    ):
        raise ExpressionError(f"unsupported element {type(node).__name__} (allowed: {GRAMMAR})")


def _check_call(node: ast.Call) -> None:
    arity = _FUNCS[node.func.id][1]
    if (
        (arity is None and not node.args)
        or (arity is not None and len(node.args) != arity)
        or any(isinstance(a, ast.Starred) for a in node.args)
    ):
        raise ExpressionError(
            f"{node.func.id}() takes {arity or 'one or more'} argument(s), got {len(node.args)}"
        )


def _bounded(value):
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(f"value {value} is not finite")
    if abs(value) > MAX_MAGNITUDE:
        shown = f"{value:.3g}" if isinstance(value, float) else f"{len(str(abs(value)))} digits"
        raise ExpressionError(f"a value exceeds 2**63 ({shown})")
    return value


def _power(base, exp):
    # bound the result before computing it: 9**9**9 must not be evaluated to find out it is too big
    if base not in (0, 1, -1) and exp > 0 and exp * math.log2(abs(base)) > 63:
        raise ExpressionError(f"{base}**{exp} exceeds 2**63")
    if base == 0 and exp < 0:
        raise ZeroDivisionError("0 to a negative power")
    result = base**exp
    if isinstance(result, complex):
        raise ExpressionError(f"{base}**{exp} is not a real number")
    return result


def evaluate(expr: str, names: dict) -> int | float:
    """The value of `expr` with `names` bound. ExpressionError (a ValueError) for anything outside the
    grammar or the bounds; ZeroDivisionError for a division by zero."""
    for name, value in names.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExpressionError(f"{name!r} is {value!r}, not a number")
        _bounded(value)

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ExpressionError(
                    f"unknown name {node.id!r}; known: {', '.join(sorted(names)) or '(none)'}"
                )
            return names[node.id]
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                return _bounded(_power(left, right))
            return _bounded(_BINOPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        fn, _ = _FUNCS[node.func.id]
        args = [ev(a) for a in node.args]
        try:
            return _bounded(fn(*args) if len(args) == 1 and fn not in (min, max) else fn(args))
        except (ValueError, OverflowError) as exc:  # log2 of a non-positive number
            raise ExpressionError(f"{node.func.id}{tuple(args)}: {exc}") from None

    try:
        return ev(parse(expr))
    except RecursionError:  # cannot happen within MAX_NODES; kept so no caller ever sees one
        raise ExpressionError("nested too deep") from None
    except OverflowError as exc:
        raise ExpressionError(str(exc)) from None


def names_in(expr: str) -> set[str]:
    return {n.id for n in ast.walk(parse(expr)) if isinstance(n, ast.Name)}
