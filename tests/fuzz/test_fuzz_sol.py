"""Fuzzing SOL-ExecBench problems: mutations of tests/sol_solutions/problem's definition.json and
workload.jsonl and of a solution.json, axis expressions, and safetensors headers.

Properties: the loaders return records or raise ConfigError naming the file, nothing else, within
the hang guard; what they accept is sane (sizes bounded, names are identifiers, paths contained);
what is invalid by construction is rejected; `bench` on invalid input exits 2 without a traceback."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from fuzz_helpers import REPO, safetensors_bytes, sol_problem, write_json, write_workloads
from fuzz_mutations import NASTY_NUMBERS, NASTY_STRINGS, TEXT_SUFFIXES, invalid, json_text, mutated, values
from fuzz_settings import examples, within
from hypothesis import given
from hypothesis import strategies as st

from mini_kv import arith
from mini_kv.errors import ConfigError, ExitCode
from mini_kv.load import safetensors_file
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.solution import load_solution
from mini_kv.solexec.workload import MAX_TENSOR_BYTES, load_workloads

PROBLEM = REPO / "tests" / "sol_solutions" / "problem"
DEFINITION = json.loads((PROBLEM / "definition.json").read_text())
WORKLOADS = [json.loads(x) for x in (PROBLEM / "workload.jsonl").read_text().splitlines() if x.strip()]
SOLUTION = json.loads((REPO / "tests" / "sol_solutions" / "good_return" / "solution.json").read_text())
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_dirs = itertools.count()


def _fresh(tmp_path_factory) -> Path:
    d, *_ = sol_problem(tmp_path_factory.mktemp(f"sol{next(_dirs)}"))
    return d


def _config_error_or(fn, file: Path):
    try:
        with within(what=f"loading {file.name}"):
            return fn()
    except ConfigError as exc:
        assert exc.expected and str(file.name) in exc.file, str(exc)
        return None


def _load_all(d: Path, sol: Path | None = None):
    definition = _config_error_or(lambda: load_definition(d / "definition.json"), d / "definition.json")
    if definition is None:
        return None
    wls = _config_error_or(lambda: load_workloads(d / "workload.jsonl", definition), d / "workload.jsonl")
    if wls is None:
        return None
    assert_sane(definition, wls)
    if sol is not None:
        loaded = _config_error_or(lambda: load_solution(sol, definition.name), sol)
        if loaded is not None:
            for s in loaded.sources:
                assert "\0" not in s.path and "\n" not in s.path and not s.path.startswith(("/", ".."))
        return loaded
    return definition, wls


def assert_sane(definition, workloads) -> None:
    for name in (*definition.axes, *(t.name for t in (*definition.inputs, *definition.outputs))):
        assert IDENT.fullmatch(name), name
    for wl in workloads:
        assert all(isinstance(v, int) and v >= 0 for v in wl.resolved_axes.values())
        for spec in (*definition.inputs, *definition.outputs):
            assert definition.nbytes(spec, wl.resolved_axes) <= MAX_TENSOR_BYTES
        for path in wl.safetensors.values():
            assert Path(path).is_file()


def _dump(obj) -> str | None:
    try:
        return json.dumps(obj)  # NaN/inf are written as NaN/Infinity: the loader must refuse them
    except (RecursionError, ValueError, TypeError):
        return None


@examples(1.0)
@given(data=st.data())
def test_mutated_definitions(tmp_path_factory, data):
    text = _dump(data.draw(mutated(DEFINITION)))
    if text is None:
        return
    d = _fresh(tmp_path_factory)
    write_json(d / "definition.json", text)
    _load_all(d)


@examples(1.0)
@given(data=st.data(), line=st.integers(0, len(WORKLOADS) - 1))
def test_mutated_workload_lines(tmp_path_factory, data, line):
    lines = [json.dumps(w) for w in WORKLOADS]
    text = _dump(data.draw(mutated(WORKLOADS[line])))
    if text is None:
        return
    lines[line] = text
    d = _fresh(tmp_path_factory)
    write_workloads(d / "workload.jsonl", lines)
    _load_all(d)


@examples(1.0)
@given(data=st.data())
def test_mutated_solutions(tmp_path_factory, data):
    text = _dump(data.draw(mutated(SOLUTION)))
    if text is None:
        return
    d = _fresh(tmp_path_factory)
    sol = write_json(d.parent / "sol" / "solution.json", text)
    (sol.parent / "main.py").write_text("def forward(x, w, alpha):\n    return x\n")
    _load_all(d, sol)


@examples(1.0)
@given(which=st.sampled_from(["definition.json", "workload.jsonl", "solution.json"]), data=st.data())
def test_mutated_json_text(tmp_path_factory, which, data):
    d = _fresh(tmp_path_factory)
    sol = write_json(d.parent / "sol" / "solution.json", SOLUTION)
    target = sol if which == "solution.json" else d / which
    target.write_text(data.draw(json_text(target.read_text())), encoding="utf-8", errors="surrogatepass")
    _load_all(d, sol)


@examples(1.0)
@given(which=st.sampled_from(["definition", "workload", "solution"]), data=st.data())
def test_invalid_by_construction_is_rejected(tmp_path_factory, which, data):
    d = _fresh(tmp_path_factory)
    sol = write_json(d.parent / "sol" / "solution.json", SOLUTION)
    if which == "definition":
        doc, kind = data.draw(
            invalid(
                DEFINITION, [("name",)], ["name", "axes", "inputs", "outputs", "reference"], TEXT_SUFFIXES
            )
        )
        text = _dump(doc)
        target = d / "definition.json"
    elif which == "workload":
        doc, kind = data.draw(invalid(WORKLOADS[0], [("uuid",)], ["uuid", "axes", "inputs"], TEXT_SUFFIXES))
        text = _dump(doc)
        target = d / "workload.jsonl"
    else:
        doc, kind = data.draw(
            invalid(
                SOLUTION,
                [("spec", "entry_point")],
                ["name", "definition", "spec", "sources"],
                ["\n", "/", ":", " ", "é", "[/x]", "\0"],
            )
        )
        text = _dump(doc)
        target = sol
    if text is None:
        return
    target.write_text(text + "\n")
    assert _load_all(d, sol) is None, f"accepted {which} with a mutation of kind {kind!r}: {text[:300]}"


def expressions() -> st.SearchStrategy:
    atom = st.one_of(
        st.sampled_from(["h", "n", "d"]),
        st.integers(-10, 10**20).map(str),
        st.sampled_from(["1e308", "0.5", "True", "None", "'s'", "2**64", "-0"]),
    )
    ops = ["+", "-", "*", "/", "//", "%", "**"]
    return st.recursive(
        atom,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(ops), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(
                st.sampled_from(["min", "max", "ceil", "floor", "log2", "abs", "eval"]),
                st.lists(inner, max_size=3),
            ).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
            inner.map(lambda e: f"-{e}"),
        ),
        max_leaves=30,
    )


@examples(4.0)
@given(
    expr=st.one_of(expressions(), st.text(max_size=40), st.sampled_from(NASTY_STRINGS)),
    h=st.sampled_from([0, 1, 4, 2**31, 2**62] + [n for n in NASTY_NUMBERS if isinstance(n, int)]),
)
def test_axis_expressions_are_bounded(expr, h):
    try:
        with within(5, what=f"evaluating {expr[:60]!r}"):
            value = arith.evaluate(expr, {"h": h, "n": 3, "d": 8})
    except (arith.ExpressionError, ZeroDivisionError):
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert math.isfinite(value) and abs(value) <= arith.MAX_MAGNITUDE


def headers() -> st.SearchStrategy:
    entry = st.fixed_dictionaries(
        {},
        optional={
            "dtype": st.one_of(st.sampled_from(["F32", "F16", "I64", "BOOL", "X"]), values()),
            "shape": st.one_of(st.lists(st.integers(-2, 2**64), max_size=3), values()),
            "data_offsets": st.one_of(st.lists(st.integers(-2, 2**64), max_size=3), values()),
        },
    )
    return st.dictionaries(
        st.sampled_from(["x", "__metadata__", "y"]), st.one_of(entry, values()), max_size=3
    )


@examples(2.0)
@given(header=st.one_of(headers(), st.binary(max_size=64)), data=st.binary(max_size=256))
def test_safetensors_headers(tmp_path_factory, header, data):
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    raw = header if isinstance(header, bytes) else safetensors_bytes(json.dumps(header), data)
    path.write_bytes(raw)
    try:
        with within(5, what="reading a safetensors header"):
            dtype, shape = safetensors_file.describe(path, "x")
    except safetensors_file.SafetensorsError:
        return
    assert dtype in safetensors_file.ITEMSIZE and all(isinstance(s, int) and s >= 0 for s in shape)


@examples(0.05, cap=12)
@given(which=st.sampled_from(["definition", "workload"]), data=st.data())
def test_bench_cli_exits_2_on_invalid_problems(tmp_path_factory, which, data):
    d = _fresh(tmp_path_factory)
    sol = write_json(d.parent / "sol" / "solution.json", SOLUTION)
    if which == "definition":
        doc, _ = data.draw(
            invalid(
                DEFINITION, [("name",)], ["name", "axes", "inputs", "outputs", "reference"], TEXT_SUFFIXES
            )
        )
        target = d / "definition.json"
    else:
        doc, _ = data.draw(invalid(WORKLOADS[0], [("uuid",)], ["uuid", "axes", "inputs"], TEXT_SUFFIXES))
        target = d / "workload.jsonl"
    text = _dump(doc)
    if text is None:
        return
    target.write_text(text + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_kv",
            "bench",
            str(d),
            "--solution",
            str(sol),
            "--device",
            "cpu",
            "--artifacts",
            str(d.parent / "artifacts"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == ExitCode.CONFIG, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and target.name in proc.stderr
