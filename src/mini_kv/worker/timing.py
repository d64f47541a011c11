"""Timing methods. Each times `samples` calls and returns per-call times in microseconds.

A workload is a list of zero-argument callables, one per input set, taken in rotation: each
call (timed or not) takes the next one, and the rotation carries over between measurements.
In hot-L2 mode the list has one entry; in cold-L2 mode it holds several input sets at distinct
addresses, so consecutive calls never see the same buffers.

cupti     : CUPTI activity records through torch.profiler: per iteration, last end minus
            first start over every kernel, memcpy and memset the iteration launched, on any
            stream or device. Also gives the per-iteration sum of those activities' durations.
            The default on CUDA (`auto`; see AUTO_CHAIN for the fallbacks).
graph     : `launches` calls captured in one CUDA graph; replay time / launches. No Python
            launch overhead; kernels run back to back.
events    : CUDA events around one call, with a device-wide sync before the end event so
            work the op put on other streams is counted. Includes the host's launch overhead
            (what a Python caller pays per call), so it overstates microsecond kernels.
wallclock : host perf_counter around one call (CPU ops); labelled as such in every record.

Before the graph and cupti spans a short spin kernel holds the stream while the host queues
the work (nvbench's blocking-kernel idea), so the host's launch latency and the gaps between
a multi-kernel op's launches stay outside the span.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import functools
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mini_kv.settings import AUTO_CHAIN, CUDA_METHODS, DEFAULTS, RunSettings, check_options
from mini_kv.worker.compare import plain_tensors

TIMER_LABELS = {
    "events": "CUDA events per launch (device-wide sync before the end event; includes launch overhead)",
    "graph": "CUDA events around a CUDA-graph replay of N launches, divided by N",
    "cupti": "CUPTI activity records (torch.profiler): last end - first start over all streams",
    "wallclock": "host wall clock (perf_counter)",
}

# A spin kernel holds the stream while the host queues the timed work. Cycles are counted at
# this clock; a slower real clock only makes the hold longer, which is harmless.
HOLD_CLOCK_HZ = 2.0e9
GRAPH_HOLD_US = 100.0
CUPTI_MIN_HOLD_US = 100.0
CUPTI_MARGIN_US = 50.0
CUPTI_MAX_HOLD_US = 20_000.0
# The hold is sized by the slowest host launch of the latest calls, not of all: one slow call (a
# collection, a page fault) held every later sample of the batch that long (about 0.4 ms a sample
# on an H100 where the calls launch in 0.1 ms). A call that launches slower than the hold only
# lengthens its own sample: the span then holds its launch gaps, against the candidate.
CUPTI_HOLD_WINDOW = 8
CUPTI_WARMUP = 2
ITERATION_MARK = "mini_kv::timed_iteration#"

Call = Callable[[], object]


class TimingError(RuntimeError):
    """A method cannot time this op (capture refused, no device work seen); `auto` falls back."""


class GraphCaptureError(TimingError):
    pass


class CuptiUnavailableError(TimingError):
    pass


class NoDeviceWorkError(RuntimeError):
    """The op launched no device work: every GPU method would time nothing, so no fallback."""


class TimingGuardError(RuntimeError):
    pass


class DeferredWorkError(RuntimeError):
    """A timed call's output changed between its return and the end of its batch: work deferred to later
    calls (cross-call batching) or left running. The subject reports it as DEFERRED_WORK."""


@dataclass
class Measurement:
    method: str
    samples: list[float]  # microseconds per call
    calls_per_sample: int = 1
    # cupti only: per iteration, the sum of the durations of its kernels, memcpys and memsets (µs)
    kernel_us: list[float] | None = None
    notes: dict = field(default_factory=dict)


class CallRotation:
    """Input sets to rotate through; each call takes the next, continuing across measurements.

    `written(k)`, where given, is (what the latest call on set k returned, set k's arguments, DPS
    outputs among them): fingerprinted when each timed call returns, outside the timed span
    (`returned`), and again later: a returned value once DEFERRED_WINDOW more calls have run (fewer when
    they hold more than DEFERRED_BYTES) and after the batch's final sync, a set's arguments after that
    sync (`settled`). A change is work the call left for later: a candidate that batches its calls
    (returns unwritten outputs and writes them in one merged pass in a later call) or finishes call j's
    output in call j+1 shrinks the time per call. (An honest call never writes a returned output again:
    one output handed back twice is already REPLAYED_RESULT.)

    A fingerprint is one copy kernel and no wait; the pairs to compare are kept and compared together
    in `settled`, with one wait per batch: compared one by one, each timed call paid a sync and a few
    launches, which doubled a GPU sample's wall time (benchmarks/sample_cost.py)."""

    remote = False  # a candidate's rotation lives in the subject (worker.remote.RemoteWorkload)

    def __init__(self, calls: Sequence[Call], written: Callable[[int], tuple] | None = None):
        if not calls:
            raise ValueError("no calls to time")
        self.calls = list(calls)
        self.pos = 0
        self.written = written
        self._window: collections.deque = collections.deque()  # (set, returned value, its fingerprint)
        self._args: dict[int, list[torch.Tensor]] = {}  # set -> its arguments' fingerprint
        self._held = 0  # bytes of the returned values the window keeps alive
        self._pairs: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]] = []  # (set, before, after)

    def __len__(self) -> int:
        return len(self.calls)

    def close(self) -> None:
        """Timing is over: what the rotation holds may go (the sets, the latest outputs)."""
        self.calls, self._window, self._args, self._pairs = [], collections.deque(), {}, []

    def next(self) -> Call:
        fn = self.calls[self.pos % len(self.calls)]
        self.pos += 1
        return fn

    def returned(self) -> None:
        """The call just timed has returned (and, on CUDA, was synchronised): fingerprint what it wrote."""
        if self.written is None:
            return
        k = (self.pos - 1) % len(self.calls)
        value, args = self.written(k)
        if value is None:  # destination-passing: what it wrote is among its arguments
            self._args[k] = fingerprint(args)
        self._window.append((k, value, fingerprint(value)))
        self._held += _nbytes(value)
        # the outputs held for a later look stay few and small: a large workload's would fill the device
        while len(self._window) > 1 and (len(self._window) > DEFERRED_WINDOW or self._held > DEFERRED_BYTES):
            k0, value0, before = self._window.popleft()
            self._held -= _nbytes(value0)
            self._pairs.append((k0, before, fingerprint(value0)))

    def settled(self, device: str) -> None:
        """After a batch: every fingerprint taken must still hold (DeferredWorkError otherwise)."""
        if not self._window and not self._args and not self._pairs:
            return
        if is_cuda(device):
            torch.cuda.synchronize()
        pairs = self._pairs + [(k, before, fingerprint(value)) for k, value, before in self._window]
        pairs += [(k, before, fingerprint(self.written(k)[1])) for k, before in sorted(self._args.items())]
        self._window, self._args, self._pairs, self._held = collections.deque(), {}, [], 0
        changed = _first_changed(pairs)
        if changed is not None:
            raise DeferredWorkError(
                f"input set {changed}: what a timed call wrote changed after the call returned (work "
                "deferred to later calls, or left running)"
            )


