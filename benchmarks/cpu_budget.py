#!/usr/bin/env python3
"""Time every shipped task card (`verify --device cpu --candidate '*'`) and every shipped SOL solution
(`bench PROBLEM --solution S --device cpu`) on this machine: wall time, exit code, verdicts, TIMEOUTs.

    PYTHONPATH=$PWD/src python benchmarks/cpu_budget.py OUT.json [--limit 60] [--only rmsnorm]

Each command runs as a fresh `python -m mini_kv` process, as a user runs it, with its attempts written
to a scratch store (not the project's artifacts/). A solution that cannot run on CPU (CUDA C++, Triton)
is run too: it must end at once with its reason, not hang. The JSON lists one entry per command and
`ok`: every command within --limit seconds and no TIMEOUT anywhere (docs/measurements/cpu-budget.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(only: str | None) -> list[dict]:
    out = []
    for card in sorted((ROOT / "tasks").glob("*.yaml")):
        out.append(
            {
                "kind": "verify",
                "name": card.stem,
                "argv": [
                    "verify",
                    "--task",
                    str(card.relative_to(ROOT)),
                    "--device",
                    "cpu",
                    "--candidate",
                    "*",
                ],
            }
        )
    for sol in sorted((ROOT / "solutions").glob("*/*/solution.json")):
        problem = ROOT / "problems" / "sol-execbench" / sol.parts[-3]
        if not (problem / "definition.json").is_file():
            continue
        out.append(
            {
                "kind": "bench",
                "name": f"{sol.parts[-3]}/{sol.parts[-2]}",
                "argv": [
                    "bench",
                    str(problem.relative_to(ROOT)),
                    "--solution",
                    str(sol.relative_to(ROOT)),
                    "--device",
                    "cpu",
                ],
            }
        )
    return [c for c in out if only is None or only in c["name"]]


def verdicts(kind: str, stdout: str) -> dict:
    """verify --json: one summary line per candidate; bench --json: one trace per workload."""
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if kind == "verify":
        return {r["candidate"]: r.get("status") for r in rows}
    return {r["workload"]["uuid"]: r["evaluation"]["status"] for r in rows}


def run(cmd: dict, store: str, limit: float) -> dict:
    argv = [sys.executable, "-m", "mini_kv", *cmd["argv"], "--artifacts", store, "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=10 * limit)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = None, exc.stdout or "", f"killed after {10 * limit:.0f} s"
    wall = time.perf_counter() - t0
    try:
        found = verdicts(cmd["kind"], stdout if isinstance(stdout, str) else stdout.decode())
    except (json.JSONDecodeError, KeyError) as exc:
        found = {"unreadable output": f"{type(exc).__name__}: {exc}"}
    timeouts = sorted(k for k, v in found.items() if v == "TIMEOUT")
    return {
        **cmd,
        "command": "python -m mini_kv " + " ".join(cmd["argv"]),
        "wall_s": round(wall, 1),
        "exit_code": code,
        "verdicts": found,
        "timeouts": timeouts,
        "within_limit": wall <= limit,
        "stderr_tail": (stderr or "")[-600:] if code not in (0, None) else "",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the JSON results")
    ap.add_argument("--limit", type=float, default=60.0, help="seconds each command may take (default 60)")
    ap.add_argument("--only", help="run only the commands whose name contains this")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="mini-kv-cpu-budget-") as store:
        for cmd in commands(args.only):
            res = run(cmd, store, args.limit)
            results.append(res)
            print(
                f"{res['wall_s']:7.1f} s  exit {res['exit_code']}  {res['kind']} {res['name']}: "
                + ", ".join(f"{k}={v}" for k, v in res["verdicts"].items()),
                flush=True,
            )
    doc = {
        "limit_s": args.limit,
        "ok": all(r["within_limit"] and not r["timeouts"] for r in results),
        "total_s": round(sum(r["wall_s"] for r in results), 1),
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"{'ok' if doc['ok'] else 'NOT ok'}: {len(results)} commands, {doc['total_s']} s in all -> {args.out}"
    )
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
