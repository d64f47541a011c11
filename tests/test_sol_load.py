"""Strict loading of definition.json, workload.jsonl and solution.json: good files load, each bad one names its field."""

import copy
import json
import os
import struct
from pathlib import Path

import pytest

from mini_kv.codec import to_json
from mini_kv.errors import ConfigError
from mini_kv.settings import DEFAULT_TOLERANCE
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.solution import load_solution
from mini_kv.solexec.workload import load_workloads

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "problems" / "sol-execbench"
TEST_PROBLEM = ROOT / "tests" / "sol_solutions" / "problem"
DEFINITION = json.loads((TEST_PROBLEM / "definition.json").read_text())


def write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.mark.parametrize("name", sorted(p.name for p in PROBLEMS.iterdir() if p.is_dir()))
def test_shipped_problems_load(name):
    d = load_definition(PROBLEMS / name / "definition.json")
    wls = load_workloads(PROBLEMS / name / "workload.jsonl", d)
    assert wls and all(set(w.resolved_axes) == set(d.axes) for w in wls)
    assert all(w.tolerance == DEFAULT_TOLERANCE for w in wls)


def test_axes_resolve_const_var_and_expr():
    d = load_definition(TEST_PROBLEM / "definition.json")
    wls = load_workloads(TEST_PROBLEM / "workload.jsonl", d)
    assert wls[1].resolved_axes == {"n": 17, "h": 4, "d": 8}
    assert wls[1].tolerance == {**DEFAULT_TOLERANCE, "max_atol": 1e-3, "max_rtol": 1e-3}
    assert [t.name for t in d.inputs] == ["x", "w", "alpha"] and d.inputs[2].is_scalar
    assert d.shape_of(d.outputs[1], wls[0].resolved_axes) == ()
    assert list(to_json(wls[0].traced())) == ["axes", "inputs", "uuid", "tolerance"]


def _mutate(path: str, value):
    d = copy.deepcopy(DEFINITION)
    keys = path.split(".")
    target = d
    for k in keys[:-1]:
        target = target[k]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return d


@pytest.mark.parametrize(
    "path, value, field, words",
    [
        ("name", KeyError, "name", "required"),
        ("surprise", 1, "surprise", "unknown field"),
        ("inputs.x.dtype", "float128", "inputs.x.dtype", "float128"),
        ("inputs.x.shape", ["n", "q"], "inputs.x.shape[1]", "not an axis"),
        ("axes.d.expression", "h * z", "axes.d.expression", "not an axis"),
        ("axes.d.expression", "__import__('os')", "axes.d.expression", "arithmetic"),
        ("reference", "def run(x, w):\n    return x\n", "reference", "run(x, w, alpha)"),
        ("reference", "def nope(:\n", "reference", "not valid Python"),
        ("reference", "import torch\n", "reference", "top-level function run"),
        ("custom_inputs_entrypoint", "make", "custom_inputs_entrypoint", "not a top-level function"),
        ("outputs.x", {"shape": ["n"], "dtype": "float32"}, "outputs.x", "share its name"),
    ],
)
def test_bad_definition_names_the_field(tmp_path, path, value, field, words):
    f = write(tmp_path / "definition.json", _mutate(path, value))
    with pytest.raises(ConfigError) as err:
        load_definition(f)
    assert err.value.file == str(f)
    assert err.value.field == field, err.value
    assert words in err.value.expected


def test_duplicate_keys_are_rejected(tmp_path):
    f = write(tmp_path / "definition.json", '{"name": "a", "name": "b"}')
    with pytest.raises(ConfigError, match="duplicate key 'name'"):
        load_definition(f)


def _workloads(tmp_path, *lines) -> Path:
    return write(
        tmp_path / "workload.jsonl", "\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines)
    )


GOOD = {
    "uuid": "u",
    "axes": {"n": 2},
    "inputs": {"x": {"type": "random"}, "w": {"type": "random"}, "alpha": {"type": "scalar", "value": 1.0}},
}


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"axes": {}}, "line 2: axes.n", "required var axis"),
        ({"axes": {"n": 2, "h": 4}}, "line 2: axes.h", "only var axes"),
        ({"axes": {"n": -1}}, "axes.n", "minimum"),
        ({"inputs": {"x": {"type": "random"}, "w": {"type": "random"}}}, "line 2: inputs.alpha", "missing"),
        (
            {"inputs": {**GOOD["inputs"], "x": {"type": "scalar", "value": 1}}},
            "line 2: inputs.x.type",
            "Python scalar",
        ),
        (
            {"inputs": {**GOOD["inputs"], "x": {"type": "custom"}}},
            "line 2: inputs",
            "every input is `custom`",
        ),
        (
            {
                "inputs": {
                    **GOOD["inputs"],
                    "x": {"type": "safetensors", "path": "none.safetensors", "tensor_key": "x"},
                }
            },
            "line 2: inputs.x.path",
            "does not exist",
        ),
        ({"tolerance": {"max_atol": 0.1, "atol": 1}}, "tolerance.atol", "unknown field"),
        ({"uuid": "first"}, "line 2: uuid", "duplicate uuid"),
    ],
)
def test_bad_workload_names_line_and_field(tmp_path, change, field, words):
    d = load_definition(TEST_PROBLEM / "definition.json")
    f = _workloads(tmp_path, {**GOOD, "uuid": "first"}, {**GOOD, **change})
    with pytest.raises(ConfigError) as err:
        load_workloads(f, d)
    assert field in str(err.value), err.value
    assert words in str(err.value)


