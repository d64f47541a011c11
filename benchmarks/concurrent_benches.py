#!/usr/bin/env python3
"""Several `bench` runs of one solution at once on one device, with the device's memory traced: the
verdicts of each run and the peak memory, in all and per process (docs/measurements/gpu-gate-h200.md,
"device memory across workloads").

    python benchmarks/concurrent_benches.py [--count 4] [--problem DIR] [--solution FILE] [--json OUT]

Defaults: four runs of the shipped PyTorch rmsnorm solution on its 14 workloads, each with an artifact
store of its own under a temporary dir. On a CUDA machine `nvidia-smi` is sampled every 250 ms
(`memory.used` of the device, `used_memory` of each compute process); elsewhere the runs go ahead and
memory is reported as not measured. Honest solutions sharing a device must keep their verdicts: exit 1
when any workload of any run did not pass."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "sol-execbench" / "rmsnorm"
SOLUTION = ROOT / "solutions" / "rmsnorm" / "pytorch" / "solution.json"


def start_trace(out: Path) -> list[subprocess.Popen]:
    """nvidia-smi sampling the device's and each process's memory into `out`, where there is one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    fmt = ["--format=csv,noheader,nounits", "-lms", "250"]
    return [
        subprocess.Popen([smi, "--query-gpu=memory.used", *fmt], stdout=open(out / "device.csv", "w")),
        subprocess.Popen(
            [smi, "--query-compute-apps=pid,used_memory", *fmt], stdout=open(out / "apps.csv", "w")
        ),
    ]


def peaks(out: Path) -> dict:
    """The peak MiB of the device and of each process, from the traces (empty where none was taken)."""

    def rows(name: str) -> list[list[str]]:
        path = out / name
        text = path.read_text() if path.is_file() else ""
        return [[f.strip() for f in ln.split(",")] for ln in text.splitlines() if ln.strip()]

    device = [float(r[0]) for r in rows("device.csv") if r and r[0].replace(".", "").isdigit()]
    per_pid: dict[str, float] = {}
    for r in rows("apps.csv"):
        if len(r) == 2 and r[1].replace(".", "").isdigit():
            per_pid[r[0]] = max(per_pid.get(r[0], 0.0), float(r[1]))
    return {"device_mib": max(device, default=None), "process_mib": sorted(per_pid.values(), reverse=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--problem", type=Path, default=PROBLEM)
    ap.add_argument("--solution", type=Path, default=SOLUTION)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="concurrent-benches-"))
    tracers = start_trace(work)
    t0 = time.monotonic()
    runs = []
    for i in range(args.count):
        cmd = [sys.executable, "-m", "mini_kv", "bench", str(args.problem), "--solution", str(args.solution)]
        cmd += ["--artifacts", str(work / f"store{i}"), "--json"]
        runs.append(
            subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        )
    verdicts = []
    for proc in runs:
        try:
            out, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        # --json: one SOL trace line per workload
        traces = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        statuses = [t.get("evaluation", {}).get("status") for t in traces]
        verdicts.append({"exit": proc.returncode, "statuses": statuses})
    wall = time.monotonic() - t0
    for t in tracers:
        t.terminate()
        t.wait()
    mem = peaks(work)
    shutil.rmtree(work, ignore_errors=True)
    bad = sum(s != "PASSED" for v in verdicts for s in v["statuses"]) + sum(
        not v["statuses"] for v in verdicts
    )
    for i, v in enumerate(verdicts):
        passed = sum(s == "PASSED" for s in v["statuses"])
        others = sorted({s for s in v["statuses"] if s != "PASSED"})
        print(f"run {i}: exit {v['exit']}, {passed}/{len(v['statuses'])} workloads PASSED {' '.join(others)}")
    if mem["device_mib"] is None:
        print(f"{args.count} runs at once in {wall:.0f} s; device memory not measured (no nvidia-smi)")
    else:
        top = ", ".join(f"{m / 1024:.1f}" for m in mem["process_mib"])
        print(
            f"{args.count} runs at once in {wall:.0f} s; device peak {mem['device_mib'] / 1024:.1f} GiB; "
            f"per process (GiB, largest first): {top}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"count": args.count, "wall_s": wall, "runs": verdicts, **mem}, indent=1)
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
