#!/usr/bin/env python3
"""How long `mini-kv report` takes on a store: wall clock and CPU time of the whole command, start-up included.

    python benchmarks/report_timing.py --artifacts DIR [--task T ...] [--repeats 3] [--png]

Runs `python -m mini_kv report` as a child process `--repeats` times (the first run also warms the file
cache and matplotlib's font cache) and prints one JSON object: per-run wall and CPU seconds, the median,
the page size, the number of attempts and charts, and the load average (the machine may be shared: CPU
seconds say what the report itself costs, wall seconds what a user waits).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(cmd: list[str]) -> dict:
    cpu0, t0 = _cpu_children(), time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _cpu_children() - cpu0
    if res.returncode != 0:
        raise SystemExit(f"report failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    m = re.search(r"(\d+) attempt\(s\), (\d+) chart\(s\), ([\d,]+) KiB", res.stdout)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "attempts": int(m.group(1)) if m else None,
        "charts": int(m.group(2)) if m else None,
        "kib": int(m.group(3).replace(",", "")) if m else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifacts", required=True, help="the attempt store to report on")
    p.add_argument(
        "--task", action="append", default=[], help="task or problem id (repeatable; default: all)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--png", action="store_true", help="also write PNGs (--png DIR)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "mini_kv",
            "report",
            "--artifacts",
            args.artifacts,
            "-o",
            str(Path(tmp) / "report.html"),
            *[x for t in args.task for x in ("--task", t)],
        ]
        if args.png:
            cmd += ["--png", str(Path(tmp) / "png")]
        runs = [run_once(cmd) for _ in range(args.repeats)]
    print(
        json.dumps(
            {
                "command": " ".join(cmd[1:]),
                "runs": runs,
                "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "loadavg_1min": os.getloadavg()[0],
                "cpu_count": os.cpu_count(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
