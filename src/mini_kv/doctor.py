"""`doctor`: what this machine has, and for each missing piece which stage it blocks and how to fix it."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from mini_kv import clocks, environment


def checks(build_dir: Path) -> list[dict]:
    rows = []

    def row(name, value, ok, blocks="", fix=""):
        rows.append({"name": name, "value": value, "ok": ok, "blocks": blocks, "fix": fix})

    row(
        "python",
        f"{platform.python_version()} ({sys.executable})",
        sys.version_info >= (3, 10),
        "everything",
        "install Python >= 3.10",
    )
    try:
        t = environment.torch_info()
        row("torch", t.version, True)
        row(
            "torch CUDA",
            t.cuda or "none (CPU build)",
            t.cuda is not None,
            "CUDA kernels (CPU kernels still verify)",
            "install a CUDA build of torch (pip install torch --index-url https://download.pytorch.org/whl/cu130)",
        )
        if t.devices:
            for d in t.devices:
                row(
                    f"GPU {d.index}",
                    f"{d.name} (compute capability {d.capability}, "
                    f"{d.sm_count} SMs, {d.memory_bytes / 2**30:.0f} GiB)",
                    True,
                )
            ok, found = clocks.probe("cuda")
            row(
                "SM clock (NVML)",
                found,
                ok,
                "the SM clock and throttling record of timed cases (timing itself runs)",
                "install nvidia-ml-py and make the driver's libnvidia-ml.so.1 visible",
            )
        else:
            row(
                "GPU",
                "none visible",
                False,
                "CUDA correctness and GPU timing",
                "run on a machine with an NVIDIA GPU and driver; check CUDA_VISIBLE_DEVICES",
            )
    except ImportError:
        row("torch", "not installed", False, "everything", "pip install torch")
    nv = environment.nvcc_info()
    row(
        "nvcc",
        f"{nv.path} ({nv.version})" if nv.path else "not found",
        nv.path is not None,
        "CUDA compile and the .cu compile check",
        "install the CUDA toolkit and put nvcc on PATH",
    )
    home = environment.cuda_home_dir()
    row(
        "CUDA_HOME",
        home or "unset",
        home is not None,
        "CUDA extension builds",
        "export CUDA_HOME=/usr/local/cuda (the toolkit root holding bin/nvcc)",
    )
    cxx = environment.cxx_info()
    row(
        "host compiler",
        cxx.version or "not found",
        cxx.path is not None,
        "every build",
        "install g++ (apt-get install g++)",
    )
    nj = environment.ninja_info()
    row("ninja", nj.version or "not found", nj.path is not None, "every build", "pip install ninja")
    build_dir.mkdir(parents=True, exist_ok=True) if build_dir.parent.exists() else None
    writable = build_dir.is_dir() and os.access(build_dir, os.W_OK)
    row("build dir", str(build_dir), writable, "compile", f"make {build_dir} writable")
    from mini_kv import pycache

    where, kept = pycache.describe()
    row(
        "bytecode",
        where,
        kept,
        "nothing; every command starts slower (torch's import compiles its sources)",
        f"drop {pycache.ENV}=off, or point {pycache.ENV} at a writable directory",
    )
    from mini_kv.profile.ncu import doctor_rows

    gpu_visible = any(r["name"].startswith("GPU ") for r in rows)
    rows.extend(doctor_rows(gpu_visible))  # present? version? can it read the counters?
    return rows
