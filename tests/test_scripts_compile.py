"""The standalone CUDA benchmark scripts include candidate kernel files: they must keep compiling
when those kernels change (`nvcc -c`, no GPU needed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.cu")))
def test_cuda_script_compiles(tmp_path, script):
    res = subprocess.run([NVCC, "-c", "-O3", "-arch=sm_90", "-std=c++17", str(ROOT / "scripts" / script),
                          "-o", str(tmp_path / "x.o")], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
