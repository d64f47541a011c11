"""Batches across a Dask cluster on CPU, loopback only (docs/distributed.md): an embedded cluster of 2
worker processes gives the verdicts a plain run gives; a worker SIGKILLed mid-candidate costs nothing
(every attempt complete, none twice, index == rebuild-index); Ctrl-C leaves no partial attempt and no
process behind. Small cases and solutions keep it short: the verdicts do not depend on sample counts."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import cmdline, run_cli
from test_index import snapshot

from mini_kv.errors import ExitCode
from mini_kv.proc import ProcessTree
from mini_kv.store.attempts import iter_attempt_dirs, read_attempt
from mini_kv.store.index import rebuild_index

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"
ONE_CASE = {"device": "cpu", "skip_benchmark": True}
FAST_SOL = {"device": "cpu", "rounds": 2, "warmup": 1, "samples": 3, "timeout": 120}


def manifest(tmp_path, verify=(), solutions=(), name="batch.yaml", **sol_options) -> Path:
    """A batch manifest (schemas/batch.schema.json) in tmp_path, paths absolute."""
    doc = {"schema_version": 1}
    if verify:
        doc["verify"] = [
            {
                "task": str(ROOT / "tasks" / f"{task}.yaml"),
                "candidates": cands,
                "options": {**ONE_CASE, "case": [case]},
            }
            for task, cands, case in verify
        ]
    if solutions:
        doc["bench"] = [
            {
                "problem": str(SOLS / "problem"),
                "solutions": [str(SOLS / s / "solution.json") for s in solutions],
                "options": {**FAST_SOL, **sol_options},
            }
        ]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def batch_args(path: Path, store: Path, *extra: str) -> list[str]:
    return ["batch", str(path), "--artifacts", str(store), "--json", *extra]


def batch_cmd(path: Path, store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mini_kv", *batch_args(path, store, *extra)]


def run_batch(path: Path, store: Path, *extra: str, env=None) -> tuple[int, dict[str, dict]]:
    """A batch in this process (conftest.run_cli); one with workers (`--workers`) in a process of its own,
    whose cluster of spawned worker processes is then the command's, not the test process's."""
    if "--workers" in extra or env is not None:
        res = subprocess.run(
            batch_cmd(path, store, *extra), capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
        )
    else:
        res = run_cli(*batch_args(path, store, *extra), timeout=600)
    lines = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    return res.returncode, {ln["item"]: ln for ln in lines}


def check_store(store: Path, items: int) -> list[dict]:
    """Every attempt whole and listed once, none partial, and the index equal to a rebuild of it."""
    dirs = list(iter_attempt_dirs(store))
    assert not [d for d in dirs if d.name.endswith(".partial")]
    headers = [read_attempt(d) for d in dirs]  # every file re-hashed
    assert len(headers) == items
    assert len({h["attempt_id"] for h in headers}) == items
    before = snapshot(store)
    rebuild_index(store)
    assert snapshot(store) == before
    return headers


def verdicts(lines: dict[str, dict]) -> dict[str, tuple]:
    return {item: (ln["status"], ln["exit_code"]) for item, ln in lines.items()}


@pytest.mark.slow
def test_two_workers_give_the_plain_runs_verdicts(tmp_path):
    path = manifest(
        tmp_path,
        verify=[("vector_add", ["*"], "n31")],  # both candidates: PASSED
        solutions=["good_dps", "wrong_values", "raises"],  # PASSED, INCORRECT_NUMERICAL, RUNTIME_ERROR
    )
    # the plain run's verdicts of these items (test_sol_bench.py and test_verify_cpu.py run them plainly)
    sol = "problem:" + str(SOLS / "{}" / "solution.json")
    plain = {
        "vector_add/v0_naive": ("PASSED", ExitCode.OK),
        "vector_add/v1_vectorized": ("PASSED", ExitCode.OK),
        sol.format("good_dps"): ("PASSED", ExitCode.OK),
        sol.format("wrong_values"): ("FAILED", ExitCode.CORRECTNESS),
        sol.format("raises"): ("FAILED", ExitCode.CORRECTNESS),
    }
    dcode, dist = run_batch(path, tmp_path / "dist", "--workers", "2")
    assert verdicts(dist) == plain, dist
    assert dcode == ExitCode.CORRECTNESS  # the worst: wrong_values and raises
    headers = check_store(tmp_path / "dist", 5)
    workers = {h["worker"]["worker"] for h in headers}
    assert len(workers) == 2, workers  # both workers took part
    assert all(h["worker"]["host"] and h["worker"]["address"].startswith("tcp://127.0.0.1") for h in headers)


def _busy_workers(client_pid: int, count: int = 1, timeout: float = 120) -> list[int]:
    """Pids of `count` Dask worker processes of `client_pid` that are running a candidate's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [
            pid
            for pid in ProcessTree.scan().below(client_pid)
            if "spawn_main" in cmdline(pid)
            and any(_is_worker_child(c) for c in ProcessTree.scan().below(pid))
        ]
        if len(busy) >= count:
            return busy
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} workers started a candidate")