DEFERRED_WINDOW = 16  # timed calls after which a returned output is fingerprinted again
DEFERRED_BYTES = 256 * 2**20  # at most this much of returned outputs kept alive for it (at least one)


def _nbytes(value) -> int:
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _first_changed(pairs: list[tuple[int, list[torch.Tensor], list[torch.Tensor]]]) -> int | None:
    """The input set of the first (set, before, after) whose fingerprints differ, else None. Where every
    pair agrees in count, shapes and devices (known on the host), each device's bytes are compared at
    once (one wait for it); one pair at a time only to name the set once something differs."""
    same_layout = all(
        len(before) == len(after)
        and all(b.shape == a.shape and b.device == a.device for b, a in zip(before, after, strict=True))
        for _, before, after in pairs
    )
    if same_layout:
        by_device: dict[torch.device, tuple[list, list]] = collections.defaultdict(lambda: ([], []))
        for _, before, after in pairs:
            for b, a in zip(before, after, strict=True):
                by_device[b.device][0].append(b)
                by_device[b.device][1].append(a)
        if all(torch.equal(torch.cat(bs), torch.cat(as_)) for bs, as_ in by_device.values()):
            return None
    return next(k for k, before, after in pairs if not _same(before, after))


def _same(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return len(before) == len(after) and all(
        b.device == a.device and torch.equal(b, a) for b, a in zip(before, after, strict=True)
    )


FINGERPRINT_ELEMENTS = 4096  # per tensor: a deferred output is written whole, so a sample shows it


def fingerprint(value) -> list[torch.Tensor]:
    """The bytes of up to FINGERPRINT_ELEMENTS evenly spaced elements of every tensor in `value` (nested
    tuples, lists, dicts), copied with one kernel each: cheap enough to take after every timed call,
    outside its span."""
    out: list[torch.Tensor] = []
    for v in plain_tensors(value):
        if v.layout == torch.strided:
            with torch.no_grad():
                flat = v.detach().reshape(-1)
                step = max(1, flat.numel() // FINGERPRINT_ELEMENTS)
                # a copy of the strided view is contiguous: its bytes viewed without a second copy
                out.append(flat[::step].clone(memory_format=torch.contiguous_format).view(torch.uint8))
    return out


def as_workload(calls: Call | Sequence[Call] | CallRotation) -> CallRotation:
    if isinstance(calls, CallRotation):
        return calls
    return CallRotation([calls] if callable(calls) else calls)


def is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def method_chain(requested: str, device: str) -> list[str]:
    """The methods to try in order: `auto` resolves to a fallback chain, anything else to itself."""
    check_options(requested, "hot", device)
    if requested == "auto":
        return list(AUTO_CHAIN) if is_cuda(device) else ["wallclock"]
    return [requested]


# ---------------------------------------------------------------------------------------- L2


def _loaded_libraries(fragment: str) -> list[str]:
    """Paths of shared libraries already mapped into this process (the runtime torch itself uses)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if fragment in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isfile(p))


@functools.cache
def persisting_l2_reset() -> tuple[Callable[[], int] | None, str]:
    """The call that resets persisting L2 lines, and how it was found.

    torch.cuda.cudart() binds only a handful of runtime calls (no cudaCtxResetPersistingL2Cache
    as of torch 2.11), so the runtime library torch already loaded is called through ctypes,
    and failing that the driver's cuCtxResetPersistingL2Cache on the current context.
    """
    fn = getattr(torch.cuda.cudart(), "cudaCtxResetPersistingL2Cache", None)
    if fn is not None:
        return (lambda: int(fn())), "torch.cuda.cudart().cudaCtxResetPersistingL2Cache"
    tried: list[str] = []
    found = _cuda_calls(("cudaCtxResetPersistingL2Cache",), ("cuCtxResetPersistingL2Cache",), tried)
    if not found:
        return None, "not available" + (f" ({'; '.join(tried)})" if tried else "")
    (f,), lib = found[0]
    f.restype, f.argtypes = ctypes.c_int, []
    return f, f"{f.__name__} via ctypes on {lib}"


def _cuda_calls(runtime: tuple, driver: tuple, tried: list) -> list[tuple[list, str]]:
    """The named calls of the CUDA runtime torch loaded, else of the driver, through ctypes: (the calls,
    the library) of each library that has them all; why each other one did not, added to `tried`."""
    found = []
    for names, libs in (
        (runtime, _loaded_libraries("libcudart")),
        (driver, _loaded_libraries("libcuda.so") or ["libcuda.so.1"]),
    ):
        for path in libs:
            try:
                lib = ctypes.CDLL(path)
                found.append(([getattr(lib, n) for n in names], os.path.basename(path)))
            except (OSError, AttributeError) as exc:
                tried.append(f"{os.path.basename(path)}: {exc}")
    return found


# cudaLimitPersistingL2CacheSize, CU_LIMIT_PERSISTING_L2_CACHE_SIZE
CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06


@functools.cache
def persisting_l2_limit() -> tuple[Callable[[int], int] | None, Callable[[], int] | None, str]:
    """(set, get, how): the device's persisting-L2 limit (the set-aside a kernel's access-policy window may
    keep lines in across a flush), through the runtime torch loaded or else the driver (ctypes, as
    persisting_l2_reset finds them). `set(0)` before every timed call leaves a candidate no carve-out."""
    found = _cuda_calls(("cudaDeviceSetLimit", "cudaDeviceGetLimit"), ("cuCtxSetLimit", "cuCtxGetLimit"), [])
    if not found:
        return None, None, "not available"
    (setter, getter), lib = found[0]
    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]
    getter.restype, getter.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]

    def set_limit(nbytes: int) -> int:
        return int(setter(CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE, nbytes))

    def get_limit() -> int:
        value = ctypes.c_size_t(0)
        rc = getter(ctypes.byref(value), CUDA_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return int(value.value) if rc == 0 else -1

    return set_limit, get_limit, f"{setter.__name__}(persisting L2, 0) via ctypes on {lib}"


FLUSH_METHOD = "read"  # how L2Flusher empties L2: a reduction over the buffer (see L2Flusher)


def l2_cache_bytes(device: str) -> int | None:
    """The L2 cache size of a CUDA device (None where torch does not say)."""
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 0) or None


class L2Flusher:
    """Before each sample, outside the timed span, on CUDA: the persisting-L2 limit set to 0 (hot and cold:
    a candidate that sets one, with an access-policy window on its data, keeps those lines through a
    flush and a reset). Cold-L2 mode also reads a buffer of >= 2x the L2 size and resets persisting-L2
    lines; then waits for both, so the span starts on an idle GPU with a cold L2.

    The flush reads rather than writes (FLUSH_METHOD): a memset leaves L2 full of dirty lines that the
    timed kernel must first write back to HBM, which on an H200 added 17% to a 2^24-element fp16 add
    against Nsight Compute's own cache control (benchmarks/l2_flush_ncu.py). A read evicts the previous
    sample's dirty lines during the flush and leaves only clean lines behind."""

    def __init__(self, device: str, enabled: bool):
        self.enabled = enabled and is_cuda(device)
        self.buf = None
        self.l2_bytes = None
        self.persisting = "not needed (hot L2)"
        self._reset = None
        self._no_carve_out, self.limit = None, "not needed (not CUDA)"
        if is_cuda(device):
            self._no_carve_out, _, self.limit = persisting_l2_limit()
        if self.enabled:
            self.l2_bytes = l2_cache_bytes(device)
            flush_bytes = 2 * (self.l2_bytes or 64 * 2**20)
            self.buf = torch.ones(flush_bytes // 4, dtype=torch.int32, device=device)
            self._sink = torch.empty((), dtype=torch.int32, device=device)
            self._reset, self.persisting = persisting_l2_reset()

    def __call__(self) -> None:
        if self._no_carve_out is not None and self._no_carve_out(0) != 0:
            self._no_carve_out, self.limit = None, f"failed via {self.limit}"  # say so once, stop calling it
        if not self.enabled:
            return
        # reads every line of the buffer, writes 4 bytes; accumulated in int32 (it wraps: the value is
        # never read), as the default int64 sum took 240 µs where this takes 75 (H100, 100 MB)
        torch.sum(self.buf, 0, dtype=torch.int32, out=self._sink)
        if self._reset is not None:
            rc = self._reset()
            if rc != 0:  # an error from the runtime: say so once, and stop calling it
                self._reset, self.persisting = None, f"failed (CUDA error {rc}) via {self.persisting}"
        torch.cuda.synchronize()

    def describe(self) -> Flush:
        flush_bytes = None if self.buf is None else self.buf.numel() * 4
        reset = self.persisting if self.enabled else "not needed (hot L2)"
        return Flush(flush_bytes, FLUSH_METHOD if self.enabled else None, self.l2_bytes, reset, self.limit)


@dataclass(frozen=True)
class Flush:
    """How L2Flusher flushed (benchmark.json's `l2_flush` of a cold-L2 case)."""

    flush_bytes: int | None
    flush_method: str | None
    l2_bytes: int | None
    persisting_l2_reset: str
    persisting_l2_limit: str


def _hold(us: float) -> None:
    """Keep the current stream busy for about `us` µs, so work queued behind it starts back to back."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None and us > 0:
        sleep(int(us * 1e-6 * HOLD_CLOCK_HZ))


# ---------------------------------------------------------------------------------- methods


def _events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def time_events(calls: CallRotation, samples: int, flush: L2Flusher) -> Measurement:
    out = []
    for _ in range(samples):
        fn = calls.next()
        flush()
        start, end = _events()
        start.record()
        fn()
        torch.cuda.synchronize()  # whole device: side-stream work is inside the span
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
        calls.returned()
    return Measurement("events", out)


def _describe_failure(exc: BaseException) -> str:
    # torch.cuda.graph's exit raises its own error and hides the one that broke the capture
    msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    ctx = exc.__cause__ or exc.__context__
    if ctx is not None and str(ctx).strip():
        msg += f" (first: {type(ctx).__name__}: {str(ctx).strip().splitlines()[0]})"
    return msg[:600]


def time_graph(calls: CallRotation, samples: int, flush: L2Flusher, launches: int) -> Measurement:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(
        stream
    ):  # warm-up on a side stream: lazy init and allocator growth stay out of capture
        for _ in range(len(calls)):
            calls.next()()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(launches):
                calls.next()()
    except Exception as exc:  # noqa: BLE001 - the op cannot be captured: a fact about it, not a crash
        del graph
        torch.cuda.synchronize()  # a failed capture must leave the device usable; if not, this raises
        raise GraphCaptureError(f"CUDA graph capture failed: {_describe_failure(exc)}") from exc
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        flush()
        _hold(GRAPH_HOLD_US)
        start, end = _events()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / launches)
    del graph
    return Measurement("graph", out, calls_per_sample=launches)


_RUNTIME_NAME = re.compile(r"^cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch, ...


def _activity(ev) -> str | None:
    fn = getattr(ev, "activity_type", None)
    if fn is None:
        return None
    try:
        return str(fn()).lower()
    except Exception:  # noqa: BLE001 - older bindings: fall back on names
        return None


_HOST_KINDS = ("cpu_op", "user_annotation", "python_function", "cpu_instant_event")
_NOT_WORK = ("annotation", "sync", "overhead", "correlation", "marker")


def _is_runtime(ev, activity: str | None) -> bool:
    """A host-side CUDA runtime or driver call (cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch...)."""
    if activity:
        if "runtime" in activity or "driver" in activity:
            return True
        if any(k in activity for k in _HOST_KINDS):
            return False
    return bool(_RUNTIME_NAME.match(ev.name()))


def _is_device_work(ev, activity: str | None, annotations: set[str]) -> bool:
    """Kernels, memcpys and memsets count; GPU-side copies of record_function ranges and sync records do not."""
    if activity:
        if any(k in activity for k in ("kernel", "memcpy", "memset")):
            return True
        if any(k in activity for k in _NOT_WORK):
            return False
    name = ev.name()
    return not (name.startswith(ITERATION_MARK) or name in annotations or "synchroniz" in name.lower())


def iteration_activity(events, iterations: int) -> list[dict]:
    """Group the profiler's device activities by timed iteration.

    An activity belongs to iteration j when the host call that launched it (the CUDA runtime or
    driver record with the same correlation id) started inside iteration j's marker range. An
    activity with no launch record (launched by a thread the profiler did not see) is placed by
    its own start time. Returns, per iteration: span_ns, busy_ns, count, unattributed.
    """
    cuda_type = torch.autograd.DeviceType.CUDA
    windows: list[tuple[int, int, int]] = []
    launch_at: dict[int, int] = {}
    annotations: set[str] = set()
    device = []
    for ev in events:
        name = ev.name()
        activity = _activity(ev)
        if ev.device_type() == cuda_type:
            device.append((ev, activity))
        elif name.startswith(ITERATION_MARK):
            windows.append((ev.start_ns(), ev.end_ns(), int(name[len(ITERATION_MARK) :])))
        elif _is_runtime(ev, activity):
            launch_at[ev.correlation_id()] = ev.start_ns()
        else:
            annotations.add(name)
    windows.sort()
    starts = [w[0] for w in windows]
    per = [
        {"first": None, "last": None, "busy_ns": 0, "count": 0, "unattributed": 0} for _ in range(iterations)
    ]
    for ev, activity in device:
        if not _is_device_work(ev, activity, annotations):
            continue
        t = launch_at.get(ev.correlation_id())
        guessed = t is None
        if guessed:
            t = ev.start_ns()
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > windows[i][1]:
            continue  # launched outside every timed iteration: the flush, the hold, warm-up work
        rec = per[windows[i][2]]
        start, end = ev.start_ns(), ev.start_ns() + ev.duration_ns()
        rec["first"] = start if rec["first"] is None else min(rec["first"], start)
        rec["last"] = end if rec["last"] is None else max(rec["last"], end)
        rec["busy_ns"] += ev.duration_ns()
        rec["count"] += 1
        rec["unattributed"] += guessed
    for rec in per:
        rec["span_ns"] = (rec["last"] - rec["first"]) if rec["count"] else 0
    return per


def _spin_host(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


@contextlib.contextmanager
def _host_ops_unrecorded():
    """The profiler records no host op of this thread meanwhile (torch's RecordFunction off): the
    flush, the hold and the deferred-work fingerprints between timed calls. Their kernels and launches
    are still CUPTI's records, placed outside every iteration; what goes is a dozen host records a
    sample that cost time to write and to read back (benchmarks/sample_cost.py: "recorded")."""
    torch.autograd._enable_record_function(False)
    try:
        yield
    finally:
        torch.autograd._enable_record_function(True)


def cupti_session():
    """A kineto session recording host ranges and CUDA activity (CUPTI), not yet started.

    torch.autograd.profiler.profile, the session torch.profiler.profile wraps, is used directly:
    torch.profiler's prepare_trace probes `hasattr(torch, "_inductor")`, and that probe imports
    inductor, dynamo and sympy, about 5 s on an H200 in a process's first session (0.4 s without it;
    docs/sol-execbench.md), for nothing a timer reads."""
    from torch.autograd.profiler import profile

    return profile(use_cpu=True, use_device="cuda", use_kineto=True)


def warm_cupti() -> None:
    """Pay the first session's start-up (CUPTI, the CUDA context) now: one session around a tiny op."""
    with cupti_session():
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()


def time_cupti(
    calls: CallRotation, samples: int, flush: L2Flusher, warmup: int = CUPTI_WARMUP
) -> Measurement:
    """torch's profiler ships with torch and reads CUPTI's activity API, so no extra package is needed."""
    from torch.autograd.profiler import record_function

    total = warmup + samples
    hold_us = 2 * CUPTI_MIN_HOLD_US
    host_us: collections.deque = collections.deque(maxlen=CUPTI_HOLD_WINDOW)  # the latest calls' host µs
    profiler_on = getattr(torch._C._autograd, "_profiler_enabled", None)
    if profiler_on is not None and profiler_on():
        # starting a second one would succeed and then stop the first one's trace under it
        raise CuptiUnavailableError("another torch.profiler is already running in this process")
    try:
        prof = cupti_session()
        prof.__enter__()
    except Exception as exc:  # noqa: BLE001 - e.g. another profiler is running: fall back
        raise CuptiUnavailableError(f"torch.profiler could not start: {_describe_failure(exc)}") from exc
    try:
        for j in range(total):
            with _host_ops_unrecorded():
                flush()
                torch.cuda.synchronize()
                _hold(hold_us)
                # Our own launches (flush, hold) stay CUPTI_MARGIN_US away from the marker range, so a
                # small offset between the profiler's host clocks cannot pull them into an iteration.
                _spin_host(CUPTI_MARGIN_US)
            with record_function(f"{ITERATION_MARK}{j}"):
                t0 = time.perf_counter()
                calls.next()()
                host_us.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()  # inside the range: launches from other threads until now count
            with _host_ops_unrecorded():
                _spin_host(CUPTI_MARGIN_US)
                calls.returned()  # after the margin: its copies stay outside every iteration's range
            # the hold must outlast the margin and the host's launching, or launch gaps leak into the span
            hold_us = min(
                CUPTI_MAX_HOLD_US, max(CUPTI_MIN_HOLD_US, CUPTI_MARGIN_US + 2 * max(host_us) + 20.0)
            )
    except BaseException:
        with contextlib.suppress(Exception):
            prof.__exit__(None, None, None)
        raise  # the op's own error, not the profiler's
    try:
        prof.__exit__(None, None, None)
        events = prof.kineto_results.events()
    except Exception as exc:  # noqa: BLE001
        raise CuptiUnavailableError(
            f"torch.profiler could not collect the trace: {_describe_failure(exc)}"
        ) from exc
    if not any(ev.device_type() == torch.autograd.DeviceType.CUDA for ev in events):
        # not even our hold kernels were recorded: CUPTI is not tracing on this machine
        raise CuptiUnavailableError("torch.profiler recorded no GPU activity at all (CUPTI not tracing)")
    per = iteration_activity(events, total)[warmup:]
    empty = [i for i, rec in enumerate(per) if rec["count"] == 0]
    if len(empty) == len(per):
        raise NoDeviceWorkError(
            "the op launched no CUDA kernel: CUPTI saw no kernel, memcpy or memset in any "
            "timed iteration (does it run on the GPU at all?)"
        )
    if empty:
        raise NoDeviceWorkError(
            f"{len(empty)} of {len(per)} timed iterations launched no CUDA kernel, memcpy or "
            f"memset (first: iteration {empty[0]}): the op skips work on some calls"
        )
    return Measurement(
        "cupti",
        [rec["span_ns"] / 1e3 for rec in per],
        kernel_us=[rec["busy_ns"] / 1e3 for rec in per],
        notes={
            "activities_per_iteration": sorted({rec["count"] for rec in per}),
            "unattributed": sum(rec["unattributed"] for rec in per),
            "hold_us": round(hold_us, 1),
        },
    )


def time_wallclock(calls: CallRotation, samples: int, device: str) -> Measurement:
    cuda = is_cuda(device)
    out = []
    for _ in range(samples):
        fn = calls.next()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
        calls.returned()
    return Measurement("wallclock", out)


def measure(
    calls: Call | Sequence[Call] | CallRotation,
    method: str,
    samples: int,
    device: str,
    flush: L2Flusher,
    launches: int = 20,
) -> Measurement:
    """Time `samples` calls with `method`; the thread count must not change while timing."""
    calls = as_workload(calls)
    if method in CUDA_METHODS and not is_cuda(device):
        raise ValueError(f"timing method {method!r} needs a CUDA device, not {device}")
    if calls.remote:  # timed next to the candidate, in the subject, bounded by this process's clock
        return calls.measure(method, samples, device, flush.enabled, launches)
    threads_before = threading.active_count()
    if method == "events":
        res = time_events(calls, samples, flush)
    elif method == "graph":
        res = time_graph(calls, samples, flush, launches)
    elif method == "cupti":
        res = time_cupti(calls, samples, flush)
    elif method == "wallclock":
        res = time_wallclock(calls, samples, device)
    else:
        raise ValueError(f"unknown timing method {method!r}")
    calls.settled(device)
    if threading.active_count() != threads_before:
        raise TimingGuardError(
            f"thread count changed during timing ({threads_before} -> "
            f"{threading.active_count()}): work may be escaping the timer"
        )
    return res


# ------------------------------------------------------------------------------ adaptive sampling


def measure_until(
    calls: Call | Sequence[Call] | CallRotation,
    method: str,
    rule,
    device: str,
    flush: L2Flusher,
    launches: int = 20,
    per_sample_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    measure_fn: Callable[..., Measurement] | None = None,
    floor: int = 1,
) -> Measurement:
    """Time batches with `method` until `rule` (stats.StoppingRule) says stop; one Measurement of
    every sample taken, with `notes["sampling"]` = {taken, stopped, batches, rel_ci}.

    Both front doors time through here, so the stopping rule is applied alike for every method. A batch
    is one `measure` call (one profiler session for cupti, one graph capture for graph), so batches
    grow geometrically rather than one sample at a time. `per_sample_s` estimates one sample's cost
    before the first batch (from the warm-up), so a slow op's first batch already fits the budget.
    `floor` (sample_floor): the budget does not stop sampling before that many samples."""
    from mini_kv import stats
    from mini_kv.status import StopReason

    measure_fn = measure_fn or measure
    calls = as_workload(calls)
    samples: list[float] = []
    kernel: list[float] = []
    notes: dict = {}
    batches = 0
    t0 = clock()
    cost = per_sample_s
    while True:
        elapsed = clock() - t0
        stop, n = stats.sampling_step(rule, samples, elapsed, cost)
        if stop == StopReason.BUDGET and len(samples) < floor:
            stop, n = None, floor - len(samples)
        if stop is not None:
            break
        m = measure_fn(calls, method, n, device, flush, launches)
        batches += 1
        samples.extend(m.samples)
        if m.kernel_us is not None:
            kernel.extend(m.kernel_us)
        notes.update(m.notes)
        cost = (clock() - t0) / len(samples)
    notes["sampling"] = {
        "taken": len(samples),
        "stopped": str(stop),
        "batches": batches,
        "rel_ci": _finite_or_none(stats.median_rel_ci(samples)),
        "seconds": round(clock() - t0, 4),
    }
    return Measurement(method, samples, launches if method == "graph" else 1, kernel or None, notes)


def sample_floor(settings: RunSettings, budget_s: float | None, reference_s: float | None) -> int:
    """The fewest samples each measurement of a case takes, whatever its budget has left: the minimum
    count (`min_samples`), lowered only where the reference itself could not take that many in its share
    of the whole budget (`reference_s`: one reference call's seconds in the warm-up, measured by the
    judge). The candidate cannot steer it: a candidate that sleeps in its warm-up calls spends the budget
    that sizes the batches (without a floor, both sides then stopped after one sample, the candidate's
    choice of which), not this count."""
    least = settings.min_samples
    if settings.fixed_count is not None or not budget_s or not math.isfinite(budget_s) or not reference_s:
        return least
    share = budget_s * (1 - DEFAULTS.warmup_share) / (2 * max(1, settings.repeats))
    return max(1, min(least, int(share / reference_s)))


def _finite_or_none(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


@dataclass(frozen=True)
class Warmup:
    """The warm-up's calls of each side, the seconds one call of each side took (None without a
    warm-up: what sizes the first timed batch) and the warm-up's seconds in all."""

    calls: int
    seconds_per_call: list
    seconds: float


def warm_up(
    sides: Sequence[CallRotation], count: int, limit_s: float, device: str, clock=time.perf_counter
) -> Warmup:
    """`count` untimed calls of each side, in turn, but no new round once `limit_s` is spent (at least one
    round: lazy initialisation stays out of the timed span)."""
    t0 = clock()
    per_side = [0.0] * len(sides)
    done = 0
    for _ in range(count):
        for i, side in enumerate(sides):
            t = clock()
            side.next()()
            if is_cuda(device):
                torch.cuda.synchronize()
            per_side[i] += clock() - t
        done += 1
        if clock() - t0 >= limit_s:
            break
    cost = [s / done for s in per_side] if done else [None] * len(sides)
    return Warmup(done, cost, round(clock() - t0, 4))


def repeat_target(settings: RunSettings, repeats: int) -> float:
    """The interval one of `repeats` measurements of a side samples to. The target is the precision of
    the P50 a case reports, which pools every repeat's samples: n samples in each of R repeats narrow
    its interval by sqrt(R) against one repeat's, so each repeat stops at target * sqrt(R), but never
    looser than settings.repeat_ci_of_max_cv * max_cv, so an honest run's medians scatter well inside the
    stability gate (with 5 repeats: 1.1 % for the 0.5 % CUDA default; the
    2 % CPU default stays 2 %)."""
    target = settings.target_rel_ci
    if repeats <= 1:
        return target
    cap = DEFAULTS.repeat_ci_of_max_cv * settings.cv_limits[0]
    return max(target, min(target * math.sqrt(repeats), cap))


def stopping_rule(settings: RunSettings, budget_s: float, repeats: int = 1):
    """The stats.StoppingRule of one of `repeats` measurements of a side, given the seconds it
    may take (its interval target: repeat_target)."""
    from mini_kv import stats

    return stats.StoppingRule(
        target_rel_ci=repeat_target(settings, repeats),
        min_samples=settings.min_samples,
        max_samples=max(settings.max_samples, settings.min_samples),
        budget_s=max(1e-6, budget_s),
        fixed=settings.fixed_count,
    )
