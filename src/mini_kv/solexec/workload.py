"""workload.jsonl: one workload a line, each checked against the schema and against its definition."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from mini_kv.errors import ConfigError
from mini_kv.load import safetensors_file
from mini_kv.load.schema import validate
from mini_kv.settings import DEFAULT_TOLERANCE
from mini_kv.solexec.definition import Definition
from mini_kv.solexec.jsonfile import parse_json, read_text

DATA_ROOT_VAR = "MINI_KV_DATA_ROOT"  # a directory outside the problem that safetensors inputs may read
MAX_TENSOR_BYTES = 2**40  # 1 TiB: no device holds one tensor larger; a bigger size is a typo or an attack


@dataclass(frozen=True)
class TraceWorkload:
    """A workload as upstream's trace writes it, in its field order (a trace's `workload`, a line of the
    attempt's workload.jsonl, what the suite hash covers)."""

    axes: dict  # the var axes as written
    inputs: dict
    uuid: str
    tolerance: dict


@dataclass(frozen=True)
class Workload:
    uuid: str
    line: int
    axes: dict  # the var axes as written
    inputs: dict  # name -> descriptor as written
    tolerance: dict  # with defaults filled in
    resolved_axes: dict = field(default_factory=dict)  # every axis's size
    safetensors: dict = field(default_factory=dict)  # input name -> absolute file path
    nbytes: int = 0  # the inputs and outputs together, for the check against the device's memory
    file: str = ""  # the workload.jsonl it came from

    def traced(self) -> TraceWorkload:
        """The workload as upstream's trace writes it."""
        inputs = {k: dict(v) for k, v in self.inputs.items()}
        return TraceWorkload(dict(self.axes), inputs, self.uuid, dict(self.tolerance))


def _check_axes(raw: dict, definition: Definition, file: str, at: str) -> dict:
    for name in raw["axes"]:
        if name not in definition.axes:
            raise ConfigError(
                file,
                f"{at}axes.{name}",
                f"not an axis of {definition.name}; its var axes: "
                f"{', '.join(definition.var_axes) or '(none)'}",
            )
        if definition.axes[name]["type"] != "var":
            raise ConfigError(
                file,
                f"{at}axes.{name}",
                f"axis {name!r} is {definition.axes[name]['type']}, only var axes are set by a workload",
            )
    missing = [n for n in definition.var_axes if n not in raw["axes"]]
    if missing:
        raise ConfigError(file, f"{at}axes.{missing[0]}", "required var axis is missing")
    try:
        return definition.resolve_axes(raw["axes"])
    except (ValueError, ZeroDivisionError) as exc:
        raise ConfigError(file, f"{at}axes", str(exc)) from None


def _check_inputs(raw: dict, definition: Definition, file: str, at: str) -> None:
    specs = {t.name: t for t in definition.inputs}
    for name in raw["inputs"]:
        if name not in specs:
            raise ConfigError(
                file,
                f"{at}inputs.{name}",
                f"not an input of {definition.name}; its inputs: {', '.join(specs)}",
            )
    for name, spec in specs.items():
        desc = raw["inputs"].get(name)
        if desc is None:
            raise ConfigError(file, f"{at}inputs.{name}", "required input descriptor is missing")
        kind = desc["type"]
        if kind == "scalar" and not spec.is_scalar:
            raise ConfigError(
                file,
                f"{at}inputs.{name}.type",
                f"`scalar` is only for inputs whose shape is null (a Python scalar); {name} is a tensor",
            )
        if kind == "safetensors" and spec.is_scalar:
            raise ConfigError(file, f"{at}inputs.{name}.type", f"{name} is a Python scalar; use `scalar`")
    kinds = {d["type"] == "custom" for d in raw["inputs"].values()}
    if kinds == {True, False}:
        raise ConfigError(file, f"{at}inputs", "either every input is `custom` or none is")
    if True in kinds and not definition.custom_inputs_entrypoint:
        raise ConfigError(
            file,
            f"{at}inputs",
            f"`custom` inputs need the definition's custom_inputs_entrypoint, "
            f"which {definition.path} does not set",
        )


def _check_sizes(definition: Definition, axes: dict, file: str, at: str) -> int:
    """Bytes of the inputs and outputs together; a tensor no machine could hold is a configuration error."""
    total = 0
    for spec in (*definition.inputs, *definition.outputs):
        n = definition.nbytes(spec, axes)
        if n > MAX_TENSOR_BYTES:
            raise ConfigError(
                file,
                f"{at}axes",
                f"{spec.name} would be {list(definition.shape_of(spec, axes))} "
                f"{spec.dtype}, {n:.3g} bytes; at most {MAX_TENSOR_BYTES} bytes (1 TiB) per tensor",
            )
        total += n
    return total


def data_roots(base: Path) -> list[Path]:
    """Where safetensors inputs may live: the workload file's directory, and $MINI_KV_DATA_ROOT if set."""
    roots = [base.resolve()]
    extra = os.environ.get(DATA_ROOT_VAR)
    if extra:
        roots.append(Path(extra).resolve())
    return roots


def _contained(rel: str, base: Path, file: str, where: str) -> Path:
    try:
        path = (base / rel).resolve()
    except (ValueError, OSError) as exc:
        raise ConfigError(file, where, f"{rel!r} is not a usable path ({type(exc).__name__})") from None
    roots = data_roots(base)
    if not any(path == r or r in path.parents for r in roots):
        raise ConfigError(
            file,
            where,
            f"{rel!r} resolves to {path}, outside the problem directory {roots[0]}; "
            f"safetensors inputs must live there (or under ${DATA_ROOT_VAR})",
        )
    return path


