"""Streamed, resumable results: each finished item is in the results file at once; Ctrl-C prints one line
and no traceback (here and on an embedded Dask cluster); the same command with --resume skips what is
done and appends the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cmdline

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems/sol-execbench/custom_inputs_matmul"
SOLUTION = ROOT / "solutions/custom_inputs_matmul/pytorch/solution.json"
FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "samples": 3, "timeout": 120}


def _solutions(tmp_path: Path, n: int) -> list[Path]:
    """n copies of the shipped solution under distinct names (a results file knows solutions by name)."""
    out = []
    sol = json.loads(SOLUTION.read_text())
    for i in range(n):
        d = tmp_path / f"s{i}"
        d.mkdir()
        for src in sol["sources"]:
            (d / src["path"]).write_text((SOLUTION.parent / src["path"]).read_text())
        (d / "solution.json").write_text(json.dumps({**sol, "name": f"matmul_copy_{i}"}))
        out.append(d / "solution.json")
    return out


def _manifest(tmp_path: Path, n: int) -> Path:
    m = tmp_path / "batch.yaml"
    sols = "".join(f"      - {s}\n" for s in _solutions(tmp_path, n))
    m.write_text(
        f"schema_version: 1\nbench:\n  - problem: {PROBLEM}\n    options: {json.dumps(FAST)}\n    solutions:\n{sols}"
    )
    return m


def _cmd(manifest: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "mini_kv", "batch", str(manifest), "--artifacts", str(tmp_path / "a"),
        "--results", str(tmp_path / "r.jsonl"), *extra,
    ]  # fmt: skip


def _solutions_in(results: Path) -> list[str]:
    return [json.loads(line)["solution"] for line in results.read_text().splitlines()]


def _interrupt_after_first(cmd: list[str], results: Path) -> subprocess.CompletedProcess:
    # SIGINT as a terminal gives it, whatever this process inherited: a shell's background job (`.ci/run
    # &`) ignores SIGINT, and an ignored signal stays ignored across exec
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (results.exists() and results.read_text().strip()):
        if proc.poll() is not None:  # it ended before any item finished: say why
            out, err = proc.communicate()
            pytest.fail(
                f"the batch ended (exit {proc.returncode}) before its first item finished:\n{err[-3000:]}"
            )
        time.sleep(0.2)
    assert results.read_text().strip(), "no item finished in time"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("where", [[], ["--workers", "2"]], ids=["here", "dask"])
def test_interrupt_then_resume_runs_each_solution_once(tmp_path, where):
    if where:
        pytest.importorskip("distributed")
    # two more than run at once (two under --workers 2, one here), so that one is left for the resume
    # however late the interrupt lands (a loaded machine finished the second while it was on its way)
    n = 4 if where else 3
    manifest = _manifest(tmp_path, n)
    results = tmp_path / "r.jsonl"
    res = _interrupt_after_first(_cmd(manifest, tmp_path, *where), results)
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("interrupted: ")]
    assert len(line) == 1, res.stderr
    done = set(_solutions_in(results))
    assert done and len(done) < n
    # each finished solution's every workload is in the file: 3 traces per solution
    assert len(_solutions_in(results)) == 3 * len(done)

    again = subprocess.run(_cmd(manifest, tmp_path, "--resume"), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{len(done)} of {n} item(s) already done, skipped" in again.stderr
    names = _solutions_in(results)
    assert sorted(set(names)) == [f"matmul_copy_{i}" for i in range(n)]
    assert len(names) == 3 * n  # nothing twice


def test_a_torn_last_line_is_dropped_and_that_item_runs_again(tmp_path):
    from mini_kv.cluster.batch import Journal

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"item": "t/a", "status": "PASSED"}) + "\n" + '{"item": "t/b", "sta')
    journal = Journal(path, resume=True)
    assert journal.done == {("verify", "t", "a")}
    assert path.read_text().count("\n") == 1 and "t/b" not in path.read_text()
    assert Journal(path, resume=False).done == set() and path.read_text() == ""


def _sol_item(tmp_path: Path, definition: str, solution: str, where: str):
    """A batch item of a SOL solution named `solution` for a definition named `definition`."""
    from mini_kv.cluster.batch import BENCH, Item
    from mini_kv.solexec.run import BenchOptions

    d = tmp_path / where
    d.mkdir()
    (d / "definition.json").write_text(json.dumps({"name": definition}))
    (d / "solution.json").write_text(json.dumps({"name": solution, "definition": definition}))
    opts = BenchOptions(solution=str(d / "solution.json"))
    return Item(BENCH, f"{where}:{solution}", str(d), None, opts, str(tmp_path / "a"))


def test_names_with_a_slash_are_not_taken_for_one_another(tmp_path):
    """definition "ops/rms" with solution "v1" and definition "ops" with solution "rms/v1" joined by "/"
    are the same string: a resumed run skipped the second when the first was done."""
    from mini_kv.cluster.batch import Journal, item_key

    done = _sol_item(tmp_path, "ops/rms", "v1", "p1")
    other = _sol_item(tmp_path, "ops", "rms/v1", "p2")
    path = tmp_path / "r.jsonl"
    trace = {"definition": "ops/rms", "workload": {}, "solution": "v1", "evaluation": {"status": "PASSED"}}
    card_line = {"item": "rmsnorm/fast", "status": "PASSED", "exit_code": 0, "attempt": "x"}
    path.write_text(json.dumps(trace) + "\n" + json.dumps(card_line) + "\n")
    journal = Journal(path, resume=True)
    assert item_key(done) in journal.done
    assert item_key(other) not in journal.done
    assert ("verify", "rmsnorm", "fast") in journal.done  # a card's line, as files have always held it


def test_two_solutions_one_name_are_refused_with_a_results_file(tmp_path):
    from mini_kv.cli_batch import run_items
    from mini_kv.errors import UserError

    first = _sol_item(tmp_path, "ops", "v1", "p1")
    second = _sol_item(tmp_path, "ops", "v1", "p2")
    with pytest.raises(UserError, match="solution name 'v1' of definition 'ops' is also the name of"):
        run_items([first, second], None, results=str(tmp_path / "r.jsonl"))
    assert not (tmp_path / "r.jsonl").exists()  # refused before anything ran or was written


def test_a_file_that_is_not_a_results_file_is_refused_on_resume(tmp_path):
    from mini_kv.cluster.batch import Journal
    from mini_kv.errors import UserError

    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(UserError, match="line 1: neither a SOL trace"):
        Journal(path, resume=True)
    assert path.read_text() == json.dumps({"hello": 1}) + "\n"  # left as it was


def _processes_naming(text: str) -> list[str]:
    """The command lines of the processes that name `text` (a jail's bwrap binds its dirs by path)."""
    lines = (cmdline(pid) for pid in os.listdir("/proc") if pid.isdigit())
    return [line for line in lines if text in line]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_bench_leaves_no_process_and_no_scratch_dir(tmp_path, sig):
    """Ctrl-C, or SIGTERM (kill, `timeout`, a CI runner's cancel), while a solution hangs: one line, no
    traceback, 130 or 143, and nothing left: no jailed process, and none of the run's scratch dirs (before,
    the jails' staging dirs stayed on Ctrl-C, and SIGTERM ended the process with no clean-up at all)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [
        sys.executable, "-m", "mini_kv", "bench", str(ROOT / "tests/sol_solutions/problem"), "--solution",
        str(ROOT / "tests/sol_solutions/hangs/solution.json"), "--device", "cpu", "--timeout", "120",
        "--artifacts", str(tmp_path / "a"),
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmp)}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:  # fmt: skip
        try:
            seen = []
            for line in proc.stderr:  # the progress lines; the hang is the second workload
                seen.append(line)
                if "workload 2/2" in line:
                    break
            assert seen and "workload 2/2" in seen[-1], "".join(seen)
            time.sleep(1)  # in the hanging call
            assert _processes_naming(str(tmp)), "no jailed worker running"
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
    assert "Traceback" not in err and "interrupted: 0 stored, 1 not run" in err, err
    assert _processes_naming(str(tmp)) == []
    assert list(tmp.iterdir()) == []
