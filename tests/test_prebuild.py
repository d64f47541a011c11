"""Builds ahead of evaluation (cluster.prebuild): only where timing is on a GPU, and the same verdicts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import QuietShow, run_batch, sol_item
from test_sol_bench import test_unavailable_language_is_reported_not_crashed as unavailable_language

from mini_kv.cluster import batch, prebuild

ROOT = Path(__file__).resolve().parents[1]


def test_builds_overlap_evaluation_only_for_several_gpu_items():
    assert prebuild.overlaps_evaluation({"cuda", "cuda:1"}, 2)
    assert not prebuild.overlaps_evaluation({"cuda"}, 1)  # nothing to overlap with
    assert not prebuild.overlaps_evaluation({"cpu", "cuda"}, 3)  # a compiler beside CPU timing: never


@pytest.mark.slow
def test_a_batch_with_builds_ahead_gives_the_same_verdicts(monkeypatch, tmp_path):
    import threading

    from mini_kv.pipeline import VerifyOptions

    built, first_built, niceness = [], threading.Event(), []
    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    real = batch.build_item

    def build_item(item):  # the second build ends after the first: their turns are the batch's order
        # a process this build thread starts (its compiler) runs below the evaluation's priority
        stat = subprocess.run(["cat", "/proc/self/stat"], capture_output=True, text=True).stdout
        niceness.append(int(stat.rsplit(")", 1)[1].split()[16]))
        if item.candidate == "v1_vectorized":
            assert first_built.wait(300)
        try:
            return real(item)
        finally:
            built.append(item.candidate)
            first_built.set()

    monkeypatch.setattr(batch, "build_item", build_item)
    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    items = [
        batch.Item(
            batch.VERIFY, f"vector_add/{c}", str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path)
        )
        for c in ("v0_naive", "v1_vectorized")
    ]
    import mini_kv.pipeline as pipeline

    order, real_stages, real_door = [], pipeline.run_stages, batch.door_of

    def stages(door, *args, **kw):
        order.append(("run", door.cand.id, door.warm is not None))
        try:
            return real_stages(door, *args, **kw)
        finally:
            order.append(("done", door.cand.id))

    def door_of(item):
        order.append(("door", item.candidate))
        return real_door(item)

    monkeypatch.setattr(pipeline, "run_stages", stages)
    monkeypatch.setattr(batch, "door_of", door_of)
    seen = []
    results = batch.run_here(items, QuietShow(), lambda item, result: seen.append(item.candidate))
    assert built == ["v0_naive", "v1_vectorized"]  # both builds were made ahead
    base = os.getpriority(os.PRIO_PROCESS, 0)  # this thread's: it starts the judges and subjects
    assert niceness == [min(19, base + prebuild.BUILD_NICENESS)] * 2
    assert seen == ["v0_naive", "v1_vectorized"]  # evaluated as their builds were ready, one at a time
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    assert all(r.detail.compile.cache_hit for r in results)  # the evaluation found the build made ahead
    # the first item's door was made and its worker started, then the second's (its subject; its judge
    # is the first's, kept: runner.KeptJudges), before the first item ran; each run used its door and worker
    assert order == [
        ("door", "v0_naive"),
        ("door", "v1_vectorized"),
        ("run", "v0_naive", True),
        ("done", "v0_naive"),
        ("run", "v1_vectorized", True),
        ("done", "v1_vectorized"),
    ]


def _states(child, settle: str | None = None) -> list[str]:
    """The state letter of every process of a worker's jails (judge and subject), from /proc; with
    `settle`, read again (for up to 2 s) until all are in that state or none is nor is about to be
    (signals land late)."""
    import time

    from mini_kv.proc import ProcessTree, _state

    if settle is not None:
        for _ in range(100):
            states = set(_states(child))
            # 'D' (a page fault or read in progress: torch's import) takes a pending stop when it ends
            if states == {settle} or not states & {settle, "D"}:
                break
            time.sleep(0.02)
    out = []
    for run in (child, child.subject):
        if run is None or run.proc is None:  # a judge not taken yet (runner.KeptJudges)
            continue
        states = (_state(pid) for pid in [run.proc.pid, *ProcessTree.scan().below(run.proc.pid)])
        out += [s for s in states if s != "X"]  # (X: gone since the scan)
    return out


@pytest.mark.slow
def test_the_next_items_worker_is_stopped_whole_while_an_item_times(monkeypatch, tmp_path):
    """A real batch on the CPU with timing: the judge says when each timing starts and ends (its
    `timing` events), and every process of the worker started ahead is stopped ('T') for as long as it
    lasts, then runs again; both verdicts as alone."""
    from mini_kv import runner
    from mini_kv.pipeline import VerifyOptions

    seen, real = [], runner.AheadOfTurn.timing.__func__

    def timing(cls, on):
        real(cls, on)
        seen.append((on, [s for child in list(cls._children) for s in _states(child, "T")]))

    monkeypatch.setattr(runner.AheadOfTurn, "timing", classmethod(timing))
    opts = VerifyOptions(device="cpu", case_filter=["n31", "bench_cpu_64k"], artifacts=str(tmp_path))
    items = [
        batch.Item(
            batch.VERIFY, f"vector_add/{c}", str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path)
        )
        for c in ("v0_naive", "v1_vectorized")
    ]
    results = run_batch(items)
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    assert all(r.detail.results.bench for r in results)  # both timed
    # the first item's timing, with the second's worker (its subject: bwrap and Python; its judge will be
    # the first's, kept) stopped
    stopped = [states for on, states in seen if on and states]
    assert stopped and all(len(s) >= 2 and set(s) == {"T"} for s in stopped), seen
    assert all("T" not in states for on, states in seen if not on), seen  # and running again after
    assert runner.AheadOfTurn._children == set() and not runner.AheadOfTurn._timing


def test_a_worker_started_ahead_is_stopped_while_a_timing_runs_and_ends_when_closed(tmp_path):
    from mini_kv import runner

    child = runner.ChildRun(None, str(tmp_path / "log"), None, ahead=True)
    try:
        runner.AheadOfTurn.timing(True)
        assert set(_states(child, "T")) == {"T"}
        child.in_turn()  # its turn: it runs again, and a timing stops it no more
        assert "T" not in _states(child, "T")
        runner.AheadOfTurn.timing(False)
        runner.AheadOfTurn.mark(child, True)
        runner.AheadOfTurn.timing(True)
        assert set(_states(child, "T")) == {"T"}
    finally:
        code = child.close(kill=False)  # stopped, and closed without a job: it ends all the same
        runner.AheadOfTurn.timing(False)
    assert code is not None and runner.AheadOfTurn._children == set()


def test_an_item_whose_worker_cannot_start_ahead_meets_its_error_in_its_own_turn(monkeypatch, tmp_path):
    from mini_kv.pipeline import VerifyOptions

    monkeypatch.setattr(batch, "build_item", lambda item: None)
    good = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    card = str(ROOT / "tasks/vector_add.yaml")
    items = [
        batch.Item(batch.VERIFY, "ok", card, "v0_naive", good, str(tmp_path)),
        batch.Item(batch.VERIFY, "bad", card, "no_such_candidate", good, str(tmp_path)),
    ]
    assert batch.started_ahead(items[1]) is None  # the look-ahead swallows it ...
    finished = batch.evaluate_here(items)
    item, first = next(finished)
    assert first.status == "PASSED"
    with pytest.raises(Exception, match="no_such_candidate"):  # ... and the item's own run raises it
        next(finished)


def test_a_batch_stopped_early_ends_the_worker_it_started_ahead(monkeypatch, tmp_path):
    from mini_kv.pipeline import VerifyOptions

    monkeypatch.setattr(batch, "build_item", lambda item: None)
    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    items = [
        batch.Item(batch.VERIFY, c, str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path))
        for c in ("v0_naive", "v1_vectorized")
    ]
    from mini_kv import runner

    started = []
    real = batch.started_ahead
    monkeypatch.setattr(
        batch, "started_ahead", lambda item, ahead=True: started.append(real(item, ahead)) or started[-1]
    )
    finished = batch.evaluate_here(items)
    next(finished)
    _, door = started
    (kept,) = runner.KeptJudges._idle  # the first item's judge, kept for the second
    assert door.warm.proc is None  # the second item's worker waits for it, its subject up
    subject = door.warm.subject.proc
    assert subject.poll() is None and kept.proc.poll() is None
    finished.close()  # -x after the first item, or Ctrl-C
    assert subject.wait(timeout=30) is not None and kept.proc.wait(timeout=30) is not None
    assert door.warm is None and runner.KeptJudges._idle == []


def test_a_worker_started_ahead_touches_nothing_on_the_gpu(monkeypatch, tmp_path):
    """Ahead (while another item may be timing): the worker starts without CUPTI's warm-up (a CUDA
    context); in its own turn, a door starts one with it."""
    from mini_kv.solexec import run as sol_run
    from mini_kv.solexec.run import BenchOptions, sol_door

    started = []

    class Child:  # stands in for the jailed worker (runner.ChildRun)
        def __init__(self, job, log, env, warm_profiler=False, sandbox=None, spec=None, ahead=False):
            started.append((warm_profiler, ahead))

        def close(self, kill):
            pass

    monkeypatch.setattr(sol_run, "ChildRun", Child)
    opts = BenchOptions(
        solution=str(ROOT / "solutions/rmsnorm/pytorch/solution.json"), device="cuda", artifacts=str(tmp_path)
    )
    for ahead in (True, False):
        door = sol_door(str(ROOT / "problems/sol-execbench/rmsnorm"), opts)
        door.start_worker(ahead=ahead)
        door.close()
    assert started == [(False, True), (True, False)]


def test_ctrl_c_while_starting_ahead_ends_that_worker_and_stops_the_batch(monkeypatch):
    closed = []

    class Door:
        def start_worker(self, ahead=False):
            raise KeyboardInterrupt

        def close(self):
            closed.append(True)

    monkeypatch.setattr(batch, "door_of", lambda item: Door())
    with pytest.raises(KeyboardInterrupt):
        batch.started_ahead(None)
    assert closed == [True]


def test_a_worker_started_early_is_killed_when_nothing_is_evaluated(tmp_path, monkeypatch):
    """bench starts the worker before it builds; a run that ends before evaluating (here: every
    workload unavailable) leaves no child behind."""
    from mini_kv import runner

    started = []
    real = runner.ChildRun.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        started.append(self)

    monkeypatch.setattr(runner.ChildRun, "__init__", spy)
    unavailable_language(tmp_path)  # test_sol_bench's run, outside its module's kept judges
    judges = [c for c in started if not isinstance(c, runner.SubjectRun)]
    assert len(judges) == 1 and len(started) == 2  # the judge and the subject started with it
    assert all(c.proc.poll() is not None for c in started) and judges[0].proc.stdin.closed


def test_items_run_in_the_order_their_builds_are_ready(monkeypatch):
    """A solution with nothing to compile does not wait behind an earlier one's cold C++ build; the
    worker started ahead for an item that then loses its turn ends unused; the results come back in
    the items' order. The builds here are stand-ins, each done only when the test says so."""
    import threading
    from types import SimpleNamespace

    from mini_kv.errors import ExitCode

    ran = {label: threading.Event() for label in ("cold", "python-1", "python-2")}
    first_start = threading.Event()
    # a build is done once that item has run; python-1's once the first worker was started ahead
    needs = {"cold": ran["python-2"], "python-2": ran["python-1"], "python-1": first_start}

    def build_item(item):
        assert needs[item.label].wait(30)

    events, doors = [], []

    def started_ahead(item, ahead=True):
        doors.append(SimpleNamespace(label=item.label, close=lambda: events.append(("closed", door))))
        door = doors[-1]
        first_start.set()
        return door

    def run_item(item, progress, line, references=None, door=None, built_ahead=None):
        events.append(("ran", item.label, door))
        ran[item.label].set()
        return batch.ItemResult(batch.BENCH, item.label, None, "PASSED", ExitCode.OK, None)

    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    monkeypatch.setattr(batch, "build_item", build_item)
    monkeypatch.setattr(batch, "started_ahead", started_ahead)
    monkeypatch.setattr(batch, "run_item", run_item)
    opts = SimpleNamespace(device="cuda")
    items = [
        batch.Item(batch.BENCH, label, "p", None, opts, "s") for label in ("cold", "python-1", "python-2")
    ]
    results = batch.run_here(items, QuietShow(), lambda item, result: None)
    assert [r.label for r in results] == ["cold", "python-1", "python-2"]  # the items' order
    runs = [e for e in events if e[0] == "ran"]
    assert [label for _, label, _ in runs] == ["python-1", "python-2", "cold"]  # as their builds were ready
    assert all(door is None or door.label == label for _, label, door in runs)  # its own worker, or a new one
    closed = [e[1] for e in events if e[0] == "closed"]
    # planned while no build was ready (first, and again while python-1 ran), cold lost its turn twice
    assert doors[0].label == "cold" and [door.label for door in closed] == ["cold", "cold"]
    assert all(door not in closed for _, _, door in runs)  # no worker both ended and used


