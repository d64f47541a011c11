#!/usr/bin/env python3
"""What one CUPTI sample costs in wall time, part by part, on rmsnorm (bf16, hidden 4096).

time_cupti's loop does more per sample than the timed call: the cold-L2 flush, the hold kernel, the
margins, the profiler's records, and the deferred-work fingerprints (timing.CallRotation). Their sum
sets how long a `bench` takes on the GPU (a workload takes hundreds of samples). Side by side in one
process, 200 samples per measurement, 3 measurements per row:

- flush: the cold-L2 flush alone, median µs per call: mini_kv's read (`L2Flusher`, an int32 sum over
  2x the L2 size), the same read summed in int64 (torch's default, used before), and a memset;
- sample: wall ms per sample, the P50 and its robust spread, the final hold, for two batch sizes
  (7 and 14418 rows), with the deferred-work check as it is (fingerprints compared once per batch,
  the host ops between timed calls not recorded by the profiler), "recorded" (the same with the
  profiler recording those host ops, as before) and off; under mini_kv's flush, and a memset.

    python benchmarks/sample_cost.py [--samples 200] [--out FILE.json]

Needs a CUDA GPU. docs/measurements/jail.md keeps a run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _flushers():
    import torch

    from mini_kv.worker import timing as T

    class Int64Read(T.L2Flusher):
        """The read flush as it was: torch's default int64 accumulation (a slower reduction)."""

        def __call__(self) -> None:
            if self._no_carve_out is not None:
                self._no_carve_out(0)
            torch.sum(self.buf, 0, out=self._wide)
            if self._reset is not None:
                self._reset()
            torch.cuda.synchronize()

        def __init__(self, device: str, enabled: bool):
            super().__init__(device, enabled)
            self._wide = torch.empty((), dtype=torch.int64, device=device)

    class Memset(T.L2Flusher):
        def __call__(self) -> None:
            self.buf.zero_()
            if self._reset is not None:
                self._reset()
            torch.cuda.synchronize()

    return {"read": T.L2Flusher, "read-int64": Int64Read, "memset": Memset}


def _rotation(batch: int, check: str, sets: int = 3):
    import torch

    from mini_kv.worker import timing as T

    xs = [
        (
            torch.randn(batch, 4096, dtype=torch.bfloat16, device="cuda"),
            torch.randn(4096, dtype=torch.bfloat16, device="cuda"),
        )
        for _ in range(sets)
    ]
    last: dict = {}

    def call(k: int) -> None:
        last[k] = torch.nn.functional.rms_norm(xs[k][0], (4096,), xs[k][1], eps=1e-5)

    calls = [lambda k=k: call(k) for k in range(sets)]
    if check == "off":
        return T.CallRotation(calls)
    return T.CallRotation(calls, written=lambda k: (last.get(k), list(xs[k])))


def flush_us(cls, calls: int = 200) -> float:
    import torch

    fl = cls("cuda", True)
    fl()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fl()
    return (time.perf_counter() - t) / calls * 1e6


def sample_row(batch: int, check: str, flush: str, samples: int, reps: int = 3) -> dict:
    import contextlib

    from mini_kv.worker import timing as T

    if check == "recorded":  # as before: the profiler records the host ops between timed calls
        T._host_ops_unrecorded, unrecorded = contextlib.nullcontext, T._host_ops_unrecorded
    fl = _flushers()[flush]("cuda", True)
    rot = _rotation(batch, check)
    for _ in range(10):
        rot.next()()
    walls, p50s, spreads, holds = [], [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        m = T.time_cupti(rot, samples, fl)
        rot.settled("cuda")
        walls.append((time.perf_counter() - t) / samples * 1e3)
        med = statistics.median(m.samples)
        p50s.append(med)
        spreads.append(statistics.median(abs(x - med) for x in m.samples) / med)
        holds.append(m.notes.get("hold_us"))
    if check == "recorded":
        T._host_ops_unrecorded = unrecorded
    return {
        "rows": batch,
        "deferred_check": check,
        "flush": flush,
        "wall_ms_per_sample": [round(w, 3) for w in walls],
        "p50_us": [round(p, 2) for p in p50s],
        "rel_mad": [round(s, 4) for s in spreads],
        "hold_us": holds,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--out", help="write the result as JSON here too")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("sample_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "flush_us": {
            name: round(statistics.median(flush_us(cls) for _ in range(3)), 1)
            for name, cls in _flushers().items()
        },
        "samples": [],
    }
    print(json.dumps({k: result[k] for k in ("gpu", "flush_us")}), flush=True)
    for batch in (7, 14418):
        for check in ("batched", "recorded", "off"):
            for flush in ("read", "memset"):
                if check != "batched" and flush != "read":
                    continue
                row = sample_row(batch, check, flush, args.samples)
                result["samples"].append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
