"""`mini-kv new card`: a card and a candidate scaffolded from a reference function, read back by the strict
loader, that `verify` passes once the two kernels are written (one build: the stub's own verify, INCORRECT
with "not written yet", would cost a second cold build of a C++ extension)."""

from __future__ import annotations

import json

import pytest
from build_helpers import share_build_cache
from conftest import run_cli

from mini_kv.errors import ExitCode

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

REF = [
    "--reference",
    "mini_kv.references.vector_add:reference",
    "--inputs",
    "mini_kv.references.vector_add:make_inputs",
]
CPU_KERNEL = "at::Tensor my_add_cpu(const at::Tensor& a, const at::Tensor& b) {\n  return a + b;\n}\n"
META_KERNEL = (
    "at::Tensor my_add_meta(const at::Tensor& a, const at::Tensor& b) {\n  return at::empty_like(a);\n}\n"
)


@pytest.fixture
def project(tmp_path):
    (tmp_path / ".mini-kv-project").touch()
    return share_build_cache(tmp_path)


def _summary(res) -> dict:
    return json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.slow
def test_a_scaffolded_card_validates_and_passes_verify_once_its_kernels_are_written(project):
    res = run_cli(
        "new",
        "card",
        "my_add",
        *REF,
        "--case",
        "n31:n=31",
        "--case",
        "grid:shape=[3, 5]",
        "--project",
        project,
    )
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    card = project / "tasks" / "my_add.yaml"
    op = project / "candidates" / "my_add" / "v0" / "op.cpp"
    assert run_cli("validate-task", card).returncode == ExitCode.OK
    assert "the CPU kernel is not written yet" in op.read_text()
    args = [
        "verify",
        "--task",
        card,
        "--device",
        "cpu",
        "--skip-benchmark",
        "--json",
        "--artifacts",
        project / "a",
    ]
    source = op.read_text()
    start, end = source.index("at::Tensor my_add_cpu"), source.index("}  // namespace")
    op.write_text(source[:start] + CPU_KERNEL + "\n" + META_KERNEL + "\n" + source[end:])
    done = run_cli(*args, cwd=project)
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert _summary(done)["status"] == "PASSED"


def test_new_card_refuses_what_it_cannot_scaffold_and_writes_nothing(project):
    cases = ["--case", "n31:n=31"]
    bad = [
        (["BadId", *REF, *cases], "ID"),
        (["ok", "--reference", "nope:f", "--inputs", "nope:g", *cases], "No module named 'nope'"),
        (["ok", *REF, "--case", "n31"], "ID:key=value"),
        (["ok", *REF, "--case", "n:n=-5"], "case n (float32)"),  # the factory refuses: said with the case
        (["ok", *REF, *cases, "--dtype", "int3"], "--dtype"),
    ]
    for argv, said in bad:
        res = run_cli("new", "card", *argv, "--project", project)
        assert res.returncode == ExitCode.CONFIG and said in res.stderr, (argv, res.stdout + res.stderr)
    assert not (project / "tasks").exists() and not (project / "candidates").exists()
    ok = run_cli("new", "card", "twice", *REF, *cases, "--project", project)
    assert ok.returncode == ExitCode.OK
    again = run_cli("new", "card", "twice", *REF, *cases, "--project", project)
    assert again.returncode == ExitCode.CONFIG and "--force" in again.stderr


SOLUTION = {
    "name": "vector_add_torch",
    "definition": "vector_add",
    "author": "tests",
    "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "kernel.py::run",
             "destination_passing_style": False},
    "sources": [{"path": "kernel.py"}],
}  # fmt: skip


def _solution(where, body: str):
    where.mkdir()
    (where / "kernel.py").write_text(f"def run(a, b):\n    return {body}\n")
    (where / "solution.json").write_text(json.dumps(SOLUTION))
    return where / "solution.json"


