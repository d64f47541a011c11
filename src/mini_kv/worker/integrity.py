"""Defences against candidates that cheat, shared by the task-card worker and the SOL-ExecBench worker.

The candidate runs in the same process as the checks and timers (it must, to be timed on the same
stream), so whatever it can reach it can change. The defences here are the ones that run inside
that process: every one ends in a reason code, recorded in the case record (task cards) or in the
log of a REWARD_HACK trace (SOL-ExecBench). What needs a place the candidate cannot reach (the
signed result channel, the files of the verifier) is checked by the parent, `mini_kv.runner`.
docs/integrity.md has the threat model and the cost of each check.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import hmac
import importlib
import itertools
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from mini_kv.status import VIOLATIONS, violation_status
from mini_kv.worker.compare import fp64_chunks, plain_tensors, raw_bytes

# reason code -> what it means; the codes, their statuses and meanings are mini_kv.status.VIOLATIONS
CODES = {code: v.meaning for code, v in VIOLATIONS.items()}


class Violation(Exception):
    """A defence fired: `code` is one of CODES, the message says what was seen."""

    def __init__(self, code: str, message: str):
        assert code in CODES, code
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message

    @property
    def status(self):
        """The verdict for it, the same in both front doors (status.VIOLATIONS)."""
        return violation_status(self.code)


# ------------------------------------------------------------------------------ harness snapshot

# Functions whose replacement would change a verdict or a time. Identity is compared, so a
# candidate that rebinds any of them (module attribute, class attribute) is caught.
WATCHED_MODULES = {
    "mini_kv.worker.timing": tuple(
        (
            "measure measure_until time_cupti time_graph time_events time_wallclock iteration_activity L2Flusher "
            "CallRotation"
        ).split()
    ),
    "mini_kv.worker.compare": tuple(
        (
            "compare tensor_errors values_match fp64_chunks chunk_errors CPU_CHUNK inputs_unchanged "
            "raw_bytes compare_matched"
        ).split()
    ),
    "mini_kv.worker.engine": (
        "correctness",
        "time_case",
        "post_check",
        "call",
        "choose_method",
        "SampledRepeats",
    ),
    "mini_kv.worker.formats": ("CardFormat", "SolFormat", "evaluate_workload"),
    "mini_kv.worker.inputs": (
        "make_case_inputs clone_args case_seed make_inputs allocate_outputs normalize_outputs"
    ).split(),
    "mini_kv.stats": ("summarize_repeats", "summarize", "speedup", "stability", "sampling_step"),
    "mini_kv.worker.integrity": ("Guard", "check_output", "degenerate", "snapshot", "violations"),
}
_TORCH_FUNCS = ("allclose", "equal", "isclose", "isfinite", "isnan", "isinf", "where", "testing.assert_close")
_TENSOR_METHODS = tuple(
    (
        "__eq__ __ne__ __le__ __lt__ __ge__ __gt__ __sub__ __invert__ __and__ __or__ abs to cpu clone "
        "detach sum any all max isnan isinf clamp_min copy_ data_ptr untyped_storage float double"
    ).split()
)
_OTHER = {
    "time.perf_counter": (time, "perf_counter"),
    "time.perf_counter_ns": (time, "perf_counter_ns"),
    "time.monotonic": (time, "monotonic"),
    "time.time": (time, "time"),
    "threading.active_count": (threading, "active_count"),
    "hmac.new": (hmac, "new"),
    "hmac.compare_digest": (hmac, "compare_digest"),
    "hashlib.sha256": (hashlib, "sha256"),
    "json.dumps": (json, "dumps"),
    "torch.cuda.synchronize": (torch.cuda, "synchronize"),
    "torch.cuda.Event": (torch.cuda, "Event"),
    "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
    "torch.cuda.Event.record": (torch.cuda.Event, "record"),
    "torch.cuda.current_stream": (torch.cuda, "current_stream"),
    "torch.profiler.profile": (torch.profiler, "profile"),
    "torch.profiler.record_function": (torch.profiler, "record_function"),
    "torch.autograd.profiler.profile": (torch.autograd.profiler, "profile"),
    "torch.autograd.profiler.record_function": (torch.autograd.profiler, "record_function"),
}


def _resolve(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _watched_objects() -> Iterator[tuple[str, object]]:
    for mod, names in WATCHED_MODULES.items():
        try:
            module = importlib.import_module(mod)
        except ImportError:  # pragma: no cover - every module ships with mini_kv
            continue
        for name in names:
            yield f"{mod}.{name}", getattr(module, name)
    for name in _TORCH_FUNCS:
        yield f"torch.{name}", _resolve(torch, name)
    for name in _TENSOR_METHODS:
        yield f"torch.Tensor.{name}", getattr(torch.Tensor, name)
    for label, (owner, attr) in _OTHER.items():
        yield label, getattr(owner, attr)


def _precision_flags() -> Iterator[tuple[str, object]]:
    """Every switch that trades float32 accuracy for speed (a candidate that flips one is faster
    than the reference for a reason that is not its kernel, and less accurate afterwards)."""
    m, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    yield "torch.backends.cuda.matmul.allow_tf32", m.allow_tf32
    yield "torch.backends.cudnn.allow_tf32", cudnn.allow_tf32
    yield (
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        m.allow_fp16_reduced_precision_reduction,
    )
    yield (
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        m.allow_bf16_reduced_precision_reduction,
    )
    yield "torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision()
    yield "torch.backends.cudnn.enabled", cudnn.enabled
    yield "torch.backends.cudnn.deterministic", cudnn.deterministic
    for where, obj in (("cuda.matmul", m), ("cudnn", cudnn)):
        if hasattr(obj, "fp32_precision"):  # newer torch: per-backend precision strings
            yield f"torch.backends.{where}.fp32_precision", obj.fp32_precision


# set by torch itself the first time it compiles (opcheck's AOT test does)
_TORCH_SET_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})


@functools.cache
def _c_environ():
    """The C library's `environ` (setenv from C++ does not show in os.environ)."""
    try:
        return ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None


