"""Timing methods. Each returns per-call times in microseconds for `samples` calls of `fn`.

events    : CUDA events around one call, with a device-wide sync before the end event so
            work the op put on other streams is counted (includes launch overhead).
graph     : `launches` calls captured in one CUDA graph; replay time / launches (no Python
            launch overhead; the honest number for microsecond kernels).
wallclock : host perf_counter around one call (CPU ops); labelled as such in every record.
"""

from __future__ import annotations

import threading
import time

import torch

METHODS = ("events", "graph", "wallclock")


class L2Flusher:
    """Cold-L2 mode: overwrite a buffer of 2x the L2 size before each sample, outside the timed span."""

    def __init__(self, device: str, enabled: bool):
        self.enabled = enabled and torch.device(device).type == "cuda"
        self.buf = None
        if self.enabled:
            props = torch.cuda.get_device_properties(torch.device(device))
            l2 = getattr(props, "L2_cache_size", 0) or 64 * 2**20
            self.buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        if self.enabled:
            self.buf.zero_()
            _reset_persisting_l2()


def _reset_persisting_l2() -> None:
    try:
        torch.cuda.cudart().cudaCtxResetPersistingL2Cache()
    except (AttributeError, RuntimeError):
        pass  # not exposed by this torch build: nothing persisting was set by us either


def default_method(device: str) -> str:
    return "graph" if torch.device(device).type == "cuda" else "wallclock"


def time_events(fn, samples: int, flush: L2Flusher) -> list[float]:
    out = []
    for _ in range(samples):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        torch.cuda.synchronize()  # whole device: side-stream work is inside the span
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out


def time_graph(fn, samples: int, flush: L2Flusher, launches: int) -> list[float]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # allocator warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / launches)
    return out


def time_wallclock(fn, samples: int, device: str) -> list[float]:
    cuda = torch.device(device).type == "cuda"
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def measure(fn, method: str, samples: int, device: str, flush: L2Flusher, launches: int = 20) -> list[float]:
    threads_before = threading.active_count()
    if method == "events":
        res = time_events(fn, samples, flush)
    elif method == "graph":
        res = time_graph(fn, samples, flush, launches)
    elif method == "wallclock":
        res = time_wallclock(fn, samples, device)
    else:
        raise ValueError(f"unknown timing method {method!r}")
    if threading.active_count() != threads_before:
        raise TimingGuardError(f"thread count changed during timing ({threads_before} -> "
                               f"{threading.active_count()}): work may be escaping the timer")
    return res


class TimingGuardError(RuntimeError):
    pass
