#!/usr/bin/env python3
"""Does the installed torch build with mini_kv? Run with the python of the environment to check
(CI runs it in a venv holding the newest torch PyPI serves):

    python scripts/torch_compat.py PROBLEM_DIR SOLUTION_JSON

Prints torch's version and the C++ standard read from its headers, then runs `bench`'s compile step
for a SOL-ExecBench C++ solution: the real build where there is a GPU (or TORCH_CUDA_ARCH_LIST),
elsewhere the nvcc compile check of every source against torch's headers. Exit 0 only when that
build or check is ok; a check that could not finish (a header this machine lacks) fails too, since
it proves nothing about this torch."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def _recorded_check(rec) -> dict:
    """A cache hit's compile check, as recorded when the build dir was made (it may have been inconclusive)."""
    try:
        return json.loads((Path(rec.build_dir) / "build.json").read_text()).get("cuda_check") or {}
    except (OSError, ValueError):
        return {}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    from mini_kv import torch_flags
    from mini_kv.solexec.build import build_log, stage_sources
    from mini_kv.solexec.run import BenchOptions, compile_problem, load_problem

    standard, source = torch_flags.torch_standard(Path(torch.__file__).parent, torch.__version__)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): C++{standard}, from {source}")
    problem_dir, solution_json = argv
    opts = BenchOptions(solution=solution_json, compile_timeout=1200)
    problem = load_problem(problem_dir, opts)
    if problem.candidates[0].group != "cpp":
        print(f"{solution_json}: not a C++ solution", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mini-kv-torch-compat-") as tmp:
        stage_sources(problem.candidates[0], Path(tmp) / "solution")
        rec, outcomes = compile_problem(problem, Path(tmp), opts, lambda msg: None)
    if rec is None:  # the solution's language cannot build here at all
        print(f"{solution_json}: {next(iter(outcomes.values()))['log']}", file=sys.stderr)
        return 1
    check = rec.cuda_check or _recorded_check(rec)
    what = "compile check" if rec.check_only else "build"
    flags = " ".join((rec.flags or {}).get("cflags", []))
    print(
        f"{solution_json}: {what} {rec.status}"
        + (f" ({check['status']})" if check else "")
        + f", cflags {flags}, cache hit {rec.cache_hit}, {rec.duration_s} s"
    )
    if rec.status != "ok" or (rec.check_only and check.get("status") != "ok"):
        print(
            check.get("note") or build_log(rec) or f"no compile check recorded in {rec.build_dir}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
