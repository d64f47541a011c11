#!/usr/bin/env python3
"""Cold builds of SOL-ExecBench C++ solutions with nvcc's front ends side by side (mini_kv's default,
src/mini_kv/compile/nvcc_steps.py) and with plain nvcc (`MINI_KV_NVCC_STEPS=off`), alternating in one
run (A B B A ...), each a cold `bench -v` in a fresh project. Writes JSON to OUT_JSON; run on a GPU
machine from the project root, after one mini_kv command has filled its bytecode cache (`doctor`):

    python benchmarks/nvcc_steps_timing.py OUT_JSON [--rounds 2] [--pair PROBLEM SOLUTION ...]

Default pair: examples/rmsnorm with examples/rmsnorm/cuda_cpp (one .cu with torch's headers; issue 21's
cold-build target, <= 35 s). Each run records its exit code, the build's seconds, its phase line, and
which nvcc its build.ninja ran; per solution and mode the median build, and the ratio of the medians.
Exit 1 if a run failed or a build.ninja did not run the nvcc its mode asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sol_build_timing import COLD_TARGET_S, bench_run  # noqa: E402

DEFAULT_PAIR = ("examples/rmsnorm", "examples/rmsnorm/cuda_cpp/solution.json")
MODES = {"side_by_side": None, "nvcc": "off"}


def ninja_nvcc(build_dir: str | None) -> tuple[str | None, str | None]:
    """The nvcc a build's build.ninja ran, and its CUDA compile command (with -MD, the steps are nvcc's)."""
    ninja = Path(build_dir or "/nonexistent") / "build.ninja"
    if not ninja.is_file():
        return None, None
    lines = ninja.read_text().splitlines()
    nvcc = next((ln[len("nvcc = ") :] for ln in lines if ln.startswith("nvcc = ")), None)
    command = next((ln.strip() for ln in lines if ln.strip().startswith("command = $nvcc")), None)
    return nvcc, command


def cold_run(problem: str, solution: str, mode: str) -> dict:
    switch = MODES[mode]
    if switch is None:
        os.environ.pop("MINI_KV_NVCC_STEPS", None)
    else:
        os.environ["MINI_KV_NVCC_STEPS"] = switch
    with tempfile.TemporaryDirectory(prefix="mkv-nvcc-steps-") as d:
        (Path(d) / ".mini-kv-project").touch()  # a project of its own: its own empty .build/
        run = bench_run(Path(d), problem, solution, n=1)
        nvcc, command = ninja_nvcc(run["build_dir"])
    # side by side only where the wrapper ran and torch left out its dependency file (-MD: plain nvcc)
    wrapped = nvcc is not None and "nvcc_steps.py" in nvcc and " -MD " not in (command or "")
    run.update(
        mode=mode,
        solution=solution,
        ninja_nvcc=nvcc,
        ninja_command=command,
        ran_as_asked=wrapped == (switch is None),
    )
    return run


def summary(runs: list[dict]) -> dict:
    out = {}
    for sol in dict.fromkeys(r["solution"] for r in runs):
        med = {}
        for mode in MODES:
            builds = [
                r["build_s"] for r in runs if r["solution"] == sol and r["mode"] == mode and r["build_s"]
            ]
            med[mode] = {"builds_s": builds, "median_s": statistics.median(builds) if builds else None}
        a, b = med["side_by_side"]["median_s"], med["nvcc"]["median_s"]
        out[sol] = {
            **med,
            "ratio": round(a / b, 3) if a and b else None,
            "cold_target_s": COLD_TARGET_S,
            "met": a is not None and a <= COLD_TARGET_S,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_json")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each mode per solution (alternating)")
    ap.add_argument("--pair", nargs=2, action="append", metavar=("PROBLEM", "SOLUTION"))
    args = ap.parse_args()
    pairs = args.pair or [DEFAULT_PAIR]
    runs = []
    for problem, solution in pairs:
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
            for mode in order:
                run = cold_run(problem, solution, mode)
                runs.append(run)
                Path(args.out_json).write_text(json.dumps({"runs": runs}, indent=2))  # so far
                print(
                    f"{solution} {mode}: exit {run['exit']}, build {run['build_s']} s, wall {run['wall_s']} s, "
                    f"nvcc as asked: {run['ran_as_asked']}",
                    flush=True,
                )
    result = {"runs": runs, "summary": summary(runs)}
    Path(args.out_json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    ok = all(r["exit"] == 0 and r["cache_hit"] is False and r["ran_as_asked"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
