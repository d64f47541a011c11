"""The one child protocol: typed job records, one child entry for every kind, the signed channel."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mini_kv.jail import off
from mini_kv.runner import run_one
from mini_kv.settings import resolve
from mini_kv.worker.channel import Channel, Verifier
from mini_kv.worker.jobs import (
    JOB_KINDS,
    BandwidthJob,
    BuildJob,
    CardJob,
    Event,
    Job,
    JobError,
    ProfileTargetJob,
    SolJob,
    SolProfileTargetJob,
)

ROOT = Path(__file__).resolve().parents[1]
NO_SANDBOX = off("test")


def example(cls) -> Job:
    """A job of kind `cls` whose every field holds a distinct JSON value (a typed record's: a record)."""
    settings = resolve({"method": "auto", "l2": "hot", "warmup": 1, "repeats": 2}, "cpu", None, environ={})
    return cls(
        **{
            f.name: settings if f.name in cls.RECORDS else {"field": f.name, "n": i}
            for i, f in enumerate(dataclasses.fields(cls))
        }
    )


def test_every_kind_round_trips_through_json():
    kinds = [CardJob, SolJob, BandwidthJob, ProfileTargetJob, SolProfileTargetJob, BuildJob]
    assert {k.KIND for k in kinds} == set(JOB_KINDS)
    for cls in kinds:
        job = example(cls)
        data = json.loads(json.dumps(job.to_dict()))
        assert data["kind"] == cls.KIND and data["schema_version"] == cls.SCHEMA_VERSION
        back = Job.from_dict(data)
        assert type(back) is cls and back == job and back.to_dict() == job.to_dict()
        assert cls.from_dict(data) == job
        with pytest.raises(dataclasses.FrozenInstanceError):
            back.device = "elsewhere"


def test_unknown_kind_version_or_field_is_refused_by_name():
    data = example(BandwidthJob).to_dict()
    with pytest.raises(JobError, match="unknown job kind 'teleport'"):
        Job.from_dict({**data, "kind": "teleport"})
    with pytest.raises(JobError, match="job kind 'bandwidth': unknown schema_version 99"):
        Job.from_dict({**data, "schema_version": 99})
    with pytest.raises(JobError, match="unknown schema_version None"):
        Job.from_dict({k: v for k, v in data.items() if k != "schema_version"})
    with pytest.raises(JobError, match="unknown field.*gpu_count"):
        Job.from_dict({**data, "gpu_count": 2})
    with pytest.raises(JobError, match="unknown job kind 'bandwidth'"):
        SolJob.from_dict(data)  # a record of another kind
    sol = example(SolJob).to_dict()
    with pytest.raises(JobError, match="job kind 'sol'.*RunSettings"):
        Job.from_dict({**sol, "settings": {"method": "auto"}})  # a typed record with fields missing


def test_the_child_refuses_an_unknown_version_as_a_fatal_event():
    class Future(BandwidthJob):
        SCHEMA_VERSION = 2

    ev = run_one(Future(device="cpu", nbytes=1, iterations=1), timeout=120, sandbox=NO_SANDBOX)
    assert not ev.ok and "unknown schema_version 2" in ev.reason


def test_bandwidth_kind_runs_in_the_child():
    import torch

    ev = run_one(BandwidthJob(device="cuda", nbytes=2**20, iterations=2), timeout=120, sandbox=NO_SANDBOX)
    if torch.cuda.is_available():
        assert ev.ok and ev.result["copy_bandwidth_Bps"] > 0
    else:  # the measurement's own answer on a machine without CUDA, through the same channel
        assert not ev.ok and "in measure" in ev.traceback, ev


def _slow_start_env(tmp_path, seconds: float) -> dict:
    """An environment whose Python sleeps `seconds` at start-up (sitecustomize), before the harness runs."""
    import os

    (tmp_path / "sitecustomize.py").write_text(f"import time\ntime.sleep({seconds})\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}


def test_the_timeout_counts_from_the_childs_ready_not_its_start_up(tmp_path, monkeypatch):
    import mini_kv.runner as runner

    job = BandwidthJob(device="cpu", nbytes=2**10, iterations=1)
    # a start-up (3 s) longer than the timeout (1.5 s) is the harness's, not the job's: the job's answer
    ev = run_one(job, timeout=1.5, env=_slow_start_env(tmp_path, 3), sandbox=NO_SANDBOX)
    assert not ev.timed_out and "in measure" in (ev.traceback or ""), ev
    # a start-up past its own limit is still a timeout (another directory: another environment, so a
    # fresh child, which pays the slow start-up again)
    monkeypatch.setattr(runner, "STARTUP_S", 2.0)
    (tmp_path / "slower").mkdir()
    ev = run_one(job, timeout=1.5, env=_slow_start_env(tmp_path / "slower", 6), sandbox=NO_SANDBOX)
    assert not ev.ok and ev.timed_out, ev


def _build_job(tmp_path, source: str) -> BuildJob:
    (tmp_path / "op.cpp").write_text(source)
    return BuildJob(
        name="mkv_test_build",
        build_dir=str(tmp_path / "out"),
        sources=[str(tmp_path / "op.cpp")],
        include_dirs=[],
        flags={"cflags": ["-O0"], "cuda_cflags": []},
        arch_list=[],
        python_module=False,
        with_cuda=False,
    )


def test_build_kind_builds_in_the_child_and_keeps_the_compiler_output(tmp_path):
    log = tmp_path / "stdout.log"
    ev = run_one(
        _build_job(tmp_path, 'extern "C" int mini_kv_answer() { return 42; }\n'),
        timeout=300,
        sandbox=NO_SANDBOX,
        log_path=str(log),
    )
    assert ev.ok, ev
    assert ev.result == "mkv_test_build" and list((tmp_path / "out").glob("*.so"))
    assert "op.cpp" in log.read_text()  # the compiler's command lines, as torch's builder prints them
    bad = tmp_path / "bad"
    bad.mkdir()
    ev = run_one(
        _build_job(bad, "int broken( {\n"), timeout=300, sandbox=NO_SANDBOX, log_path=str(bad / "log")
    )
    assert not ev.ok and "Error building extension" in ev.reason
    assert "error" in (bad / "log").read_text() + ev.reason


def test_unsigned_replayed_or_foreign_events_are_rejected(tmp_path):
    key = b"k" * 32
    path = tmp_path / "events"
    chan = Channel(str(path), key)
    chan.send(event=Event.RESULT, result={"ok": True})
    chan.f.close()
    lines = path.read_bytes().splitlines()
    v = Verifier(key)
    assert v.read(lines[0])["event"] == "result"
    assert v.read(lines[0])["event"] == "forged"  # the same signed line again: out of sequence
    assert Verifier(b"x" * 32).read(lines[0])["event"] == "forged"  # another run's key
    unsigned = json.dumps({"mac": "0" * 64, "body": json.dumps({"event": "result", "seq": 1})}).encode()
    assert Verifier(key).read(unsigned)["event"] == "forged"
    assert Verifier(key).read(b'{"event": "done"}')["event"] == "forged"