def test_a_build_that_failed_ahead_is_not_compiled_again_in_its_run(monkeypatch, tmp_path):
    """A batch builds every item ahead; a build that failed on its sources (a compiler error) is the
    item's result in its turn, with the same log, instead of a second compile (a failed build is never
    cached, and on an H100 the second compile of each syntax error cost 18 s of a 107-s batch)."""
    from mini_kv.compile import compiler

    sols = ROOT / "tests" / "sol_solutions"
    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    compiles, real = [], compiler._build_into

    def build_into(plan, *args, **kw):
        compiles.append(plan.key)
        return real(plan, *args, **kw)

    monkeypatch.setattr(compiler, "_build_into", build_into)
    names = ("cuda_syntax_error_lean", "good_dps")
    items = [sol_item(sols / "problem", sols / name / "solution.json", tmp_path) for name in names]
    results = batch.run_here(items, QuietShow(), lambda item, result: None)
    assert [r.status for r in results] == ["COMPILE_ERROR", "PASSED"], [r.reason for r in results]
    assert len(compiles) == 1, compiles  # the build ahead only
    rec = results[0].detail.compile
    assert rec.status == "error" and compiler.failed_alike(rec, rec.key)
    assert "error" in str(rec.cuda_check).lower()  # nvcc's compile check (no CUDA build on this machine)


