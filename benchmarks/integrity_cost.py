#!/usr/bin/env python3
"""What the integrity defences cost: `verify` wall time with and without them, interleaved.

    python benchmarks/integrity_cost.py --before DIR [--task tasks/rmsnorm.yaml] [--rounds 2] [--out F.json]

DIR is a copy of the project at the commit before the defences (7d8c42d^), with the changes since
that are not defences applied, so that only the defences differ: the on-device input generation
(11b3f91), this tree's comparisons (worker/compare.py, on the device) and this tree's candidates.
In a git checkout,

    python benchmarks/integrity_cost.py --prepare DIR

writes it (a plain copy of the files, no .git: it travels to a GPU machine as a carried folder).

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
BEFORE_DEFENCES = "7d8c42d^"  # the commit that added the defences, minus one
NOT_DEFENCES = ("11b3f91",)  # later commits that the comparison needs in both trees
FROM_THIS_TREE = ("src/mini_kv/worker/compare.py", "candidates")
PREBUILD = """
import concurrent.futures, sys
from pathlib import Path
from mini_kv.compile.compiler import compile_candidate
from mini_kv.load.task_card import load_task_card
root, card = Path(sys.argv[1]), load_task_card(Path(sys.argv[1]) / sys.argv[2])
jobs = [c for c in card.candidates if c.cuda_sources or c.cpu_sources]
with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs))) as pool:
    recs = list(pool.map(lambda c: compile_candidate(root, c, timeout=600), jobs))
bad = [(c.id, r.status) for c, r in zip(jobs, recs) if r.status != "ok"]
print(f"{root.name}: built {len(jobs)} candidates" + (f", failed {bad}" if bad else ""))
sys.exit(1 if bad else 0)
"""


def prepare(dest: Path) -> None:
    """Write the tree without the defences to `dest` (see the module docstring)."""
    import shutil
    import tempfile

    if dest.exists():
        raise SystemExit(f"{dest} exists: give a new directory")
    work = Path(tempfile.mkdtemp(prefix="mini-kv-before-")) / "tree"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", str(work), BEFORE_DEFENCES], check=True)
    try:
        for rev in NOT_DEFENCES:
            subprocess.run(["git", "-C", str(work), "cherry-pick", "--no-commit", rev], check=True)
        for rel in FROM_THIS_TREE:
            if (work / rel).is_dir():
                shutil.rmtree(work / rel)
            (shutil.copytree if (ROOT / rel).is_dir() else shutil.copy2)(ROOT / rel, work / rel)
        subprocess.run(["git", "-C", str(work), "add", "-A", *FROM_THIS_TREE], check=True)
        files = subprocess.run(
            ["git", "-C", str(work), "ls-files", "-z"], check=True, capture_output=True
        ).stdout
        for rel in filter(None, files.decode().split("\0")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / rel, dest / rel)
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(work)], check=False)
    print(
        f"{dest}: the project at {BEFORE_DEFENCES} + {', '.join(NOT_DEFENCES)} + this tree's "
        f"{', '.join(FROM_THIS_TREE)}"
    )


def tree_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def prebuild(tree: Path, task: str) -> None:
    subprocess.run(
        [sys.executable, "-c", PREBUILD, str(tree), task], cwd=tree, env=tree_env(tree), check=True
    )


def timed_verify(tree: Path, task: str, extra: list[str]) -> tuple[float, int, list[dict]]:
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "mini_kv", "verify", "--task", task, "--candidate", "*", "--json", *extra],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode != 0:
        sys.stderr.write(res.stderr[-3000:])
    return wall, res.returncode, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="the tree without the defences")
    ap.add_argument("--prepare", type=Path, metavar="DIR", help="write that tree to DIR (needs git) and stop")
    ap.add_argument("--task", default="tasks/rmsnorm.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare.resolve())
        return 0
    if args.before is None:
        ap.error("give --before DIR (or --prepare DIR first)")
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
    print(
        f"median with {med['with']:.2f} s, without {med['without']:.2f} s: with/without = {ratio:.3f} "
        f"({(ratio - 1) * 100:+.1f} %)"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"task": args.task, "extra": extra, "walls_s": walls, "medians_s": med, "ratio": ratio},
                indent=2,
            )
            + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
