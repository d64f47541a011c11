"""The one child-process entry: `python -m mini_kv.worker.child --result-fd N`, one job JSON a line on stdin.

Every job kind (mini_kv.worker.jobs) runs here: a task card's candidate, a SOL solution, and the
one-shot kinds (bandwidth probe, the profiled target, a build), each answering with
one `result` event. Events go back signed on a pipe the parent owns (mini_kv.worker.channel); the
parent alone writes attempt files. A `begin` event precedes each case so that a crash or hang is
pinned on it. Under ncu the job comes from a file (`--job`) and the events go to one (`--result-file`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import traceback

from mini_kv.codec import to_json
from mini_kv.proc import settle_worker
from mini_kv.status import Status
from mini_kv.worker.channel import KEY_ENV, POISONED_MARKERS, Channel
from mini_kv.worker.jobs import (
    BETWEEN_JOBS,
    SUBJECT_DROPPED,
    SUBJECT_KINDS,
    SUBJECT_LOST,
    Event,
    Job,
)


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
    parser.add_argument(
        "--warm-contract", action="store_true", help="a subject: import opcheck's stack first"
    )
    parser.add_argument(
        "--card-modules",
        help="a card's judge: JSON {project_root, modules: [[field, 'module:function'], ...]} to import "
        "before the job, answered with a `modules` event",
    )
    ns = parser.parse_args(argv)
    # The cyclic collector off while the harness's own imports run: they build hundreds of thousands of
    # long-lived objects that each collection walks again (about a fifth of torch's import CPU, a quarter
    # of opcheck's, in each of a candidate's two processes); frozen afterwards, so later collections skip
    # them too. Back on before any job or candidate code runs.
    gc.disable()
    import torch  # noqa: F401 - every job needs it; loading it before the job arrives overlaps the parent's work

    if ns.subject_fd is not None:
        from mini_kv.worker.subject import serve

        if ns.warm_contract:
            _warm_contract()
        _collector_back()
        return serve(ns.subject_fd)

    if ns.warm_profiler:
        _warm_profiler()
    _collector_back()
    # the key comes first (stdin's first line, or the environment under ncu), the job after it: the
    # channel is up before the job is known, for a card's `modules` answer
    key = os.environ.pop(KEY_ENV) if ns.job else sys.stdin.readline().strip()
    chan = Channel(ns.result_fd if ns.result_file is None else ns.result_file, bytes.fromhex(key))
    if ns.card_modules:
        field, message = import_card_modules(json.loads(ns.card_modules)) or (None, None)
        chan.send(event=Event.MODULES, ok=field is None, field=field, message=message)
    if ns.job:
        with open(ns.job) as f:
            return _run(json.load(f), chan, ns)
    # a judge whose job ended with `done` waits for the next one (a batch's next candidate, with a fresh
    # subject: runner.KeptJudges), and one whose subject was lost for the cases left (runner._WorkerRun);
    # the end of stdin ends it
    while line := sys.stdin.readline():
        code = _run(json.loads(line), chan, ns)
        if code != 0 or chan.last not in BETWEEN_JOBS:
            return code
    return 0


def _run(data: dict, chan: Channel, ns: argparse.Namespace) -> int:
    """One job: a judge's (linked to its subject on the fd the parent sends with it) or a one-shot kind's."""
    try:
        job = Job.from_dict(data)
        settle_worker(getattr(job, "device", None), getattr(job, "memory_limit_bytes", None))
        if job.KIND in SUBJECT_KINDS:  # a judge says `ready` once its subject is up too (run_job)
            return run_job(job, chan, *_link_fds(ns.result_fd))
        if ns.result_file is None:  # the parent's timeouts count from here (runner.ChildRun.next_event)
            chan.send(event=Event.READY)
        return HANDLERS[job.KIND](job, chan)
    except Exception as exc:  # noqa: BLE001 - report, then exit non-zero
        chan.send(
            event=Event.FATAL, reason=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:]
        )
        return 3


def _collector_back() -> None:
    """The harness's imports done (main): what they made kept out of every later collection, and the
    collector on again."""
    gc.freeze()
    gc.enable()


def import_card_modules(spec: dict) -> tuple[str, str] | None:
    """A card's reference and input modules imported here, in the judge, before its job: None, or the
    first field whose module does not import or names no callable, and why. One that fails is
    the card's error, told before any build (pipeline.CardDoor.prepare); the job's load finds them
    imported. No candidate code has run in this pair yet."""
    from mini_kv.load.targets import add_project_to_path, import_error

    add_project_to_path(spec.get("project_root"))
    for field, target in spec.get("modules", []):
        why = import_error(str(target), catch=BaseException)  # sys.exit() at import too: the card's fault
        if why is not None:
            return field, why
    return None


def _link_fds(result_fd: int) -> tuple[int, int | None]:
    """The judge's end of the link to its subject, which the parent sends on the result channel with the
    job's log (this process's output from now on: a kept judge's next job logs where that job's
    attempt does), and the subject's CPU meter where the parent has one (remote.CpuMeter)."""
    with socket.socket(fileno=os.dup(result_fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 16, 3)
    if len(fds) not in (2, 3):
        raise RuntimeError("the parent sent no link to a subject")
    sys.stdout.flush()
    sys.stderr.flush()
    for out in (1, 2):
        os.dup2(fds[1], out)
    os.close(fds[1])
    return fds[0], (fds[2] if len(fds) == 3 else None)


def _warm_contract() -> None:
    """A card's subject imports what opcheck needs (torch's optests, torch._dynamo: seconds) before it
    answers its judge's `hello`, while the parent still builds, so the contract stage does not wait for
    it. No candidate code is loaded yet."""
    try:
        import torch.testing._internal.optests  # noqa: F401
    except Exception:  # noqa: BLE001 - only a head start: the contract check imports it again, and says why
        pass


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


def run_job(job: Job, chan: Channel, link_fd: int, meter_fd: int | None = None) -> int:
    """A problem's candidate (kinds `card` and `sol`), loaded in the subject by its format's evaluator,
    then one loop over the kind's steps: a card's correctness cases, contract checks and bench cases, a
    SOL problem's workloads (each record holds its timing too); a `begin` event before each. A subject
    that is gone ends the job (a `lost` event): the parent pins that on the case of the last `begin`, and
    sends the cases left to this judge again with a fresh subject. The judge runs no candidate code, and
    what a subject sent was never more than a claim, so a subject's end changes nothing the judge holds;
    a CUDA error that may poison the context (below) still ends it."""
    from mini_kv.worker.remote import CpuMeter, SubjectLink, SubjectLost

    subject = SubjectLink(link_fd, job.device, None if meter_fd is None else CpuMeter(meter_fd))
    try:
        # the subject answers once it is up (Python, torch; no candidate code): `ready` then, so that a
        # loaded host's slow start is not taken from the candidate's first timeout
        subject.ask("hello")
        chan.send(event=Event.READY)
        return _run_stages(job, chan, subject)
    except SubjectLost as lost:
        print(f"mini_kv: {lost}", file=sys.stderr, flush=True)
        chan.send(event=Event.LOST, code=SUBJECT_DROPPED if subject.broken else SUBJECT_LOST)
        return 0
    finally:
        subject.close()


def _run_stages(job: Job, chan: Channel, subject) -> int:
    """The kind's evaluator (worker/formats.EVALUATORS) loaded, then each of its steps over the job's list
    of items, one event per item (its record); the engine (worker/engine.py) does the checking."""
    from mini_kv.worker.formats import EVALUATORS

    ev = EVALUATORS[job.KIND].load(job, chan, subject)
    if ev is None:  # a failed `load` event was sent
        return 0
    for step in ev.STEPS:
        for item in getattr(job, step.over, None) or []:
            rec, fields = getattr(ev, step.method)(item)
            chan.send(event=step.event, record=rec, **fields)
            _stop_if_broken(subject)
            if _poisoned(rec if isinstance(rec, dict) else to_json(rec)):
                return 4  # the CUDA context may be poisoned: the parent continues in a fresh child
    chan.send(event=Event.DONE)
    return 0


def _poisoned(rec: dict) -> bool:
    """A record (a card case's dict, a SOL workload's as JSON) of a CUDA error that may poison the context."""
    why = rec.get("reason") or rec.get("log") or ""
    return rec.get("status") == Status.RUNTIME_ERROR and any(m in why for m in POISONED_MARKERS)


def _stop_if_broken(subject) -> None:
    """After a record: a subject that broke the protocol is asked nothing more (the parent goes on with
    a fresh subject for what is left)."""
    from mini_kv.worker.remote import SubjectLost

    if subject.broken:
        raise SubjectLost(f"the subject broke the protocol ({subject.broken})")


def _one_shot(path: str):
    """A kind with one answer, `path`'s function of the job, sent as a `result` event (an exception
    becomes a `fatal` one in main)."""

    def handler(job: Job, chan: Channel) -> int:
        from mini_kv.worker.inputs import import_path

        chan.send(event=Event.RESULT, result=import_path(path)(job))
        return 0

    return handler


HANDLERS = {
    "bandwidth": _one_shot("mini_kv.worker.bandwidth:measure_job"),
    "profile_target": _one_shot("mini_kv.profile.target:run"),
    "sol_profile_target": _one_shot("mini_kv.profile.sol:run_target"),
    "build": _one_shot("mini_kv.compile.jit_child:build"),
}


def _exit(code: int, argv: list[str]) -> None:
    """End the child without the interpreter's teardown (proc.exit_without_teardown: atexit handlers and
    streams as usual): with torch loaded it cost about 0.3 s of CPU, 0.7 s after opcheck's torch._dynamo,
    in each of a candidate's two processes, after its results were sent. Under ncu (`--result-file`) the
    process ends as usual, so that the profiler's own exit handlers run."""
    from mini_kv.proc import exit_without_teardown

    if "--result-file" in argv:
        sys.exit(code)
    exit_without_teardown(code)


if __name__ == "__main__":
    _exit(main(), sys.argv[1:])
