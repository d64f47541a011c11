"""Bytes and FLOPs per case from a card's expressions; achieved GB/s, TFLOP/s and share of peak."""

from __future__ import annotations

from dataclasses import dataclass

from mini_kv import arith


def evaluate(expr: str, names: dict) -> float:
    """Arithmetic on numbers and names only (cards are data, not code), within mini_kv.arith's bounds."""
    return float(arith.evaluate(expr, names))


def case_names(params: dict, itemsize: int, numel: int) -> dict:
    names = {k: v for k, v in params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**names, "itemsize": itemsize, "numel": numel}


@dataclass(frozen=True)
class Achieved:
    """A timed case's throughput (a bench record's `roofline`): GB/s, TFLOP/s, share of the measured peak."""

    gbps: float | None
    tflops: float | None
    peak_share: float | None


def achieved(
    bytes_moved: float | None, flops: float | None, seconds: float, peak_bw: float | None
) -> Achieved:
    gbps = bytes_moved / seconds / 1e9 if bytes_moved and seconds > 0 else None
    tflops = flops / seconds / 1e12 if flops and seconds > 0 else None
    return Achieved(gbps, tflops, (gbps * 1e9 / peak_bw) if gbps and peak_bw else None)


# How much faster than the measured copy bandwidth a timed case may look before its time is physically
# impossible. The probe (worker/bandwidth.py) measures a device-to-device copy, about 90 % of the
# memory's peak; a card's `bytes` may overcount what really crosses the memory bus. Twice the measured
# bandwidth is beyond any real kernel, and far from what a cheat that skips its work measures (10x to
# 1000x), so an honest kernel is never flagged and a skipped one always is.
IMPOSSIBLE_MARGIN = 2.0


def floor_seconds(bytes_moved: float | None, peak_bw_Bps: float | None) -> float | None:
    """The least time a case's compulsory memory traffic can take: bytes over IMPOSSIBLE_MARGIN times
    the measured copy bandwidth; None when either is unknown (CPU, or a card without sizes)."""
    if not bytes_moved or not peak_bw_Bps or bytes_moved <= 0 or peak_bw_Bps <= 0:
        return None
    return bytes_moved / (IMPOSSIBLE_MARGIN * peak_bw_Bps)


def impossible_time(record: dict, p50_us: float) -> str | None:
    """Why a timed bench case's candidate P50 (µs) is faster than physics allows, or None.

    Applies to cold-L2 timings only: with a warm L2 the data need not cross the memory bus, so a bytes
    floor at memory bandwidth does not bound them. (There is no FLOPs floor: mini_kv measures no peak
    compute, and a table of vendors' peaks per dtype would be a guess.)"""
    if record.get("l2") != "cold":
        return None
    bytes_moved, peak = record.get("bytes"), record.get("peak_bw_Bps")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (bytes_moved, peak))
    floor = floor_seconds(bytes_moved, peak) if ok else None
    if floor is None or p50_us * 1e-6 >= floor:
        return None
    return (
        f"IMPOSSIBLE_TIME: case {record.get('id')}: candidate P50 {p50_us:.4g} us is below its roofline floor "
        f"{floor * 1e6:.4g} us ({bytes_moved:.4g} bytes at {IMPOSSIBLE_MARGIN:g}x the measured "
        f"{peak / 1e9:.4g} GB/s): physically impossible, never ranked"
    )