def _is_worker_child(pid: int) -> bool:
    """A candidate's worker child: a `mini_kv.worker.child` process (in its jail, or the bwrap that holds
    it: both name the entry point on their command line)."""
    return "mini_kv.worker.child" in cmdline(pid)


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark` (everything the client started, at any depth)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if mark.encode() in Path(f"/proc/{name}/environ").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found


def _ctrl_c_reaches_it() -> None:
    """A Popen preexec_fn: SIGINT back to its default, so that Ctrl-C (the SIGINT a test sends) interrupts
    the command as it would from a terminal, even where the tests were started with SIGINT ignored (a
    background job of a non-interactive shell inherits SIG_IGN, and Python then keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _another_hang(tmp_path) -> str:
    """A second solution that spins like `hangs` (its own name): with worker children forked in
    milliseconds the quick solutions are done within a second, so two hanging ones keep two workers busy."""
    import shutil

    dest = tmp_path / "hangs_too"
    shutil.copytree(SOLS / "hangs", dest)
    doc = json.loads((dest / "solution.json").read_text())
    (dest / "solution.json").write_text(json.dumps({**doc, "name": "hangs_too"}))
    return str(dest)


def test_workers_killed_mid_candidate_lose_nothing(tmp_path):
    # `hangs` spins in its second workload (TIMEOUT after 5 s): its child outlives a dead worker unless
    # it dies with it. The two hangs keep both workers busy when they are killed; one more item after them
    solutions = ["hangs", _another_hang(tmp_path), "good_dps"]
    path = manifest(tmp_path, solutions=solutions, timeout=5)
    store = tmp_path / "store"
    client = subprocess.Popen(
        batch_cmd(path, store, "--workers", "2", "--retries", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        busy = _busy_workers(client.pid, 2)
        time.sleep(3)
        children = [c for pid in busy for c in ProcessTree.scan().below(pid)]
        for pid in busy:  # both at once: every running item loses its worker
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)  # a child would otherwise run on for seconds (until its next write finds no reader)
        running = [c for c in children if cmdline(c)]  # a zombie has no command line
        out, err = client.communicate(timeout=300)
    finally:
        client.kill()
    assert running == [], "a dead worker's candidate child is still running"
    lines = {json.loads(ln)["item"]: json.loads(ln) for ln in out.splitlines() if ln.startswith("{")}
    assert len(lines) == len(solutions), err
    assert "WORKER_LOST" not in {ln["status"] for ln in lines.values()}, err
    check_store(store, len(solutions))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_leaves_no_partial_attempt_and_no_process(tmp_path, sig):
    """Ctrl-C, or SIGTERM, on a batch whose two Dask workers are busy: no process and none of mini_kv's
    scratch dirs left (the workers end without their clean-up running: the batch sweeps what they left),
    no partial attempt, every stored one whole."""
    path = manifest(tmp_path, solutions=["hangs", _another_hang(tmp_path), "good_dps", "good_return"])
    store, mark = tmp_path / "store", f"MINI_KV_TEST_MARK_{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    client = subprocess.Popen(
        batch_cmd(path, store, "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, mark: "1", "TMPDIR": str(tmp)},
        preexec_fn=_ctrl_c_reaches_it,
    )
    try:
        _busy_workers(client.pid, 2)  # one of them on the solution that never returns
        time.sleep(3)
        client.send_signal(sig)
        client.communicate(timeout=60)
    finally:
        client.kill()
    assert client.returncode == (130 if sig == signal.SIGINT else 143)
    assert [d.name for d in tmp.iterdir() if d.name.startswith("mini-kv-")] == []
    deadline = time.monotonic() + 20  # the nannies' workers and their children go within seconds
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _marked(mark) == [], [cmdline(p) for p in _marked(mark)]
    assert not [d for d in iter_attempt_dirs(store) if d.name.endswith(".partial")]
    for d in iter_attempt_dirs(store):
        read_attempt(d)  # an attempt stored before the interrupt is whole


def test_the_manifest_is_checked_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nverify:\n  - task: nowhere.yaml\n")
    res = run_cli("batch", str(bad))
    assert res.returncode == ExitCode.CONFIG
    assert "bad.yaml: verify[0].task" in res.stderr and "no such task card" in res.stderr
    bad.write_text(
        "schema_version: 1\nbench:\n  - problem: p\n    solutions: [a.json]\n    options: {round: 2}\n"
    )
    res = run_cli("batch", str(bad))
    assert res.returncode == ExitCode.CONFIG and "bad.yaml" in res.stderr and "round" in res.stderr


def test_the_slurm_job_script():
    """`--cluster slurm`: each job one worker on one GPU, one task at a time, holding GPU=1 (no Slurm
    here: the script is what can be checked)."""
    pytest.importorskip("dask_jobqueue")
    from mini_kv.cluster.cluster import Placement, slurm_cluster

    cluster = slurm_cluster(
        Placement(cluster="slurm", workers=2),
        scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
    )
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH --gres=gpu:1" in script
    assert "--resources GPU=1" in script and "--nthreads 1" in script
    assert "tcp://127.0.0.1:" in script


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_existing_scheduler_and_mini_kv_worker(tmp_path):
    """`--cluster tcp://...` with a scheduler started apart and `mini-kv worker` serving it."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
            + ["--port", address.rsplit(":", 1)[1], "--no-dashboard"],
            stderr=subprocess.DEVNULL,
            preexec_fn=_ctrl_c_reaches_it,
        )
    ]
    try:
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "mini_kv", "worker", address, "--workers", "1"],
                cwd=ROOT,
                stderr=subprocess.DEVNULL,
                preexec_fn=_ctrl_c_reaches_it,
            )
        )
        sol = str(SOLS / "good_dps" / "solution.json")
        res = subprocess.run(
            [sys.executable, "-m", "mini_kv", "bench", str(SOLS / "problem"), "--solution", sol]
            + ["--device", "cpu", "--rounds", "2", "--samples", "3", "--artifacts", str(tmp_path / "s")]
            + ["--cluster", address],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASSED" in res.stdout
    [header] = check_store(tmp_path / "s", 1)
    assert header["worker"]["worker"].endswith("-cpu0")


def test_manifest_options_are_the_command_line_names(tmp_path):
    from mini_kv.cluster.manifest import load_manifest
    from mini_kv.errors import ConfigError

    task = Path(__file__).resolve().parents[1] / "tasks/vector_add.yaml"
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        f"schema_version: 1\nverify:\n  - task: {task}\n    options: {{case: [n31], memory_limit: 3, device: cpu}}\n"
    )
    (item, *_) = load_manifest(str(manifest), str(tmp_path / "a"))
    assert item.opts.case_filter == ["n31"] and item.opts.memory_limit_gb == 3
    # the record's field names are not the interface: refused, naming the field
    manifest.write_text(
        f"schema_version: 1\nverify:\n  - task: {task}\n    options: {{case_filter: [n31]}}\n"
    )
    with pytest.raises(ConfigError, match="case_filter"):
        load_manifest(str(manifest), str(tmp_path / "a"))


