#!/usr/bin/env python3
"""A batch of N solutions of one problem, with the reference timed beside every solution
(--interleave-reference) and timed once per workload with a drift re-check for the later solutions (the
default), side by side on this machine: wall time per batch, the reference's timed calls, how each
workload's reference side was measured.

    PYTHONPATH=$PWD/src python benchmarks/reference_reuse.py [PROBLEM SOLUTION] [--count 4] [--device cpu]
        [--pairs 2] [--json OUT.json]

The N solutions are copies of SOLUTION under distinct names, given in memory (mini_kv.api), so every one
is evaluated in full. Each pair runs the two modes one after the other, alternating which goes first, so
a slow spell of a shared machine falls on both (docs/measurements/reference-reuse-cpu.md).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path

from mini_kv import api

ROOT = Path(__file__).resolve().parents[1]


def copies(solution: Path, count: int) -> list[api.Solution]:
    spec = json.loads(solution.read_text())
    sources = {
        s["path"]: s.get("content") or (solution.parent / s["path"]).read_text() for s in spec["sources"]
    }
    return [
        api.Solution(
            name=f"{spec['name']}_{i}",
            entry_point=spec["spec"]["entry_point"],
            sources=sources,
            language=spec["spec"]["languages"][0],
            destination_passing_style=bool(spec["spec"].get("destination_passing_style")),
        )
        for i in range(count)
    ]


def one_batch(problem: Path, sols: list[api.Solution], device: str, interleave: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="mini-kv-refreuse-") as store:
        t0 = time.perf_counter()
        sources, timed = collections.Counter(), collections.Counter()
        statuses = []
        for result in api.evaluate(
            problem, sols, device=device, artifacts=store, interleave_reference=interleave
        ):
            statuses.append(result.status)
            cases = json.loads((result.attempt / "benchmark.json").read_text())["cases"]
            for case in cases:
                if "candidate" not in case:
                    continue
                sources[(case.get("reference_timing") or {}).get("source", "interleaved")] += 1
                for who, n in case["sampling"]["timed_calls"].items():
                    timed[who] += n
        wall = time.perf_counter() - t0
    return {
        "wall_s": round(wall, 2),
        "statuses": statuses,
        "sources": dict(sources),
        "timed_calls": dict(timed),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("problem", nargs="?", default=str(ROOT / "problems/sol-execbench/rmsnorm"))
    p.add_argument("solution", nargs="?", default=str(ROOT / "solutions/rmsnorm/pytorch/solution.json"))
    p.add_argument("--count", type=int, default=4, help="solutions in the batch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--pairs", type=int, default=2, help="runs of each mode, alternating")
    p.add_argument("--json", help="write the runs here")
    args = p.parse_args()
    sols = copies(Path(args.solution), args.count)
    runs = []
    for k in range(args.pairs):
        for interleave in (True, False) if k % 2 == 0 else (False, True):
            run = one_batch(Path(args.problem), sols, args.device, interleave)
            run["mode"] = "interleaved" if interleave else "reuse"
            runs.append(run)
            print(json.dumps(run), flush=True)
    for mode in ("interleaved", "reuse"):
        walls = [r["wall_s"] for r in runs if r["mode"] == mode]
        print(f"{mode}: wall {statistics.median(walls):.1f} s (median of {walls})")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
