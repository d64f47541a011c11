"""The device's measured copy bandwidth: the roofline's memory ceiling.

Measured once per environment (a large device-to-device copy, bytes read + written over the
median time of ITERATIONS copies timed with CUDA events) and cached in
`<project>/.build/bandwidth-<environment key>.json`. The measurement runs in a worker child (job
kind `bandwidth`), so the parent never holds a CUDA context or the buffers.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from mini_kv.codec import from_json, optional
from mini_kv.settings import DEFAULTS

COPY_BYTES = 2 * 2**30
ITERATIONS = 20
WARMUP = 3
SCHEMA_VERSION = 1
METHOD = (
    f"device-to-device copy of up to {COPY_BYTES // 2**30} GiB (torch copy_), bytes read + written "
    f"over the median of {ITERATIONS} copies timed with CUDA events"
)


@dataclass(frozen=True)
class Bandwidth:
    """One measurement (cached as .build/bandwidth-<environment key>.json): bytes read + written per
    second, how, the copy's size and the counted bytes, the median and extremes of the copies' seconds."""

    schema_version: int
    copy_bandwidth_Bps: float
    method: str
    bytes_per_copy: int
    counted_bytes_per_copy: int
    iterations: int
    median_s: float
    min_s: float
    max_s: float
    device_name: str
    torch: str
    measured_at: str
    cache: str | None = optional()  # the file it was read from (not in the file itself)


@dataclass(frozen=True)
class Unmeasured:
    """A failed measurement: no bandwidth, and why (never cached; the next run measures again)."""

    error: str
    copy_bandwidth_Bps: None = None
    method: str = METHOD


def measure(device: str = "cuda", nbytes: int = COPY_BYTES, iterations: int = ITERATIONS) -> Bandwidth:
    import torch

    dev = torch.device(device)
    if dev.index is not None:
        torch.cuda.set_device(dev)  # events and copies below run on this device's current stream
    free, _ = torch.cuda.mem_get_info(dev)
    nbytes = int(min(nbytes, free // 4)) // 2**20 * 2**20  # leave room: two buffers, well under free memory
    if nbytes <= 0:
        raise RuntimeError(f"too little free device memory to measure copy bandwidth ({free} bytes free)")
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(WARMUP):
        dst.copy_(src)
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    med, name = statistics.median(times), torch.cuda.get_device_properties(dev).name
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    copies = (2 * nbytes / med, METHOD, nbytes, 2 * nbytes, iterations, med, min(times), max(times))
    return Bandwidth(SCHEMA_VERSION, *copies, name, torch.__version__, now)


def measure_job(job) -> Bandwidth:
    """Job kind `bandwidth`, in the worker child."""
    return measure(job.device, job.nbytes, job.iterations)


def cache_path(project_root: Path, environment_key: str) -> Path:
    return Path(project_root) / ".build" / f"bandwidth-{environment_key}.json"


def load_cached(project_root: Path, environment_key: str) -> Bandwidth | None:
    path = cache_path(project_root, environment_key)
    try:
        data = json.loads(path.read_text())
        got = from_json(Bandwidth, {**data, "cache": str(path)})
    except (OSError, ValueError, TypeError):  # unreadable, or fields missing: measure again
        return None
    if got.schema_version != SCHEMA_VERSION or not (got.copy_bandwidth_Bps or 0) > 0:
        return None  # from another layout: measure again
    return got


def ensure(
    project_root: Path,
    environment_key: str,
    device: str,
    timeout: float = DEFAULTS.bandwidth_timeout_s,
    env: dict | None = None,
) -> Bandwidth | Unmeasured | None:
    """The cached measurement for this environment, measuring it first if needed. None off CUDA.

    `env` is the measuring child's environment (e.g. CUDA_VISIBLE_DEVICES, so it measures the GPU
    the worker will use). A lock makes concurrent verifies measure once, one at a time. A failed
    measurement is returned (Unmeasured) but not cached.
    """
    if not device.startswith("cuda"):
        return None
    cached = load_cached(project_root, environment_key)
    if cached is not None:
        return cached
    from filelock import FileLock

    from mini_kv.runner import AheadOfTurn, run_one
    from mini_kv.store.atomic import write_json
    from mini_kv.worker.jobs import BandwidthJob

    path = cache_path(project_root, environment_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        cached = load_cached(project_root, environment_key)  # measured while we waited
        if cached is not None:
            return cached
        AheadOfTurn.timing(True)  # a measurement on the GPU, as a timing is: workers started ahead stop
        try:
            ev = run_one(
                BandwidthJob(device=device, nbytes=COPY_BYTES, iterations=ITERATIONS),
                timeout,
                env=env,  # jailed as every child is (harness code only, but one way to start a child)
            )
        finally:
            AheadOfTurn.timing(False)
        if not ev.ok:
            return Unmeasured(f"bandwidth measurement failed ({ev.reason}): {ev.log_tail.strip()[-500:]}")
        write_json(path, ev.result)
    return from_json(Bandwidth, {**ev.result, "cache": str(path)})
