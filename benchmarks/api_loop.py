"""A generation loop's cost per solution: one `api.evaluate` call per solution, with and without
`api.kept_judges()`.

    python benchmarks/api_loop.py [--problem DIR] [--solution S.json] [--calls N] [--rounds R] [--device D]

Each round runs the loop twice, plain and within `api.kept_judges()`, alternating which goes first;
each loop makes `--calls` calls of one solution (the same solution.json each time: the verdict does
not depend on the loop), storing nothing (`store=False`). Reported: per loop, the wall time per call
(median over rounds, min and max) and the CPU time per call of every process of the loop, jailed
children included (a cpuacct cgroup of its own, where cgroup v1's cpuacct is writable; else null).
Every call must pass; exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")


@contextlib.contextmanager
def cpu_meter():
    """Yields a function that returns the CPU seconds used so far by this process and everything it
    started: a cpuacct cgroup of its own where cgroup v1's cpuacct is writable (root), else None."""
    group = CGROUP_ROOT / f"mini-kv-api-loop-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        yield lambda: None
        return
    try:
        yield lambda: int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        (CGROUP_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            group.rmdir()


def loop(problem: Path, solution: Path, calls: int, device: str, kept: bool, cpu) -> dict:
    from mini_kv import api

    scope = api.kept_judges() if kept else contextlib.nullcontext()
    c0, t0 = cpu(), time.perf_counter()
    statuses = []
    with scope:
        for _ in range(calls):
            (result,) = api.evaluate(problem, [solution], device=device, store=False)
            statuses.append(result.status)
    wall, used = time.perf_counter() - t0, cpu()
    return {
        "wall_per_call_s": wall / calls,
        "cpu_per_call_s": None if used is None else (used - c0) / calls,
        "all_passed": all(s == "PASSED" for s in statuses),
    }


def summary(runs: list[dict], key: str) -> dict | None:
    values = [r[key] for r in runs if r[key] is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default=str(ROOT / "problems/sol-execbench/custom_inputs_matmul"))
    ap.add_argument("--solution", default=str(ROOT / "solutions/custom_inputs_matmul/pytorch/solution.json"))
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.calls < 2 or args.rounds < 1:
        ap.error("--calls must be at least 2 (a judge is kept for the next call) and --rounds at least 1")
    runs: dict[str, list[dict]] = {"plain": [], "kept_judges": []}
    with cpu_meter() as cpu:
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for kept in order:
                out = loop(Path(args.problem), Path(args.solution), args.calls, args.device, kept, cpu)
                runs["kept_judges" if kept else "plain"].append(out)
                print(json.dumps({"round": r, "kept_judges": kept, **out}), file=sys.stderr, flush=True)
    report = {
        "problem": args.problem,
        "solution": args.solution,
        "device": args.device,
        "calls": args.calls,
        "rounds": args.rounds,
        **{
            name: {
                "wall_per_call_s": summary(rs, "wall_per_call_s"),
                "cpu_per_call_s": summary(rs, "cpu_per_call_s"),
            }
            for name, rs in runs.items()
        },
    }
    print(json.dumps(report, indent=2))
    return 0 if all(r["all_passed"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
