"""--junit-xml on verify, bench and batch: one testsuite per item, one testcase per case or workload,
failures carry the status and its reason, and the file parses as JUnit XML."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests/sol_solutions"


def _suites(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    return {s.get("name"): s for s in root.findall("testsuite")}


@pytest.mark.slow
def test_bench_writes_a_testcase_per_workload_with_failures_named(tmp_path):
    out = tmp_path / "j.xml"
    res = subprocess.run(
        [sys.executable, "-m", "mini_kv", "bench", str(SOLS / "problem"), "--solution",
         str(SOLS / "good_dps/solution.json"), str(SOLS / "raises/solution.json"), "--device", "cpu",
         "--artifacts", str(tmp_path / "a"), "--junit-xml", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 4, res.stderr
    suites = _suites(out)
    good = next(s for n, s in suites.items() if n.endswith("good_dps/solution.json"))
    bad = next(s for n, s in suites.items() if n.endswith("raises/solution.json"))
    assert (good.get("tests"), good.get("failures")) == ("2", "0")
    assert (bad.get("tests"), bad.get("failures")) == ("2", "1")
    (failure,) = bad.iter("failure")
    assert failure.get("type") == "RUNTIME_ERROR" and failure.text


def test_verify_results_map_cases_contract_checks_and_skips():
    from mini_kv.cli_batch import junit_xml
    from mini_kv.cluster.batch import VERIFY, ItemResult
    from mini_kv.model import WorkerResults
    from mini_kv.pipeline import VerifyResult

    detail = VerifyResult(
        "c",
        {"status": "INCORRECT"},
        WorkerResults(
            cases=[
                {"id": "n1", "status": "PASSED"},
                {"id": "n2", "status": "INCORRECT_NUMERICAL", "reason": "max abs err 1.0"},
                {"id": "n3", "status": "SKIPPED", "reason": "cpu only"},
            ],
            contract={
                "opcheck": {"status": "FAILED", "reason": "schema"},
                "gradcheck": {"status": "PASSED"},
            },
        ),
        None,
        "/a",
    )
    result = ItemResult(VERIFY, "t/c", "c", "INCORRECT", 4, "/a", detail)
    lost = ItemResult(VERIFY, "t/d", "d", "WORKER_LOST", 9, None, reason="died")
    root = ET.fromstring(junit_xml([result, lost]))
    card, gone = root.findall("testsuite")
    assert (card.get("tests"), card.get("failures"), card.get("skipped")) == ("5", "2", "1")
    assert [c.get("name") for c in card.findall("testcase")] == ["n1", "n2", "n3", "opcheck", "gradcheck"]
    assert card.find("testcase[@name='n2']/failure").text == "max abs err 1.0"
    assert gone.find("testcase/failure").get("type") == "WORKER_LOST"
