"""One verdict vocabulary: each reason code has one status (mini_kv.status.VIOLATIONS), docs/integrity.md
shows that table. (That the same violation gets the same status through `verify` and `bench` is
tests/exploits/test_exploits.py's, on its verify of the exploit card.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv.errors import ExitCode
from mini_kv.status import VIOLATIONS, Status, verdict_of, violation_status, violation_table
from mini_kv.worker import integrity

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
EXPLOITS = ROOT / "tests" / "exploits"


def test_docs_table_is_the_code_table():
    text = (ROOT / "docs" / "integrity.md").read_text()
    found = re.search(r"<!-- violations:begin[^>]*-->\n(.*?)\n<!-- violations:end -->", text, re.S)
    assert found, "docs/integrity.md has no generated verdict table"
    assert found.group(1) == violation_table(), "regenerate it: python -m mini_kv.status"


def test_every_code_has_one_status_and_the_defences_use_it():
    assert set(integrity.CODES) == set(VIOLATIONS)
    for code, cls in VIOLATIONS.items():
        assert integrity.Violation(code, "x").status == cls.status == violation_status(code)
        assert cls.sol_name in {Status.REWARD_HACK}  # upstream's word for every cheat
    assert verdict_of(["IMPOSSIBLE_TIME", "STREAM_ESCAPE"]) == Status.REWARD_HACK
    assert verdict_of(["IMPOSSIBLE_TIME"]) == Status.IMPOSSIBLE_TIME
    assert verdict_of([]) is None
    assert violation_status("MADE_UP_BY_THE_SUBJECT") == Status.REWARD_HACK


@pytest.mark.slow
def test_require_own_kernels_on_task_cards(tmp_path):
    """verify --require-own-kernels: a C++ operator whose add is aten's (`a + b`) is LIBRARY_DELEGATION on
    its first case, a REWARD_HACK like any violation; one with its own loop passes, its census naming
    its own operator."""
    common = ["--device", "cpu", "--skip-benchmark", "--require-own-kernels", "--json"]
    delegating = run_cli(
        "verify",
        "--task",
        str((EXPLOITS / "task_card" / "exploits.yaml").relative_to(ROOT)),
        "--candidate",
        "replay_ptr",  # right in every correctness case (its cheat is caught while timed), built on a + b
        "--artifacts",
        str(tmp_path / "delegating"),
        "--sandbox",
        "off",
        *common,
        timeout=1500,
    )
    summary = json.loads(next(ln for ln in delegating.stdout.splitlines() if ln.startswith("{")))
    assert summary["status"] == "REWARD_HACK" and delegating.returncode == ExitCode.CORRECTNESS
    cases = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())["cases"]
    flagged = [c for c in cases if c.get("integrity") == "LIBRARY_DELEGATION"]
    assert flagged and all("aten::add" in c["reason"] for c in flagged)

    own = run_cli(
        "verify",
        "--task",
        "tasks/vector_add.yaml",
        "--candidate",
        "v0_naive",
        "--artifacts",
        str(tmp_path / "own"),
        *common,
        timeout=1500,
    )
    summary = json.loads(next(ln for ln in own.stdout.splitlines() if ln.startswith("{")))
    assert summary["status"] == "PASSED", summary
    cases = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())["cases"]
    censused = [c["kernels"] for c in cases if c.get("kernels")]
    assert censused and all(k["library"] == [] for k in censused)
    assert all("mini_kv_vector_add_v0_naive::vector_add" in k["ops"] for k in censused)


def test_an_attempt_written_before_the_vocabulary_still_reads():
    """A caught cheat's attempt said INCORRECT (task card) or FAILED (SOL) before each violation had one
    status; it reads as the status its records now give, while any other claim still has to match."""
    from mini_kv.store.headline import _status_word

    assert _status_word("INCORRECT", Status.REWARD_HACK) == Status.REWARD_HACK
    assert _status_word("FAILED", Status.IMPOSSIBLE_TIME) == Status.IMPOSSIBLE_TIME
    assert _status_word("PASSED", Status.REWARD_HACK) == "PASSED"  # a rewrite to PASSED stays a mismatch
    assert _status_word("INCORRECT", Status.PASSED) == "INCORRECT"