def _check_safetensors(raw: dict, definition: Definition, axes: dict, base: Path, file: str, at: str) -> dict:
    """Resolve each safetensors path (relative to the workload file, contained in its directory or the
    data root) and check key, dtype, shape and the data's length now."""
    specs = {t.name: t for t in definition.inputs}
    found = {}
    for name, desc in raw["inputs"].items():
        if desc["type"] != "safetensors":
            continue
        where = f"{at}inputs.{name}"
        path = _contained(desc["path"], base, file, f"{where}.path")
        if not path.is_file():
            raise ConfigError(
                file, f"{where}.path", f"file {desc['path']!r} does not exist (looked for {path})"
            )
        try:
            dtype, shape = safetensors_file.describe(path, desc["tensor_key"])
        except safetensors_file.SafetensorsError as exc:
            raise ConfigError(file, f"{where}.tensor_key", f"{path}: {exc}") from None
        want = definition.shape_of(specs[name], axes)
        if dtype != specs[name].dtype or shape != want:
            raise ConfigError(
                file,
                where,
                f"{path}[{desc['tensor_key']!r}] is {list(shape)} {dtype}, the definition "
                f"wants {list(want)} {specs[name].dtype} for these axes",
            )
        found[name] = str(path)
    return found


def parse_workload(raw, definition: Definition, file: str, line: int, base: Path) -> Workload:
    at = f"line {line}: "
    validate(raw, "sol_workload", f"{file}: line {line}")
    axes = _check_axes(raw, definition, file, at)
    nbytes = _check_sizes(definition, axes, file, at)
    _check_inputs(raw, definition, file, at)
    st = _check_safetensors(raw, definition, axes, base, file, at)
    return Workload(
        uuid=raw["uuid"],
        line=line,
        axes=dict(raw["axes"]),
        inputs=dict(raw["inputs"]),
        tolerance={**DEFAULT_TOLERANCE, **raw.get("tolerance", {})},
        resolved_axes=axes,
        safetensors=st,
        nbytes=nbytes,
        file=file,
    )


def load_workloads(path: str | Path, definition: Definition) -> list[Workload]:
    path = Path(path)
    file = str(path)
    out: list[Workload] = []
    seen: dict[str, int] = {}
    # lines end at "\n" only: str.splitlines() would also split at U+2028 or U+0085, which JSON allows raw in strings
    for i, text in enumerate(read_text(path).split("\n"), start=1):
        if not text.strip():
            continue
        wl = parse_workload(parse_json(text, file, f"line {i}"), definition, file, i, path.parent.resolve())
        if wl.uuid in seen:
            raise ConfigError(
                file, f"line {i}: uuid", f"duplicate uuid {wl.uuid!r} (first used on line {seen[wl.uuid]})"
            )
        seen[wl.uuid] = i
        out.append(wl)
    if not out:
        raise ConfigError(file, "", "no workloads (expected one JSON object per line)")
    return out


# ------------------------------------------------------------------------------- unseen workloads

EXTRA_FILE = "--extra-workloads"  # what an extra workload's `file` names: the option that drew it
EXTRA_TRIES = 200  # draws per workload before giving up on finding var-axis values not already used


def _axis_range(values: list[int]) -> tuple[int, int]:
    """Where an unseen value of a var axis is drawn: between the smallest and the largest shipped value
    (no larger, so the device that holds the shipped workloads holds these), or, for an axis every
    shipped workload sets alike, between half that value and the value."""
    lo, hi = min(values), max(values)
    return (max(1, lo // 2), hi) if lo == hi else (lo, hi)


def extra_workloads(definition: Definition, shipped: list[Workload], count: int, seed: int) -> list[Workload]:
    """`count` workloads whose var-axis values no shipped workload has, drawn with `seed` from the ranges
    the shipped ones span (_axis_range); each takes the input descriptors and tolerance of a shipped
    workload drawn with them. A solution specialised to the shipped shapes (a shape-keyed fast path,
    hard-coded sizes) meets shapes it has not seen. The same seed draws the same workloads, so an attempt
    that records the seed and the workloads (its workload.jsonl) can be run again."""
    if count <= 0:
        return []
    if not definition.var_axes:
        raise ConfigError(definition.path, "axes", f"{EXTRA_FILE} needs a var axis to draw; there is none")
    for wl in shipped:
        for name, desc in wl.inputs.items():
            if desc["type"] == "safetensors":
                raise ConfigError(
                    wl.file,
                    f"line {wl.line}: inputs.{name}.type",
                    f"{EXTRA_FILE} draws new shapes, which a safetensors file does not have; "
                    "use it with random, scalar or custom inputs",
                )
    rng = random.Random(seed)
    ranges = {a: _axis_range([int(wl.axes[a]) for wl in shipped]) for a in definition.var_axes}
    seen = {tuple(int(wl.axes[a]) for a in definition.var_axes) for wl in shipped}
    out = []
    for i in range(count):
        for _ in range(EXTRA_TRIES):
            values = tuple(rng.randint(*ranges[a]) for a in definition.var_axes)
            if values not in seen:
                break
        else:
            raise ConfigError(
                definition.path,
                "axes",
                f"{EXTRA_FILE} {count}: no var-axis values left to draw in {ranges} that no workload has",
            )
        seen.add(values)
        model = rng.choice(shipped)
        raw = {
            "uuid": f"extra-{seed}-{i}",
            "axes": dict(zip(definition.var_axes, values, strict=True)),
            "inputs": {k: dict(v) for k, v in model.inputs.items()},
            "tolerance": {
                k: v for k, v in model.tolerance.items() if v != DEFAULT_TOLERANCE.get(k, object())
            },
        }
        out.append(parse_workload(raw, definition, EXTRA_FILE, i + 1, Path(model.file).parent.resolve()))
    return out
