"""The static pre-check (mini_kv.judge.static_check): kernelguard over a candidate's sources, in a forked
child that input crafted against it cannot turn into a hang, a crash or a memory blow-up of the run."""

from __future__ import annotations

import os
import time

import pytest

from mini_kv.judge import static_check

pytest.importorskip("kernelguard")

ID_CACHE = """import torch
_cache = {}

def run(x, y):
    key = id(x)
    if key in _cache:
        return _cache[key]
    out = x + y
    _cache[key] = out
    return out
"""


def test_a_cache_keyed_on_the_inputs_address_is_named_and_an_honest_source_is_not():
    got = static_check.check_sources(
        {"kernel.py": ID_CACHE, "README.md": "not a source", "ok.py": "def run(x):\n    return x * 2\n"}
    )
    assert got.ran and got.classification == "hacked" and got.files == ("kernel.py", "ok.py")
    assert {(f.file, f.pattern) for f in got.findings} == {("kernel.py", "OUTPUT_REPLAY_CACHE")}
    assert "OUTPUT_REPLAY_CACHE (high) in kernel.py" in got.line()
    clean = static_check.check_sources({"ok.py": "def run(x):\n    return x * 2\n"})
    assert clean.ran and clean.classification == "valid" and clean.findings == () and clean.line() is None


def test_the_same_sources_are_read_once_per_process(monkeypatch):
    import kernelguard

    monkeypatch.setattr(static_check, "_ANSWERS", {})
    first = static_check.check_sources({"kernel.py": ID_CACHE})
    # a second read would fork a child with this broken detector
    monkeypatch.setattr(kernelguard, "analyze_code", lambda *a, **k: 1 / 0)
    again = static_check.check_sources({"kernel.py": ID_CACHE})
    assert again == first and again.ran
    other = static_check.check_sources(
        {"kernel.py": ID_CACHE + "\n"}
    )  # another text: read, and here it fails
    assert not other.ran


def test_a_parent_with_gigabytes_of_address_space_still_gets_its_check(monkeypatch):
    """A CUDA context or torch alone gives the parent gigabytes of address space, which the forked child
    inherits: its cap is on top of that, or the detector could not allocate at all."""
    import mmap

    monkeypatch.setattr(static_check, "_ANSWERS", {})
    reserved = mmap.mmap(-1, 8 << 30)  # address space, not memory: untouched pages
    try:
        got = static_check.check_sources({"kernel.py": ID_CACHE * 30})
    finally:
        reserved.close()
    assert got.ran and {f.pattern for f in got.findings} == {"OUTPUT_REPLAY_CACHE"}, got


def test_a_source_too_large_is_named_not_read(monkeypatch):
    monkeypatch.setattr(static_check, "MAX_FILE_BYTES", 100)
    got = static_check.check_sources({"big.cu": "x" * 101, "kernel.py": ID_CACHE[:90]})
    assert got.skipped == ("big.cu",) and got.files == ("kernel.py",)


@pytest.mark.parametrize(
    "runaway, why",
    [
        (lambda *a, **k: time.sleep(60), "did not finish within 1 s"),  # a parser or a regex that never ends
        (lambda *a, **k: bytearray(4 << 30), "failed (exited with status 1)"),  # a blow-up: its memory cap
        (lambda *a, **k: 1 / 0, "failed (exited with status 1)"),  # a crash of the detector
    ],
    ids=["hang", "memory", "crash"],
)
def test_a_detector_that_runs_away_costs_its_child_and_the_check_says_why(monkeypatch, runaway, why):
    """The attacker's input cannot be known ahead, so the detector itself is made to run away (the child
    is forked from this process, patched module and all): the run goes on, the record says why."""
    import kernelguard

    monkeypatch.setattr(kernelguard, "analyze_code", runaway)
    monkeypatch.setattr(static_check, "_ANSWERS", {})  # nothing read before
    monkeypatch.setattr(static_check, "TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    got = static_check.check_sources({"kernel.py": ID_CACHE})
    assert time.monotonic() - t0 < 10
    assert not got.ran and got.reason == f"kernelguard {why}" and got.files == ("kernel.py",)
    assert got.line() == f"static check ({got.tool}): not run: kernelguard {why}"


def test_a_run_stopped_during_the_check_leaves_no_child_behind(monkeypatch):
    """Ctrl-C (here: an interruption raised while the parent waits) ends the child and reaps it."""
    import kernelguard

    monkeypatch.setattr(kernelguard, "analyze_code", lambda *a, **k: time.sleep(60))
    monkeypatch.setattr(static_check, "_ANSWERS", {})
    forked = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    def interrupted(pid, fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fork", fork)
    monkeypatch.setattr(static_check, "_collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        static_check.check_sources({"kernel.py": ID_CACHE})
    (pid,) = forked
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(pid, os.WNOHANG)
