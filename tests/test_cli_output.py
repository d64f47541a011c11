"""What verify and bench print: tables readable at 80 columns, COLUMNS honoured when piped, a plain line
per finished case when piped, and messages that say what went wrong (compiler error with file:line, a
summary after a failure, scalar inputs by value, namespace mismatch, no empty tracebacks)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from build_helpers import share_build_cache
from rich.console import Console

from mini_kv import pipeline, report
from mini_kv.compile.compiler import CompileRecord
from mini_kv.model import WorkerResults
from mini_kv.pipeline import VerifyResult
from mini_kv.solexec.table import traces_table

ROOT = Path(__file__).resolve().parents[1]
LONG_IDS = ["large_values-float16", "r1000_h4097-bfloat16", "n31-float32"]


def _render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _case(cid: str, status: str = "PASSED", **extra) -> dict:
    return {
        "id": cid,
        "kind": "core",
        "status": status,
        "max_abs_err": 0.000123456,
        "max_rel_err": 12.3456,
        "reference_error": {"max_abs_err": 0.0009765625},
        **extra,
    }


def _bench_rec(cid: str) -> dict:
    summary = {"overall": {"p50": 12345.678, "p95": 23456.789}, "p50_robust_cv": 0.0123}
    return {
        "id": cid,
        "method": "wallclock",
        "l2": "n/a",
        "candidate": {"summary": summary},
        "reference": {"summary": {"overall": {"p50": 10000.5, "p95": 1.0}}},
        "speedup": 0.81234,
        "roofline": {"gbps": 1234.5, "tflops": 12.25, "peak_share": 0.29},
        "stability": {"stable": True},
    }


def test_correctness_table_at_80_columns_keeps_ids_and_numbers_whole():
    text = _render(report.case_table([_case(c) for c in LONG_IDS], width=80))
    assert max(len(ln) for ln in text.splitlines()) <= 80
    for cid in LONG_IDS:
        assert cid in text
    assert "0.000123" in text and "12.3" in text and "…" not in text


def test_bench_table_at_80_columns_is_split_with_the_id_repeated():
    text = _render(report.bench_table([_bench_rec(c) for c in LONG_IDS], width=80))
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    for cell in ("12345.68", "23456.79", "10000.50", "0.812", "1234.5", "12.25", "29%", "1.2%", "wallclock"):
        assert cell in text, cell
    for cid in LONG_IDS:
        assert text.count(cid) == 2  # once in each part


def test_bench_trace_table_at_80_columns_keeps_statuses_whole():
    from mini_kv.model import Performance
    from mini_kv.solexec.traces import Correctness, Evaluation, Trace, TraceEnvironment

    def trace(status, correctness=None, performance=None) -> Trace:
        env = TraceEnvironment("CPU", {})
        return Trace("d", {}, "s", Evaluation(status, env, "t", "", correctness, performance))

    traces = [trace(s) for s in ("INCORRECT_NUMERICAL", "TIMEOUT", "RUNTIME_ERROR")]
    traces.append(
        trace("PASSED", Correctness(2.5e-2, 1.5e-3, False, False), Performance(123.456, 234.567, 1.9))
    )
    text = _render(traces_table(traces, width=80))
    assert max(len(ln) for ln in text.splitlines()) <= 80 and "…" not in text
    for cell in (
        "INCORRECT_NUMERICAL",
        "TIMEOUT",
        "RUNTIME_ERROR",
        "123.456",
        "234.567",
        "1.90x",
        "1.50e-03",
    ):
        assert cell in text, cell


def test_failed_case_details_go_on_their_own_line_with_scalars_by_value():
    failed = _case(
        "n1000-float16",
        "INCORRECT",
        reason="mismatch",
        first_mismatch={"index": 7, "got": 1.5, "expected": 2.0},
        inputs=[{"shape": [1000], "dtype": "float16", "device": "cpu", "contiguous": False}, {"value": 0.5}],
    )
    lines = report.case_details([failed, _case("n31-float32")])
    assert lines == [
        "  n1000-float16: inputs (float16[1000] non-contiguous, 0.5); mismatch first at 7: got 1.5, "
        "expected 2"
    ]
    assert "None" not in lines[0]


# g++ as torch.utils.cpp_extension runs it, then the builder's own traceback
BUILD_LOG = """[1/2] c++ -MMD -MF op.o.d -c /proj/candidates/x/op.cpp -o op.o
FAILED: op.o
/proj/candidates/x/op.cpp:12:5: error: 'undefined_thing' was not declared in this scope
   12 |     undefined_thing(a);
      |     ^~~~~~~~~~~~~~~
