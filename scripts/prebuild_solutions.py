#!/usr/bin/env python3
"""Build SOL-ExecBench C++ solutions and task-card candidates in parallel, so that the `mini-kv bench`
and `verify` runs that follow hit the build cache instead of building one after the other (a
cuDNN-frontend or CUTLASS build takes one to three minutes of a single core; a GPU machine has many).

    python scripts/prebuild_solutions.py [PROBLEM_DIR SOLUTION_JSON ...] [--card CARD ...] [--keep-going]

Run from the project root (the build cache is its `.build/`). Builds go through the same compiler
and flags as `bench` (its own compile step, `mini_kv.solexec.run.compile_problem`) and `verify` (the
card's candidates, for the device this machine has: CUDA where torch sees a GPU, else CPU), so the
cache keys match. Python-language solutions are skipped; a language that cannot build here is
reported with the reason `bench` would give.
Prints one line per build; exit 1 if any build failed (its log follows its line), unless
--keep-going (the GPU gate prebuilds planted broken sources too: their tests decide).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def build_one(problem_dir: str, solution_json: str) -> tuple[str, bool]:
    from mini_kv.cluster.prebuild import build_solution

    rec = build_solution(problem_dir, solution_json, compile_timeout=1200)
    if rec is None:
        return f"{solution_json}: not C++ or not buildable here, nothing to build", True
    return _line(solution_json, rec)


def build_candidate(card_path: str, cand_id: str) -> tuple[str, bool]:
    from mini_kv.cluster.prebuild import build_card_candidate

    return _line(
        f"{card_path} {cand_id}", build_card_candidate(card_path, cand_id, None, compile_timeout=1200)
    )


def _line(name: str, rec) -> tuple[str, bool]:
    from mini_kv.solexec.build import build_log

    line = f"{name}: {rec.status}, cache hit {rec.cache_hit}, {rec.duration_s} s"
    if rec.status != "ok":
        return line + "\n" + build_log(rec), False
    return line, True


def card_jobs(card_path: str) -> list[tuple]:
    from mini_kv.load.task_card import load_task_card

    return [(build_candidate, card_path, c.id) for c in load_task_card(card_path).candidates]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="*", metavar="PROBLEM_DIR SOLUTION_JSON")
    ap.add_argument("--card", action="append", default=[], help="build every candidate of this task card")
    ap.add_argument("--keep-going", action="store_true", help="exit 0 even if a build failed")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2 or not (args.pairs or args.card):
        print(__doc__, file=sys.stderr)
        return 2
    jobs = [(build_one, p, s) for p, s in zip(args.pairs[0::2], args.pairs[1::2], strict=True)]
    for card in args.card:
        jobs += card_jobs(card)
    t0 = time.perf_counter()
    # each build runs in its own child process (nvcc, ninja); one per core keeps memory in bounds
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda job: job[0](*job[1:]), jobs))
    for line, _ in results:
        print(line, flush=True)
    print(f"prebuilt {len(jobs)} in {time.perf_counter() - t0:.1f} s")
    return 0 if args.keep_going or all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
