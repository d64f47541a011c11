"""Planted misbehaving candidates (tests/planted/): each failure becomes a recorded status,
the cases before and after it keep their results, and nothing hangs."""

import json
from pathlib import Path

import pytest

from mini_kv.errors import ExitCode

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

CARD = "tests/planted/planted.yaml"

EXPECTED = {
    "segfault": ("RUNTIME_ERROR", "SIGSEGV"),
    "abort": ("RUNTIME_ERROR", "SIGABRT"),
    "hang": ("TIMEOUT", "process group killed"),
    "throw": ("RUNTIME_ERROR", "planted: the op threw"),
    "oom": ("RUNTIME_ERROR", "RuntimeError"),
}


def _verify(cli, tmp_path, candidate):
    # a hang costs its case's timeout (opcheck leaves out the case a child hung on; 2 s, less than torch's
    # first import of its compiler stack for opcheck, which the runner allows on top); the other cases take
    # milliseconds, except the OOM, which touches 3 GiB before the memory limit stops it: several seconds on a busy
    # 2-core machine (10 s once ran out there), so its limit is generous; it costs nothing when met
    res = cli(
        "verify",
        "--task",
        CARD,
        "--candidate",
        candidate,
        "--skip-benchmark",
        "--timeout",
        "2" if candidate == "hang" else "30",
        "--memory-limit",
        "3",
        "--artifacts",
        str(tmp_path),
        "--json",
        timeout=600,
    )
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    corr = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())
    return res, summary, corr


@pytest.mark.slow
@pytest.mark.parametrize("candidate", sorted(EXPECTED))
def test_planted_failure_is_a_recorded_status(cli, tmp_path, candidate):
    res, summary, corr = _verify(cli, tmp_path, candidate)
    assert res.returncode == ExitCode.CORRECTNESS, res.stderr
    cases = {c["id"]: c for c in corr["cases"]}
    status, text = EXPECTED[candidate]
    assert cases["n33-float32"]["status"] == status
    assert text in cases["n33-float32"]["reason"]
    # results before the failure are intact, and a fresh worker carried on after it
    assert cases["n31-float32"]["status"] == "PASSED"
    assert cases["n64-float32"]["status"] == "PASSED"
    assert summary["status"] == "INCORRECT"
    opcheck = corr["contract"]["opcheck"]
    # the child died on n33: opcheck calls the op on the other core cases, within the case timeout plus
    # the allowance for torch's own imports (the hang's 2 s alone is too short for them)
    if candidate in ("segfault", "abort", "hang"):
        assert opcheck["status"] == "PASSED", opcheck
        assert [c["case"] for c in opcheck["cases"]] == ["n31-float32", "n64-float32"]


@pytest.mark.slow
def test_a_forged_record_reaches_no_channel(cli, tmp_path):
    """The planted op writes a PASS record to every pipe it holds: the candidate runs in the subject,
    which holds no pipe to the parent and no key, so the record lands nowhere and the case's verdict is
    the judge's own comparison (the op computes the right sum). The channel's own check of unsigned
    bytes is tests/test_jobs.py's."""
    res, summary, corr = _verify(cli, tmp_path, "forge")
    case = next(c for c in corr["cases"] if c["id"] == "n33-float32")
    assert case["status"] == "PASSED" and "calls" in case, case
    assert not [i for i in corr["incidents"] if i.get("integrity") == "FORGED_RESULT_CHANNEL"]
    assert res.returncode == ExitCode.OK, summary


class _ScriptedChild:
    """A child whose events are scripted; it notes the time budget of each wait."""

    def __init__(self, events):
        self.events, self.budgets = list(events), []

    def next_event(self, budget):
        self.budgets.append(budget)
        return self.events.pop(0)


def test_a_childs_load_and_first_contract_check_get_the_harness_allowances(tmp_path):
    """The runner holds each step to the per-case timeout, with torch's and the harness's own time on
    top where a child spends it: its load stage (every child's, a fresh one after a crash too) and its
    first contract check. A load that hangs still ends, after both."""
    from types import SimpleNamespace

    from mini_kv import runner
    from mini_kv.settings import DEFAULTS
    from mini_kv.worker.jobs import Event

    job = SimpleNamespace(cases=[{"id": "a"}, {"id": "b"}], contract=["opcheck"])
    run = runner._WorkerRun(job, 2.0, 1e6, str(tmp_path / "log"), None, None, SimpleNamespace(record=dict))
    load, contract = 2.0 + DEFAULTS.load_s, 2.0 + DEFAULTS.contract_import_s
    first = _ScriptedChild(
        [
            {"event": Event.LOAD, "ok": True},
            {"event": Event.BEGIN, "stage": "correctness", "case": "a"},
            {"event": Event.CASE, "record": {"id": "a"}},
            {"event": Event.BEGIN, "stage": "contract", "case": None},
            {"event": Event.CONTRACT, "name": "opcheck", "record": {}},
            {"event": Event.BEGIN, "stage": "correctness", "case": "b"},
            "timeout",
        ]
    )
    assert run._read(first) == ("timeout", 2.0)
    assert first.budgets == [load, 2.0, 2.0, 2.0, contract, 2.0, 2.0]
    fresh = _ScriptedChild(["timeout"])  # the next child hangs while loading
    assert run._read(fresh) == ("timeout", load)
