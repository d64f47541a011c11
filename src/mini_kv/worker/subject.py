"""The subject: the one process that runs candidate code, and nothing but what the judge asks of it.

Started by the parent like any worker child (`python -m mini_kv.worker.child --subject-fd N`, jailed
the same way), it holds no channel key and no job: it knows only its end of the link to the judge
(mini_kv.worker.link). The judge sends each request; the subject loads the candidate, calls it on
tensors the judge shares with it (mini_kv.worker.shared), times it, and answers.

What runs here runs beside the candidate, which can change any of it, so an answer is a claim, never a
verdict: the judge compares the outputs, bounds the timings with its own clock, and takes a report of
a violation (the in-process defences of mini_kv.worker.integrity still run here, around every call)
only as evidence against the candidate, which is all a forged one could be.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import dataclass, field

import torch

from mini_kv.codec import to_json
from mini_kv.proc import settle_worker
from mini_kv.worker import explain, integrity, loader, shared
from mini_kv.worker.inputs import import_path
from mini_kv.worker.link import Link, LinkClosed
from mini_kv.worker.timing import CallRotation, DeferredWorkError, L2Flusher, measure

OWN_IDS = -1  # buffers the subject makes (returned outputs) count down from here; the judge's count up


@dataclass
class Rotation:
    """A workload the judge times here (timing.CallRotation, kept across measurements): its input sets
    (views of the judge's buffers) and the candidate's latest output on each, for the judge's spot checks."""

    workload: CallRotation
    sets: list[list]
    last: dict[int, object]


class Subject:
    """The subject's state: what it loaded, the buffers it maps, the outputs it handed over."""

    def __init__(self):
        self.targets: dict[str, object] = {}
        self.device = "cpu"
        self.guard: integrity.Guard | None = None
        self.buffers: dict[int, shared.Buffer] = {}
        self.views: dict[tuple, torch.Tensor] = {}  # one tensor object per view: its id() stays stable
        # own buffer id -> (the candidate's output behind it, its view in the buffer)
        self.handed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rotations: dict[int, Rotation] = {}
        self.next_own = OWN_IDS
        self.factory = None
        self.flushers: dict[bool, L2Flusher] = {}

    # ------------------------------------------------------------------ requests

    def handle(self, msg: dict, fds: list[int]) -> tuple[dict, list[int]]:
        self._map(msg.get("new", []), fds)
        for wid in msg.get("forget", []):
            self._forget(wid)
        for buf in msg.get("free", []):
            self._drop(buf)
        shared.release_let_go()  # after the device finished what the last request queued
        try:
            handler = getattr(self, "do_" + str(msg.get("request")), None)
            if handler is None:
                raise ValueError(f"unknown request {msg.get('request')!r}")
            return handler(msg)
        except integrity.Violation as v:
            return {"ok": False, "violation": {"code": v.code, "message": v.message}}, []
        except Exception as exc:  # noqa: BLE001 - the candidate raising is an answer (at its memory cap: said so)
            return {"ok": False, "error": Raised.of(exc, explain.out_of_memory(exc))}, []
        except SystemExit as exc:  # sys.exit() in the candidate: its answer too, not this process's end
            return {"ok": False, "error": Raised.of(exc, explain.system_exit(exc))}, []

    def do_hello(self, msg: dict) -> tuple[dict, list[int]]:
        """Up: the judge's `ready` waits for this answer (worker/child.run_job)."""
        return {"ok": True}, []

    def do_load(self, msg: dict) -> tuple[dict, list[int]]:
        """The candidate (and the regression gate's baseline), loaded under the Guard."""
        self.device = msg["device"]
        settle_worker(self.device, msg.get("memory_limit_bytes"))
        if msg.get("project_root") and msg["project_root"] not in sys.path:
            sys.path.append(msg["project_root"])
        self.factory = import_path(msg["inputs"]) if msg.get("inputs") else None
        self.guard = integrity.Guard(integrity.snapshot())
        known = loader.op_names()
        fields = {}
        if msg["kind"] == "card":
            try:
                self.targets["candidate"] = loader.load_op(msg["library"], msg["op"])
            except Exception as exc:  # noqa: BLE001 - with a hint at what the library did register
                hint = loader.registration_hint(msg["op"], loader.op_names() - known)
                return {"ok": False, "error": Raised.of(exc), "hint": hint}, []
            kernels = loader.registered_kernels(msg["op"])
            missing = not (kernels.get("CPU") and kernels.get("Meta"))
            fields = {
                "kernels": kernels,
                "hint": loader.registration_hint(msg["op"], loader.op_names() - known) if missing else None,
            }
        else:
            module = loader.import_solution(msg["solution"])
            fn = getattr(module, msg["solution"]["entry_function"], None)
            if not callable(fn):
                return {"ok": False, "missing_entry": True}, []
            self.targets["candidate"] = fn
        self.guard.check("loading the candidate")
        return {"ok": True, **fields}, []

    def do_load_baseline(self, msg: dict) -> tuple[dict, list[int]]:
        if "library" in msg:
            self.targets["baseline"] = loader.load_op(msg["library"], msg["op"])
        else:
            module = loader.import_beside(msg["baseline"], msg["solution"])
            self.targets["baseline"] = getattr(module, msg["baseline"]["entry_function"])
        self.guard.check("loading the baseline")
        return {"ok": True}, []

    def do_call(self, msg: dict) -> tuple[dict, list[int]]:
        """One call under the Guard; the outputs it returned copied into buffers the judge maps."""
        args = [self._decode(a) for a in msg["args"]]
        outputs = [args[i] for i in msg.get("outputs", [])]  # destination-passing: written in place
        fn = self.targets[msg["target"]]
        integrity.poison(
            [int(n) for n in msg.get("poison", [])], self.device
        )  # freed blocks: no right values
        self.guard.hold_next = bool(msg.get("hold"))
        # which ops and kernels the call ran (integrity.kernel_census), where asked
        taking = integrity.kernel_census(self.device) if msg.get("census") else contextlib.nullcontext()
        with taking as census:
            out = self.guard.call(fn, args, self.device, msg.get("when", "the call"), outputs=outputs)
        new, fds = [], []
        encoded = self._encode_out(out, args, new, fds)
        self._refresh()
        reply = {"ok": True, "out": encoded, "new": new, **({"census": census} if census else {})}
        if self.guard.hold_skipped is not None:  # a held call (CUDA): whether its stream check ran
            reply["hold_skipped"] = self.guard.hold_skipped
        return reply, fds

    def do_refresh(self, msg: dict) -> tuple[dict, list[int]]:
        """The outputs handed over so far copied again: what the candidate's own tensors hold now."""
        _sync(self.device)
        self._refresh()
        return {"ok": True}, []

    def do_check(self, msg: dict) -> tuple[dict, list[int]]:
        self.guard.check(msg["when"])
        return {"ok": True}, []

    def do_workload(self, msg: dict) -> tuple[dict, list[int]]:
        """A rotation of input sets to time `target` on (timing.CallRotation, kept across measurements)."""
        fn = self.targets[msg["target"]]
        sets = [[self._decode(a) for a in s] for s in msg["sets"]]
        # each set's latest output kept (a store, no copy, inside the timed span): the judge spot-checks it
        last: dict[int, object] = {}
        calls = [(lambda k=k, a=a: last.__setitem__(k, fn(*a))) for k, a in enumerate(sets)]
        # what a call on set k wrote (its output, DPS outputs among its arguments): timing.CallRotation's
        # deferred-work check fingerprints it when each timed call returns and after the batch
        workload = CallRotation(calls, written=lambda k: (last.get(k), sets[k]))
        self.rotations[msg["id"]] = Rotation(workload, sets, last)
        return {"ok": True}, []

    def do_spot(self, msg: dict) -> tuple[dict, list[int]]:
        """The latest output of a workload's timed calls on one input set, copied out for the judge."""
        new, fds = [], []
        k = int(msg["set"])
        rot = self.rotations[msg["workload"]]
        encoded = self._encode_out(rot.last.get(k), rot.sets[k], new, fds)
        # the copies into the new shared buffers have landed before the judge, another process on the
        # device, reads them (before, it read them while they were being written: on an H200 honest
        # solutions were STALE_OUTPUT_AFTER_TIMING at random, the fresh buffer's bytes seen)
        _sync(self.device)
        return {"ok": True, "out": encoded, "new": new}, fds

    def do_run(self, msg: dict) -> tuple[dict, list[int]]:
        """One untimed call of a workload (the warm-up)."""
        self.rotations[msg["workload"]].workload.next()()
        _sync(self.device)
        return {"ok": True}, []

    def do_measure(self, msg: dict) -> tuple[dict, list[int]]:
        """One batch of timed calls, with the checks that belong next to the timer: no thread left
        behind, the harness intact."""
        threads = integrity.os_threads()
        cold = bool(msg["cold"])
        if cold not in self.flushers:
            self.flushers[cold] = L2Flusher(self.device, cold)
        try:
            workload, samples, launches = (
                self.rotations[msg["workload"]].workload,
                int(msg["samples"]),
                int(msg["launches"]),
            )
            m = measure(workload, msg["method"], samples, self.device, self.flushers[cold], launches)
        except DeferredWorkError as exc:
            raise integrity.Violation("DEFERRED_WORK", f"while timing: {exc}") from None
        _sync(self.device)  # the outputs the judge spot-checks have landed
        new = integrity.os_threads() - threads if msg["method"] != "cupti" else set()
        left = integrity.foreign_threads(new)
        if left:
            raise integrity.Violation("THREAD_ESCAPE", f"{len(left)} new thread(s) running after timing")
        self.guard.check("after timing")
        # the measurement, and where the rotation goes on (the judge's spot checks)
        return {"ok": True, **vars(m), "pos": workload.pos}, []

    def do_contract(self, msg: dict) -> tuple[dict, list[int]]:
        from mini_kv.worker import contract

        check = {"opcheck": contract.opcheck, "gradcheck": contract.gradcheck}[msg["name"]]
        rec = check(
            self.targets["candidate"], self.factory, msg["task_id"], msg["cases"], self.device, msg["salt"]
        )
        self.guard.check(f"after {msg['name']}")
        return {"ok": True, "record": rec}, []

    # ------------------------------------------------------------------ buffers and values

    def _map(self, new: list[dict], fds: list[int]) -> None:
        if len(new) != len(fds):
            for fd in fds:
                os.close(fd)
            raise ValueError("buffers and file descriptors do not match")
        for spec, fd in zip(new, fds, strict=True):
            self.buffers[spec["id"]] = shared.receive(spec["id"], fd, spec["nbytes"], spec["device"])

    def close_sent(self, fds: list[int]) -> None:
        """Our buffers' file descriptors once sent (a loop variable left in `serve` kept the last
        buffer mapped after the judge freed it)."""
        for buf in self.buffers.values():
            if buf.fd in fds:
                buf.close_fd()

    def _forget(self, workload: int) -> None:
        """A rotation whose timing is over: its sets (views of the judge's buffers, which keep them
        mapped) and the candidate's latest outputs on them go."""
        self.rotations.pop(workload, None)

    def _drop(self, buf: int) -> None:
        self.buffers.pop(buf, None)
        self.handed.pop(buf, None)
        for key in [k for k in self.views if k[0] == buf]:
            del self.views[key]

    def _decode(self, value):
        if isinstance(value, dict) and "t" in value:
            spec = shared.SharedView.from_dict(value["t"])
            key = (spec.buf, spec.dtype, spec.shape, spec.stride)
            if key not in self.views:
                self.views[key] = self.buffers[spec.buf].view(spec)
            return self.views[key]
        if isinstance(value, dict) and "seq" in value:
            items = [self._decode(v) for v in value["seq"]]
            return tuple(items) if value.get("tuple") else items
        if isinstance(value, dict) and "e" in value:  # an empty tensor: nothing to share
            return torch.empty(
                value["e"]["shape"], dtype=getattr(torch, value["e"]["dtype"]), device=self.device
            )
        return value["v"]

    def _encode_out(self, out, args, new: list, fds: list):
        """What the call returned, as the judge will see it: each tensor checked for what only this
        side can see (a subclass, a view of an input or of an earlier output), then copied out."""
        if isinstance(out, torch.Tensor):
            problem = integrity.plain_tensor_problem(out)
            if problem:  # it cannot be copied out faithfully (a subclass computes when read)
                raise integrity.Violation("OUTPUT_NOT_PLAIN_TENSOR", problem)
            found = integrity.output_finding(out, args)
            same = [b for b, (o, _) in self.handed.items() if integrity.overlaps(out, o)]
            spec = self._hand_over(out, new, fds)
            return {"t": to_json(spec), "finding": found, "same_memory": same}
        if isinstance(out, (tuple, list)):
            items = [self._encode_out(o, args, new, fds) for o in out]
            return {"seq": items, "tuple": isinstance(out, tuple)}
        if isinstance(out, dict) and all(isinstance(k, str) for k in out):
            return {"map": {k: self._encode_out(v, args, new, fds) for k, v in out.items()}}
        if out is None or isinstance(out, (bool, int, float, str)):
            return {"v": out}
        cls = type(out)  # its qualified name, for the message (mini_kv.worker.explain)
        return {
            "opaque": cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        }

    def _hand_over(self, out: torch.Tensor, new: list, fds: list) -> shared.SharedView:
        nbytes = out.numel() * out.element_size()
        buf = shared.create(self.next_own, nbytes, str(out.device))
        self.next_own -= 1
        self.buffers[buf.id] = buf
        new.append({"id": buf.id, "nbytes": nbytes, "device": str(out.device)})
        fds.append(buf.fd)
        contiguous = tuple(torch.empty(out.shape, device="meta").stride())
        spec = shared.SharedView(buf.id, shared.dtype_name(out.dtype), tuple(out.shape), contiguous)
        self.handed[buf.id] = (out, buf.view(spec))
        with torch.no_grad():
            self.handed[buf.id][1].copy_(out)
        return spec

    def _refresh(self) -> None:
        """Work the candidate does on its outputs after a call returned (a thread, a later call) shows
        in the judge's copies: they are taken again after every call and when the judge asks."""
        with torch.no_grad():
            for out, view in self.handed.values():
                view.copy_(out)
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize()  # the copies landed before the judge reads them


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Raised:
    """An exception as the subject answers it (the candidate's, or a bad request's): its class's name, its
    message and traceback; `plain` where the message says all (explain.system_exit, explain.out_of_memory)."""

    type: str
    message: str
    traceback: str
    plain: bool | None = field(default=None, metadata={"omit_none": True})

    @classmethod
    def of(cls, exc: BaseException, plain: str | None = None) -> Raised:
        message = plain or explain.exception_message(exc)[:4000]
        return cls(type(exc).__name__, message, traceback.format_exc()[-4000:], True if plain else None)


def serve(fd: int) -> int:
    """Answer the judge until it closes the link."""
    link = Link(fd)
    subject = Subject()
    while True:
        try:
            msg, fds = link.recv()
        except LinkClosed:
            return 0
        reply, out_fds = subject.handle(msg, fds)
        try:
            link.send(to_json({**reply, "seq": msg.get("seq")}), out_fds)
        finally:
            subject.close_sent(out_fds)
