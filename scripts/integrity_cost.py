#!/usr/bin/env python3
"""What the integrity defences cost: `verify` wall time with and without them, interleaved.

    python scripts/integrity_cost.py --before DIR [--task tasks/rmsnorm.yaml] [--rounds 2] [--out F.json]

DIR is a copy of the project at the commit before the defences (7d8c42d^), with the changes since
that are not defences applied, so that only the defences differ (docs/integrity.md says which):

    git worktree add /tmp/before 7d8c42d^ && cd /tmp/before && git cherry-pick --no-commit 11b3f91
    cp <this tree>/src/mini_kv/worker/compare.py src/mini_kv/worker/   # comparisons on the device
    cp <this tree>/candidates/*/*/kernel.cu ...                          # the same kernels

Both trees' candidates are built first (each tree in its own process, with its own sources on
PYTHONPATH), so both timed runs find every build in their cache. Then `verify --task T
--candidate '*' [--l2 cold on CUDA] --json` runs in this tree and in DIR alternately, `--rounds`
times each, starting with this tree. Prints each wall time, the medians and their ratio; exit 1
when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREBUILD = """
import concurrent.futures, sys
from pathlib import Path
from mini_kv.build.compiler import compile_candidate
from mini_kv.load.task_card import load_task_card
root, card = Path(sys.argv[1]), load_task_card(Path(sys.argv[1]) / sys.argv[2])
jobs = [c for c in card.candidates if c.cuda_sources or c.cpu_sources]
with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs))) as pool:
    recs = list(pool.map(lambda c: compile_candidate(root, c, timeout=600), jobs))
bad = [(c.id, r["status"]) for c, r in zip(jobs, recs) if r["status"] != "ok"]
print(f"{root.name}: built {len(jobs)} candidates" + (f", failed {bad}" if bad else ""))
sys.exit(1 if bad else 0)
"""


def tree_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def prebuild(tree: Path, task: str) -> None:
    subprocess.run([sys.executable, "-c", PREBUILD, str(tree), task], cwd=tree, env=tree_env(tree), check=True)


def timed_verify(tree: Path, task: str, extra: list[str]) -> tuple[float, int, list[dict]]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "mini_kv", "verify", "--task", task, "--candidate", "*", "--json",
                          *extra], cwd=tree, env=tree_env(tree), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode != 0:
        sys.stderr.write(res.stderr[-3000:])
    return wall, res.returncode, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--task", default="tasks/rmsnorm.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    before = args.before.resolve()
    import torch

    extra = ["--l2", "cold"] if torch.cuda.is_available() else ["--device", "cpu"]
    for tree in (ROOT, before):
        prebuild(tree, args.task)
    walls: dict[str, list[float]] = {"with": [], "without": []}
    failed = False
    for r in range(args.rounds):
        for label, tree in (("with", ROOT), ("without", before)):
            wall, rc, lines = timed_verify(tree, args.task, extra)
            walls[label].append(round(wall, 2))
            statuses = {x.get("candidate"): x.get("status") for x in lines}
            print(f"round {r + 1} {label:7s} defences: {wall:7.2f} s  exit {rc}  {statuses}", flush=True)
            failed |= rc != 0
    med = {k: statistics.median(v) for k, v in walls.items()}
    ratio = med["with"] / med["without"]
    print(f"median with {med['with']:.2f} s, without {med['without']:.2f} s: with/without = {ratio:.3f} "
          f"({(ratio - 1) * 100:+.1f} %)")
    if args.out:
        args.out.write_text(json.dumps({"task": args.task, "extra": extra, "walls_s": walls, "medians_s": med,
                                        "ratio": ratio}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
