"""The one child-process entry: `python -m mini_kv.worker.child --result-fd N`, job JSON on stdin.

Every job kind (mini_kv.worker.jobs) runs here: a task card's candidate, a SOL solution, and the
one-shot kinds (bandwidth probe, A/B timing, the profiled target, a build), each answering with
one `result` event. Events go back signed on a pipe the parent owns (mini_kv.worker.channel); the
parent alone writes attempt files. A `begin` event precedes each case so that a crash or hang is
pinned on it. Under ncu the job comes from a file (`--job`) and the events go to one (`--result-file`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback

from mini_kv.status import Status
from mini_kv.worker.channel import KEY_ENV, POISONED_MARKERS, Channel
from mini_kv.worker.jobs import SUBJECT_DROPPED_EXIT, SUBJECT_KINDS, SUBJECT_LOST_EXIT, Event, Job


def main(argv: list[str] | None = None) -> int:
    from mini_kv._jail_prelude import restrict_from_env

    restrict_from_env()  # started by the jail: its Landlock rules, before anything of the job
    parser = argparse.ArgumentParser(prog="python -m mini_kv.worker.child")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--result-fd", type=int)
    out.add_argument("--result-file")
    out.add_argument("--subject-fd", type=int, help="run as the subject of a judge, linked on this fd")
    parser.add_argument("--job", help=f"the job's JSON file (default: stdin); the key is then in ${KEY_ENV}")
    parser.add_argument("--warm-profiler", action="store_true")
    ns = parser.parse_args(argv)
    import torch  # noqa: F401 - every job needs it; loading it before the job arrives overlaps the parent's work

    if ns.subject_fd is not None:
        from mini_kv.worker.subject import serve

        return serve(ns.subject_fd)

    if ns.warm_profiler:
        _warm_profiler()
    if ns.job:
        with open(ns.job) as f:
            data = json.load(f)
        key = os.environ.pop(KEY_ENV)
    else:
        data = json.load(sys.stdin)
        key = data.pop("channel_key")
    chan = Channel(ns.result_fd if ns.result_file is None else ns.result_file, bytes.fromhex(key))
    if ns.result_file is None:  # the parent's timeouts count from here (runner.ChildRun.next_event)
        chan.send(event=Event.READY)
    try:
        job = Job.from_dict(data)
        _limit_memory(job)
        if job.KIND in SUBJECT_KINDS:
            return run_job(job, chan, _link_fd(ns.result_fd))
        return HANDLERS[job.KIND](job, chan)
    except Exception as exc:  # noqa: BLE001 - report, then exit non-zero
        chan.send(
            event=Event.FATAL, reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:]
        )
        return 3


def _link_fd(result_fd: int) -> int:
    """The judge's end of the link to its subject, which the parent sends on the result channel."""
    with socket.socket(fileno=os.dup(result_fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 16, 1)
    if len(fds) != 1:
        raise RuntimeError("the parent sent no link to a subject")
    return fds[0]


def _warm_profiler() -> None:
    """The first CUPTI session of a process costs a CUDA context and CUPTI's start-up (about 0.4 s on
    an H200): a child started before its job pays it while the parent still prepares the job. No
    candidate code has been loaded yet; the harness's snapshot is taken after this."""
    import torch

    if not torch.cuda.is_available():
        return
    try:
        from mini_kv.worker.timing import warm_cupti

        warm_cupti()
    except Exception:  # noqa: BLE001 - only a head start: timing reports a profiler that cannot run
        pass


def _limit_memory(job: Job) -> None:
    """On CPU, cap the address space so an op that allocates without bound fails inside this
    child (a clean error) instead of exhausting the machine. Not on CUDA: its driver maps huge
    virtual ranges."""
    limit = getattr(job, "memory_limit_bytes", None)
    if limit and not str(job.device).startswith("cuda"):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _set_device(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda" and torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))
    # One intra-op thread on CPU: the reference gets no parallelism the candidate lacks, and
    # timings do not swing with the other core's load.
    torch.set_num_threads(1)


def run_job(job: Job, chan: Channel, link_fd: int) -> int:
    """A problem's candidate (kinds `card` and `sol`), loaded in the subject by its format's evaluator
    (_evaluator), then one loop over the stages: the correctness cases (a SOL workload's record holds its
    timing too), the contract checks, the bench cases; a `begin` event before each. A subject that is
    gone ends the job: the parent pins that on the case of the last `begin`, and goes on in a new pair."""
    from mini_kv.worker.remote import Subject, SubjectLost

    _set_device(job.device)
    subject = Subject(link_fd, job.device)
    try:
        return _run_stages(job, chan, subject)
    except SubjectLost as lost:
        print(f"mini_kv: {lost}", file=sys.stderr, flush=True)
        return SUBJECT_DROPPED_EXIT if subject.broken else SUBJECT_LOST_EXIT
    finally:
        subject.close()


def _run_stages(job: Job, chan: Channel, subject) -> int:
    ev = _evaluator(job.KIND).load(job, chan, subject)
    if ev is None:  # a failed `load` event was sent
        return 0
    for case in job.cases:
        rec, extra = ev.correctness(case)
        chan.send(event=Event.CASE, record=rec, **extra)
        _stop_if_broken(subject)
        if rec["status"] == Status.RUNTIME_ERROR and any(
            m in (rec.get("reason") or rec.get("log") or "") for m in POISONED_MARKERS
        ):
            return 4  # the CUDA context may be poisoned: the parent continues in a fresh child
    for name in getattr(job, "contract", []):
        chan.send(event=Event.BEGIN, stage="contract", case=name)
        chan.send(event=Event.CONTRACT, name=name, record=ev.contract(name))
        _stop_if_broken(subject)
    for case in getattr(job, "bench_cases", []):
        chan.send(event=Event.BEGIN, stage="benchmark", case=case["id"])
        chan.send(event=Event.BENCH, record=ev.bench(case))
        _stop_if_broken(subject)
    chan.send(event=Event.DONE)
    return 0


def _stop_if_broken(subject) -> None:
    """After a record: a subject that broke the protocol is asked nothing more (the parent goes on with
    a fresh pair for what is left)."""
    from mini_kv.worker.remote import SubjectLost

    if subject.broken:
        raise SubjectLost(f"the subject broke the protocol ({subject.broken})")


def _evaluator(kind: str):
    """A format's strategy for run_job: `load(job, chan)` -> an evaluator (or None), whose `correctness(case)`,
    `contract(name)` and `bench(case)` give the records."""
    if kind == "card":
        return CardEvaluator
    from mini_kv.solexec.evaluate import SolEvaluator

    return SolEvaluator


class CardEvaluator:
    """Kind `card`: the candidate's dispatcher op against the card's reference, checked by worker/correctness.py
    (cases), worker/contract.py (opcheck, gradcheck) and timed by worker/benchmark.py."""

    def __init__(self, job: Job, chan: Channel, op, reference, factory, guard):
        self.job, self.chan, self.op, self.reference = job, chan, op, reference
        self.factory, self.guard = factory, guard

    @classmethod
    def load(cls, job: Job, chan: Channel, subject) -> CardEvaluator | None:
        """The evaluator with the candidate loaded in the subject under its Guard, or None after a
        failed `load` event. The reference and the card's input factory are loaded here, in the judge."""
        from mini_kv.worker.inputs import import_path
        from mini_kv.worker.remote import RemoteGuard, RemoteOp

        if job.project_root and job.project_root not in sys.path:
            sys.path.append(job.project_root)  # the card's own modules, as the loader imports them
        reference, factory = import_path(job.reference), import_path(job.inputs)
        reply = subject.request(
            "load",
            kind="card",
            device=job.device,
            library=job.library,
            op=job.op,
            project_root=job.project_root,
            inputs=job.inputs,
            memory_limit_bytes=job.memory_limit_bytes,
        )
        if not reply.get("ok"):
            return chan.send(event=Event.LOAD, ok=False, **_load_failure(reply))
        if job.baseline:
            # the regression gate's same-run comparison: the baseline's own build, under its own
            # dispatcher namespace, takes the reference's place in the interleaved timing
            reply_b = subject.request("load_baseline", library=job.baseline["library"], op=job.baseline["op"])
            if not reply_b.get("ok"):  # a violation too: either way no same-run comparison
                why = _load_failure(reply_b)["reason"]
                return chan.send(
                    event=Event.LOAD, ok=False, reason=f"the baseline's build did not load: {why}"
                )
            reference = RemoteOp(subject, "baseline")
        chan.send(event=Event.LOAD, ok=True, kernels=reply.get("kernels"), hint=reply.get("hint"))
        return cls(job, chan, RemoteOp(subject, "candidate"), reference, factory, RemoteGuard(subject))

    def correctness(self, case: dict) -> tuple[dict, dict]:
        from mini_kv.worker import correctness

        job, chan = self.job, self.chan
        # `inputs` until the card's factory has made them: a crash or hang there is the card's fault
        chan.send(event=Event.BEGIN, stage="inputs", case=case["id"])
        rec = correctness.run_case(
            self.op,
            self.reference,
            self.factory,
            job.task_id,
            case,
            job.tolerances.get(case["dtype"]),
            job.device,
            job.salt,
            self.guard,
            on_inputs=lambda: chan.send(event=Event.BEGIN, stage="correctness", case=case["id"]),
            own_kernels=bool(job.benchmark.get("require_own_kernels")),
        )
        return rec, {}

    def contract(self, name: str) -> dict:
        """opcheck or gradcheck, run in the subject (they call the op in ways only torch knows): its
        record is the subject's claim, and a violation there fails the check."""
        from mini_kv.worker import integrity

        job = self.job
        try:
            reply = self.op.subject.ask(
                "contract", name=name, task_id=job.task_id, cases=job.all_cases, salt=job.salt
            )
        except integrity.Violation as v:
            return {"status": v.status, "integrity": v.code, "reason": str(v)}
        except Exception as exc:  # noqa: BLE001 - the check itself broke in the subject
            return {"status": Status.FAILED, "reason": f"{type(exc).__name__}: {exc}"}
        return reply["record"] if isinstance(reply.get("record"), dict) else {"status": Status.FAILED}

    def bench(self, case: dict) -> dict:
        from mini_kv.worker import benchmark, integrity

        job = self.job
        try:
            return benchmark.bench_case(
                self.op,
                self.reference,
                self.factory,
                job.task_id,
                case,
                job.benchmark,
                job.tolerances[case["dtype"]],
                job.device,
                job.salt,
                job.peak_bw,
                job.exprs,
                self.guard,
            )
        except integrity.Violation as v:
            return {"id": case["id"], "status": v.status, "integrity": v.code, "reason": str(v)}
        except Exception as exc:  # noqa: BLE001 - a failed benchmark is a result
            return {
                "id": case["id"],
                "status": Status.BENCHMARK_ERROR,
                "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }


def _load_failure(reply: dict) -> dict:
    """The `load` event's fields for a subject that could not load the candidate, or reported a
    violation while it did."""
    if isinstance(reply.get("violation"), dict):
        v = reply["violation"]
        return {"integrity": v.get("code"), "reason": f"{v.get('code')}: {v.get('message')}"}
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    return {"reason": f"{err.get('type')}: {err.get('message')}", "hint": reply.get("hint")}


def _one_shot(path: str):
    """A kind with one answer, `path`'s function of the job, sent as a `result` event (an exception
    becomes a `fatal` one in main)."""

    def handler(job: Job, chan: Channel) -> int:
        from mini_kv.worker.inputs import import_path

        if hasattr(job, "device"):
            _set_device(job.device)
        chan.send(event=Event.RESULT, result=import_path(path)(job))
        return 0

    return handler


HANDLERS = {
    "bandwidth": _one_shot("mini_kv.worker.bandwidth:measure_job"),
    "ab": _one_shot("mini_kv.profile.ab:time_pair"),
    "profile_target": _one_shot("mini_kv.profile.target:run"),
    "sol_profile_target": _one_shot("mini_kv.profile.sol:run_target"),
    "build": _one_shot("mini_kv.compile.jit_child:build"),
}


if __name__ == "__main__":
    sys.exit(main())
