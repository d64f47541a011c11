#!/usr/bin/env python3
"""Build SOL-ExecBench C++ solutions in parallel, so that the `mini-kv bench` runs that follow hit
the build cache instead of building one after the other (a cuDNN-frontend or CUTLASS build takes
one to three minutes of a single core; a GPU machine has many).

    python scripts/prebuild_solutions.py PROBLEM_DIR SOLUTION_JSON [PROBLEM_DIR SOLUTION_JSON ...]

Run from the project root (the build cache is its `.build/`). Builds go through the same compiler
and flags as `bench` (its own compile step, `mini_kv.solexec.run.compile_problem`), so the cache
keys match. Python-language solutions are skipped; a language that cannot build here is reported
with the reason `bench` would give.
Prints one line per solution; exit 1 if any build failed (its log follows its line).
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build_one(problem_dir: str, solution_json: str) -> tuple[str, bool]:
    from mini_kv.solexec.build import build_log, stage_sources
    from mini_kv.solexec.run import BenchOptions, compile_problem, load_problem

    opts = BenchOptions(solution=solution_json, compile_timeout=1200)
    problem = load_problem(problem_dir, opts)
    if problem.solution.group != "cpp":
        return f"{solution_json}: not C++, nothing to build", True
    with tempfile.TemporaryDirectory(prefix="mini-kv-prebuild-") as tmp:
        stage_sources(problem.solution, Path(tmp) / "solution")
        rec, outcomes = compile_problem(problem, Path(tmp), opts, lambda msg: None)
    if rec is None:  # the language cannot build here: every workload carries the reason
        return f"{solution_json}: {next(iter(outcomes.values()))['log']}", True
    line = f"{solution_json}: {rec['status']}, cache hit {rec.get('cache_hit')}, {rec.get('duration_s')} s"
    if rec["status"] != "ok":
        return line + "\n" + build_log(rec), False
    return line, True


def main(argv: list[str]) -> int:
    if not argv or len(argv) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    pairs = list(zip(argv[0::2], argv[1::2], strict=True))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:  # each build runs in its own child process
        results = list(pool.map(lambda pair: build_one(*pair), pairs))
    for line, _ in results:
        print(line, flush=True)
    print(f"prebuilt {len(pairs)} solutions in {time.perf_counter() - t0:.1f} s")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
