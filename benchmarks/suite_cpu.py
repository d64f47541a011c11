"""Where a command's CPU goes, by kind of process: run it, sample /proc beside it, sum CPU per kind.

    python benchmarks/suite_cpu.py [--every S] -- COMMAND...
    python benchmarks/suite_cpu.py -- python -m pytest -n auto --dist loadscope -q -p no:cacheprovider

Every process alive during the command is seen every `--every` seconds (default 0.2); its CPU (user and
system, /proc/PID/stat) at the last sighting counts, less what it had used before the command started.
A process that starts and ends between two sightings is missed, and one seen last before its end is
counted short: the totals are lower bounds. Kinds: a worker child's role (judge, subject, one-shot),
a pytest-xdist worker, bwrap, or the program's name. Prints one line per kind, most
CPU first, and the command's wall time; exits with the command's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import Counter

HZ = os.sysconf("SC_CLK_TCK")


def kind(cmdline: list[str], comm: str) -> str:
    """The kind a process counts under."""
    if not cmdline:
        return f"kernel: {comm}"
    if os.path.basename(cmdline[0]) == "bwrap":  # the jail's own processes (its outer and inner bwrap)
        return "bwrap"
    if "mini_kv.worker.child" in cmdline:
        return "subject" if "--subject-fd" in cmdline else "judge or one-shot child"
    if any("xdist" in a or "execnet" in a for a in cmdline) or (
        len(cmdline) > 2 and cmdline[1:3] == ["-u", "-c"]
    ):
        return "pytest-xdist worker"
    return (
        os.path.basename(cmdline[0])
        if "python" not in os.path.basename(cmdline[0])
        else " ".join(cmdline[:3])
    )


def sample(seen: dict, base: dict, first: bool) -> None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = [a for a in f.read().split("\0") if a]
        except OSError:  # gone between the listing and the read
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / HZ
        key = (pid, fields[19])  # pid and start time: a reused pid is another process
        if first:
            base[key] = cpu
        # a process's kind is fixed at its first sighting with a command line (an exec changes it only
        # from the fork's copy of its parent's)
        old = seen.get(key)
        seen[key] = (cpu, old[1] if old and not old[1].startswith("kernel") else kind(cmdline, comm))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given (after --)")
    seen: dict = {}
    base: dict = {}
    sample(seen, base, first=True)
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(args.every):
            sample(seen, base, first=False)

    thread = threading.Thread(target=sampler, daemon=True)
    t0 = time.monotonic()
    thread.start()
    code = subprocess.call(cmd)
    done.set()
    thread.join()
    wall = time.monotonic() - t0
    totals, counts = Counter(), Counter()
    for key, (cpu, what) in seen.items():
        totals[what] += cpu - base.get(key, 0.0)
        counts[what] += 1
    print(f"wall {wall:.1f} s; CPU by kind of process (at least):", file=sys.stderr)
    for what, cpu in totals.most_common(15):
        if cpu >= 0.5:
            print(f"{cpu:9.1f} s  {counts[what]:5d} processes  {what}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
