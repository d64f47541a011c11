"""`mini-kv new card`: a card and a candidate scaffolded from a reference function, read back by the strict
loader, that `verify` passes once the two kernels are written (one build: the stub's own verify, INCORRECT
with "not written yet", would cost a second cold build of a C++ extension)."""

from __future__ import annotations

import json

import pytest
from build_helpers import share_build_cache
from conftest import run_cli

from mini_kv.errors import ExitCode

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
