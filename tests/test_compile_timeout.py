"""--compile-timeout: a build that runs too long is killed with its whole process group and recorded
as COMPILE_TIMEOUT (exit code 3); nothing lands in the build cache."""

import json
import subprocess
import time
from pathlib import Path

import pytest

from mini_kv.errors import ExitCode

CARD = "tests/planted/planted.yaml"


def _compilers_alive(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if "pgrep" not in ln]


@pytest.mark.slow
def test_compile_timeout_kills_the_build(cli, tmp_path):
    t0 = time.monotonic()
    res = cli(
        "verify",
        "--task",
        CARD,
        "--candidate",
        "slow_build",
        "--compile-timeout",
        "4",
        "--artifacts",
        str(tmp_path),
        "--json",
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == ExitCode.COMPILE, res.stdout + res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "COMPILE_TIMEOUT"
    assert summary["compile"]["status"] == "timeout"
    assert elapsed < 120, f"the build was not stopped at its timeout ({elapsed:.0f} s)"
    time.sleep(0.5)
    assert not _compilers_alive("slow_build/op.cpp"), "a compiler process outlived the timeout"
    compile_rec = json.loads((Path(summary["attempt"]) / "compile.json").read_text())
    assert not (Path(compile_rec["build_dir"]) / "build.json").exists()  # not cached
    # a build killed outright (no finally ran) leaves its scratch dir: the next build of the key clears it
    stale = Path(compile_rec["build_dir"]).parent / f"tmp-{compile_rec['key'][:12]}-killed"
    stale.mkdir()
    again = cli(
        "verify", "--task", CARD, "--candidate", "slow_build", "--compile-timeout", "4",
        "--artifacts", str(tmp_path), "--json", timeout=300,
    )  # fmt: skip
    assert again.returncode == ExitCode.COMPILE
    assert not stale.exists()
