"""The standalone CUDA benchmarks (benchmarks/*.cu) include candidate kernel files: they must keep compiling
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
# ccache (CI keeps its cache between runs) keys a compile by its preprocessed source, flags and compiler:
# a hit is the same compile of our own benchmark sources that already succeeded
CCACHE = [c] if (c := shutil.which("ccache")) else []


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.cu")))
def test_cuda_script_compiles(tmp_path, script):
    res = subprocess.run(
        [
            *CCACHE,
            NVCC,
            "-c",
            "-O3",
            "-arch=sm_90",
            "-std=c++17",
            str(ROOT / "benchmarks" / script),
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
            str(sols / "cuda_syntax_error_lean" / "solution.json"),
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
    assert any(
        ln.startswith(str(sols / "cuda_syntax_error_lean" / "solution.json") + ": error") for ln in lines
    )
    assert "kernel.cu" in res.stdout  # the failed build's log follows its line
    assert any("wrong_values" in ln and "not C++" in ln for ln in lines)


def test_sol_build_timing_reads_build_ninja_and_nvcc_phases(tmp_path):
    """benchmarks/sol_build_timing.py's breakdown: the compile and link lines of torch's build.ninja, run
    again one by one (here: a fake compiler that only echoes), and nvcc --time's CSV summed per phase."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sol_build_timing as t
    finally:
        sys.path.pop(0)
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(
        "source file name , phase name , phase input files , phase output file , arch , tool, metric , unit\n"
        "k.cu , gcc (preprocessing 4) , k.cu , k.cpp4.ii ,  , nvcc , 3283.2959 , ms\n"
        "k.cu , cudafe++ , k.cpp4.ii , k.cudafe1.cpp , compute_90 , nvcc , 37377.9844 , ms\n"
        "k.cu , cicc , k.cpp1.ii , k.ptx , compute_90 , nvcc , 58256.4883 , ms\n"
        "k.cu , gcc (compiling) , k.cudafe1.cpp , k.o ,  , nvcc , 118987.0234 , ms\n"
    )
    assert t.nvcc_phases(csv_path) == {
        "gcc (preprocessing 4)": 3.28,
        "cudafe++": 37.38,
        "cicc": 58.26,
        "gcc (compiling)": 118.99,
    }
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text(
        "cxx = true\nnvcc = false\ncflags = -O3\nldflags = -shared\n"
        "rule compile\n  command = $cxx $cflags -c $in -o $out\n"
        "build op.o: compile /src/op.cpp\n"
        "build m.so: link op.o\n"
    )
    out = t.breakdown(build, tmp_path)
    assert [(s["rule"], s["output"], s["exit"]) for s in out["steps"]] == [
        ("compile", "op.o", 0),
        ("link", "m.so", 0),
    ]
    assert out["compile_parallel_s"] >= 0 and out["arch_flags"] == []
    assert "not found" in t.breakdown(tmp_path / "nowhere", tmp_path)["error"]