def _c_env_items() -> list[bytes]:
    env = _c_environ()
    if env is None:
        return []
    items, i = [], 0
    while env[i] is not None:
        items.append(env[i])
        i += 1
    return sorted(e for e in items if e.split(b"=", 1)[0].decode(errors="replace") not in _TORCH_SET_ENV)


def _process_state() -> Iterator[tuple[str, object]]:
    env = sorted((k, v) for k, v in os.environ.items() if k not in _TORCH_SET_ENV)
    yield "os.environ", hashlib.sha256(json.dumps(env).encode()).hexdigest()
    yield "environ (C)", hashlib.sha256(b"\0".join(_c_env_items())).hexdigest()
    yield "torch.get_num_threads()", torch.get_num_threads()
    yield "sys.gettrace()", id(sys.gettrace())
    yield "sys.getprofile()", id(sys.getprofile())
    yield "torch.are_deterministic_algorithms_enabled()", torch.are_deterministic_algorithms_enabled()


def _stream_state() -> tuple[int, int] | None:
    """(device, the current stream's handle) once CUDA is in use."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    dev = torch.cuda.current_device()
    return dev, torch.cuda.current_stream(dev).cuda_stream


@dataclass(frozen=True)
class Snapshot:
    """What the harness relies on, taken before any candidate code runs (snapshot): the watched objects,
    the precision switches, the process's state and the current CUDA stream."""

    objects: dict[str, object]
    precision: dict[str, object]
    process: dict[str, object]
    stream: tuple[int, int] | None


def snapshot() -> Snapshot:
    return Snapshot(
        dict(_watched_objects()), dict(_precision_flags()), dict(_process_state()), _stream_state()
    )


def violations(snap: Snapshot) -> list[tuple[str, str]]:
    """(code, message) for everything that differs from `snap`."""
    out, now = [], snapshot()
    replaced = sorted(n for n, obj in snap.objects.items() if now.objects.get(n) is not obj)
    if replaced:
        out.append(("HARNESS_TAMPERED", f"replaced {', '.join(replaced)}"))
    moved = sorted(k for k, v in snap.process.items() if now.process.get(k) != v)
    if moved:
        out.append(("HARNESS_TAMPERED", f"changed {', '.join(moved)}"))
    was, prec = snap.precision, now.precision
    flipped = [f"{k}: {was[k]!r} -> {prec.get(k)!r}" for k in sorted(was) if prec.get(k) != was[k]]
    if flipped:
        out.append(("PRECISION_FLAGS_CHANGED", "; ".join(flipped)))
    if snap.stream and now.stream != snap.stream:
        out.append(
            ("STREAM_SWITCHED", f"current CUDA stream {now.stream} is not the harness's {snap.stream}")
        )
    return out


