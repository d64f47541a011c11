"""Bytes and FLOPs per case from a card's expressions; achieved GB/s, TFLOP/s and share of peak."""

from __future__ import annotations

import ast
import math
import operator

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod}
_FUNCS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}


def evaluate(expr: str, names: dict) -> float:
    """Arithmetic on numbers and names only; anything else is rejected (cards are data, not code)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"unknown name {node.id!r}; known: {', '.join(sorted(names))}")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"unsupported expression element {ast.dump(node)[:60]}")
    return float(ev(ast.parse(expr, mode="eval")))


def case_names(params: dict, itemsize: int, numel: int) -> dict:
    names = {k: v for k, v in params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    names.update({"itemsize": itemsize, "numel": numel})
    return names


def achieved(bytes_moved: float | None, flops: float | None, seconds: float, peak_bw: float | None) -> dict:
    gbps = bytes_moved / seconds / 1e9 if bytes_moved and seconds > 0 else None
    tflops = flops / seconds / 1e12 if flops and seconds > 0 else None
    return {"gbps": gbps, "tflops": tflops,
            "peak_share": (gbps * 1e9 / peak_bw) if gbps and peak_bw else None}