def test_bad_json_line_is_named(tmp_path):
    d = load_definition(TEST_PROBLEM / "definition.json")
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        load_workloads(_workloads(tmp_path, GOOD, "{oops"), d)


def _safetensors(path: Path, tensors: dict) -> Path:
    """A .safetensors file built byte by byte from the format's description."""
    header, blob = {}, b""
    for key, (tag, shape, data) in tensors.items():
        header[key] = {"dtype": tag, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + blob)
    return path


def test_safetensors_inputs_are_checked_at_load_and_read_exactly(tmp_path):
    import torch

    from mini_kv.load.safetensors_file import load_tensor

    w = torch.arange(8, dtype=torch.float32)
    _safetensors(
        tmp_path / "w.safetensors",
        {
            "weight": ("F32", [8], w.numpy().tobytes()),
            "bad": ("F16", [8], torch.zeros(8, dtype=torch.float16).numpy().tobytes()),
        },
    )
    d = load_definition(TEST_PROBLEM / "definition.json")
    good = {
        **GOOD,
        "inputs": {
            **GOOD["inputs"],
            "w": {"type": "safetensors", "path": "w.safetensors", "tensor_key": "weight"},
        },
    }
    (wl,) = load_workloads(_workloads(tmp_path, good), d)
    assert wl.safetensors == {"w": str((tmp_path / "w.safetensors").resolve())}
    assert torch.equal(load_tensor(Path(wl.safetensors["w"]), "weight"), w)
    wrong = copy.deepcopy(good)
    wrong["inputs"]["w"]["tensor_key"] = "bad"
    with pytest.raises(ConfigError, match=r"is \[8\] float16, the definition wants \[8\] float32"):
        load_workloads(_workloads(tmp_path, wrong), d)
    wrong["inputs"]["w"]["tensor_key"] = "missing"
    with pytest.raises(ConfigError, match="no tensor 'missing'; keys: bad, weight"):
        load_workloads(_workloads(tmp_path, wrong), d)


SOLUTION = {
    "name": "s",
    "definition": "scale_mul",
    "author": "t",
    "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "k.py::run"},
    "sources": [{"path": "k.py", "content": "def run(x, w, alpha, y, total):\n    pass\n"}],
}


def _solution(tmp_path, **changes) -> Path:
    raw = copy.deepcopy(SOLUTION)
    for key, value in changes.items():
        if key in raw["spec"] or key in ("languages", "entry_point", "compile_options"):
            raw["spec"][key] = value
        else:
            raw[key] = value
    return write(tmp_path / "solution.json", raw)


def test_solution_defaults_and_sources_beside_the_file(tmp_path):
    (tmp_path / "k.py").write_text("def run(x, w, alpha, y, total):\n    y.zero_()\n")
    s = load_solution(_solution(tmp_path, sources=[{"path": "k.py"}]), "scale_mul")
    assert s.dps is True and s.group == "python" and s.entry_function == "run"
    assert s.sources[0].content.startswith("def run")
    assert s.resolved()["sources"][0]["content"] == s.sources[0].content


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"definition": "other"}, "definition", "not the problem's definition"),
        ({"sources": [{"path": "/etc/passwd"}]}, "sources[0].path", "relative path"),
        ({"sources": [{"path": "../k.py"}]}, "sources[0].path", "relative path"),
        ({"sources": [{"path": "k.py"}]}, "sources[0].path", "no `content` given"),
        (
            {"sources": [{"path": "k.py", "content": "a"}, {"path": "./k.py", "content": "b"}]},
            "sources[1].path",
            "duplicate source",
        ),
        ({"entry_point": "main.py::run"}, "spec.entry_point", "not among the sources"),
        ({"entry_point": "k.py"}, "spec.entry_point", "<source path>::<function name>"),
        ({"languages": ["pytorch", "cuda_cpp"]}, "spec.languages", "cannot be mixed"),
        ({"languages": ["cuda_cpp"]}, "spec.entry_point", "C++/CUDA entry file"),
        ({"languages": ["fortran"]}, "spec.languages[0]", "fortran"),
        ({"compile_options": {"cflags": ["-O2"], "nvcc": []}}, "spec.compile_options.nvcc", "unknown field"),
    ],
)
def test_bad_solution_names_the_field(tmp_path, changes, field, words):
    f = _solution(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_solution(f, "scale_mul")
    assert err.value.field == field, err.value
    assert words in err.value.expected


def test_source_symlink_out_of_the_solution_dir_is_refused(tmp_path):
    outside = tmp_path / "secret.py"
    outside.write_text("x = 1\n")
    sol_dir = tmp_path / "sol"
    sol_dir.mkdir()
    os.symlink(outside, sol_dir / "k.py")
    with pytest.raises(ConfigError, match="outside the solution's directory"):
        load_solution(_solution(sol_dir, sources=[{"path": "k.py"}]), "scale_mul")


def test_shipped_solutions_load():
    found = sorted(ROOT.glob("solutions/*/*/solution.json")) + sorted(
        ROOT.glob("examples/rmsnorm/*/solution.json")
    )
    for path in found:
        s = load_solution(path)
        assert s.entry_file in {src.path for src in s.sources}