def test_a_failure_that_may_be_the_machines_is_built_again(tmp_path):
    """Only a compiler's own error on the same key is reused: a timeout, a refusal, a compiler killed
    or short of memory (beside a batch's other builds), another key, or logs gone are built again."""
    from dataclasses import replace

    from mini_kv.compile.compiler import BuildStatus, CompileRecord, failed_alike

    log = tmp_path / "stdout.log"
    log.write_text("kernel.cu(3): error: expected a ';'\n")
    rec = CompileRecord(
        status=BuildStatus.ERROR, key="k", failed_build_dir=str(tmp_path), logs={"stdout.log": str(log)}
    )
    assert failed_alike(rec, "k")
    assert not failed_alike(rec, "other key")
    assert not failed_alike(None, "k")
    assert not failed_alike(replace(rec, status=BuildStatus.TIMEOUT), "k")
    assert not failed_alike(replace(rec, refused="a link out of the candidate dir"), "k")
    assert not failed_alike(replace(rec, failed_build_dir=str(tmp_path / "gone")), "k")
    log.write_text("k.cpp:7:12: error: 'x' was not declared in this scope\n")  # gcc's form
    assert failed_alike(rec, "k")
    machine = (
        "g++: fatal error: Killed signal terminated program cc1plus",
        "k.cpp:7:12: fatal error: virtual memory exhausted: Cannot allocate memory",
        "k.cpp:1: fatal error: error writing to /tmp/ccX.s: No space left on device",
        "ninja: build stopped: subcommand failed.",  # no diagnostic on a source line
    )
    for text in machine:
        log.write_text(text + "\n")
        assert not failed_alike(rec, "k"), text


def test_one_pattern_finds_every_compilers_error_on_a_source_line():
    """compile.diagnostics: what the report shows first and what failed_alike takes for the sources'
    failure, for gcc/clang and nvcc alike; a line without a source location is none."""
    from mini_kv.compile.diagnostics import first_compiler_error

    for line, loc in [
        ("k.cpp:7:12: error: 'x' was not declared in this scope", "k.cpp:7:12"),
        ("k.cpp:3:10: fatal error: nope.h: No such file or directory", "k.cpp:3:10"),
        ("kernel.cu(3): error: expected a ';'", "kernel.cu(3)"),
        ('kernel.cu(1): catastrophic error: cannot open source file "nope.h"', "kernel.cu(1)"),
    ]:
        assert first_compiler_error(f"FAILED: k.o\n{line}\n") == (loc, [line])
    assert first_compiler_error("g++: fatal error: Killed signal terminated program cc1plus\n") is None