/proj/candidates/x/op.cpp:20:1: error: expected ';' before '}' token
ninja: build stopped: subcommand failed.
Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/torch/utils/cpp_extension.py", line 2100, in _run_ninja_build
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/src/mini_kv/compile/jit_child.py", line 40, in main
    torch.utils.cpp_extension.load(
RuntimeError: Error building extension 'x'
"""


def _failed_build(tmp_path) -> CompileRecord:
    log = tmp_path / "stderr.log"
    log.write_text(BUILD_LOG)
    return CompileRecord(status="error", cache_hit=False, duration_s=3.0, logs={"stderr.log": str(log)})


def test_compile_error_shows_the_first_compiler_error_with_file_and_line_not_the_traceback(tmp_path):
    text = report.compile_error_excerpt(_failed_build(tmp_path))
    lines = text.splitlines()
    assert (
        lines[0] == "/proj/candidates/x/op.cpp:12:5: error: 'undefined_thing' was not declared in this scope"
    )
    assert "undefined_thing(a);" in lines[1] and "^~~" in lines[2]
    assert "1 more error" in text and "-v" in text
    assert (
        "Traceback" not in text and "cpp_extension.py" not in text and "Error building extension" not in text
    )
    verbose = report.compile_error_excerpt(_failed_build(tmp_path), verbose=True)
    assert "op.cpp:20:1" in verbose and "Traceback" not in verbose


def _result(
    status: str, compile_rec: CompileRecord, results: dict, correctness: dict | None = None
) -> VerifyResult:
    summary = {"status": status, "correctness": correctness, "benchmark": None}
    return VerifyResult("v0", summary, WorkerResults(**results), compile_rec, "/a/b")


def test_the_summary_line_after_a_compile_error_says_where_it_failed(tmp_path):
    res = _result(
        "COMPILE_ERROR", _failed_build(tmp_path), {"load": None, "cases": [], "contract": {}, "bench": []}
    )
    console = Console(width=200, record=True, file=io.StringIO())
    report.print_verify(res, console)
    last = [ln for ln in console.export_text().splitlines() if ln.startswith("COMPILE_ERROR")][0]
    assert last == (
        "COMPILE_ERROR v0: build failed at /proj/candidates/x/op.cpp:12:5, NOTHING RAN (0 passed, 0 failed, "
        "0 skipped, 0 not run of 0 cases), timing: none"
    )


def test_the_summary_line_after_incorrect_names_what_failed():
    cases = [_case("n31-float32", "INCORRECT", reason="x"), _case("n33-float32")]
    corr = {
        "ok": False,
        "counts": {"core": {"passed": 1, "total": 2, "skipped": 0}},
        "contract": {},
        "missing_kernels": [],
        "integrity_failures": [],
    }
    res = _result(
        "INCORRECT",
        CompileRecord(status="ok", cache_hit=True, duration_s=0.1),
        {"load": {"ok": True}, "cases": cases, "contract": {}, "bench": []},
        corr,
    )
    console = Console(width=200, record=True, file=io.StringIO())
    report.print_verify(res, console)
    last = [ln for ln in console.export_text().splitlines() if ln.startswith("INCORRECT")][0]
    assert last == (
        "INCORRECT v0: failed n31-float32, 1 passed, 1 failed, 0 skipped, 0 not run of 2 cases (core 1/2), "
        "timing: none"
    )
    # a load failure without any case run still says what happened
    res = _result(
        "INCORRECT",
        CompileRecord(status="ok", cache_hit=True, duration_s=0.1),
        {"load": {"ok": False, "reason": "LookupError: x"}, "cases": [], "contract": {}, "bench": []},
        {
            "ok": False,
            "counts": {},
            "contract": {},
            "missing_kernels": ["CPU", "Meta"],
            "integrity_failures": [],
        },
    )
    console = Console(width=200, record=True, file=io.StringIO())
    report.print_verify(res, console)
    last = [ln for ln in console.export_text().splitlines() if ln.startswith("INCORRECT")][0]
    assert last == (
        "INCORRECT v0: the op did not load, missing kernels CPU, Meta, NOTHING RAN (0 passed, 0 failed, "
        "0 skipped, 0 not run of 0 cases), timing: none"
    )


def test_every_summary_line_counts_passed_failed_skipped_and_not_run_and_says_if_timing_was_stable():
    """Finding 7 of issue 35: "11/11 workloads passed" for a run that skipped 3 of 14, "0/0" for one with
    nothing run, and no word on stability while the attempt was unstable."""
    from sol_helpers import bench_result

    from mini_kv.cli_batch import batch_summary_line
    from mini_kv.solexec.table import bench_summary_line

    counts = {"PASSED": 11, "SKIPPED": 3}
    unstable = {"ran": True, "stable": False}
    line = bench_summary_line(bench_result(counts=counts, benchmark=unstable))
    assert line.startswith("11 passed, 0 failed, 3 skipped, 0 not run of 14 workloads, timing UNSTABLE")
    line = bench_summary_line(bench_result(counts={"SKIPPED": 2}, benchmark={"ran": False, "stable": None}))
    assert line.startswith("NOTHING RAN (0 passed, 0 failed, 2 skipped, 0 not run of 2 workloads)")
    counts = {"PASSED": 1, "INCORRECT_NUMERICAL": 1, "TIMEOUT": 1, "NOT_RUN": 2}
    line = bench_summary_line(bench_result(counts=counts, benchmark={"ran": True, "stable": True}))
    assert line == "1 passed, 2 failed, 0 skipped, 2 not run of 5 workloads, timing stable"
    from mini_kv.cluster.batch import BENCH, VERIFY, ItemResult

    summary = {"status": "PASSED", "benchmark": {"ran": True, "stable": False}}
    items = [
        ItemResult(
            VERIFY, "a", "a", "PASSED", 0, "/a", VerifyResult("a", summary, WorkerResults(), None, "/a")
        ),
        ItemResult(
            BENCH, "b", None, "PASSED", 0, "/b", bench_result(benchmark={"ran": True, "stable": True})
        ),
        ItemResult(BENCH, "c", None, "WORKER_LOST", 9, None, reason="died"),
    ]
    line = batch_summary_line(items)
    assert line.startswith(
        "summary: 2 passed, 1 failed, 0 skipped, 0 not run of 3 items, timing stable in 1 of 2 timed items"
    )
    assert "a PASSED, b PASSED, c WORKER_LOST" in line and "throttled" not in line
    hot = {"ran": True, "stable": True, "throttled": {"w1": ["sw_power_cap"]}}
    items[1] = ItemResult(BENCH, "b", None, "PASSED", 0, "/b", bench_result(benchmark=hot))
    assert "GPU throttled while timing 1 item(s)" in batch_summary_line(items)
    assert "GPU throttled (sw_power_cap) while timing 1 case(s): w1" in bench_summary_line(
        bench_result(counts={"PASSED": 1}, benchmark=hot)
    )


def test_namespace_and_op_name_mismatches_are_named():
    import torch

    from mini_kv.worker import loader

    before = loader.op_names()
    lib = torch.library.Library("mini_kv_test_ns_other", "DEF")  # noqa: TID251 - a real registration
    lib.define("scaled(Tensor a) -> Tensor")
    registered = loader.op_names() - before
    assert registered == {"mini_kv_test_ns_other::scaled"}
    hint = loader.registration_hint("mini_kv_test_ns_card::scaled", registered)
    assert hint.startswith("namespace mismatch") and "mini_kv_test_ns_other::scaled" in hint
    hint = loader.registration_hint("mini_kv_test_ns_other::scale", registered)
    assert hint.startswith("op name mismatch") and "mini_kv_test_ns_other::scaled" in hint
    assert "no operator at all" in loader.registration_hint("a::b", set())
    # the card's own op without kernels: nothing to hint, the missing kernels say it all
    assert loader.registration_hint("mini_kv_test_ns_other::scaled", registered) is None


def test_a_load_failure_without_an_exception_carries_no_traceback():
    from mini_kv.worker import formats

    sent = []

    class Chan:
        def send(self, **event):
            sent.append(event)

    formats._fail(Chan(), "COMPILE_ERROR", "the solution has no function 'run'")
    assert sent[0]["traceback"] is None
    try:
        raise ValueError("boom")
    except ValueError:
        formats._fail(Chan(), "COMPILE_ERROR", "import failed")
    assert "ValueError: boom" in sent[1]["traceback"]


def test_a_plain_line_per_finished_result():
    job = SimpleNamespace(cases=[{"id": "a"}, {"id": "b"}], contract=["opcheck"], bench_cases=[{"id": "z"}])
    lines = []
    on_event = pipeline._progress(job, "v0", lambda *a, **k: None, lines.append)
    on_event({"event": "case", "record": {"id": "a", "status": "PASS"}})
    why = "\n  max abs error 0.5 at [3] (expected 1.0, got 1.5)\nsecond line\n"
    on_event({"event": "case", "record": {"id": "b", "status": "FAIL", "reason": why}})
    on_event({"event": "contract", "name": "opcheck", "record": {"status": "PASS"}})
    on_event({"event": "bench", "record": _bench_rec("z")})
    assert lines == [
        "v0 correctness 1/2 a: PASS",
        "v0 correctness 2/2 b: FAIL (max abs error 0.5 at [3] (expected 1.0, got 1.5))",
        "v0 contract 1/1 opcheck: PASS",
        "v0 benchmark 1/1 z: ok P50 12345.68 µs, speedup 0.812x",
    ]


def test_a_failed_workloads_line_says_why_in_one_line():
    """A SOL workload's line carries the first line of its log when it did not pass (a user watching
    `bench` saw "workload 2/14 ...: RUNTIME_ERROR" and nothing more until the end), cut to 160 columns."""
    job = SimpleNamespace(cases=[{"id": "a"}, {"id": "b"}])
    lines = []
    on_event = pipeline._progress(job, None, lambda *a, **k: None, lines.append)
    on_event({"event": "case", "record": {"id": "a", "status": "PASSED", "log": "fine\n"}})
    long = "solution raised OutOfMemoryError: CUDA out of memory. " + "x" * 300
    on_event({"event": "case", "record": {"id": "b", "status": "RUNTIME_ERROR", "log": long + "\nTraceback"}})
    assert lines[0] == "workload 1/2 a: PASSED"
    assert lines[1].startswith("workload 2/2 b: RUNTIME_ERROR (solution raised OutOfMemoryError: CUDA out")
    assert lines[1].endswith("...)") and len(lines[1]) == len("workload 2/2 b: RUNTIME_ERROR ()") + 160


@pytest.mark.slow
def test_piped_verify_at_80_columns_prints_progress_and_whole_ids(tmp_path):
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_kv",
            "verify",
            "--task",
            "tasks/vector_add.yaml",
            "--candidate",  # one: the test reads its output, the other candidates add only builds
            "v0_naive",
            "--device",
            "cpu",
            "--case",
            "large_values",
            "--case",
            "n31",
            "--case",
            "bench_cpu_64k",
            "--budget",  # 1 s of timing, not the default 3: the test reads the output, not the times
            "1",
            "-v",
            "--artifacts",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert r.returncode in (0, 5), r.stdout + r.stderr
    out = r.stdout
    for cid in ("large_values-float16", "large_values-float32", "n31-float32", "bench_cpu_64k-float32"):
        assert cid in out, cid
    assert "…" not in out
    table_lines = [ln for ln in out.splitlines() if ln[:1] in "┏┃┡│└"]
    assert table_lines and max(len(ln) for ln in table_lines) <= 80
    # one flushed line per finished case on stderr (not a terminal here)
    assert (
        "v0_naive correctness 4/4" in r.stderr and "v0_naive benchmark 1/1 bench_cpu_64k-float32" in r.stderr
    )
    assert any(
        ln.startswith("attempt: ") and ln.endswith(tuple("0123456789abcdef")) for ln in out.splitlines()
    )


def _tutorial_project(tmp_path: Path, op_cpp_edit) -> Path:
    """The tutorial's project (docs/candidates.md) with its op.cpp changed by `op_cpp_edit`."""
    from test_tutorial import DOC, tutorial_steps

    for kind, payload in tutorial_steps(DOC.read_text()):
        if kind == "file":
            rel, body = payload.split("\n", 1)
            if rel.endswith("op.cpp"):
                body = op_cpp_edit(body)
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(body)
    (tmp_path / ".mini-kv-project").write_text("")
    # a build that succeeds is shared with the tutorial's test and earlier runs; a compile error is not kept
    return share_build_cache(tmp_path)


