"""On a GPU: an out-of-bounds device write poisons the CUDA context of the worker. It must become
RUNTIME_ERROR for that case alone, and the next candidate of the same run must still verify."""

import json
from pathlib import Path

import pytest

from mini_kv.errors import ExitCode

CARD = "tests/planted/planted_cuda.yaml"


@pytest.mark.gpu
def test_oob_device_write_is_a_runtime_error_and_the_run_goes_on(cli, tmp_path):
    res = cli(
        "verify",
        "--task",
        CARD,
        "--candidate",
        "oob_write",
        "--candidate",
        "honest",
        "--device",
        "cuda",
        "--skip-benchmark",
        "--timeout",
        "60",
        "--artifacts",
        str(tmp_path),
        "--json",
        timeout=900,
    )
    lines = [json.loads(ln) for ln in res.stdout.strip().splitlines() if ln.startswith("{")]
    by_cand = {s["candidate"]: s for s in lines}
    assert set(by_cand) == {"oob_write", "honest"}, res.stdout + res.stderr
    assert res.returncode == ExitCode.CORRECTNESS

    corr = json.loads((Path(by_cand["oob_write"]["attempt"]) / "correctness.json").read_text())
    cases = {c["id"]: c for c in corr["cases"]}
    assert cases["n33-float32"]["status"] == "RUNTIME_ERROR"
    assert (
        "illegal memory access" in cases["n33-float32"]["reason"].lower()
        or "an illegal" in cases["n33-float32"]["reason"].lower()
    ), cases["n33-float32"]["reason"]
    assert cases["n31-float32"]["status"] == "PASSED"  # before the fault: kept
    assert cases["n64-float32"]["status"] == "PASSED"  # after it: a fresh worker with a fresh context
    assert by_cand["oob_write"]["status"] == "INCORRECT"

    honest = json.loads((Path(by_cand["honest"]["attempt"]) / "correctness.json").read_text())
    assert all(c["status"] == "PASSED" for c in honest["cases"]), honest["cases"]
    assert by_cand["honest"]["status"] == "PASSED"
    # each passed case says how many of its calls were held for the stream-order check and how many of
    # those the check saw (worker.remote.StreamChecks): every round's call is held
    for c in honest["cases"]:
        if c["kind"] != "illegal":
            held = c["stream_checks"]
            assert held["held"] == c["calls"] and 0 <= held["checked"] <= held["held"], c
