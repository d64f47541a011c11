"""The judge's side of the subject: the candidate as a callable, a guard and a workload that all run there.

The evaluation engine calls the candidate as `op(*args)`, checks around it with a Guard and times it
through a timing.CallRotation; here each of those is a request to the subject process
(mini_kv.worker.subject), so the engine's code is the same whichever process the candidate is in.

A tensor the judge passes is moved into a shared buffer once (mini_kv.worker.shared) and stays there:
the judge's own tensor object is re-pointed at the buffer (`Tensor.set_`), so whatever the subject
writes into it (a mutated input, a DPS output) the judge sees in place, and whatever the judge writes
(new values for the check after timing) the subject sees at the same address. A buffer is freed on
both sides when the judge's last tensor on it goes.

What the subject answers is a claim. Outputs are judged by the engine; a reported violation is
evidence against the candidate and taken as such; timings are bounded by this process's clock
(`RemoteWorkload.measure`); an answer out of turn or out of protocol is a violation; a subject that is
gone ends the judge's job (SubjectLost), and the parent pins that on the case it was on.
"""

from __future__ import annotations

import collections
import functools
import math
import os
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mini_kv.codec import to_json
from mini_kv.worker import shared
from mini_kv.worker.integrity import (
    CODES,
    SUBJECT_VIEWS,
    SubjectView,
    Violation,
    library_work,
    perturb_in_place,
    rewrite_in_place,
)
from mini_kv.worker.integrity import poison as integrity_poison
from mini_kv.worker.link import Link, LinkClosed, LinkError
from mini_kv.worker.timing import (
    CallRotation,
    CuptiUnavailableError,
    GraphCaptureError,
    Measurement,
    NoDeviceWorkError,
    TimingError,
    TimingGuardError,
    is_cuda,
)

# Timed calls cannot add up to more than the time the whole batch took on the judge's clock; the
# slack covers the two clocks' resolution and rounding of the samples.
CLOCK_SLACK_S = 0.002
# Wall-clock samples are the host's time of each call: the time between them (the loop, the timer) is
# small, so most of the batch's time must be in them. What is left unexplained beyond this share of
# the batch and this much per sample is time the samples do not own up to: an impossible claim. Where
# the parent handed over a CpuMeter the batch's time is the less of the judge's clock and the CPU time
# the subject's jail used: a loaded host keeps an honest subject waiting for a CPU between its calls
# (that wait is on the clock, not in the CPU time), while work done outside the calls, or a clock that
# reads short, shows in both.
WALL_UNEXPLAINED_SHARE = 0.5
# the loop, the timer, the deferred-work fingerprint (timing.CallRotation.returned)
WALL_GAP_PER_SAMPLE_S = 100e-6
WALL_GAP_FIXED_S = 0.02
# A batch whose gaps are unexplained is timed again, up to this many batches in all: a loaded host stalls
# the subject between two calls now and then (a stall inside a call is a slow sample, owned up to), so
# an honest batch fails by chance and its next one passes; work done outside the timed calls, or a
# clock that reads short, leaves the gap in every batch.
WALL_GAP_TRIES = 3


class CpuMeter:
    """The kernel's count of the CPU time the subject's whole jail has used: its cgroup's
    `cpuacct.usage` (v1, ns) or `cpu.stat` (v2, `usage_usec`), opened read-only by the parent
    (jail.Jailed.cpu_meter) and handed to the judge with the link. Nothing in the subject can set it
    back or leave work out of it: every process the subject starts is in the group."""

    def __init__(self, fd: int):
        self.fd = fd

    def seconds(self) -> float:
        text = os.pread(self.fd, 4096, 0).decode("ascii", "replace")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1e-6
        return int(text.strip()) * 1e-9

    def close(self) -> None:
        os.close(self.fd)


class SubjectLost(BaseException):
    """The subject process is gone: the judge's job ends (not an Exception, so that no engine handler
    takes it for the candidate raising), and the parent records the case it was on."""


