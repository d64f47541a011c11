"""The standalone CUDA benchmark scripts include candidate kernel files: they must keep compiling
when those kernels change (`nvcc -c`, no GPU needed). And scripts/prebuild_solutions.py, which the
GPU run uses to build SOL C++ solutions in parallel (compile checks here)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.cu")))
def test_cuda_script_compiles(tmp_path, script):
    res = subprocess.run(
        [
            NVCC,
            "-c",
            "-O3",
            "-arch=sm_90",
            "-std=c++17",
            str(ROOT / "scripts" / script),
            "-o",
            str(tmp_path / "x.o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_prebuild_solutions_builds_cpp_and_reports_failures_with_their_log():
    sols, problem = ROOT / "tests" / "sol_solutions", ROOT / "tests" / "sol_solutions" / "problem"
    res = subprocess.run(
        [
            sys.executable,
            "scripts/prebuild_solutions.py",
            str(problem),
            str(sols / "cuda_good" / "solution.json"),
            str(problem),
            str(sols / "cuda_syntax_error" / "solution.json"),
            str(problem),
            str(sols / "wrong_values" / "solution.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert any(ln.startswith(str(sols / "cuda_good" / "solution.json") + ": ok") for ln in lines), res.stdout
    assert any(ln.startswith(str(sols / "cuda_syntax_error" / "solution.json") + ": error") for ln in lines)
    assert "kernel.cu" in res.stdout  # the failed build's log follows its line
    assert any("wrong_values" in ln and "not C++" in ln for ln in lines)
