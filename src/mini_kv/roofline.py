"""Bytes and FLOPs per case from a card's expressions; achieved GB/s, TFLOP/s and share of peak."""

from __future__ import annotations

from mini_kv import arith


def evaluate(expr: str, names: dict) -> float:
    """Arithmetic on numbers and names only (cards are data, not code), within mini_kv.arith's bounds."""
    return float(arith.evaluate(expr, names))


def case_names(params: dict, itemsize: int, numel: int) -> dict:
    names = {k: v for k, v in params.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {**names, "itemsize": itemsize, "numel": numel}


def achieved(bytes_moved: float | None, flops: float | None, seconds: float, peak_bw: float | None) -> dict:
    gbps = bytes_moved / seconds / 1e9 if bytes_moved and seconds > 0 else None
    return {
        "gbps": gbps,
        "tflops": flops / seconds / 1e12 if flops and seconds > 0 else None,
        "peak_share": (gbps * 1e9 / peak_bw) if gbps and peak_bw else None,
    }
