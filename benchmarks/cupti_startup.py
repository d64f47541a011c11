#!/usr/bin/env python3
"""What CUPTI timing costs a worker on this GPU: the first profiler session of a fresh process, opened
through torch.profiler.profile after or before CUDA's initialisation, and through
torch.autograd.profiler.profile as mini_kv's timer opens it (each in a fresh process, with the modules
the session imported); CUPTI's own start-up through ctypes, without torch; and the wall time of one
CUPTI-timed call of a tiny kernel at several batch sizes, cold and hot L2.

    PYTHONPATH=$PWD/src python benchmarks/cupti_startup.py [OUT.txt]

docs/measurements/sol-cold-build-h200.md has the H200 figures. Needs a CUDA GPU.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ORDERS = ("plain", "early", "plain_cudaonly", "early_cudaonly", "autograd")


def one_process(mode: str) -> str:
    """In this (fresh) process: import torch, then the sessions `mode` names; one line of seconds."""
    t = time.perf_counter()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from mini_kv.worker.timing import cupti_session

    a = time.perf_counter()
    acts = [ProfilerActivity.CUDA] if "cudaonly" in mode else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    modules = len(sys.modules)

    def session() -> None:  # mini_kv's session (`autograd`), or torch.profiler's
        with cupti_session() if mode == "autograd" else profile(activities=acts):
            torch.ones(1, device="cuda").add_(1)
            torch.cuda.synchronize()

    marks = []
    if "early" in mode:  # a session without work, before CUDA is initialised
        with profile(activities=acts):
            pass
        marks.append(("empty session before CUDA init", time.perf_counter()))
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    marks.append(("CUDA init", time.perf_counter()))
    session()
    marks.append(("first session with work", time.perf_counter()))
    session()
    marks.append(("second", time.perf_counter()))
    prev, out = a, [f"import {a - t:.2f}"]
    for name, m in marks:
        out.append(f"{name} {m - prev:.2f}")
        prev = m
    return (
        f"{mode:28s} "
        + ", ".join(out)
        + f"; after import {prev - a:.2f} s; modules the sessions imported {len(sys.modules) - modules}"
    )


def raw_cupti() -> list[str]:
    """CUPTI's own start-up, without torch: cuInit, a context, dlopen of the libcupti torch ships, the
    activity callbacks, and enabling the activity kinds the timer reads."""
    import ctypes
    import glob
    import site

    paths = [
        p
        for d in site.getsitepackages()
        for p in sorted(glob.glob(f"{d}/nvidia/**/libcupti.so*", recursive=True))
    ]
    paths += sorted(glob.glob("/usr/local/cuda/lib64/libcupti.so*"))
    lines = []
    t = time.perf_counter()
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuInit(0)
    lines.append(f"cuInit rc={rc} {time.perf_counter() - t:.3f} s")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    t = time.perf_counter()
    rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    lines.append(f"primary context rc={rc} {time.perf_counter() - t:.3f} s")
    if not paths:
        return [*lines, "no libcupti found"]
    t = time.perf_counter()
    cupti = ctypes.CDLL(paths[0])
    lines.append(f"dlopen {paths[0]} {time.perf_counter() - t:.3f} s")
    size_t, voidp = ctypes.c_size_t, ctypes.c_void_p
    requested = ctypes.CFUNCTYPE(None, ctypes.POINTER(voidp), ctypes.POINTER(size_t), ctypes.POINTER(size_t))
    completed = ctypes.CFUNCTYPE(None, voidp, ctypes.c_uint32, voidp, size_t, size_t)
    buffers = []

    def give(buf, size, max_records):
        b = ctypes.create_string_buffer(8 << 20)
        buffers.append(b)
        buf[0], size[0], max_records[0] = ctypes.cast(b, voidp).value, 8 << 20, 0

    callbacks = (requested(give), completed(lambda *_: None))
    t = time.perf_counter()
    rc = cupti.cuptiActivityRegisterCallbacks(*callbacks)
    lines.append(f"cuptiActivityRegisterCallbacks rc={rc} {time.perf_counter() - t:.3f} s")
    for kind, name in (
        (10, "CONCURRENT_KERNEL"),
        (1, "MEMCPY"),
        (2, "MEMSET"),
        (4, "RUNTIME"),
        (5, "DRIVER"),
    ):
        t = time.perf_counter()
        rc = cupti.cuptiActivityEnable(kind)
        lines.append(f"cuptiActivityEnable({name}) rc={rc} {time.perf_counter() - t:.3f} s")
    return lines


def per_call_cost() -> list[str]:
    import torch

    from mini_kv.worker import timing

    x = torch.randn(7 * 4096, device="cuda", dtype=torch.bfloat16)
    work = timing.CallRotation([lambda: x.mul(2)])
    lines = []
    for label, flush, counts in (
        ("cold L2", timing.L2Flusher("cuda", True), (10, 40, 160, 640)),
        ("hot L2", timing.L2Flusher("cuda", False), (10, 160)),
    ):
        timing.time_cupti(work, 10, flush)  # the process's first session is not what is measured here
        for n in counts:
            walls = []
            for _ in range(5):
                t = time.perf_counter()
                timing.time_cupti(work, n, flush)
                walls.append(time.perf_counter() - t)
            med = statistics.median(walls)
            lines.append(
                f"time_cupti samples={n}: median wall {med * 1e3:.1f} ms "
                f"({med / n * 1e6:.0f} us per sample), {label}"
            )
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(one_process(sys.argv[2]), flush=True)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--raw":
        print("\n".join(raw_cupti()), flush=True)
        return 0
    lines = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    for mode in (*ORDERS, *ORDERS[:2]):  # the first two orders again: the machine's own spread
        res = subprocess.run(
            [sys.executable, __file__, "--one", mode], capture_output=True, text=True, env=env, timeout=300
        )
        lines.append(
            res.stdout.strip()
            if res.returncode == 0
            else f"{mode}: exit {res.returncode} {res.stderr[-300:]}"
        )
        print(lines[-1], flush=True)
    res = subprocess.run(
        [sys.executable, __file__, "--raw"], capture_output=True, text=True, env=env, timeout=120
    )
    for line in (res.stdout.strip() or f"--raw: exit {res.returncode} {res.stderr[-300:]}").splitlines():
        lines.append(f"CUPTI without torch: {line}")
        print(lines[-1], flush=True)
    for line in per_call_cost():
        lines.append(line)
        print(line, flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
