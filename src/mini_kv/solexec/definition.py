"""definition.json: schema, then the rules a schema cannot say, then a frozen Definition.

Axes are `const` (a fixed size), `var` (bound by each workload) or `expr` (arithmetic over other
axes). A tensor's shape lists axis names (or literal sizes as digit strings); `null` is a Python
scalar and `[]` a 0-d tensor. The reference is Python source whose top-level `run` takes the
inputs, by name and in order.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from pathlib import Path

from mini_kv import arith
from mini_kv.errors import ConfigError
from mini_kv.load.safetensors_file import ITEMSIZE as SAFETENSORS_ITEMSIZE
from mini_kv.load.schema import validate
from mini_kv.solexec.jsonfile import read_json


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[str, ...] | None  # None: a Python scalar
    dtype: str

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


@dataclass(frozen=True)
class Definition:
    path: str
    raw: dict = field(repr=False)
    name: str = ""
    axes: dict = field(default_factory=dict)  # name -> raw axis spec, in file order
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    reference: str = ""
    custom_inputs_entrypoint: str | None = None

    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if a["type"] == "var"]

    def resolve_axes(self, bound: dict[str, int]) -> dict[str, int]:
        """Every axis's size from the var axes' values; ValueError names the axis that cannot be sized."""
        values = {n: a["value"] for n, a in self.axes.items() if a["type"] == "const"}
        values.update({n: bound[n] for n in self.var_axes if n in bound})
        pending = {n: a["expression"] for n, a in self.axes.items() if a["type"] == "expr"}
        while pending:  # expressions may use other expressions: resolve in dependency order
            ready = {n: e for n, e in pending.items() if _names(e) <= set(values)}
            if not ready:
                raise ValueError(
                    f"axis {sorted(pending)[0]!r}: its expression uses an axis that is never sized "
                    "(unbound var axis or a cycle)"
                )
            for n, e in ready.items():
                values[n] = _axis_value(n, e, values)
                del pending[n]
        return values

    def shape_of(self, spec: TensorSpec, axes: dict[str, int]) -> tuple[int, ...] | None:
        if spec.shape is None:
            return None
        return tuple(int(d) if is_literal_size(d) else axes[d] for d in spec.shape)

    def nbytes(self, spec: TensorSpec, axes: dict[str, int]) -> int:
        """Bytes of one tensor (8 for a Python scalar)."""
        shape = self.shape_of(spec, axes)
        return 8 if shape is None else math.prod(shape) * ITEMSIZE[spec.dtype]


# bytes per element: safetensors' dtypes, and float4_e2m1fn_x2, which packs two values in one byte (torch
# counts it as one element) and has no safetensors name
ITEMSIZE = {**SAFETENSORS_ITEMSIZE, "float4_e2m1fn_x2": 1}
MAX_LITERAL_DIGITS = 18  # a literal size stays below 2**63


def is_literal_size(dim: str) -> bool:
    """A shape entry that is a size itself: ASCII digits only (`"²".isdigit()` is true, int("²") fails)."""
    return dim.isascii() and dim.isdigit() and len(dim) <= MAX_LITERAL_DIGITS


def _names(expression: str) -> set[str]:
    return arith.names_in(expression)


def _axis_value(name: str, expression: str, values: dict[str, int]) -> int:
    value = arith.evaluate(expression, values)
    if value != int(value) or value < 0:
        raise ValueError(f"axis {name!r} = {expression!r} gives {value:g}, not a non-negative integer")
    return int(value)


def _check_axes(axes: dict, file: str) -> None:
    for name, axis in axes.items():
        if axis["type"] != "expr":
            continue
        where = f"axes.{name}.expression"
        try:
            used = _names(axis["expression"])
        except arith.ExpressionError as exc:
            raise ConfigError(
                file,
                where,
                f"not an arithmetic expression over axis names ({exc}); the grammar: {arith.GRAMMAR}",
            ) from None
        unknown = sorted(used - set(axes))
        if unknown:
            raise ConfigError(
                file, where, f"uses {', '.join(unknown)}, which is not an axis; known axes: {', '.join(axes)}"
            )


def _tensors(raw: dict, group: str, axes: dict, file: str) -> tuple[TensorSpec, ...]:
    out = []
    for name, spec in raw.items():
        shape = spec["shape"]
        for i, dim in enumerate(shape or []):
            if not is_literal_size(dim) and dim not in axes:
                raise ConfigError(
                    file,
                    f"{group}.{name}.shape[{i}]",
                    f"{dim!r} is not an axis or a size (ASCII digits, at most "
                    f"{MAX_LITERAL_DIGITS}); known axes: {', '.join(axes) or '(none)'}",
                )
        out.append(TensorSpec(name, None if shape is None else tuple(shape), spec["dtype"]))
    return tuple(out)


def _check_reference(raw: dict, inputs: tuple[TensorSpec, ...], file: str) -> None:
    try:
        tree = ast.parse(raw["reference"], mode="exec")
    except SyntaxError as exc:
        raise ConfigError(file, "reference", f"not valid Python (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte; nesting the parser cannot take
        raise ConfigError(file, "reference", f"not valid Python ({type(exc).__name__})") from None
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    run = funcs.get("run")
    if run is None:
        raise ConfigError(file, "reference", "must define a top-level function run(...) taking the inputs")
    params = [a.arg for a in (*run.args.posonlyargs, *run.args.args)]
    names = [t.name for t in inputs]
    if params != names:
        raise ConfigError(
            file,
            "reference",
            f"run{tuple(params)} must take exactly the inputs, in order: run({', '.join(names)})",
        )
    entry = raw.get("custom_inputs_entrypoint")
    if entry and entry not in funcs:
        raise ConfigError(
            file, "custom_inputs_entrypoint", f"{entry!r} is not a top-level function of the reference source"
        )


def load_definition(path: str | Path) -> Definition:
    path = Path(path)
    file = str(path)
    raw = read_json(path)
    validate(raw, "sol_definition", file)
    overlap = sorted(set(raw["inputs"]) & set(raw["outputs"]))
    if overlap:
        raise ConfigError(file, f"outputs.{overlap[0]}", "an output may not share its name with an input")
    clash = sorted((set(raw["inputs"]) | set(raw["outputs"])) & set(raw["axes"]))
    if clash:
        raise ConfigError(file, f"axes.{clash[0]}", "an axis may not share its name with an input or output")
    _check_axes(raw["axes"], file)
    inputs = _tensors(raw["inputs"], "inputs", raw["axes"], file)
    outputs = _tensors(raw["outputs"], "outputs", raw["axes"], file)
    _check_reference(raw, inputs, file)
    return Definition(
        path=file,
        raw=raw,
        name=raw["name"],
        axes=dict(raw["axes"]),
        inputs=inputs,
        outputs=outputs,
        reference=raw["reference"],
        custom_inputs_entrypoint=raw.get("custom_inputs_entrypoint"),
    )