def _verify(project: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(project)])}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_kv",
            "verify",
            "--task",
            "tasks/scaled_add.yaml",
            "--device",
            "cpu",
            "--skip-benchmark",
            *extra,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


@pytest.mark.slow
def test_kernels_registered_under_another_namespace_are_named(tmp_path):
    # the schema is defined where the card says, the kernels go to another namespace
    project = _tutorial_project(
        tmp_path,
        lambda src: src.replace("TORCH_LIBRARY_IMPL(my_scaled_add_v0,", "TORCH_LIBRARY_IMPL(my_scaled_add,"),
    )
    r = _verify(project)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "namespace mismatch" in r.stdout and "my_scaled_add::scaled_add" in r.stdout
    summary = next(ln for ln in r.stdout.splitlines() if ln.startswith("INCORRECT"))
    assert "missing kernels CPU, Meta" in summary


@pytest.mark.slow
def test_a_real_compile_error_shows_file_and_line_and_a_summary(tmp_path):
    project = _tutorial_project(
        tmp_path,
        lambda src: src.replace(
            "check_inputs(a_in, b_in);", "check_inputs(a_in, b_in)\n  undefined_call();", 1
        ),
    )
    r = _verify(project)
    assert r.returncode == 3, r.stdout + r.stderr
    out = r.stdout
    assert "candidates/scaled_add/v0/op.cpp:" in out and "error:" in out
    assert "Traceback" not in out and "cpp_extension.py" not in out
    summary = next(ln for ln in out.splitlines() if ln.startswith("COMPILE_ERROR"))
    assert "build failed at " in summary and "op.cpp:" in summary