def test_a_sol_problem_from_a_card_keeps_its_inputs_and_judges_solutions(tmp_path):
    """`new sol`: the card's float32 cases as workloads, the factory's values stored (zeros stay zeros),
    a case of another rank left out and said; `bench` passes a + b and fails a - b on the stored inputs."""
    from mini_kv.load.safetensors_file import load_tensor
    from mini_kv.solexec.run import BenchOptions, bench

    out = tmp_path / "problem"
    res = run_cli("new", "sol", "tasks/vector_add.yaml", "--dtype", "float32", "--out", out)
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    assert "left out" in res.stdout and "transposed-float32" in res.stdout
    definition = json.loads((out / "definition.json").read_text())
    assert definition["inputs"]["a"]["shape"] == definition["inputs"]["b"]["shape"] == ["a_0"]
    assert definition["axes"]["a_0"] == {"type": "var"}
    lines = [json.loads(x) for x in (out / "workload.jsonl").read_text().splitlines()]
    ids = [w["uuid"] for w in lines]
    assert "zeros-float32" in ids and "shape_mismatch-float32" not in ids and "transposed-float32" not in ids
    assert not load_tensor(out / "inputs" / "zeros-float32.safetensors", "a").any()
    assert lines[0]["tolerance"]["max_atol"] == 1e-6
    assert run_cli("new", "sol", "tasks/vector_add.yaml", "--out", out).returncode == ExitCode.CONFIG

    keep = [x for x in (out / "workload.jsonl").read_text().splitlines() if '"n31-' in x or '"n1025-' in x]
    (out / "workload.jsonl").write_text("\n".join(keep) + "\n")  # two workloads are enough to judge by
    fast = {"rounds": 1, "warmup": 1, "repeats": 1, "samples": 3}
    for body, want in (("a + b", "PASSED"), ("a - b", "INCORRECT_NUMERICAL")):
        sol = _solution(tmp_path / body.replace(" ", ""), body)
        opts = BenchOptions(solution=str(sol), artifacts=str(tmp_path / "artifacts"), device="cpu", **fast)
        got = {t.workload.uuid: t.evaluation.status for t in bench(str(out), opts).traces}
        assert len(got) == 2 and set(got.values()) == {want}, got


def _new_sol_from(tmp_path, name: str, module: str, reference: str):
    """`new sol` on a one-case card whose reference and factory are those of the project's module `name`
    (a name of its own per test: the commands run in this process, which keeps what it imported)."""
    (tmp_path / ".mini-kv-project").touch()
    (tmp_path / f"{name}.py").write_text(module)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "op.cpp").write_text("")
    (tmp_path / "card.yaml").write_text(
        "schema_version: 1\nid: op\nversion: 1.0.0\n"
        f"operator: {{name: op, version: 1.0.0, reference: '{name}:{reference}', inputs: '{name}:make_inputs'}}\n"
        "candidates:\n  - {id: v0, path: c, op: 'ns::op', sources: {cpu: [op.cpp]}}\n"
        "tolerances:\n  float32: {atol: 1.0e-6, rtol: 1.0e-6}\n"
        "cases:\n  - {id: n8, kind: core, params: {n: 8}, dtypes: [float32]}\n"
    )
    return run_cli("new", "sol", tmp_path / "card.yaml", "--project", tmp_path, "--out", tmp_path / "p")


def test_a_card_reference_already_called_run_is_the_entry_point_as_it_is(tmp_path):
    """A `run` that calls the card's function would call itself when that function is `run`."""
    res = _new_sol_from(
        tmp_path,
        "myref",
        "import torch\n\ndef run(a, b):\n    return a * b\n\n"
        "def make_inputs(params, dtype, device, generator):\n"
        "    n = int(params['n'])\n"
        "    return tuple(torch.randn(n, generator=generator).to(dtype) for _ in range(2))\n",
        "run",
    )
    assert res.returncode == ExitCode.OK, res.stdout + res.stderr
    reference = json.loads((tmp_path / "p" / "definition.json").read_text())["reference"]
    assert reference.count("def run(") == 1


def test_a_card_whose_factory_makes_nothing_here_is_an_error_and_writes_nothing(tmp_path):
    res = _new_sol_from(
        tmp_path,
        "noref",
        "def reference(a):\n    return a\n\ndef make_inputs(params, dtype, device, generator):\n    return None\n",
        "reference",
    )
    assert res.returncode == ExitCode.CONFIG and "made no inputs" in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "p").exists()
