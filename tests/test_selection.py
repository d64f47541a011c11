"""pytest-style selection on verify, bench and batch: -k EXPR, -x and --lf."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv.cli_batch import keyword_matches
from mini_kv.errors import UserError

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests/sol_solutions"


def test_keyword_expressions_are_pytests():
    assert keyword_matches("good", "scale_mul_good_dps")
    assert keyword_matches("good and not return", "scale_mul_good_dps")
    assert not keyword_matches("good and not return", "scale_mul_good_return")
    assert keyword_matches("(wrong or raises) and not shape", "x/raises")
    assert keyword_matches("GOOD", "scale_mul_good_dps")  # case-insensitive, as pytest
    for bad in ("good and", "__import__('os')", "a b", "(good", ""):
        with pytest.raises(UserError):
            keyword_matches(bad, "x")


def _bench(store: Path, *args: str) -> subprocess.CompletedProcess:
    """In this process (conftest.run_cli), with the fewest rounds and samples: selection does not depend
    on them."""
    sols = [str(SOLS / s / "solution.json") for s in ("good_dps", "wrong_values", "good_return")]
    fast = ["--rounds", "2", "--warmup", "1", "--repeats", "1", "--samples", "3"]
    return run_cli(
        "bench", str(SOLS / "problem"), "--solution", *sols, "--device", "cpu", *fast, "--artifacts", str(store), *args
    )  # fmt: skip


@pytest.mark.slow
def test_exitfirst_then_last_failed_then_keyword(tmp_path):
    first = _bench(tmp_path, "-x")
    assert first.returncode == 4
    assert "-x: stopped at the first failure; 1 not run" in first.stderr
    assert "good_return" not in first.stdout
    # --lf: what did not pass last time, and what never ran
    again = _bench(tmp_path, "--lf")
    assert (
        "Solution: scale_mul_wrong_values" in again.stdout
        and "Solution: scale_mul_good_return" in again.stdout
    )
    assert "Solution: scale_mul_good_dps" not in again.stdout
    only = _bench(tmp_path, "-k", "good and not return")
    assert "Solution: scale_mul_good_dps" in only.stdout and only.stdout.count("Solution:") == 1
    none = _bench(tmp_path, "-k", "nomatch")
    assert none.returncode == 2 and "the selection is empty" in none.stderr