def test_regression_table_at_80_columns_keeps_ids_and_numbers_whole():
    from mini_kv.judge import regression as rg
    from mini_kv.stats import Slower, summarize_repeats
    from mini_kv.status import Verdict

    def runs(p50: float) -> tuple[list, object]:
        return [[p50] * 5], summarize_repeats([[p50] * 5])

    same_run = rg.SameRun(
        "interleaved",
        *runs(29.7712),
        rg.BaselineSide(*runs(21.8906)),
        Slower(1.36, 4.3e-55, True, True, True, (0, 0), (0, 0)),
        None,
        None,
    )
    case = rg.CaseVerdict(
        "bench_cpu_64k-float32",
        Verdict.FAIL,
        (),
        first_batch=Slower(1.479, 5.3e-66, True, True, True, (0, 0), (0, 0)),
        confirmation=same_run,
        baseline=rg.Times(21.9412, 22.0, 5),
        candidate=rg.Times(32.4437, 33.0, 5),
        p50_ratio=1.479,
        p95_ratio=3.229,
    )
    reg = rg.RegressionVerdict(
        Verdict.FAIL, (), rg.Thresholds(), cases=(case,), baseline_file={"path": "baselines/x.json"}
    )
    console = Console(width=80, record=True, file=io.StringIO())
    report.print_regression(reg, console)
    text = console.export_text()
    assert max(len(ln) for ln in text.splitlines()) <= 80 and "…" not in text
    for cell in (
        "bench_cpu_64k-float32",
        "21.94",
        "32.44",
        "+47.9%",
        "+222.9%",
        "p=5.3e-66",
        "21.89 / 29.77",
        "+36.0%",
        "p=4.3e-55",
    ):
        assert cell in text, cell


