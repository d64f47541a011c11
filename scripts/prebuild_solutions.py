#!/usr/bin/env python3
"""Build SOL-ExecBench C++ solutions in parallel, so that the `mini-kv bench` runs that follow hit
the build cache instead of building one after the other (a cuDNN-frontend or CUTLASS build takes
one to three minutes of a single core; a GPU machine has many).

    python scripts/prebuild_solutions.py PROBLEM_DIR SOLUTION_JSON [PROBLEM_DIR SOLUTION_JSON ...]

Run from the project root (the build cache is its `.build/`). Builds go through the same compiler
and flags as `bench` (`mini_kv.solexec.build`), so the cache keys match. Python-language solutions
are skipped; a language that cannot build here is reported with the reason `bench` would give.
Prints one line per solution; exit 1 if any build failed (its log follows its line).
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build_one(problem_dir: str, solution_json: str) -> tuple[str, bool]:
    from mini_kv.load.task_card import find_project_root
    from mini_kv.solexec import languages
    from mini_kv.solexec.build import build_log, compile_solution, stage_sources
    from mini_kv.solexec.run import BenchOptions, load_problem

    solution = load_problem(problem_dir, BenchOptions(solution=solution_json)).solution
    if solution.group != "cpp":
        return f"{solution_json}: not C++, nothing to build", True
    flags, reason = languages.cpp_flags(solution.languages, solution.dependencies)
    if reason:
        return f"{solution_json}: unavailable here: {reason}", True
    with tempfile.TemporaryDirectory(prefix="mini-kv-prebuild-") as tmp:
        staged = stage_sources(solution, Path(tmp) / "solution")
        rec = compile_solution(find_project_root(Path.cwd()), solution, staged, flags, timeout=1200)
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
