"""The GPU's SM clock while each case was timed, and whether it was held back (NVML, read by the parent).

Timing runs in the subject and the judge records when each case's timing had the device (its `span`,
worker/engine.py). The parent, outside every jail, samples the device's SM clock and NVML's clock-event
reasons every INTERVAL_S while a job runs (`ClockWatch`), then gives each timed case a `clocks` record
of the samples inside its span (`attach`). A case sampled under a power cap, a thermal limit or a
hardware slowdown was timed on a throttled GPU: its times read slow, and the run's benchmark headline
lists it under `throttled` (verify and bench print it). Without NVML (no driver, no pynvml, a device
it cannot name) nothing is recorded and the run says why once.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass

INTERVAL_S = 0.01
# NVML's clock-event reasons that hold the SM clock below what the work would get. GPU idle, application
# clocks and sync boost are settings or idleness, not throttling.
THROTTLES = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


@dataclass(frozen=True)
class Clocks:
    """benchmark.json's `clocks` of a timed case: the SM clock (MHz) sampled during its span, the
    device's maximum, and the throttle reasons seen in any sample (empty: not throttled)."""

    samples: int
    sm_mhz_min: int
    sm_mhz_median: int
    sm_mhz_max: int
    sm_mhz_limit: int
    throttled: bool
    reasons: list


def nvml_index(device: str, visible: str | None) -> int | str | None:
    """NVML's name for a torch device: its index among all GPUs, or a UUID, through
    CUDA_VISIBLE_DEVICES (`visible`); None where that cannot be said (a MIG slice, a bad entry)."""
    ordinal = int(device.partition(":")[2] or 0)
    if not visible:
        return ordinal
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if ordinal >= len(entries):
        return None
    entry = entries[ordinal]
    if entry.isdigit():
        return int(entry)
    return entry if entry.startswith("GPU-") else None


def _reasons(mask: int) -> list[str]:
    return [name for bit, name in THROTTLES.items() if mask & bit]


class ClockWatch:
    """A thread sampling one GPU's SM clock and throttle reasons until `stop`. `unavailable`: why
    nothing is sampled (None while it works)."""

    def __init__(self, device: str, interval_s: float = INTERVAL_S, environ=os.environ):
        self.samples: list[tuple[float, int, int]] = []  # (time.time(), SM MHz, clock-event reasons)
        self.limit_mhz = 0
        self.unavailable: str | None = None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not device.startswith("cuda"):
            self.unavailable = "not a CUDA device"
            return
        self._which = nvml_index(device, environ.get("CUDA_VISIBLE_DEVICES"))
        if self._which is None:
            self.unavailable = f"NVML cannot name {device} (CUDA_VISIBLE_DEVICES)"
            return
        self._thread = threading.Thread(target=self._run, name="mini-kv-clocks", daemon=True)
        self._thread.start()

    def _open(self):
        import pynvml

        pynvml.nvmlInit()
        if isinstance(self._which, str):
            handle = pynvml.nvmlDeviceGetHandleByUUID(self._which)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(self._which)
        self.limit_mhz = int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        return pynvml, handle

    def _run(self) -> None:
        try:
            nvml, handle = self._open()
        except Exception as exc:  # noqa: BLE001 - no NVML here: say why, time as before
            self.unavailable = f"NVML unavailable ({type(exc).__name__}: {exc})"
            return
        try:
            while True:
                mhz = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
                mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
                self.samples.append((time.time(), int(mhz), int(mask)))
                if self._stop.wait(self._interval):
                    break
        except Exception as exc:  # noqa: BLE001 - a driver error mid-run ends the sampling, not the run
            self.unavailable = f"NVML stopped answering ({type(exc).__name__}: {exc})"
        finally:
            nvml.nvmlShutdown()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def during(self, start: float, end: float) -> Clocks | None:
        """The samples taken inside [start, end]; a span shorter than the interval gets the sample
        just before it and the one just after it. None without samples."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            before = [s for s in self.samples if s[0] < start][-1:]
            after = [s for s in self.samples if s[0] > end][:1]
            inside = before + after
        if not inside:
            return None
        mhz = [s[1] for s in inside]
        mask = 0
        for s in inside:
            mask |= s[2]
        reasons = _reasons(mask)
        return Clocks(
            len(inside),
            min(mhz),
            round(statistics.median(mhz)),
            max(mhz),
            self.limit_mhz,
            bool(reasons),
            reasons,
        )


def attach(records: list, watch: ClockWatch) -> None:
    """Give every timed record (a dict with a `span`, anywhere in `records`) its `clocks`."""
    from mini_kv.codec import to_json

    for rec in records:
        if not isinstance(rec, dict):
            continue
        span = rec.get("span")
        if isinstance(span, dict) and "start" in span and "end" in span:
            found = watch.during(span["start"], span["end"])
            if found is not None:
                rec["clocks"] = to_json(found)
        attach([v for v in rec.values() if isinstance(v, dict)], watch)


def throttled(records: list) -> dict[str, list]:
    """{id: throttle reasons} of the timed records whose clocks say throttled (a benchmark headline's
    `throttled`)."""
    return {
        r["id"]: r["clocks"]["reasons"]
        for r in records
        if isinstance(r.get("clocks"), dict) and r["clocks"].get("throttled")
    }


def probe(device: str = "cuda", environ=os.environ, wait_s: float = 2.0) -> tuple[bool, str]:
    """doctor's row: whether timed cases on `device` will record their SM clock, and the clock now."""
    watch = ClockWatch(device, environ=environ)
    deadline = time.monotonic() + wait_s
    while not watch.samples and watch.unavailable is None and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    if not watch.samples:
        return False, watch.unavailable or f"NVML gave no sample within {wait_s} s"
    _, mhz, mask = watch.samples[0]
    held = _reasons(mask)
    return True, f"{mhz} MHz now of {watch.limit_mhz} MHz" + (
        f", throttled ({', '.join(held)})" if held else ""
    )