# --------------------------------------------------------------------------------- threads


def os_threads() -> set[int]:
    """Thread ids of this process as the kernel sees them: C++ std::threads included (Python's
    threading.active_count sees only threads started from Python)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # not Linux: only Python threads are visible
        return {t.native_id for t in threading.enumerate() if t.native_id is not None}


class Guard:
    """Checks around one candidate call: harness intact, no thread left behind."""

    def __init__(self, snap: Snapshot):
        self.snap = snap
        self.calls = 0
        self.hold = StreamHold()
        self.hold_next = False  # hold the caller's stream during the next call (a call on fresh inputs)
        # whether the last call's stream-order check was skipped (the hold ended first); None: not held
        self.hold_skipped: bool | None = None

    def check(self, when: str) -> None:
        bad = violations(self.snap)
        if bad:
            code, msg = bad[0]
            raise Violation(code, f"{when}: {msg}" + "".join(f"; also {c}: {m}" for c, m in bad[1:]))

    def call(self, fn, args, device: str, when: str = "the call", outputs=()):
        """fn(*args), then: no new thread alive, on CUDA every output ready on the caller's stream
        when the call returned, the harness intact. `outputs` (DPS) are the buffers written."""
        cuda = torch.device(device).type == "cuda"
        hold_on, self.hold_next = cuda and self.hold_next, False
        self.hold_skipped = None
        before = os_threads()
        if hold_on:
            self.hold.start()
        t0 = time.perf_counter()
        out = fn(*args)
        host_s = time.perf_counter() - t0
        self.calls += 1
        # A library may start a worker pool on its first call (a JIT compiler, a runtime); a thread
        # per call, or one that still holds work, shows on a later call or in the output re-read.
        new = foreign_threads(os_threads() - before) if self.calls > 1 else set()
        early, held = [], []
        if cuda:
            written = cuda_tensors([out, *outputs])
            if hold_on:
                skipped = self.hold.skipped
                held = self.hold.snapshot(written, host_s)
                self.hold_skipped = self.hold.skipped > skipped
            # copies queued on the caller's stream before any sync: what a caller that trusts stream
            # order reads. Work left on an unjoined side stream has not landed in them yet.
            early = [(t, t.clone()) for t in written]
            torch.cuda.synchronize()
        self.check(f"after {when}")
        if new:
            raise Violation(
                "THREAD_ESCAPE", f"{when} left {len(new)} new thread(s) running after it returned"
            )
        for t, copy in held:
            # a constant output (all zeros: a zeros case) may equal memory nobody wrote yet; not evidence
            if same_bytes(t, copy) and not constant_bytes(t):
                raise Violation(
                    "STREAM_ESCAPE",
                    f"{when}: the output was written while the caller's stream was still held before the "
                    "call: by work on a stream not made to wait for the caller's",
                )
        for t, copy in early:
            if not same_bytes(t, copy):
                raise Violation(
                    "STREAM_ESCAPE",
                    f"{when}: the output changed after the call returned, on a stream "
                    "the caller's stream was not made to wait for",
                )
        return out


def cuda_tensors(value) -> list[torch.Tensor]:
    """The non-empty plain CUDA tensors in `value` (nested tuples, lists, dicts): what a call wrote."""
    return [v for v in plain_tensors(value) if v.is_cuda]


def constant_bytes(t: torch.Tensor) -> bool:
    """Every element of `t` has the same bytes."""
    b = raw_bytes(t).view(-1, t.element_size()) if t.element_size() else raw_bytes(t)
    return bool((b == b[:1]).all())


class StreamHold:
    """Stream order whatever the size of the work. Before a checked CUDA call the caller's stream is held
    by a spin kernel; when the call returns, each output is copied, again and again until the hold ends,
    on a stream of the harness's own that does not wait for it. The last copy that ended while the hold
    was still on (an event after the spin says so) is kept: no work ordered after the caller's stream
    can have run before it, so an output that it already shows with its final bytes was written by
    work on a stream that did not wait for the caller's (the cheat that made STREAM_ESCAPE depend on
    size: small side-stream work finished before the caller's copy of it ran). Copying until the hold
    ends, not once, gives such work the whole hold to land, however late a busy GPU (other processes'
    contexts take turns with ours) runs it. Where the hold ended before a first copy did (the call
    synchronised, its host side outlasted the spin, or other contexts had the GPU) the check is skipped
    and later holds last longer; each hold lasts three times the last call's host side, times that
    stretch, within [MIN_S, MAX_S]. Only calls on fresh inputs are held (the correctness rounds:
    remote.stream_hold_next), so no freed block can already hold the call's right answer; freed blocks
    of the last outputs' sizes are filled first too."""

    MIN_S, MAX_S = 0.001, 0.02
    CLOCK_HZ = 2.0e9  # the spin's cycles per second (a slower clock only holds longer)
    DOUBLE_BUFFER_BYTES = 1 << 30  # outputs larger than this together are copied once (memory)

    def __init__(self):
        self.seconds = self.MIN_S
        self.stretch = 1.0  # doubles with each skipped check (a busy GPU), never shrinks
        self.sizes: list[int] = []
        self.ended = None
        self.stream = None
        self.skipped = 0  # checks skipped because the hold had ended (docs: what it cannot see)

    def start(self) -> None:
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            self.ended = None
            return
        poison(self.sizes, "cuda")
        sleep(int(self.seconds * self.CLOCK_HZ))
        self.ended = torch.cuda.Event()
        self.ended.record()

    def snapshot(self, tensors: list[torch.Tensor], host_s: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(output, the last copy of it taken while the hold was on) for each output; [] when no copy
        ended before the hold did."""
        ended, self.ended = self.ended, None
        self.sizes = [t.numel() * t.element_size() for t in tensors]
        if ended is None or not tensors:
            self._next_hold(host_s)
            return []
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        rounds = 2 if sum(self.sizes) <= self.DOUBLE_BUFFER_BYTES else 1
        # allocated on the harness's stream: a block freed on the caller's stream may still be read or
        # written by the call's work queued behind the hold there
        with torch.cuda.stream(self.stream):
            buffers = [[torch.empty_like(t) for t in tensors] for _ in range(rounds)]
        kept = None
        # bounded by the host's clock too: a spin that never ends (a wedged GPU) must not hold the harness
        deadline = time.perf_counter() + 4 * self.seconds + 0.1
        for i in itertools.count():
            copies = buffers[i % rounds]
            with torch.cuda.stream(self.stream):
                for t, c in zip(tensors, copies, strict=True):
                    c.copy_(t)
                done = torch.cuda.Event()
                done.record()
            done.synchronize()
            if ended.query():  # the hold ended before this copy did: it may hold ordered work's bytes
                break
            kept = copies
            if rounds == 1 or time.perf_counter() > deadline:
                break
        if kept is None:
            self.skipped += 1
            self.stretch *= 2
        self._next_hold(host_s)
        return [] if kept is None else list(zip(tensors, kept, strict=True))

    def _next_hold(self, host_s: float) -> None:
        # the next hold outlasts this call's host side three times over (a one-off JIT build is forgotten)
        self.seconds = min(self.MAX_S, max(self.MIN_S, 3 * host_s) * self.stretch)


# CUDA driver and profiler threads start lazily (first launch on a device, first profiler session)
# and live on; they are not the candidate's work. A name is a weak test (a thread can rename
# itself), which docs/integrity.md records.
_RUNTIME_THREAD_PREFIXES = ("cuda", "cupti", "kineto")


def foreign_threads(tids: set[int]) -> set[int]:
    out = set()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip().lower()
        except OSError:
            continue  # gone already
        if not name.startswith(_RUNTIME_THREAD_PREFIXES):
            out.add(tid)
    return out


# ------------------------------------------------------------------------------ output checks


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """[start, end) of the bytes `t` can reach in its storage, or None for an empty tensor."""
    if t.numel() == 0:
        return None
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True)) + 1
    return start, start + extent * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    sa, sb = _span(a), _span(b)
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def plain_tensor_problem(out) -> str | None:
    """None when `out` is exactly a torch.Tensor backed by its own dense storage."""
    if type(out) is not torch.Tensor:
        return (
            f"output is a {type(out).__module__}.{type(out).__name__}, not exactly a torch.Tensor "
            "(a subclass can compute or change its values when read)"
        )
    if out.layout != torch.strided or out.is_meta or out.device.type not in ("cpu", "cuda"):
        return f"output has layout {out.layout} on {out.device}: not a dense tensor with real storage"
    if out.is_neg() or out.is_conj() or out._is_zerotensor():
        return "output is a lazy view (negation/conjugation bit or ZeroTensor) with no materialised values"
    if out.numel() == 0:
        return None
    try:
        nbytes = out.untyped_storage().nbytes()
        ptr = out.data_ptr()
    except (RuntimeError, NotImplementedError) as exc:
        return f"output has no real storage ({type(exc).__name__}: {exc})"
    if ptr == 0:
        return "output has a null data pointer"
    if (
        any(st == 0 for s, st in zip(out.shape, out.stride(), strict=True) if s > 1)
        or nbytes < out.numel() * out.element_size()
    ):
        return (
            f"output is a broadcast view: {out.numel()} elements over {nbytes} bytes of storage "
            f"(strides {list(out.stride())})"
        )
    return None


@dataclass(frozen=True)
class SubjectView:
    """What the subject saw of an output that the judge's copy of it cannot show: `finding`, a
    (code, message) of check_output's about the candidate's own tensor (a view of an input); `buf`, the
    buffer the copy is in; `same_memory`, the buffers of earlier outputs that the tensor shared memory
    with there."""

    finding: tuple[str, str] | None
    buf: int
    same_memory: frozenset[int]


# the judge's copies of outputs, by id() (worker/remote.py fills it and empties it as they go)
SUBJECT_VIEWS: dict[int, SubjectView] = {}


def check_output(out, inputs, reference_outputs=(), earlier_outputs=()) -> None:
    """Raise Violation unless `out` is a plain tensor that shares memory with none of `inputs`,
    the reference's outputs or the candidate's earlier outputs (all kept alive by the caller, so a
    freed buffer cannot be handed back). Something that is no tensor at all is left to the
    comparison (a wrong type is a contract failure, not a cheat). For an output copied out of the
    subject, what the subject saw of its memory counts the same (SUBJECT_VIEWS)."""
    if not isinstance(out, torch.Tensor):
        return
    seen = SUBJECT_VIEWS.get(id(out))
    found = (seen and seen.finding) or output_finding(out, inputs, reference_outputs, earlier_outputs)
    if not found and seen:
        earlier = {SUBJECT_VIEWS[id(e)].buf for e in earlier_outputs if id(e) in SUBJECT_VIEWS}
        if earlier & seen.same_memory:
            found = ("REPLAYED_RESULT", "the output is the same memory as an earlier call's output")
    if found:
        raise Violation(*found)


def output_finding(
    out: torch.Tensor, inputs, reference_outputs=(), earlier_outputs=()
) -> tuple[str, str] | None:
    """check_output's (code, message), or None."""
    msg = plain_tensor_problem(out)
    if msg:
        return "OUTPUT_NOT_PLAIN_TENSOR", msg
    for i, a in enumerate(inputs):
        if isinstance(a, torch.Tensor) and overlaps(out, a):
            return "OUTPUT_ALIASES_INPUT", f"the output shares memory with input {i}"
    for r in reference_outputs:
        if isinstance(r, torch.Tensor) and overlaps(out, r):
            return "OUTPUT_ALIASES_REFERENCE", "the output shares memory with the reference's output"
    for e in earlier_outputs:
        if isinstance(e, torch.Tensor) and overlaps(out, e):
            return "REPLAYED_RESULT", "the output is the same memory as an earlier call's output"
    return None


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    # on a's device: a host copy of a large CUDA output costs far more than the comparison
    return torch.equal(raw_bytes(a), raw_bytes(b.to(a.device)))


# ------------------------------------------------------------------------------- degenerate

MIN_SMALL = 16  # elements in the abs-tolerance region before its relative error is judged
MAX_MEDIAN_REL = 0.5


def _finite_pairs(out: torch.Tensor, ref: torch.Tensor):
    """FP64 chunks (compare.fp64_chunks) of `out` and `ref`, of the elements finite in both."""
    for _, o, r in fp64_chunks(out, ref):
        fin = o.isfinite() & r.isfinite()
        yield (o, r) if fin.all() else (o[fin], r[fin])


def _rel_where_small(o: torch.Tensor, r: torch.Tensor, atol: float) -> torch.Tensor:
    """|o - r| / |r| where 0 < |r| <= atol."""
    small = (r != 0) & (r.abs() <= atol)
    return (o[small] - r[small]).abs() / r[small].abs()


def degenerate(out: torch.Tensor, ref: torch.Tensor, atol: float) -> str | None:
    """An output that passed the tolerance without carrying the reference's information: all zeros or one
    constant while the reference varies, or, where the reference is below atol (so |out - ref| <= atol
    accepts anything small), a median relative error above 0.5 there (honest outputs agree to ~rtol;
    zeros or noise are off by 1 or more). Over the elements finite in both, in FP64 on the output's
    own device (a host round trip of a 60M-element output takes seconds), in chunks on the CPU."""
    if out.numel() < 2 or not (out.is_floating_point() and ref.is_floating_point()):
        return None
    n_fin = n_small = n_nonzero = 0
    first = None  # (out, ref) at the first element finite in both
    ref_varies = out_varies = False
    for o, r in _finite_pairs(out, ref):
        if not o.numel():
            continue
        first = first or (float(o[0]), float(r[0]))
        ref_varies = ref_varies or bool((r != first[1]).any())
        out_varies = out_varies or bool((o != first[0]).any())
        nonzero = r != 0
        n_fin += o.numel()
        n_small += int((nonzero & (r.abs() <= atol)).sum())
        n_nonzero += int(nonzero.sum())
    if n_fin < 2:
        return None
    if ref_varies and not out_varies:
        what = "all zeros" if first[0] == 0.0 else f"the constant {first[0]:g}"
        return f"the output is {what} while the reference varies"
    if n_small >= MIN_SMALL and n_small * 2 >= n_nonzero:
        # a second pass, taken only here (rare): the relative errors where the reference is small
        rel = torch.cat([_rel_where_small(o, r, atol) for o, r in _finite_pairs(out, ref)]).median()
        if float(rel) > MAX_MEDIAN_REL:
            return (
                f"where the reference is below atol={atol:g} ({n_small} elements) the output's "
                f"median relative error is {float(rel):.3g}: it passes the absolute tolerance without "
                "carrying the values"
            )
    return None


# ------------------------------------------------------------------------------------ inputs


def rewrite_in_place(targets, sources) -> None:
    """Write `sources`' values into `targets` without changing what identifies them: same data
    pointer, shape, Python id, and (written through `.data`) the same version counter. A result
    cache keyed on any of those hands back stale results afterwards."""
    with torch.no_grad():
        for t, s in zip(targets, sources, strict=True):
            if isinstance(t, torch.Tensor) and t.numel():
                t.data.copy_(s)


PERTURB_SHARE = 1 / 32  # of one input's elements, rewritten before a spot-checked batch


def perturb_in_place(targets, spares, rng) -> bool:
    """Rewrite one contiguous block (PERTURB_SHARE of its elements, at a random place) of one floating-point
    input, chosen at random by size, with the spare values there; in place as rewrite_in_place writes, so
    address, shape, id and version counter stay. The rest of the values stay too: a result cache keyed on
    the shape and a sample of the values (not the whole content) hits on the old key and hands back the
    old result, which the spot check then finds wrong in more than the tolerance's share of elements.
    Integer inputs (indices, offsets, lengths) are left whole: a mix of two valid ones may be invalid.
    False when there is no floating-point input to rewrite so."""
    pairs = [
        (t, s)
        for t, s in zip(targets, spares, strict=True)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and t.is_contiguous()
    ]
    if not pairs:
        return False
    t, s = rng.choices(pairs, weights=[t.numel() for t, _ in pairs])[0]
    n = t.numel()
    size = min(n, max(1, int(n * PERTURB_SHARE) + 1))
    start = rng.randrange(n - size + 1)
    with torch.no_grad():
        t.data.view(-1)[start : start + size].copy_(s.reshape(-1)[start : start + size])
    return True


def poison(sizes, device) -> None:
    """Fill freed blocks of the likely output sizes with NaN (0xFF bytes), so an output that is
    allocated and not written (handed back from a freed buffer) does not hold stale right values."""
    for nbytes in sizes:
        if nbytes > 0:
            torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device)  # allocated, filled, freed


