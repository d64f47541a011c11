"""The worker zygote (mini_kv.worker.zygote): children forked from a process that has loaded Python and
torch once, each one as confined and as killable as a fresh process was."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mini_kv.runner import ChildRun, run_one
from mini_kv.sandbox import disabled
from mini_kv.worker import zygote
from mini_kv.worker.jobs import BandwidthJob, Event

NO_SANDBOX = disabled("test")
# on CPU this job's answer is a signed error from the child ("Expected a cuda device"): it ran the job
JOB = BandwidthJob(device="cpu", nbytes=2**12, iterations=2)


def _answered(ev: dict) -> bool:
    return (
        ev["event"] == Event.FATAL
        and "Expected a cuda device" in ev.get("reason", "")
        and not ev.get("timed_out")
    )


pytestmark = pytest.mark.skipif(not zygote.enabled(), reason="the zygote needs Linux (fork)")


def _only_zygote() -> zygote.Zygote:
    assert len(zygote._zygotes) == 1, zygote._zygotes
    return next(iter(zygote._zygotes.values()))


@pytest.fixture(autouse=True)
def fresh_zygotes():
    zygote.close_all()
    zygote._broken.clear()
    yield
    zygote.close_all()
    zygote._broken.clear()


def test_children_are_forked_from_one_zygote_and_answer_as_fresh_ones_do(monkeypatch):
    first = run_one(JOB, timeout=120, sandbox=NO_SANDBOX)
    z = _only_zygote()
    t0 = time.monotonic()
    second = run_one(JOB, timeout=120, sandbox=NO_SANDBOX)
    forked_s = time.monotonic() - t0
    assert _answered(first) and _answered(second), (first, second)
    assert _only_zygote() is z and z.next_request == 2 and z.running == 0
    # the same job in a fresh process (MINI_KV_ZYGOTE=0) gives the same kind of answer
    monkeypatch.setenv("MINI_KV_ZYGOTE", "0")
    t0 = time.monotonic()
    fresh = run_one(JOB, timeout=120, sandbox=NO_SANDBOX)
    fresh_s = time.monotonic() - t0
    assert _answered(fresh), fresh
    assert forked_s < fresh_s, (forked_s, fresh_s)  # torch is not imported again


def test_another_environment_gets_its_own_zygote(tmp_path):
    run_one(JOB, timeout=120, sandbox=NO_SANDBOX)
    env = {**os.environ, "MINI_KV_TEST_MARK": "1"}
    ev = run_one(JOB, timeout=120, env=env, sandbox=NO_SANDBOX)
    assert _answered(ev) and len(zygote._zygotes) == 2


def test_a_child_waiting_for_its_job_dies_with_a_killed_zygote_and_a_new_zygote_takes_over(tmp_path):
    child = ChildRun(None, str(tmp_path / "w.log"), None, sandbox=NO_SANDBOX)  # started early, no job yet
    pid = child.proc.pid
    assert pid is not None
    os.kill(_only_zygote().proc.pid, signal.SIGKILL)
    code = child.close(kill=False)  # no hang: its zygote's end is gone, and so is the child
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]
    ev = run_one(JOB, timeout=120, sandbox=NO_SANDBOX)
    assert _answered(ev), ev


def test_a_child_is_killed_with_its_process_group(tmp_path):
    child = ChildRun(None, str(tmp_path / "w.log"), None, sandbox=NO_SANDBOX)
    pid = child.proc.pid
    assert os.getpgid(pid) == pid  # a session and group of its own, as Popen(start_new_session) gave
    child.close(kill=True)  # (its stdin closes first: it may end on its own, reading no job, before the kill)
    assert not _running(pid) and _only_zygote().running == 0


def test_the_zygote_exits_with_its_parent_and_takes_its_children(tmp_path):
    """A parent that dies without cleaning up (SIGKILL): the zygote sees its socket close and exits,
    killing the child it had forked."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from mini_kv.runner import ChildRun\n"
        "from mini_kv.sandbox import disabled\n"
        "c = ChildRun(None, sys.argv[1], None, sandbox=disabled('test'))\n"
        "from mini_kv.worker import zygote\n"
        "z = next(iter(zygote._zygotes.values()))\n"
        "print(z.proc.pid, c.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "w.log")], stdout=subprocess.PIPE, text=True
    )
    zygote_pid, child_pid = map(int, parent.stdout.readline().split())
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 20
    alive = [zygote_pid, child_pid]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.05)
    assert not alive, alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_zygote_that_cannot_load_leaves_the_work_to_fresh_processes(tmp_path):
    """A zygote that dies before it is ready (here: at start-up): the child it never forked is started as
    a fresh process, with nothing of the job lost, and so is every later child of that environment."""
    from pathlib import Path

    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nif b'mini_kv.worker.zygote' in open('/proc/self/cmdline', 'rb').read():\n"
        "    print('planted: this zygote cannot load', file=sys.stderr, flush=True)\n    os._exit(7)\n"
    )
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(src)])}
    log = tmp_path / "worker.log"
    ev = run_one(JOB, timeout=120, env=env, sandbox=NO_SANDBOX, log_path=str(log))
    assert _answered(ev), ev
    assert zygote._key(env) in zygote._broken
    assert "planted: this zygote cannot load" in log.read_text()  # the worker log says why
    ev = run_one(JOB, timeout=120, env=env, sandbox=NO_SANDBOX)
    assert _answered(ev), ev
