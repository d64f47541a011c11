"""The correctness matrix catches planted bugs (tests/broken_candidates/README.md), on the exact cases."""

import json
from pathlib import Path

import pytest

from mini_kv.errors import ExitCode

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

SALT = "broken-candidates-fixed-salt"  # fixed inputs, so the failing cases are exact

# (card, candidate) -> (cases that must fail, cases that may fail)
EXPECTED = {
    ("rmsnorm", "off_by_one"): (
        {"r4_h33-float32", "r7_h129-float32", "r4_h33-float16", "r1000_h4097-float32", "transposed-float32"},
        {"r7_h129-float16", "r4_h33_bf16-bfloat16", "r7_h129_bf16-bfloat16"},
    ),
    ("rmsnorm", "fp16_accum"): (
        {"large_values-float16", "r1000_h4097-float16", "r1000_h4097-bfloat16"},
        {"r5_h127_bf16-bfloat16", "r7_h129_bf16-bfloat16", "r2_h128_bf16-bfloat16"},
    ),
}


def _run(cli, tmp_path, card, candidate):
    res = cli(
        "verify",
        "--task",
        f"tests/broken_candidates/{card}.yaml",
        "--candidate",
        candidate,
        "--skip-benchmark",
        "--seed-salt",
        SALT,
        "--artifacts",
        str(tmp_path),
        "--json",
        timeout=900,
    )
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    corr = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())
    return res, summary, corr


@pytest.mark.slow
@pytest.mark.parametrize("card,candidate", sorted(EXPECTED))
def test_numeric_bug_fails_exactly_the_expected_cases(cli, tmp_path, card, candidate):
    res, summary, corr = _run(cli, tmp_path, card, candidate)
    assert res.returncode == ExitCode.CORRECTNESS
    failed = {c["id"] for c in corr["cases"] if c["status"] not in ("PASSED", "SKIPPED")}
    must, may = EXPECTED[(card, candidate)]
    assert must <= failed, f"not caught: {must - failed}"
    assert failed <= must | may, f"unexpected failures: {failed - must - may}"
    for c in corr["cases"]:
        if c["id"] in must:
            assert c["status"] == "INCORRECT" and c["first_mismatch"] is not None


@pytest.mark.slow
def test_missing_meta_kernel_is_caught(cli, tmp_path):
    res, summary, corr = _run(cli, tmp_path, "fused_bias_relu", "no_meta")
    assert res.returncode == ExitCode.CORRECTNESS
    assert all(c["status"] in ("PASSED", "SKIPPED") for c in corr["cases"])  # numerics are fine
    assert summary["correctness"]["missing_kernels"] == ["Meta"]
    assert corr["contract"]["opcheck"]["status"] == "FAILED"