# ------------------------------------------------------------------------------ whose kernels ran

# aten ops that move, shape, allocate or fill memory and compute nothing: a candidate with kernels of its
# own still calls them (an output allocated with torch.empty, a view, a copy into a DPS output)
STRUCTURAL_OPS = frozenset(
    (
        "empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full "
        "full_like new_zeros new_ones new_full zero_ fill_ copy_ clone contiguous to _to_copy detach detach_ "
        "lift_fresh alias view _unsafe_view reshape _reshape_alias as_strided expand expand_as permute "
        "transpose t unsqueeze squeeze flatten unflatten select slice narrow split split_with_sizes chunk "
        "unbind resize_ set_ item _local_scalar_dense resolve_conj resolve_neg is_nonzero size stride numel view_as _has_compatible_"
        "shallow_copy_type record_stream"
    ).split()
)
# CUDA kernels of the libraries torch brings (aten's own, cuBLAS/cuBLASLt, cuDNN, CUB, Thrust): names as
# CUPTI records them. A candidate's Triton, CUDA or CUTLASS kernel has a name of its own.
LIBRARY_KERNEL = re.compile(
    r"at::|^void (cub|thrust|cudnn)|cublas|cudnn|_xmma_|^sm\d+_|^(ampere|volta|turing|hopper)_|^nvjet_"
    r"|gemv2?[NT]?_kernel|gemmSN|splitKreduce|^cutlass_\d+_(tensorop|wmma|simt)_"
)
_NOT_COMPUTE = re.compile(r"^Memcpy|^Memset|^cuda|^cu[A-Z]")  # copies, fills and runtime calls