def test_leaderboard_at_80_columns_keeps_ids_whole():
    from mini_kv.codec import from_json
    from mini_kv.leaderboard import Board, rich_tables

    entry = {
        "rank": 1,
        "candidate": "v2_vectorized_long_name",
        "geomean_speedup": 1.23456,
        "cases": {"bench_4096x8192-float16": 1.5, "bench_1024x1024-bfloat16": 0.9},
        "regression": None,
        "signature": "unsigned",
        "attempt_id": "20261204T170749227007Z-v2_vectorized_long_name-d750e2",
        "created_at": "2026-12-04T17:07:49+00:00",
        "path": "rmsnorm/20261204T170749227007Z-v2_vectorized_long_name-d750e2",
    }
    doc = {
        "schema_version": 1,
        "generated_at": "2026-12-04T17:08:00+00:00",
        "artifacts": "artifacts",
        "task": None,
        "problems": [],
        "signing": {"key_id": None, "required": False},
        "groups": [
            {
                "task_id": "rmsnorm",
                "suite_hash": "5e87f8b84e70aa",
                "environment_key": "99dd",
                "device": "cpu",
                "entries": [entry],
            }
        ],
    }
    text = "".join(_render(t) for t in rich_tables(from_json(Board, doc), 80))
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    for cell in (entry["candidate"], "1.235x", "bench_4096x8192-float16 1.500x"):
        assert cell in text, cell
    # the attempt id is wider than what is left beside rank and candidate: folded over lines, never cut
    cells = "".join(ln.split("│")[3].strip() for ln in text.splitlines() if ln.count("│") == 4)
    assert entry["attempt_id"] in cells


