"""What the OS sandbox adds to a child's start: `python -c pass` started directly and through
mini_kv.sandbox, each RUNS times (median), plus the one-time probe.

    python benchmarks/sandbox_overhead.py [RUNS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from mini_kv.sandbox import Sandbox, disabled, probe


def start_times(info, runs: int) -> list[float]:
    cmd = [sys.executable, "-c", "pass"]
    times = []
    for _ in range(runs):
        box = Sandbox(info)
        try:
            t0 = time.perf_counter()
            subprocess.run(box.argv(cmd), env=box.env(None), check=True)
            times.append(time.perf_counter() - t0)
        finally:
            box.close()
    return times


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    t0 = time.perf_counter()
    info = probe()
    print(
        f"probe: {time.perf_counter() - t0:.3f} s; sandbox {'on (' + str(info.mechanism) + ')' if info.enabled else 'off: ' + info.reason}"
    )
    if not info.enabled:
        return 1
    for label, which in (("direct", disabled("baseline")), ("sandboxed", info)):
        times = start_times(which, runs)
        print(
            f"{label:9s} median {statistics.median(times):.3f} s over {runs} starts "
            f"(min {min(times):.3f}, max {max(times):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