class CandidateError(Exception):
    """The candidate raised in the subject; the class is named as the candidate's exception was."""

    remote_traceback = ""


_TIMING_ERRORS = {
    c.__name__: c
    for c in (TimingError, GraphCaptureError, CuptiUnavailableError, NoDeviceWorkError, TimingGuardError)
}


@functools.cache
def _named(name: str) -> type[Exception]:
    return _TIMING_ERRORS.get(name) or type(name, (CandidateError,), {"__module__": "subject"})


class SubjectLink:
    """The link to the subject process and the buffers both sides map."""

    def __init__(self, fd: int, device: str, meter: CpuMeter | None = None):
        self.link = Link(fd)
        self.device = device
        self.meter = meter  # the subject's CPU time, where the parent could count it
        self.seq = 0
        self.next_id = 1
        self.by_storage: dict[int, int] = {}  # data_ptr of a shared buffer's storage -> buffer id
        self.mapped: dict[int, shared.Buffer] = {}  # the last answer's buffers, until decoded
        self.new: list[dict] = []
        self.new_fds: list[int] = []
        # buffers no tensor here is on any more, appended by weakref finalizers at any moment (a gc pass
        # inside `request` too): one deque that is only ever appended to and popped from, so no id is lost
        self.freed: collections.deque[int] = collections.deque()
        self.forgotten: list[int] = []  # workloads whose timing is over: the subject drops their sets
        self.broken: str | None = None  # how the subject broke the protocol: nothing it says counts after

    # ------------------------------------------------------------------ requests

    def ask(self, op: str, /, **fields) -> dict:
        """Send one request and take its answer; a failed answer raised as what it reports."""
        reply = self.request(op, **fields)
        if reply.get("ok") is True:
            return reply
        if isinstance(reply.get("violation"), dict):
            v = reply["violation"]
            if v.get("code") not in CODES:
                code = repr(v.get("code"))[:200]
                raise self.lie(f"the subject reported a violation code the harness does not know: {code}")
            raise Violation(v["code"], str(v.get("message"))[:4000])
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        exc = _named(str(err.get("type") or "SubjectError"))(str(err.get("message", ""))[:4000])
        exc.remote_traceback = str(err.get("traceback", ""))[-4000:]
        exc.plain = err.get("plain") is True  # its message says all (explain.system_exit)
        raise exc

    def request(self, op: str, /, **fields) -> dict:
        if self.broken:
            raise SubjectLost(f"the subject broke the protocol earlier ({self.broken})")
        if self.device.startswith("cuda"):
            # what this process wrote into shared buffers (inputs, poison, new values) has landed before
            # the subject, another process on the device, is asked to read it
            torch.cuda.synchronize()
            shared.release_let_go()  # what that work used and no tensor is on any more
        self.seq += 1
        free = [self.freed.popleft() for _ in range(len(self.freed))]
        msg = {**fields, "request": op, "seq": self.seq, "new": self.new, "free": free}
        if self.forgotten:
            msg["forget"], self.forgotten = self.forgotten, []
        fds, self.new, self.new_fds = self.new_fds, [], []
        try:
            self.link.send(msg, fds)
            reply, got = self.link.recv()
        except LinkClosed:
            raise SubjectLost(f"the subject process ended during the request {op!r}") from None
        except LinkError as exc:
            raise self.lie(f"the subject answered {op!r} with {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)
        if reply.get("seq") != self.seq:
            for fd in got:
                os.close(fd)
            raise self.lie(
                f"the subject answered out of turn (answer {reply.get('seq')!r} to request {self.seq})"
            )
        self._receive(reply.get("new") or [], got)
        return reply

    def lie(self, what: str) -> Violation:
        """The violation for an answer out of protocol; the subject is not asked anything after it (the
        judge ends its job once the case is recorded, and the parent goes on with a fresh subject)."""
        self.broken = what[:300]
        return Violation("FORGED_RESULT_CHANNEL", what)

    def close(self) -> None:
        self.link.close()
        if self.meter is not None:
            self.meter.close()

    # ------------------------------------------------------------------ values both sides see

    def encode(self, value):
        """`value` as a message names it; a tensor is moved into a shared buffer first."""
        if isinstance(value, torch.Tensor):
            if value.numel() == 0:
                return {"e": {"dtype": shared.dtype_name(value.dtype), "shape": list(value.shape)}}
            return {"t": to_json(self._share(value))}
        if isinstance(value, (tuple, list)):
            return {"seq": [self.encode(v) for v in value], "tuple": isinstance(value, tuple)}
        return {"v": value}

    def decode(self, value):
        """An answer's value: a tensor is a view on the buffer the subject copied it into."""
        if not isinstance(value, dict):
            raise self.lie(f"the subject answered out of protocol: {value!r}"[:300])
        if "t" in value:
            try:
                spec = shared.SharedView.from_dict(value["t"])
                buf = self.mapped[spec.buf]
                if spec.nbytes_needed() > buf.nbytes:
                    raise ValueError(f"a view past the end of buffer {spec.buf}")
            except (KeyError, TypeError, ValueError) as exc:
                raise self.lie(f"the subject named an output out of protocol: {exc}") from None
            view = buf.view(spec)
            found = value.get("finding")
            found = (str(found[0]), str(found[1])[:1000]) if _is_finding(found) else None
            same = value.get("same_memory") if isinstance(value.get("same_memory"), list) else []
            SUBJECT_VIEWS[id(view)] = SubjectView(
                found, spec.buf, frozenset(x for x in same if isinstance(x, int))
            )
            weakref.finalize(view, SUBJECT_VIEWS.pop, id(view), None)
            return view
        if "seq" in value and isinstance(value["seq"], list):
            items = [self.decode(v) for v in value["seq"]]
            return tuple(items) if value.get("tuple") else items
        if "map" in value and isinstance(value["map"], dict):
            return {str(k): self.decode(v) for k, v in value["map"].items()}
        if "v" in value:
            return value["v"]
        return _Opaque(str(value.get("opaque")))

    def _share(self, t: torch.Tensor) -> shared.SharedView:
        buf = self.by_storage.get(t.untyped_storage().data_ptr())
        if buf is None:
            buf = self._move(t)
        dtype = shared.dtype_name(t.dtype)
        return shared.SharedView(buf, dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def _move(self, t: torch.Tensor) -> int:
        """Copy `t`'s elements into a new shared buffer and point `t` at it; the buffer's id."""
        nbytes, stride = shared.layout_of(t)
        buf = shared.create(self.next_id, nbytes, str(t.device))
        self.next_id += 1
        flat = buf.raw.view(t.dtype)
        with torch.no_grad():
            flat.copy_(shared.raw_span(t))
            t.set_(flat.untyped_storage(), 0, t.shape, stride)
        self._track(buf)
        self.new.append({"id": buf.id, "nbytes": nbytes, "device": str(t.device)})
        self.new_fds.append(buf.fd)
        buf.fd = -1  # closed once sent (request)
        return buf.id

    def _track(self, buf: shared.Buffer) -> None:
        """Free the buffer on both sides once no tensor here is on it."""
        ptr = buf.raw.untyped_storage().data_ptr()
        self.by_storage[ptr] = buf.id
        weakref.finalize(buf.anchor, self._forget, ptr, buf.id)

    def _forget(self, ptr: int, buf: int) -> None:
        if self.by_storage.get(ptr) == buf:
            del self.by_storage[ptr]
        self.freed.append(buf)

    def _receive(self, new: list, fds: list[int]) -> None:
        """Map the buffers an answer brought (outputs the subject copied out); only until decoded."""
        self.mapped = {}
        left = list(fds)
        try:
            if len(new) != len(fds):
                raise ValueError("buffers and file descriptors do not match")
            for n in new:
                if int(n["id"]) >= 0 or int(n["id"]) in self.mapped:
                    raise ValueError(f"buffer id {n['id']!r} is not the subject's to give")
                fd = left.pop(0)
                if str(n["device"]) not in ("cpu", self.device):
                    os.close(fd)
                    raise ValueError(f"a buffer on {n['device']!r}")
                buf = shared.receive(int(n["id"]), fd, int(n["nbytes"]), str(n["device"]))
                self.mapped[buf.id] = buf
                # (the deque itself, never replaced: a finalizer bound to a list that `request` had
                # swapped for a new one by the time the buffer was let go lost its id, and the subject
                # kept those outputs mapped, 9 GB after rmsnorm's 13 workloads on an H200)
                weakref.finalize(buf.anchor, self.freed.append, buf.id)
        except (shared.SharedMemoryError, ValueError, TypeError, KeyError) as exc:
            for fd in left:
                os.close(fd)
            raise self.lie(f"the subject sent a buffer out of protocol: {exc}") from None


def _is_finding(found) -> bool:
    return isinstance(found, list) and len(found) == 2 and found[0] in CODES


class _Opaque:
    """A returned value that is no tensor, number or sequence: only its type's name crossed over."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} from the subject>"


@dataclass(frozen=True)
class StreamChecks:
    """A case's calls held for the stream-order check (integrity.StreamHold) and how many of them were
    checked: a check is skipped where the hold ended before a copy of the outputs did (a call that
    synchronises, a GPU busy with other processes). The subject reports it: a count, not a verdict."""

    held: int = 0
    checked: int = 0

    def add(self, skipped: bool) -> StreamChecks:
        return StreamChecks(self.held + 1, self.checked + (not skipped))


class RemoteOp:
    """The candidate (or the regression gate's baseline) as the engine calls it: `op(*args)`."""

    def __init__(self, subject: SubjectLink, target: str):
        self.subject, self.target = subject, target
        self.poison: list[int] = []  # block sizes to fill before the next call (poison_before)
        self.census: Census | None = None  # what the last census call ran (census_next, census_of)
        self._census_next = False
        self._hold_next = False  # hold the caller's stream during the next call (stream_hold_next)
        self.holds = StreamChecks()  # the held calls since stream_checks_of last read them

    def __call__(self, *args):
        return self.call(list(args))

    def call(self, args: list, when: str = "the call", outputs=()):
        """One call in the subject under its Guard; `outputs` (DPS) are among `args`, written in place."""
        encoded = [self.subject.encode(a) for a in args]
        where = [next(i for i, a in enumerate(args) if a is o) for o in outputs]
        poison, self.poison = self.poison, []
        census, self._census_next = self._census_next, False
        hold, self._hold_next = self._hold_next, False
        fields = dict(args=encoded, outputs=where, when=when, poison=poison, census=census, hold=hold)
        reply = self.subject.ask("call", target=self.target, **fields)
        if "hold_skipped" in reply:
            self.holds = self.holds.add(bool(reply["hold_skipped"]))
        if census:
            self.census = Census.claimed(reply.get("census"))
        return self.subject.decode(reply.get("out"))

    def refresh(self) -> None:
        """What the candidate's own outputs hold now, copied again into the judge's views of them."""
        self.subject.ask("refresh")


class RemoteGuard:
    """integrity.Guard's interface, its checks run in the subject where the candidate could break them."""

    def __init__(self, subject: SubjectLink):
        self.subject = subject

    def check(self, when: str) -> None:
        self.subject.ask("check", when=when)

    def call(self, fn: RemoteOp, args, device: str, when: str = "the call", outputs=()):
        return fn.call(list(args), when, outputs)


@dataclass(frozen=True)
class SpotCheck:
    """How the judge checks timed calls (RemoteWorkload.measure). `wrong(args, outputs)`: why the
    outputs of a call on `args` (their values now) are wrong, or None, the reference run here;
    `spare`: other valid input values of the same shapes, swapped into the checked set before its batch
    (new values at the same address, Python id and version counter: a result kept from an earlier
    call is wrong); `outputs`: the positions of destination-passing outputs among a set's arguments;
    `stale_caught(old, new)`: whether the reference's result for the `old` input values fails the check
    on `new` ones (None: not known, so a set's values are always rewritten whole)."""

    wrong: Callable[[list, list], str | None]
    spare: list
    outputs: tuple[int, ...] = ()
    stale_caught: Callable[[list, list], bool] | None = None


class RemoteWorkload(CallRotation):
    """Input sets to rotate through for timing a target in the subject (timing.CallRotation's rotation,
    kept there across measurements). timing.measure hands a batch to `measure`."""

    remote = True
    _ids = iter(range(1, 1 << 62))

    def __init__(self, op: RemoteOp, sets: list[list], spot: SpotCheck | None = None):
        super().__init__([None] * len(sets))
        self.subject, self.id, self.sets, self.spot = op.subject, next(self._ids), sets, spot
        self.pos = 0  # the subject's place in the rotation after the last batch (its claim)
        self._batches, self._kept = 0, []
        encoded = [[self.subject.encode(a) for a in s] for s in sets]
        self.subject.ask("workload", id=self.id, target=op.target, sets=encoded)

    def close(self) -> None:
        """The subject drops this rotation (its sets, each set's latest output) with the next request:
        kept, a large workload's sets and outputs stayed mapped in the subject until it ended (an H200
        reached 81 GB over rmsnorm's 14 workloads, and concurrent runs ran out of memory)."""
        if self.sets:
            self.subject.forgotten.append(self.id)
        self.sets, self._kept = [], []
        super().close()

    def next(self):
        """One untimed call (the warm-up) on the set the rotation is at, in step with the subject's
        rotation: _arm chooses among the sets the next batch calls from `pos` (out of step after a
        warm-up, a set the batch did not call was checked: an honest destination-passing solution's
        poisoned outputs, STALE_OUTPUT_AFTER_TIMING on an H200)."""

        def call():
            self.subject.ask("run", workload=self.id)
            self.pos += 1

        return call

    def measure(self, method: str, samples: int, device: str, cold: bool, launches: int) -> Measurement:
        """One batch timed in the subject, bracketed by this process's clock (check_claim), with one of
        the input sets it calls spot-checked (_arm, _spot_check). A batch with unexplained gaps is timed
        again (WALL_GAP_TRIES); the last one's gap is a violation."""
        meter = None if is_cuda(device) else self.subject.meter  # a GPU's work is not CPU time
        for tries_left in range(WALL_GAP_TRIES - 1, -1, -1):
            before = meter.seconds() if meter else None
            m, elapsed, k = self._batch(method, samples, cold, launches)
            cpu = meter.seconds() - before if meter else None
            check_claim(m, method, samples, elapsed)
            gap = unexplained_gap(m, samples, elapsed, cpu)
            if gap is None or tries_left == 0:
                break
            if k is not None:
                self._restore(k)  # this batch's samples are dropped, its armed set with them
        if gap is not None:
            raise Violation("IMPOSSIBLE_TIME", f"{gap} (in each of {WALL_GAP_TRIES} batches)")
        if k is not None:
            self._spot_check(k)
        return m

    def _batch(
        self, method: str, samples: int, cold: bool, launches: int
    ) -> tuple[Measurement, float, int | None]:
        """One batch: the subject's claim, the seconds this process's clock saw it take, the armed set."""
        k = self._arm(samples) if self.spot is not None else None
        t0 = time.perf_counter()
        reply = self.subject.ask(
            "measure", workload=self.id, method=method, samples=samples, cold=cold, launches=launches
        )
        elapsed = time.perf_counter() - t0
        try:
            m = Measurement(
                method=str(reply["method"]),
                samples=[float(x) for x in reply["samples"]],
                calls_per_sample=int(reply["calls_per_sample"]),
                kernel_us=None if reply.get("kernel_us") is None else [float(x) for x in reply["kernel_us"]],
                notes=dict(reply.get("notes") or {}),
            )
            self.pos = int(reply["pos"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self.subject.lie(f"the subject's timing answer is out of protocol: {exc}") from None
        return m, elapsed, k

    def _arm(self, samples: int) -> int:
        """Before a batch: choose at random one of the input sets it will call (every batch calls at
        least `samples` calls, from where the rotation stands), give it new values and poison its
        destination-passing outputs, so that only work done in this batch can pass the check. The new
        values alternate between two kinds, the first batch taking the second: every element the spare's (a result kept for the old
        address, id, shape or version counter is wrong), and one block of the set's own values changed
        (integrity.perturb_in_place: a result kept for the old shape and a sample of the values is)."""
        k = (self.pos + random.randrange(min(samples, len(self.sets)))) % len(self.sets)
        self._swap(k, partial=self._batches % 2 == 0)
        self._batches += 1
        for i in self.spot.outputs:
            _poison(self.sets[k][i])
        return k

    def _swap(self, k: int, partial: bool = False) -> None:
        """Set k's input values replaced, in place (rewrite_in_place), the old ones kept to put back. A
        partial change is kept only where a result kept from the old values would fail the check: one
        element of a 24-element input moved a scale-and-sum's result by less than the tolerance about
        one batch in 50, and a max over a block that did not hold the maximum not at all."""
        theirs = [a for i, a in enumerate(self.sets[k]) if i not in self.spot.outputs]
        self._kept = [a.clone() if isinstance(a, torch.Tensor) else a for a in theirs]
        spare = self.spot.spare[: len(theirs)]
        caught = self.spot.stale_caught
        if partial and perturb_in_place(theirs, spare, random) and caught and caught(self._kept, theirs):
            return
        rewrite_in_place(theirs, spare)  # every element (or no float input)

    def _restore(self, k: int) -> None:
        theirs = [a for i, a in enumerate(self.sets[k]) if i not in self.spot.outputs]
        rewrite_in_place(theirs, self._kept)
        self._kept = []

    def _spot_check(self, k: int) -> None:
        """After the batch: the outputs of its last call on set k, judged here; then set k's own
        values back (the check after timing compares each set with the reference's copy of it)."""
        if self.spot.outputs:
            outs = [self.sets[k][i] for i in self.spot.outputs]
        else:
            outs = self.subject.decode(self.subject.ask("spot", workload=self.id, set=k).get("out"))
        try:
            why = self.spot.wrong(self.sets[k], outs)
        except Exception as exc:  # noqa: BLE001 - an output that cannot even be compared is wrong
            why = f"{type(exc).__name__}: {exc}"
        if why:
            raise Violation(
                "STALE_OUTPUT_AFTER_TIMING",
                f"a timed call on input set {k}, checked after timing its batch, with new values in its "
                f"input buffers: {why} (right when checked, wrong when timed: it skipped work or replayed a result)",
            )
        self._restore(k)


def _poison(t) -> None:
    """An output buffer filled with all-ones bytes (NaN for floats): what no correct kernel leaves."""
    if isinstance(t, torch.Tensor) and t.numel():
        with torch.no_grad():
            shared.raw_span(t.data).view(torch.uint8).fill_(0xFF)


def check_claim(m: Measurement, method: str, samples: int, elapsed_s: float) -> None:
    """Refuse samples this process's clock makes impossible: another method or count than asked, a
    non-finite or negative time, timed calls that add up to more than the batch took."""
    if m.method != method or len(m.samples) != samples or m.calls_per_sample < 1:
        raise Violation(
            "IMPOSSIBLE_TIME",
            f"asked for {samples} samples by {method}, the subject claimed {len(m.samples)} by {m.method}",
        )
    if not all(math.isfinite(x) and x >= 0 for x in m.samples):
        raise Violation("IMPOSSIBLE_TIME", "the subject claimed a negative or non-finite time")
    claimed = sum(m.samples) * m.calls_per_sample * 1e-6
    if claimed > elapsed_s + CLOCK_SLACK_S:
        raise Violation(
            "IMPOSSIBLE_TIME",
            f"{samples} samples claimed {claimed * 1e3:.3f} ms of timed calls in a batch the judge's "
            f"clock saw take {elapsed_s * 1e3:.3f} ms",
        )


def unexplained_gap(m: Measurement, samples: int, elapsed_s: float, cpu_s: float | None = None) -> str | None:
    """Host wall-clock samples, where little happens between the timed calls, that add up to far less
    than the batch took (the less of the judge's clock and, where counted, the subject's CPU time): what
    is wrong, else None."""
    claimed = sum(m.samples) * m.calls_per_sample * 1e-6
    # a count that went back was tampered with: no excuse from it
    busy = elapsed_s if cpu_s is None or cpu_s < 0 else min(elapsed_s, cpu_s)
    unexplained = busy - claimed - WALL_GAP_FIXED_S - WALL_GAP_PER_SAMPLE_S * samples
    if m.method != "wallclock" or unexplained <= WALL_UNEXPLAINED_SHARE * busy:
        return None
    used = "" if cpu_s is None else f" (the subject used {cpu_s * 1e3:.3f} ms of CPU time in it)"
    return (
        f"{samples} wall-clock samples claimed {claimed * 1e3:.3f} ms of a batch the judge's clock saw "
        f"take {elapsed_s * 1e3:.3f} ms{used}: more than half of it unaccounted for between the calls"
    )


def workload_of(fn, sets: list[list], spot: SpotCheck | None = None) -> CallRotation:
    """The timing rotation of `fn` over `sets`: in the subject for a RemoteOp (its timed calls
    spot-checked by `spot`), here for the reference."""
    if isinstance(fn, RemoteOp):
        return RemoteWorkload(fn, sets, spot)
    return CallRotation([(lambda s=s: fn(*s)) for s in sets])


def poison_before(op, sizes: list[int], device: str) -> None:
    """Freed blocks of these sizes filled with NaN where the candidate allocates: in the subject, just
    before its next call, for a RemoteOp (integrity.poison)."""
    if isinstance(op, RemoteOp):
        op.poison = list(sizes)
    else:
        integrity_poison(sizes, device)


@dataclass(frozen=True)
class Census:
    """What the candidate's call ran, by the subject's census (its claim: name -> count of aten ops and of
    CUDA kernels, kept to its expected shape), and the compute of it left to libraries (library_work)."""

    ops: dict | None = field(default=None, metadata={"omit_none": True})
    kernels: dict | None = field(default=None, metadata={"omit_none": True})
    library: list = field(default_factory=list)

    @classmethod
    def claimed(cls, value) -> Census:
        value = value if isinstance(value, dict) else {}
        ops, kernels = (
            {str(k)[:300]: int(v) for k, v in list(value[part].items())[:500] if isinstance(v, int)}
            if isinstance(value.get(part), dict)
            else None
            for part in ("ops", "kernels")
        )
        return cls(ops, kernels, library_work(ops or {}, kernels or {}))


def census_next(op) -> None:
    """Take a census of the ops and kernels the candidate's next call runs (integrity.kernel_census); a
    no-op in-process."""
    if isinstance(op, RemoteOp):
        op._census_next = True


def stream_hold_next(op) -> None:
    """Hold the caller's stream during the candidate's next call (integrity.StreamHold): for calls on fresh
    inputs only, where no freed block can already hold the call's right answer."""
    if isinstance(op, RemoteOp):
        op._hold_next = True


def stream_checks_of(op) -> StreamChecks | None:
    """The held calls since the last read (stream_hold_next), and how many of them had their stream-order
    check; None in-process or when none was held (a CPU run). Reading starts a new count."""
    if not isinstance(op, RemoteOp):
        return None
    got, op.holds = op.holds, StreamChecks()
    return got if got.held else None


def census_of(op) -> Census | None:
    """The census taken since census_next, or None (in-process, or none taken)."""
    return op.census if isinstance(op, RemoteOp) else None


def refresh(op) -> None:
    """After a pause: a candidate's outputs as its own tensors hold them now (a no-op in-process)."""
    if isinstance(op, RemoteOp):
        op.refresh()