@contextlib.contextmanager
def kernel_census(device: str):
    """Record what ran inside the block: `ops` (operator name -> count, as torch's dispatcher reports them to
    its profiler; aten's own are `aten::...`, a custom op's `<namespace>::<op>`) and, on CUDA, `kernels`
    (device kernel name -> count, from CUPTI). The dict yielded is filled when the block ends."""
    from torch.autograd.profiler import profile

    census: dict[str, dict[str, int]] = {"ops": {}, "kernels": {}}
    cuda = torch.device(device).type == "cuda"
    prof = profile(use_cpu=True, use_device="cuda" if cuda else None, use_kineto=True)
    with prof:
        yield census
        if cuda:
            torch.cuda.synchronize()
    for ev in prof.kineto_results.events():
        on_device = cuda and ev.device_type() == torch.autograd.DeviceType.CUDA
        name = ev.name()
        if on_device and not _NOT_COMPUTE.match(name):
            census["kernels"][name] = census["kernels"].get(name, 0) + 1
        elif not on_device and "::" in name and not name.startswith(("mini_kv::", "cuda")):
            census["ops"][name] = census["ops"].get(name, 0) + 1


def library_work(ops: dict, kernels: dict) -> list[str]:
    """The compute a call left to libraries (by its census): aten ops that are not STRUCTURAL_OPS, and CUDA
    kernels whose names are the libraries' (LIBRARY_KERNEL)."""
    ops = [n for n in ops if n.startswith("aten::") and n.split("::", 1)[1] not in STRUCTURAL_OPS]
    return sorted(ops) + sorted(k for k in kernels if LIBRARY_KERNEL.search(k))


def check_own_kernels(found: list[str]) -> None:
    """Under --require-own-kernels: LIBRARY_DELEGATION when any of the call's compute was a library's
    (`found`: remote.Census.library)."""
    if found:
        shown = ", ".join(found[:8]) + (f" (+{len(found) - 8} more)" if len(found) > 8 else "")
        raise Violation(
            "LIBRARY_DELEGATION",
            f"the candidate's call ran library compute ({shown}); --require-own-kernels accepts only "
            "kernels of its own beside allocation, views and copies",
        )


# ------------------------------------------------------------------------------ parent side


def reward_hack_log(code: str, message: str) -> str:
    """A REWARD_HACK trace's log starts with the reason code."""
    return f"{code}: {message}"
