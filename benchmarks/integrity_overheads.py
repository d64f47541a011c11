"""Per-call cost of integrity defences on the CPU: the census of one call (integrity.kernel_census,
one per workload or case), the fingerprint of a timed call's output (timing.fingerprint, after every
timed call, outside its span) and the static pre-check of an attempt's sources (judge.static_check,
once per attempt: a forked child running kernelguard, or its kept answer for the same sources).
docs/measurements/integrity-overheads.md has the figures.

    PYTHONPATH=src python benchmarks/integrity_overheads.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from mini_kv.judge import static_check
from mini_kv.worker import integrity, timing

ROOT = Path(__file__).resolve().parents[1]


def median_s(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    torch.set_num_threads(1)
    x, w = torch.randn(1 << 20), torch.randn(1 << 20)

    def op():
        return x * w

    def census():
        with integrity.kernel_census("cpu"):
            op()

    t0 = time.perf_counter()
    census()
    first = time.perf_counter() - t0
    print(
        f"census: first session {first * 1e3:.1f} ms, later {median_s(census, 20) * 1e3:.2f} ms "
        f"(the 1M-element op alone {median_s(op, 20) * 1e3:.2f} ms)"
    )
    y, small = op(), torch.randn(24)
    for label, out in (("1M-element", y), ("24-element", small)):
        cost = median_s(lambda out=out: timing.fingerprint(out), 50)
        print(f"fingerprint of a {label} float32 output: {cost * 1e6:.0f} us")
    for sol in ("rmsnorm/triton", "rmsnorm/cuda_cpp", "flux_rope/pytorch"):
        folder = ROOT / "solutions" / sol
        files = {
            p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "solution.json"
        }

        def fresh(files=files):
            static_check._ANSWERS.clear()
            static_check.check_sources(files)

        cost, kept = median_s(fresh, 10), median_s(lambda files=files: static_check.check_sources(files), 10)
        print(
            f"static check of solutions/{sol} ({', '.join(sorted(files))}): {cost * 1e3:.0f} ms, kept {kept * 1e6:.0f} us"
        )


if __name__ == "__main__":
    main()
