#!/usr/bin/env python3
"""A batch of N solutions of one problem, with the reference timed beside every solution
(--interleave-reference) and timed once per workload with a drift re-check for the later solutions (the
default), side by side on this machine: wall time per batch, the reference's timed calls, how each
workload's reference side was measured.

    PYTHONPATH=$PWD/src python benchmarks/reference_reuse.py [PROBLEM SOLUTION] [--count 4] [--device cpu]
        [--pairs 2] [--json OUT.json]

The N solutions are copies of SOLUTION under distinct names, run through the batch evaluator the API
and `bench` use (cluster.batch.evaluate_here), so every one is evaluated in full. Each pair runs the two modes one after the other, alternating which goes first, so
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

from mini_kv.cluster.batch import BENCH, Item, evaluate_here
from mini_kv.solexec.run import BenchOptions

ROOT = Path(__file__).resolve().parents[1]


def copies(solution: Path, count: int, where: Path) -> list[Path]:
    """`count` copies of the solution under distinct names, its sources inline."""
    spec = json.loads(solution.read_text())
    spec["sources"] = [
        {"path": s["path"], "content": s.get("content") or (solution.parent / s["path"]).read_text()}
        for s in spec["sources"]
    ]
    out = []
    for i in range(count):
        path = where / f"{i}" / "solution.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({**spec, "name": f"{spec['name']}_{i}"}))
        out.append(path)
    return out


def one_batch(problem: Path, sols: list[Path], options: dict, interleave: bool) -> dict:
    """One batch's wall time, its solutions' timing seconds (the workloads' `timing` phase, summed), the
    timed calls of each side, and how the reference sides were measured (with the re-checks' drifts)."""
    with tempfile.TemporaryDirectory(prefix="mini-kv-refreuse-") as store:
        items = [
            Item(BENCH, str(s), str(problem), None, BenchOptions(solution=str(s), artifacts=store,
                 interleave_reference=interleave, **options), store)
            for s in sols
        ]  # fmt: skip
        t0 = time.perf_counter()
        sources, timed, drifts = collections.Counter(), collections.Counter(), []
        timing_s, sampling_s, statuses = [], [], []
        for _, result in evaluate_here(items):
            phases = result.detail.phases
            timing_s.append(phases.get("workload_timing_s", 0.0))
            sampling_s.append(phases.get("workload_timing_sampling_s", 0.0))
            failed = [t.evaluation.log for t in result.detail.traces if t.evaluation.status != "PASSED"]
            statuses.append(result.status + (f": {failed[0].splitlines()[0][:160]}" if failed else ""))
            for case in json.loads((Path(result.attempt) / "benchmark.json").read_text())["cases"]:
                if "candidate" not in case:
                    continue
                how = case.get("reference_timing") or {"source": "interleaved"}
                sources[how["source"]] += 1
                if how.get("recheck"):
                    drifts.append((how["recheck"]["drift"], how["recheck"]["band"]))
                for who, n in case["sampling"]["timed_calls"].items():
                    timed[who] += n
        wall = time.perf_counter() - t0
    return {
        "wall_s": round(wall, 2),
        "timing_s": [round(t, 2) for t in timing_s],
        "sampling_s": [round(t, 2) for t in sampling_s],
        "statuses": statuses,
        "sources": dict(sources),
        "timed_calls": dict(timed),
        "abs_drift_median": round(statistics.median(abs(d) for d, _ in drifts), 4) if drifts else None,
        "band": sorted({b for _, b in drifts}),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("problem", nargs="?", default=str(ROOT / "problems/sol-execbench/rmsnorm"))
    p.add_argument("solution", nargs="?", default=str(ROOT / "solutions/rmsnorm/pytorch/solution.json"))
    p.add_argument("--count", type=int, default=4, help="solutions in the batch")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-cv", type=float, default=None, help="the stability gate's limit (and the band's)")
    p.add_argument("--pairs", type=int, default=2, help="runs of each mode, alternating")
    p.add_argument("--json", help="write the runs here")
    args = p.parse_args()
    options = {"device": args.device, **({"max_cv": args.max_cv} if args.max_cv else {})}
    runs = []
    with tempfile.TemporaryDirectory(prefix="mini-kv-refreuse-sols-") as tmp:
        sols = copies(Path(args.solution), args.count, Path(tmp))
        for k in range(args.pairs):
            for interleave in (True, False) if k % 2 == 0 else (False, True):
                run = one_batch(Path(args.problem), sols, options, interleave)
                run["mode"] = "interleaved" if interleave else "reuse"
                runs.append(run)
                print(json.dumps(run), flush=True)
    for mode in ("interleaved", "reuse"):
        mine = [r for r in runs if r["mode"] == mode]
        walls = [r["wall_s"] for r in mine]
        later = [t for r in mine for t in r["timing_s"][1:]]
        sampled = [t for r in mine for t in r["sampling_s"][1:]]
        print(
            f"{mode}: batch wall {statistics.median(walls):.1f} s (median of {walls}); per solution after "
            f"the first: timing {statistics.median(later):.2f} s, of it sampling "
            f"{statistics.median(sampled):.2f} s (medians of {len(later)})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
