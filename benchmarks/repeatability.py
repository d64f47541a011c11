#!/usr/bin/env python3
"""Run-to-run repeatability: two back-to-back `verify` runs of the same card, compared.

    python benchmarks/repeatability.py [--task tasks/rmsnorm.yaml] [--out FILE.json] [-- extra verify args]

For every candidate and bench case: candidate P50 in run 1 and run 2 and their difference, speedup
in both runs and their difference, and whether both were stable. Passes when every candidate P50
differs by at most 2 %, every speedup by at most 5 %, and every case is stable in both runs.
Exit 0 on pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_P50_DIFF, MAX_SPEEDUP_DIFF = 0.02, 0.05


def verify(task: str, extra: list[str]) -> dict[str, dict]:
    cmd = [sys.executable, "-m", "mini_kv", "verify", "--task", task, "--candidate", "*", "--json", *extra]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            s = json.loads(line)
            bench = json.loads((Path(s["attempt"]) / "benchmark.json").read_text())
            out[s["candidate"]] = {c["id"]: c for c in bench.get("cases", []) if "candidate" in c}
    if not out:
        raise SystemExit(f"verify produced no result:\n{res.stderr[-3000:]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="tasks/rmsnorm.yaml")
    ap.add_argument("--out")
    ap.add_argument("extra", nargs="*", help="extra verify arguments (after --)")
    args = ap.parse_args()
    runs = [verify(args.task, args.extra), verify(args.task, args.extra)]
    rows, ok = [], True
    print(
        f"{'candidate':18} {'case':26} {'P50 #1':>9} {'P50 #2':>9} {'diff':>7} {'speedup #1':>10} "
        f"{'speedup #2':>10} {'diff':>7} stable"
    )
    for cand in sorted(runs[0]):
        for case_id, a in runs[0][cand].items():
            b = runs[1].get(cand, {}).get(case_id)
            if b is None:
                ok = False
                continue
            p = [r["candidate"]["summary"]["overall"]["p50"] for r in (a, b)]
            s = [r["speedup"] for r in (a, b)]
            stable = [r["stability"]["stable"] for r in (a, b)]
            dp, ds = abs(p[1] / p[0] - 1), abs(s[1] / s[0] - 1)
            good = dp <= MAX_P50_DIFF and ds <= MAX_SPEEDUP_DIFF and all(stable)
            ok &= good
            rows.append(
                {
                    "candidate": cand,
                    "case": case_id,
                    "method": a["method"],
                    "p50_us": p,
                    "p50_diff": dp,
                    "speedup": s,
                    "speedup_diff": ds,
                    "stable": stable,
                    "ok": good,
                }
            )
            print(
                f"{cand:18} {case_id:26} {p[0]:9.2f} {p[1]:9.2f} {dp * 100:6.2f}% {s[0]:10.3f} {s[1]:10.3f} "
                f"{ds * 100:6.2f}% {'yes' if all(stable) else 'NO'}"
            )
    print(
        "repeatability "
        + ("passed" if ok else "FAILED")
        + f" (limits: P50 {MAX_P50_DIFF:.0%}, speedup {MAX_SPEEDUP_DIFF:.0%}, stable in both runs)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps({"task": args.task, "ok": ok, "rows": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
