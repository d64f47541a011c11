#!/usr/bin/env python3
"""What CUPTI timing costs a worker on this GPU: the first torch.profiler session of a fresh process,
opened after or before CUDA's initialisation (each order in a fresh process, twice), and the wall time
of one CUPTI-timed call of a tiny kernel at several batch sizes, cold and hot L2.

    PYTHONPATH=$PWD/src python scripts/cupti_startup.py [OUT.txt]

docs/sol-execbench.md ("Where a cache hit's seconds go") has the H200 figures. Needs a CUDA GPU.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ORDERS = ("plain", "early", "plain_cudaonly", "early_cudaonly")


def one_process(mode: str) -> str:
    """In this (fresh) process: import torch, then the sessions `mode` names; one line of seconds."""
    t = time.perf_counter()
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = time.perf_counter()
    acts = [ProfilerActivity.CUDA] if "cudaonly" in mode else [ProfilerActivity.CPU, ProfilerActivity.CUDA]

    def session() -> None:
        with profile(activities=acts):
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
    return f"{mode:28s} " + ", ".join(out) + f"; after import {prev - a:.2f} s"


def per_call_cost() -> list[str]:
    import torch

    from mini_kv.worker import timing

    x = torch.randn(7 * 4096, device="cuda", dtype=torch.bfloat16)
    work = timing.Workload([lambda: x.mul(2)])
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
    for line in per_call_cost():
        lines.append(line)
        print(line, flush=True)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
