"""Inputs found by fuzzing that crashed, hung or were wrongly accepted: each is now a clean
configuration error (exit 2) that names the file and the field, or the right status."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fuzz_helpers import (
    card_project,
    cli_main,
    safetensors_bytes,
    shipped_card,
    sol_problem,
    write_card,
    write_json,
    write_workloads,
)

from mini_kv import arith
from mini_kv.errors import ConfigError, ExitCode
from mini_kv.load.task_card import load_task_card
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.solution import load_solution
from mini_kv.solexec.workload import load_workloads


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return card_project(tmp_path_factory.mktemp("project"))


def _rejected(path: Path, field: str | None = None, *words: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_task_card(path)
    err = info.value
    assert err.file == str(path)
    if field is not None:
        assert err.field == field, str(err)
    for w in words:
        assert w in str(err), str(err)
    return err


# ------------------------------------------------------------------------------------ rich markup


def _set(card: dict, dotted: str, value) -> dict:
    keys = dotted.split(".")
    target = card
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return card


@pytest.mark.parametrize(
    "field, value", [("id", "[/x]"), ("cases.0.id", "[/red]"), ("[/x]", 1), ("candidates.0.id", "[bold]x")]
)
def test_markup_in_a_card_is_printed_not_interpreted(project, field, value):
    card = _set(shipped_card(), field, value)
    code, out = cli_main("validate-task", str(write_card(project, card, "markup.yaml")))
    assert code == ExitCode.CONFIG, out
    assert "[" + (field if field.startswith("[") else value).strip("[") in out
    assert "markup.yaml" in out and "Traceback" not in out


def test_markup_in_the_card_file_name(project):
    path = write_card(project, shipped_card(), "a[/x].yaml")
    code, out = cli_main("validate-task", str(path))
    assert code == ExitCode.OK, out
    assert "a[/x].yaml: ok" in out
    for missing in ("missing[/x].yaml", "missing[red].yaml"):
        code, out = cli_main("validate-task", f"{path.parent}/{missing}")
        assert code == ExitCode.CONFIG and missing in out, out


def test_markup_in_a_workload_uuid(tmp_path):
    d, definition, wls, sol = sol_problem(tmp_path)
    write_workloads(d / "workload.jsonl", [{**wls[0], "uuid": "[/x]"}, {**wls[1], "uuid": "[/x]"}])
    write_json(tmp_path / "sol" / "solution.json", sol)
    code, out = cli_main(
        "bench", str(d), "--solution", str(tmp_path / "sol" / "solution.json"), "--device", "cpu"
    )
    assert code == ExitCode.CONFIG and "duplicate uuid '[/x]'" in out, out


# ------------------------------------------------------------------------------------ YAML shape


def test_deeply_nested_yaml_is_refused(project):
    path = write_card(project, "schema_version: 1\ndescription: " + "[" * 500 + "]" * 500 + "\n", "deep.yaml")
    _rejected(path, "line 2", "nested more than 64 levels")


def test_recursive_alias_is_refused(project):
    path = write_card(project, "schema_version: 1\nrec: &r [*r]\n", "rec.yaml")
    _rejected(path, "line 2", "alias *r refers to a node that contains it")


def test_alias_bomb_is_refused_quickly(project):
    lines = ["schema_version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    path = write_card(project, "\n".join(lines) + "\n", "bomb.yaml")
    assert len(path.read_bytes()) < 1200
    t0 = time.monotonic()
    _rejected(path, None, "aliases are expanded")
    assert time.monotonic() - t0 < 5


def test_non_string_key_under_tolerances(project):
    card = shipped_card()
    card["tolerances"][1] = {"atol": 1e-3, "rtol": 1e-3}
    _rejected(write_card(project, card, "intkey.yaml"), "tolerances.1", "a key must be a string")


@pytest.mark.parametrize(
    "field", ["benchmark.max_cv", "timeouts.stage_s", "tolerances.float32.atol", "tolerances.float32.rtol"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_inf_are_refused(project, field, value):
    card = shipped_card()
    card.setdefault("timeouts", {})
    _rejected(write_card(project, _set(card, field, value), "nan.yaml"), field, "finite number")


def test_infinite_compile_timeout_is_refused(project):
    card = {**shipped_card(), "timeouts": {"compile_s": 1e300}}
    _rejected(write_card(project, card, "inf.yaml"), "timeouts.compile_s", "604800")
    card = {**shipped_card(), "timeouts": {"compile_s": float("inf")}}
    _rejected(write_card(project, card, "inf.yaml"), "timeouts.compile_s", "finite")


@pytest.mark.parametrize("text", ["\0", "\ud800", "\n"])
def test_unusable_characters_in_a_path_field(project, text):
    card = shipped_card()
    card["candidates"][0]["path"] = "candidates/vector_add" + text + "/v0_naive"
    err = _rejected(write_card(project, card, "badpath.yaml"))
    # libyaml refuses the escape of a lone surrogate already while parsing (no field); else the path
    assert err.field == "candidates[0].path" or (text == "\ud800" and "Unicode" in err.expected), str(err)


@pytest.mark.parametrize(
    "field, value",
    [
        ("id", "a" * 256),
        ("id", "vector_add\n"),
        ("version", "1.0.0\n"),
        ("version", "1.0." + "9" * 40),
        ("candidates.0.op", "mini_kv_vector_add_v0_naive::vector_add\n"),
        ("cases.0.id", "n31\n"),
    ],
)
def test_ids_and_versions_are_bounded_and_end_at_the_end(project, field, value):
    card = _set(shipped_card(), field, value)
    err = _rejected(write_card(project, card, "ids.yaml"))
    assert err.field.replace("[", ".").replace("]", "") == field


def test_bytes_expression_is_checked_at_load(project):
    card = shipped_card()
    card["operator"]["bytes"] = "9**9**9**9"
    _rejected(write_card(project, card, "expr.yaml"), "operator.bytes", "exceeds 2**63")
    card["operator"]["bytes"] = "__import__('os')"
    _rejected(write_card(project, card, "expr.yaml"), "operator.bytes", "unsupported")


# ------------------------------------------------------------------------------------ JSON files


def test_deep_json_is_refused_in_every_file(tmp_path):
    d, definition, wls, sol = sol_problem(tmp_path)
    deep = "[" * 200_000 + "]" * 200_000
    write_json(d / "bad.json", deep)
    with pytest.raises(ConfigError, match="nested too deep"):
        load_definition(d / "bad.json")
    good = load_definition(d / "definition.json")
    write_workloads(d / "workload.jsonl", [wls[0], deep])
    with pytest.raises(ConfigError, match="line 2: nested too deep"):
        load_workloads(d / "workload.jsonl", good)
    write_json(tmp_path / "s" / "solution.json", {**sol, "description": json.loads("[" * 70 + "]" * 70)})
    with pytest.raises(ConfigError, match="description" + r"(\[0\])+: nested more than 64"):
        load_solution(tmp_path / "s" / "solution.json")


def test_json_number_beyond_float_is_refused(tmp_path):
    d, definition, wls, _ = sol_problem(tmp_path)
    write_workloads(
        d / "workload.jsonl",
        [
            '{"uuid": "a", "axes": {"n": 3}, "inputs": {"x": {"type": "random"}, '
            '"w": {"type": "random"}, "alpha": {"type": "scalar", "value": 1e400}}}'
        ],
    )
    with pytest.raises(ConfigError, match=r"line 1: inputs\.alpha\.value: a finite number"):
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))


def test_superscript_digit_is_not_a_size(tmp_path):
    d, definition, _, _ = sol_problem(tmp_path)
    definition["inputs"]["w"]["shape"] = ["²"]
    write_json(d / "definition.json", definition)
    with pytest.raises(ConfigError, match=r"inputs\.w\.shape\[0\]"):
        load_definition(d / "definition.json")


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9**9",
        "h**h**h**h",
        "1" + "0" * 4000,
        "h * 1e308 * 10",
        "min()",
        "+".join(["h"] * 20000),
        "True",
        "h.real",
        "(h,)",
        "h if h else 1",
    ],
)
def test_axis_expressions_are_bounded(tmp_path, expression):
    d, definition, wls, _ = sol_problem(tmp_path)
    definition["axes"]["d"]["expression"] = expression
    write_json(d / "definition.json", definition)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))
    assert time.monotonic() - t0 < 5
    assert "axes" in info.value.field


def test_arith_keeps_integers_exact_and_bounds_values():
    assert arith.evaluate("n * 2**40 + 1", {"n": 3}) == 3 * 2**40 + 1
    assert arith.evaluate("ceil(n / 3) + max(n, 2) + min(n)", {"n": 10}) == 4 + 10 + 10
    for expr in ("2**64", "n * n", "log2(0)"):
        with pytest.raises(arith.ExpressionError):
            arith.evaluate(expr, {"n": 2**40})
    with pytest.raises(ZeroDivisionError):
        arith.evaluate("n // 0", {"n": 1})
    with pytest.raises(arith.ExpressionError, match="exceeds 2"):  # too large even to format as a float
        arith.evaluate("h", {"h": 10**400})


@pytest.mark.parametrize("n", [2**62, 10**18])
def test_impossible_sizes_are_configuration_errors(tmp_path, n):
    d, definition, wls, _ = sol_problem(tmp_path)
    write_workloads(d / "workload.jsonl", [{**wls[0], "axes": {"n": n}}])
    with pytest.raises(ConfigError, match=r"line 1: axes: .*at most 1099511627776 bytes"):
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))


def test_sizes_beyond_the_device_are_refused_before_building(tmp_path):
    from mini_kv.solexec.run import BenchOptions, bench

    d, definition, wls, sol = sol_problem(tmp_path)
    write_workloads(d / "workload.jsonl", [wls[0], {**wls[1], "axes": {"n": 10**9}}])  # 32 GB for x
    sol_path = write_json(tmp_path / "sol" / "solution.json", sol)
    opts = BenchOptions(
        solution=str(sol_path), device="cpu", memory_limit_gb=4, artifacts=str(tmp_path / "a")
    )
    with pytest.raises(ConfigError) as info:
        bench(str(d), opts)
    assert info.value.field == "line 2: axes" and "cpu has 4 GiB" in str(info.value)
    # nothing stored (the store's dir is made before the worker starts, so that the jail masks it)
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


# ------------------------------------------------------------------------------------ solution sources


@pytest.mark.parametrize(
    "paths, index",
    [
        (["."], 0),
        (["./"], 0),
        (["main.py", "main.py/b.py"], 1),
        (["a\0.py"], 0),
        (["a\ud800.py"], 0),
        (["x" * 300 + ".py"], 0),
        (["a\n.py"], 0),
    ],
)
def test_unusable_source_paths(tmp_path, paths, index):
    _, _, _, sol = sol_problem(tmp_path)
    sol["sources"] = [{"path": "main.py", "content": sol["sources"][0]["content"]}] + [
        {"path": p, "content": "x = 1\n"} for p in paths if p != "main.py"
    ]
    if paths[0] != "main.py":
        sol["sources"] = sol["sources"][1:] + sol["sources"][:1]
    path = write_json(tmp_path / "s" / "solution.json", sol)
    with pytest.raises(ConfigError) as info:
        load_solution(path)
    assert info.value.field == f"sources[{index}].path", str(info.value)


def test_empty_content_is_read_from_the_file_beside(tmp_path):
    _, _, _, sol = sol_problem(tmp_path)
    code = sol["sources"][0]["content"]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "main.py").write_text(code)
    sol["sources"][0]["content"] = ""
    loaded = load_solution(write_json(tmp_path / "s" / "solution.json", sol))
    assert loaded.sources[0].content == code
    (tmp_path / "s" / "main.py").unlink()
    with pytest.raises(ConfigError, match=r"sources\[0\]\.path: an empty `content` given and no file"):
        load_solution(tmp_path / "s" / "solution.json")


# ------------------------------------------------------------------------------------ safetensors


def _st_problem(tmp_path, header, data=b"", rel="x.safetensors"):
    d, definition, wls, _ = sol_problem(tmp_path)
    target = d / rel if not Path(rel).is_absolute() else Path(rel)
    if header is not None:
        target.write_bytes(safetensors_bytes(header, data))
    wl = {
        **wls[0],
        "inputs": {**wls[0]["inputs"], "x": {"type": "safetensors", "path": rel, "tensor_key": "x"}},
    }
    write_workloads(d / "workload.jsonl", [wl])
    return d


@pytest.mark.parametrize(
    "header, data, words",
    [
        ({"x": 5}, b"", "not an object"),
        (
            {"x": {"dtype": "F32", "shape": ["3", 8], "data_offsets": [0, 96]}},
            b"\0" * 96,
            "not a list of non-negative",
        ),
        ({"x": {"dtype": "F32", "shape": [3, 8], "data_offsets": [96, 0]}}, b"\0" * 96, "data_offsets"),
        ({"x": {"dtype": "F32", "shape": [3, 8], "data_offsets": "0-96"}}, b"\0" * 96, "data_offsets"),
        ('{"x": {"dtype": "F32", "shape": [NaN, 8], "data_offsets": [0, 96]}}', b"", "not UTF-8 JSON"),
        ({"x": {"dtype": "F32", "shape": [3, 8], "data_offsets": [0, 96]}}, b"\0" * 50, "truncated"),
        ({"x": {"dtype": 7, "shape": [3, 8], "data_offsets": [0, 96]}}, b"\0" * 96, "dtype 7"),
    ],
)
def test_malformed_safetensors_headers(tmp_path, header, data, words):
    d = _st_problem(tmp_path, header, data)
    with pytest.raises(ConfigError, match=r"line 1: inputs\.x") as info:
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))
    assert words in str(info.value)


def test_safetensors_outside_the_problem_directory_is_refused(tmp_path, monkeypatch):
    outside = tmp_path / "elsewhere" / "x.safetensors"
    outside.parent.mkdir()
    outside.write_bytes(
        safetensors_bytes({"x": {"dtype": "F32", "shape": [3, 8], "data_offsets": [0, 96]}}, b"\0" * 96)
    )
    monkeypatch.delenv("MINI_KV_DATA_ROOT", raising=False)
    d = _st_problem(tmp_path, None, rel=str(outside))
    definition = load_definition(d / "definition.json")
    with pytest.raises(ConfigError, match=r"line 1: inputs\.x\.path: .*outside the problem directory"):
        load_workloads(d / "workload.jsonl", definition)
    monkeypatch.setenv("MINI_KV_DATA_ROOT", str(outside.parent))  # a documented data root
    assert load_workloads(d / "workload.jsonl", definition)[0].safetensors["x"] == str(outside)
    d2 = _st_problem(tmp_path / "p2", None, rel="/etc/passwd")
    with pytest.raises(ConfigError, match="outside the problem directory"):
        load_workloads(d2 / "workload.jsonl", definition)


def test_a_refused_file_is_never_quoted(tmp_path):
    d, _, _, _ = sol_problem(tmp_path)
    secret = b"root:x:0:0:root:/root:/bin/bash\n"
    (d / "x.safetensors").write_bytes(secret)
    d = _st_problem(tmp_path, None)
    with pytest.raises(ConfigError) as info:
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))
    message = str(info.value)
    assert str(int.from_bytes(secret[:8], "little")) not in message and "root:x" not in message
    assert "not a safetensors file" in message


def test_integers_must_be_integers(tmp_path, project):
    """JSON Schema counts 3.0 as an integer; a size or a count of 3.0 broke the worker later."""
    d, definition, wls, _ = sol_problem(tmp_path)
    write_workloads(d / "workload.jsonl", [{**wls[0], "axes": {"n": 3.0}}])
    with pytest.raises(ConfigError, match=r"line 1: axes\.n"):
        load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))
    card = shipped_card()
    card["benchmark"]["warmup"] = 20.0
    _rejected(write_card(project, card, "float_count.yaml"), "benchmark.warmup", "integer")


@pytest.mark.parametrize("field", ["name", "uuid"])
def test_names_without_control_characters(tmp_path, field):
    d, definition, wls, _ = sol_problem(tmp_path)
    if field == "name":
        write_json(d / "definition.json", {**definition, "name": definition["name"] + "\n"})
        with pytest.raises(ConfigError, match="definition.json: name: "):
            load_definition(d / "definition.json")
    else:
        write_workloads(d / "workload.jsonl", [{**wls[0], "uuid": "small\n"}])
        with pytest.raises(ConfigError, match=r"line 1: uuid"):
            load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))


@pytest.mark.parametrize("rel", ["a\0b", "a\ud800", "x" * 5000])
def test_resolve_inside_refuses_unusable_paths(project, rel):
    from mini_kv.load.task_card import resolve_inside

    with pytest.raises(ConfigError, match="not a usable path"):
        resolve_inside(project, rel, "card.yaml", "candidates[0].path", kind="dir")


def test_workload_lines_end_at_newline_only(tmp_path):
    """JSON allows U+2028 and U+0085 raw inside a string; they do not end a JSONL line."""
    d, definition, wls, _ = sol_problem(tmp_path)
    raw = json.dumps({**wls[0], "uuid": "a\u2028b\x85c"}, ensure_ascii=False)
    assert "\u2028" in raw  # written raw, not escaped
    write_workloads(d / "workload.jsonl", [raw, wls[1]])
    loaded = load_workloads(d / "workload.jsonl", load_definition(d / "definition.json"))
    assert [w.uuid for w in loaded] == ["a\u2028b\x85c", "tall"] and [w.line for w in loaded] == [1, 2]