def test_more_cpu_workers_than_the_cores_hold_is_warned(capsys, monkeypatch):
    from mini_kv.cluster import cluster

    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 2)
    cluster.warn_oversubscribed(2)
    err = capsys.readouterr().err
    assert "--workers 2 on 2 cores" in err and "at most --workers 1" in err
    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 16)
    cluster.warn_oversubscribed(4)
    cluster.warn_oversubscribed(None)
    assert capsys.readouterr().err == ""


def test_a_workers_judges_are_kept_for_one_batch_and_end_when_idle(monkeypatch):
    """batch.WorkerJudges: kept from a batch's first item on the worker; another batch's item ends them,
    a lone item keeps none, and IDLE_S after an item with no next one they end."""
    import time

    from mini_kv.cluster.batch import WorkerJudges
    from mini_kv.runner import KeptJudges

    monkeypatch.setattr(WorkerJudges, "IDLE_S", 0.05)
    WorkerJudges.serving("a")
    assert KeptJudges.keeping() and WorkerJudges._batch == "a"
    WorkerJudges.served()
    WorkerJudges.serving("a")  # the next item of the batch in time: the same scope
    assert KeptJudges._depth == 1 and WorkerJudges._timer is None
    WorkerJudges.serving("b")  # another batch's item: the first batch's scope ends, one of its own
    assert KeptJudges._depth == 1 and WorkerJudges._batch == "b"
    WorkerJudges.serving(None)  # a lone item: nothing kept
    assert not KeptJudges.keeping()
    WorkerJudges.serving("c")
    WorkerJudges.served()
    late = WorkerJudges._timer
    WorkerJudges.serving("c")  # the next item came while the timer, fired, waited for the lock
    late.function(*late.args, **late.kwargs)
    assert KeptJudges.keeping() and WorkerJudges._batch == "c"  # that timer ends nothing
    WorkerJudges.served()
    time.sleep(0.5)
    assert not KeptJudges.keeping() and WorkerJudges._batch is None