def test_doctor_at_80_columns_cuts_nothing():
    env = {**os.environ, "COLUMNS": "80"}
    out = subprocess.run(
        [sys.executable, "-m", "mini_kv", "doctor"], capture_output=True, text=True, env=env
    ).stdout
    assert "…" not in out
    assert max(len(ln) for ln in out.splitlines()) <= 80
    joined = "".join(ln.split("│")[2].strip() for ln in out.splitlines() if ln.count("│") > 3)
    assert sys.executable in joined  # the interpreter's path, folded over lines but whole


def test_leaderboard_and_report_take_what_bench_and_verify_took(tmp_path):
    from mini_kv.cli_common import task_id_of

    assert task_id_of(str(ROOT / "problems/sol-execbench/custom_inputs_matmul"), "TARGET") == "custom_matmul"
    assert task_id_of(str(ROOT / "tasks/vector_add.yaml"), "TARGET") == "vector_add"
    assert task_id_of("vector_add", "TARGET") == "vector_add"
    problem = str(ROOT / "problems/sol-execbench/custom_inputs_matmul")
    res = subprocess.run(
        [sys.executable, "-m", "mini_kv", "leaderboard", problem, "--artifacts", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    # the directory was read as its task: the message names the task, not the path
    assert res.returncode == 2 and "custom_matmul: no attempt of this task" in res.stderr, res.stderr


def test_verbose_means_one_thing_on_every_command():
    from mini_kv.cli_common import VERBOSE_HELP

    for cmd in ("verify", "bench", "batch"):
        out = subprocess.run(
            [sys.executable, "-m", "mini_kv", cmd, "--help"], capture_output=True, text=True, check=True
        ).stdout
        assert " ".join(VERBOSE_HELP.split()) in " ".join(out.split()), cmd


def test_verbose_details_name_settings_build_and_time():
    from mini_kv.settings import resolve
    from mini_kv.tables import verbose_details

    lines = verbose_details(
        resolve({"warmup": 20, "method": "cupti", "l2": "cold"}, "cuda:0", None, environ={}),
        CompileRecord(status="ok", cache_hit=True, duration_s=0.0, key="abc"),
        {"prepared_s": 1.0, "recorded_s": 3.5, "workload_timing_s": 1.2},
        None,
    )
    text = "\n".join(lines)
    assert "warmup 20" in text and "method cupti" in text and "l2 cold" in text
    assert "cache hit True" in text
    assert "total 3.5" in text and "timing 1.20" in text


def test_a_long_stage_is_never_silent_when_stderr_is_not_a_terminal(capsys, monkeypatch):
    from mini_kv import cli_common

    monkeypatch.setattr(cli_common, "HEARTBEAT_S", 0.5)
    with cli_common.BatchDisplay(1) as show:
        update = show.row("t/c")
        update("compile c: op.cpp")
        import time as _time

        _time.sleep(2.5)
        update("correctness", completed=1, total=3)  # a count within a stage: no new line
        show.done("t/c", "PASSED")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "t/c: compile c: op.cpp"
    beats = [ln for ln in err if ln.startswith("t/c: compile c: op.cpp: still running, ")]
    assert len(beats) >= 2 and all(ln.endswith(" s so far") for ln in beats)
    assert not any("correctness" in ln for ln in err)
