"""Parent side of the process boundary: start the worker child, read its events, enforce timeouts.

Every job kind (mini_kv.worker.jobs) runs in `python -m mini_kv.worker.child`: `run_worker` for the
staged kinds (card, sol), `run_one` for the one-shot ones. The parent never imports candidate code.
A child that crashes or hangs is killed (its whole tree: the jail's PID namespace); the case it was
running is recorded as RUNTIME_ERROR or TIMEOUT with the tail of its log, and a fresh child continues
with the cases after it; where only the subject (the candidate's process) ended, its judge continues
with a fresh subject. Every child is started through the jail (mini_kv.jail), as `spec` says.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mini_kv import jail, pycache
from mini_kv.jail import JailInfo, JailSpec
from mini_kv.model import JailRecord, WorkerResults
from mini_kv.proc import exit_text
from mini_kv.settings import DEFAULTS
from mini_kv.status import Status
from mini_kv.worker import explain
from mini_kv.worker.channel import Verifier
from mini_kv.worker.jobs import (
    BETWEEN_JOBS,
    SUBJECT_DROPPED,
    SUBJECT_KINDS,
    SUBJECT_LOST,
    Event,
    Job,
)
from mini_kv.worker.link import pair as link_pair

MAX_RESTARTS = 50
# how long a subject that ended first (its judge said so) may take to finish ending before it is killed:
# killed sooner, a candidate's own exit reads as SIGKILL, ours
SUBJECT_END_WAIT_S = 3.0
STARTUP_S = DEFAULTS.startup_s


def _tail(path: str, n: int = 4000, since: int = 0) -> str:
    """The last `n` bytes of a log, none before offset `since` (where the case it is shown for began)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(since, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _describe_exit(code: int | None, memory_cap: int | None = None) -> str:
    """How a child ended; `memory_cap`: its jail's memory cap, where its tree (or a process of it) was
    killed there."""
    how = _exit_status(code)
    return how if memory_cap is None else f"{how}: {jail.out_of_memory(memory_cap, '--memory-limit')}"


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code == jail.ENTER_FAILED:
        return (
            f"exited with status {code}: the jail could not be set up (the worker log says why; "
            "--sandbox off runs without it)"
        )
    return exit_text(code)


def _ended(code: int | None, child: ChildRun) -> str:
    """How a worker ended, for the record: a judge whose subject was lost says how the subject ended."""
    if code == SUBJECT_LOST:
        return explain.process_ended(_describe_exit(child.subject_code, child.subject_out_of_memory))
    if code == SUBJECT_DROPPED:
        return "the judge dropped its subject, which broke the protocol (the case's record says how)"
    return f"worker {_describe_exit(code, child.out_of_memory)}"


def default_sandbox() -> JailInfo:
    """The jail of a run that did not choose one: --sandbox's default (auto), $MINI_KV_SANDBOX."""
    return jail.resolve(jail.mode_from(None))


def default_spec(job: Job | None = None) -> JailSpec:
    """A child's view when its caller names none: the project around the working directory read-only
    (less its .build/ and artifacts/), the files and dirs the job names, and the GPU if there is one."""
    from mini_kv.load.task_card import find_project_root

    root = find_project_root(Path.cwd())
    named = [p for p in job_paths(job.to_dict()) if os.path.exists(p)] if job is not None else []
    return JailSpec(
        read_only=(str(root), *named),
        hidden=tuple(str(root / d) for d in (".build", "artifacts") if (root / d).exists()),
        gpu=bool(jail.gpu_nodes()),
    )


def job_paths(value) -> list[str]:
    """Every absolute path named in a job's data: ChildRun stages those under `.build/` into its jail."""
    if isinstance(value, str):
        return [value] if value.startswith("/") else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in job_paths(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in job_paths(v)]
    return []


# the files of mini_kv that hold a worker's checks and timers (not the loaders, CLI, store or profiler,
# which may be edited in a working tree while a long run goes on); a card's reference module comes
# with the job's `watch_paths`
_WORKER_FILES = tuple(("worker/*.py stats.py runner.py status.py model.py settings.py").split())


def harness_paths(extra=()) -> list:
    """The verifier's files that a worker uses, and `extra` paths: watched (pycache.file_stamps) while it runs."""
    return [
        *(p for pattern in _WORKER_FILES for p in sorted(Path(__file__).resolve().parent.glob(pattern))),
        *extra,
    ]


def files_changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


class AheadOfTurn:
    """The workers started before their turn (a batch's next item: cluster.batch.evaluate_here), stopped
    whole (SIGSTOP to every process of their jails) while a worker of this process times (its judge's
    Event.TIMING), and continued when the timing ends. Their start-up (Python, torch, opcheck's imports)
    runs beside the item before's build, correctness rounds and contract checks, never beside a timing:
    on an H100 a worker's start beside a timing shifted the reference re-checks of small kernels, and on
    a CPU it would take the cores the timed calls run on. A worker started ahead runs no candidate code
    and touches nothing on the GPU (no CUPTI warm-up) until its job is sent."""

    _lock = threading.Lock()
    _children: set[ChildRun] = set()
    _timing = False

    @classmethod
    def mark(cls, child: ChildRun, ahead: bool) -> None:
        """`child` started ahead (stopped now if a timing runs), or its turn has come (or it is closed):
        it runs again, and is stopped no more."""
        with cls._lock:
            if (child in cls._children) != ahead:
                (cls._children.add if ahead else cls._children.discard)(child)
                if cls._timing:
                    child.signal(signal.SIGSTOP if ahead else signal.SIGCONT)

    @classmethod
    def timing(cls, on: bool) -> None:
        with cls._lock:
            if on != cls._timing:
                cls._timing = on
                for child in cls._children:
                    child.signal(signal.SIGSTOP if on else signal.SIGCONT)


@dataclass
class _Judge:
    """A judge kept between jobs (KeptJudges): its jailed process, its end of the result channel, the
    channel's verifier (its numbering goes on) and the key it was started under."""

    proc: Any
    fd: int
    verifier: Verifier
    key: tuple

    def end(self) -> None:
        """The end of its stdin ends it; one that does not end by itself is killed."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill_tree()
            self.proc.wait()
        self.proc.cleanup()
        os.close(self.fd)


class KeptJudges:
    """Judges kept between the jobs of a batch (`keep_judges`: cluster.batch.evaluate_here). A judge whose
    job ended with `done` and that is still alive waits for another job, and the next ChildRun started
    alike (the same jail view, sandbox, environment and card modules: `ChildRun.pool_key`) takes it
    instead of starting one: its Python, torch and the card's modules (about a second and a half of
    CPU) are paid once per batch. Every job gets a fresh subject: the candidate never runs where another
    candidate ran, and the judge runs no candidate code. A ChildRun started while a judge of its kind is
    busy (a batch's next item, started ahead) waits for it, and starts its own when its turn comes and
    none was kept (that judge crashed, hung, or was killed)."""

    IDLE_MAX = 2  # judges kept at once (each holds torch, and on a GPU a CUDA context)
    _lock = threading.Lock()
    _depth = 0
    _idle: list[_Judge] = []
    _busy: dict[tuple, int] = {}

    @classmethod
    def enter(cls) -> None:
        with cls._lock:
            cls._depth += 1

    @classmethod
    def leave(cls) -> None:
        with cls._lock:
            cls._depth -= 1
            ending, cls._idle = (cls._idle, []) if cls._depth == 0 else ([], cls._idle)
        for judge in ending:
            judge.end()

    @classmethod
    def busy(cls, key: tuple | None, change: int) -> None:
        if key is not None:
            with cls._lock:
                cls._busy[key] = cls._busy.get(key, 0) + change

    @classmethod
    def exists(cls, key: tuple | None) -> bool:
        """A judge of this kind is kept, or busy and may be kept: worth waiting for."""
        with cls._lock:
            if key is None or cls._depth == 0:
                return False
            return cls._busy.get(key, 0) > 0 or any(j.key == key for j in cls._idle)

    @classmethod
    def keeping(cls) -> bool:
        with cls._lock:
            return cls._depth > 0

    @classmethod
    def take(cls, key: tuple | None) -> _Judge | None:
        """A kept judge of this kind, alive (one that died waiting, e.g. with the thread that started it:
        its jail's parent-death signal, is ended and passed over)."""
        while key is not None:
            with cls._lock:
                found = next((j for j in cls._idle if j.key == key), None)
                if found is None:
                    return None
                cls._idle.remove(found)
            if found.proc.poll() is None:
                return found
            found.end()
        return None

    @classmethod
    def put(cls, judge: _Judge) -> None:
        with cls._lock:
            cls._idle.append(judge)
            ending = cls._idle[: -cls.IDLE_MAX]
            cls._idle = cls._idle[-cls.IDLE_MAX :]
        for old in ending:
            old.end()


@contextlib.contextmanager
def keep_judges():
    """Within it, judges are kept between jobs (KeptJudges); at its end the idle ones end."""
    KeptJudges.enter()
    try:
        yield
    finally:
        KeptJudges.leave()


class ChildRun:
    """One jailed child process and its event pipe.

    The child imports torch before it reads its job, so a child started early (`ChildRun(None, ...)`
    then `send(job)`) loads torch while the parent still prepares the job (e.g. builds);
    `warm_profiler` has it pay CUPTI's start-up then too, `warm_contract` its subject the import of
    torch's compiler stack that opcheck needs (seconds: while the parent builds, not in the contract
    stage). `spec` says what the jail shows it (default: `default_spec`); the build products a job names
    are staged into it when the job is sent. `ahead`: started before its turn, so stopped while a timing
    runs until `in_turn` (AheadOfTurn)."""

    def __init__(
        self,
        job: Job | None,
        log_path: str,
        env: dict | None,
        warm_profiler: bool = False,
        sandbox: JailInfo | None = None,
        spec: JailSpec | None = None,
        warm_contract: bool = False,
        card_modules: dict | None = None,
        ahead: bool = False,
    ):
        self.warm_contract = warm_contract
        self.card_modules = card_modules
        self.key = secrets.token_bytes(32)
        self.verifier = Verifier(self.key)
        self.log = open(log_path, "ab")
        self.sandbox_info = sandbox if sandbox is not None else default_sandbox()
        self.spec = spec if spec is not None else default_spec(job)
        self.env, self.warm = env, self._warm_flags(warm_profiler, warm_contract)
        self.job: Job | None = None
        self.subject: SubjectRun | None = None
        self.subject_code: int | None = None  # how the subject ended (close)
        # (close) the jail's memory cap where the kernel killed the child, or its subject, at it
        self.out_of_memory: int | None = None
        self.subject_out_of_memory: int | None = None
        self.judge_end: int | None = None  # the judge's end of the link, until handed to it
        self.buf = b""
        self.ready = False  # the child's `ready` event seen
        self.ended = False  # its result pipe closed: it is exiting (or exited) by itself
        self.log_path = log_path
        self.done_seen = False  # the job's `done` (or `lost`) read: the judge waits for another (close)
        # a judge of a staged kind can be kept between jobs (KeptJudges); its kind, what it was started with
        staged = self.HAS_SUBJECT and (job is None or job.KIND in SUBJECT_KINDS)
        self.pool_key = self._pool_key(env) if staged else None
        self.modules_answered = card_modules is None  # a kept judge imported them for its first job
        self.proc = None
        self.fd: int | None = None
        # started early (maybe ahead of its turn) where a judge of its kind is kept or busy: it takes that
        # judge in its turn (_need_judge), never one another run's turn comes to first
        if not (job is None and KeptJudges.exists(self.pool_key)) and not self._adopt():
            self._start()
        if job is None or job.KIND in SUBJECT_KINDS:
            self._spawn_subject()
        if ahead:
            AheadOfTurn.mark(self, True)
        if job is not None:
            self.send(job)

    def signal(self, sig: int) -> None:
        """`sig` to every process of this child's jail and of its subject's."""
        for run in (self, self.subject):
            if run is not None and run.proc is not None:
                run.proc.signal_tree(sig)

    def _pool_key(self, env: dict | None) -> tuple:
        """What a kept judge must have been started with to serve this run (KeptJudges): its environment
        as the jail makes it, so that a variable changed between two runs (CUDA_VISIBLE_DEVICES, a
        thread count) is a different kind of judge."""
        modules = json.dumps(self.card_modules, sort_keys=True) if self.card_modules is not None else None
        view = self.spec.view(runs_candidate=False)
        return (self.sandbox_info, view, modules, json.dumps(jail.environment(env, view), sort_keys=True))

    def _adopt(self) -> bool:
        """A kept judge of this run's kind taken over, if one waits (KeptJudges)."""
        judge = KeptJudges.take(self.pool_key)
        if judge is None:
            return False
        self.proc, self.fd, self.verifier = judge.proc, judge.fd, judge.verifier
        self.modules_answered = True
        KeptJudges.busy(self.pool_key, 1)
        # the attempt's log says whose judge this was (its own lines follow once the job is sent)
        self.log.write(f"mini-kv: judge pid {judge.proc.pid} kept from an earlier job\n".encode())
        self.log.flush()
        return True

    def _need_judge(self) -> None:
        """A run that waited for a kept judge (KeptJudges.exists), in its turn: that judge, else its own."""
        if self.proc is None and not self._adopt():
            self._start()

    def in_turn(self) -> None:
        """A child started ahead of its turn: its turn has come (AheadOfTurn)."""
        AheadOfTurn.mark(self, False)

    FD_FLAG = "--result-fd"

    @staticmethod
    def _warm_flags(profiler: bool, contract: bool) -> list[str]:
        """What the child does before its job: a judge warms CUPTI (its subject gets `contract`)."""
        return ["--warm-profiler"] if profiler else []

    def _channel(self) -> tuple[int | None, int]:
        """(this end, the child's end) of the result channel: a socket, so that the judge's end of
        the link to its subject can be handed over on it (send)."""
        mine, theirs = socket.socketpair()
        return mine.detach(), theirs.detach()

    def _start(self) -> None:
        pycache.warm_for_children()  # once per environment: what jailed children import, compiled
        KeptJudges.busy(self.pool_key, 1)
        self.fd, write_fd = self._channel()
        argv = [sys.executable, "-m", "mini_kv.worker.child", self.FD_FLAG, str(write_fd), *self.warm]
        if self.card_modules is not None:
            argv += ["--card-modules", json.dumps(self.card_modules)]
        try:
            self.proc = jail.popen(
                argv,
                # a judge sees no candidate's own files (its subject does); a one-shot job's child, whose
                # job loads candidate code itself, and a subject see them
                self.spec.view(runs_candidate=self.pool_key is None),
                self.sandbox_info,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                self_landlock=True,  # worker.child applies the jail's Landlock rules first thing
            )
        finally:
            os.close(write_fd)
        if self.HAS_SUBJECT:  # a judge: the channel's key, its stdin's first line (a subject gets none)
            try:
                self.proc.stdin.write(self.key.hex().encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:  # the child died early: next_event sees the end of the stream
                pass

    def card_modules_error(self, timeout: float) -> tuple[str, str] | None:
        """(field, why) where the card's modules did not import in the judge (`card_modules`), else None:
        its `modules` event, the first it sends (a kept judge imported them for its first job)."""
        self._need_judge()
        if self.modules_answered:
            return None
        self.modules_answered = True
        ev = self.next_event(timeout)
        if isinstance(ev, dict) and ev.get("event") == Event.MODULES:
            return None if ev.get("ok") else (str(ev.get("field")), str(ev.get("message")))
        what = (
            "did not answer in time" if ev == "timeout" else "ended" if ev is None else "answered out of turn"
        )
        return (
            "operator.reference",
            f"the judge importing the card's modules {what}: {_tail(self.log_path, 2000)}",
        )

    def send(self, job: Job) -> None:
        self._need_judge()
        self.in_turn()
        self.job = job
        data = job.to_dict()
        judged = job.KIND in SUBJECT_KINDS
        # a library under .build/: copied into the view of the process that loads it, a one-shot job's
        # child or a judge's subject (_link_subject), never into a judge's (it loads none, and a kept
        # judge's view would gather every library of its batch)
        for path in () if judged else job_paths(data):
            self.proc.stage(path)
        try:  # one line: a judge kept after this job reads the next one (KeptJudges)
            self.proc.stdin.write(json.dumps(data).encode() + b"\n")
            self.proc.stdin.flush()
            if not judged:
                self.proc.stdin.close()
        except BrokenPipeError:  # the child died early: next_event sees the end of the stream
            pass
        if judged:
            self._link_subject()
        elif self.subject is not None:  # started early for a kind that needs none
            self.subject.close(kill=True)
            self.subject = None

    HAS_SUBJECT = True

    def _spawn_subject(self) -> None:
        """The subject, the process that runs the candidate, started as this child is (so jailed alike)
        and with it (its start-up, torch above all, overlaps the judge's and the parent's work)."""
        if not self.HAS_SUBJECT:
            return
        self.judge_end, subject_end = link_pair()
        try:
            self.subject = SubjectRun(
                subject_end, self.log_path, self.env, self.sandbox_info, self.spec, self.warm_contract
            )
        finally:
            os.close(subject_end)

    def _link_subject(self) -> None:
        """The job's files staged into the subject's view (the candidate's library above all), and the
        judge's end of the link handed to the judge on the result channel."""
        if self.subject is None:
            self._spawn_subject()
        for path in job_paths(self.job.to_dict()):
            self.subject.proc.stage(path)
        meter = self.subject.proc.cpu_meter()  # read-only: the judge's count of the subject's CPU time
        fds = [self.judge_end, self.log.fileno(), *([] if meter is None else [meter])]  # and its log
        try:
            with socket.socket(fileno=os.dup(self.fd)) as sock:
                socket.send_fds(sock, [b"link"], fds)
        except OSError:  # the judge died early: next_event sees the end of the stream
            pass
        finally:
            os.close(self.judge_end)
            self.judge_end = None
            if meter is not None:
                os.close(meter)

    def next_event(self, timeout: float) -> dict | None | str:
        """An event dict, None at end of stream, or 'timeout'. `timeout` counts from the child's
        `ready`: its start-up (Python, torch, CUPTI; no candidate code yet) gets STARTUP_S instead, so
        that a busy machine's slow start is never a candidate's TIMEOUT."""
        if not self.ready:
            ev = self._next_line(max(timeout, STARTUP_S))
            if not (isinstance(ev, dict) and ev.get("event") == Event.READY):
                return ev
            self.ready = True
        return self._next_line(timeout)

    def _next_line(self, timeout: float) -> dict | None | str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return "timeout"
            try:
                chunk = os.read(self.fd, 1 << 16)
            except ConnectionResetError:  # it died with our data unread (a kept judge: its next link)
                chunk = b""
            if not chunk:
                self.ended = True
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        ev = self.verifier.read(line)
        self.done_seen = ev.get("event") in BETWEEN_JOBS
        return ev

    def close(self, kill: bool) -> int | None:
        """Wait for the child (kill its tree first with `kill`); whatever it left running dies with it:
        the jail's PID namespace ends with its first process. The subject ends when the judge closes
        the link, and is killed once the judge has ended (by then a subject that died has said how)."""
        self.in_turn()  # a stopped child ends neither by itself nor by its pipe closing
        if self.judge_end is not None:  # a child closed before its job: the link never handed over
            os.close(self.judge_end)
            self.judge_end = None
        if self.proc is None:  # it waited for a kept judge and never needed one
            return self._end_subject(None)
        if not kill and self._keep():
            return 0
        KeptJudges.busy(self.pool_key, -1)
        if not self.proc.stdin.closed:  # a child that never got its job, or a judge between jobs
            self.proc.stdin.close()
        if kill and self.ended:  # a child that died (its pipe closed): let bwrap report how it died
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if kill:
            self.proc.kill_tree()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill_tree()
            code = self.proc.wait()
        self.proc.cleanup()
        self.out_of_memory = self.proc.oom_cap
        if self.fd is not None:
            os.close(self.fd)
        return self._end_subject(code)

    def _end_subject(self, code: int | None) -> int | None:
        """The subject ended (killed: its judge has ended, or is done with it), then the log closed."""
        self._close_subject(code)
        self.log.close()
        return code

    def _close_subject(self, code: int | None) -> None:
        if self.subject is not None:
            if code == SUBJECT_LOST:  # the subject ended first: let it finish ending, unkilled by us
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.subject.proc.wait(timeout=SUBJECT_END_WAIT_S)
            self.subject_code = self.subject.close(kill=True)
            self.subject_out_of_memory = self.subject.out_of_memory
            self.subject = None

    def subject_lost(self, code: int) -> int:
        """The judge said its subject is gone (Event.LOST, `code` as its exit status would have said it) and
        waits for its next job: the subject ends as at a judge's end (how it ended is kept for the record),
        and the judge takes the job's cases left with a fresh subject (send): a judge's start (Python,
        torch, the card's modules, a CUDA context) is paid once per candidate, not once per crash."""
        self._close_subject(code)
        self.ready = False  # the judge says `ready` again once its next subject answers
        return code

    def _keep(self) -> bool:
        """A judge whose job ended with `done`, alive and with nothing more to say, kept for the next job
        of a batch (KeptJudges); its subject ends."""
        if not (
            self.pool_key is not None
            and KeptJudges.keeping()
            and self.done_seen
            and not self.ended
            and not self.buf
            and self.proc.poll() is None
        ):
            return False
        KeptJudges.busy(self.pool_key, -1)
        KeptJudges.put(_Judge(self.proc, self.fd, self.verifier, self.pool_key))
        self.fd = None
        self._end_subject(0)
        return True


class SubjectRun(ChildRun):
    """The subject child of a judge: started like every worker child, with its end of the link to the
    judge where the result channel would be. It has no job, no key and nothing to tell the parent."""

    FD_FLAG = "--subject-fd"
    HAS_SUBJECT = False

    def __init__(
        self,
        link_fd: int,
        log_path: str,
        env: dict | None,
        sandbox: JailInfo,
        spec: JailSpec,
        warm_contract: bool = False,
    ):
        self.link_fd = link_fd
        super().__init__(None, log_path, env, sandbox=sandbox, spec=spec, warm_contract=warm_contract)

    @staticmethod
    def _warm_flags(profiler: bool, contract: bool) -> list[str]:
        return ["--warm-contract"] if contract else []  # opcheck's imports, before any candidate code

    def _channel(self) -> tuple[int | None, int]:
        return None, os.dup(self.link_fd)


@dataclass(frozen=True)
class OneShot:
    """What a one-shot job's child answered: its `result` event's payload (`ok`), else why there is none
    (the child's `fatal` event, a timeout, a crash, unsigned data), with the tail of the child's output
    and the jail record of where it ran."""

    ok: bool
    result: Any  # the job's answer (None without one)
    reason: str | None
    log_tail: str
    sandbox: JailRecord
    timed_out: bool = False
    traceback: str | None = None


def run_one(
    job: Job,
    timeout: float,
    env: dict | None = None,
    sandbox: JailInfo | None = None,
    log_path: str | None = None,
    spec: JailSpec | None = None,
) -> OneShot:
    """A one-shot job kind in a fresh child. `log_path` keeps the child's output (default: a scratch
    dir's file, removed)."""
    if log_path is None:
        with jail.scratch("child") as box:
            return run_one(job, timeout, env, sandbox, str(box / "child.log"), spec)
    child = ChildRun(job, log_path, env, sandbox=sandbox, spec=spec)
    ev = child.next_event(timeout)
    kind = ev.get("event") if isinstance(ev, dict) else None
    code = child.close(kill=kind != Event.RESULT)
    if kind not in (Event.RESULT, Event.FATAL):  # forged, another event, none, or none in time
        why = (
            f"no result within {timeout:.0f} s; process group killed"
            if ev == "timeout"
            else f"worker {_describe_exit(code, child.out_of_memory)} without a result"
            if ev is None
            else f"unexpected event {ev!r}"[:500]
        )
        ev = {"reason": why, "timed_out": ev == "timeout"}
    return OneShot(
        kind == Event.RESULT,
        ev.get("result"),
        ev.get("reason"),
        _tail(log_path),
        child.sandbox_info.record(),
        bool(ev.get("timed_out")),
        ev.get("traceback"),
    )


def run_worker(
    job: Job,
    case_timeout: float,
    stage_timeout: float,
    log_path: str | None = None,
    env: dict | None = None,
    on_event=None,
    first_child: ChildRun | None = None,
    sandbox: JailInfo | None = None,
    give_up_after: int = DEFAULTS.give_up_after,
    spec: JailSpec | None = None,
) -> WorkerResults:
    """Run every stage of `job` (kind card or sol) in child processes; returns their records.

    `give_up_after`: consecutive TIMEOUTs after which the cases still pending are recorded NOT_RUN (0: never).

    `on_event`, if given, sees every event the child sends (e.g. to show progress). `first_child`:
    a child started earlier without a job (same `env`, logging to `log_path`); it runs the first batch.
    `sandbox`: how children are jailed (default: mini_kv.jail's choice for this machine), recorded in
    the results; `spec`: what the jail shows them (default: the first child's, else `default_spec`).
    """
    if log_path is None:
        if first_child is None:
            raise ValueError("run_worker needs a log_path or a first_child (whose log it goes on)")
        log_path = first_child.log_path
    if sandbox is None:
        sandbox = first_child.sandbox_info if first_child is not None else default_sandbox()
    if spec is None:
        spec = first_child.spec if first_child is not None else default_spec()
    run = _WorkerRun(job, case_timeout, stage_timeout, log_path, env, on_event, sandbox, give_up_after, spec)
    return run.run(first_child)


class _WorkerRun:
    """One `run_worker` call: what is still pending, the results so far, the case the child is on.
    A child that crashes or hangs gets the case it was on recorded, and a fresh child the rest; a subject
    that crashes (its judge alive: Event.LOST) the same, the rest going to that judge with a fresh subject."""

    def __init__(
        self,
        job: Job,
        case_timeout: float,
        stage_timeout: float,
        log_path: str,
        env: dict | None,
        on_event,
        sandbox: JailInfo,
        give_up_after: int = DEFAULTS.give_up_after,
        spec: JailSpec | None = None,
    ):
        self.job, self.case_timeout, self.stage_timeout = job, case_timeout, stage_timeout
        self.log_path, self.env, self.on_event, self.sandbox = log_path, env, on_event, sandbox
        self.spec = spec
        self.results = WorkerResults(log_path, sandbox.record())
        self.pending = {
            "cases": list(job.cases),
            "bench_cases": list(getattr(job, "bench_cases", [])),
            "contract": list(getattr(job, "contract", [])),
        }
        self.started = time.monotonic()
        self.current: tuple | None = None  # (stage, case id) the child is on
        self.give_up_after = give_up_after
        self.timeouts_in_row = 0  # TIMEOUTs since a case last finished
        self.lost_code = SUBJECT_LOST  # how the judge's last `lost` event said its subject ended
        self.log_mark = 0  # the log's size when the current case began (_mark_log)
        self.broke: list[str] = []  # the cases a child crashed or hung on (_contract_cases)
        self.handlers = {
            Event.BEGIN: self._begin,
            Event.LOAD: self._load,
            Event.CASE: self._record,
            Event.CONTRACT: self._record,
            Event.BENCH: self._record,
            Event.TIMING: lambda ev: AheadOfTurn.timing(ev.get("on") is True),
            Event.FATAL: self._fatal,
            Event.DONE: self._done,
            Event.LOST: self._lost,
            Event.FORGED: self._unsigned,
        }

    def run(self, first_child: ChildRun | None) -> WorkerResults:
        # the verifier's own files (and the suite's), checked from here where the candidate cannot reach
        watch = getattr(self.job, "watch_paths", [])
        files_before = pycache.file_stamps(harness_paths(watch))
        for _ in range(MAX_RESTARTS):
            sub = self.job.replace(**self.pending, **self._contract_cases())
            if first_child is not None:
                child, first_child = first_child, None
                child.send(sub)
            else:
                child = ChildRun(sub, self.log_path, self.env, sandbox=self.sandbox, spec=self.spec)
            try:
                outcome, budget = self._read(child)
            except BaseException:  # Ctrl-C, SIGTERM: the child's tree killed and its jail's dirs removed
                child.close(kill=True)
                raise
            finally:  # a judge that crashed or hung while timing never says its timing ended
                AheadOfTurn.timing(False)
            lost = outcome == "lost"
            code = child.subject_lost(self.lost_code) if lost else child.close(kill=outcome != "done")
            if not self._carry_on(outcome, _ended(code, child), budget):
                if lost:  # the judge waits for a next job: kept for a batch's next item, else ended
                    child.close(kill=False)
                break
            if lost:  # the judge goes on: the cases left go to it, with a fresh subject
                first_child = child
        touched = files_changed(files_before, pycache.file_stamps(harness_paths(watch)))
        if touched:
            changed = "files of the verifier changed while the worker ran: " + ", ".join(touched[:10])
            self._incident("worker", changed, integrity="HARNESS_TAMPERED", case=None)
        return self.results

    def _contract_cases(self) -> dict:
        """The cases a contract check picks from (a card job's `all_cases`) without those a child already
        crashed or hung on: opcheck would call the op on them again, a hang costing its timeout twice."""
        every = getattr(self.job, "all_cases", None)
        if every is None or not self.broke:
            return {}
        return {"all_cases": [c for c in every if c["id"] not in self.broke]}

    def _incident(self, stage: str, reason: str, prefix: str = "", **more) -> None:
        """An incident of the run: what went wrong outside any one case's record (correctness.json)."""
        self.results.incidents.append({"stage": stage, **more, "reason": prefix + reason})

    def _forged(self, what: str, prefix: str = "the result channel carried ") -> None:
        case = self.current[1] if self.current else None
        self._incident("channel", what, prefix, integrity="FORGED_RESULT_CHANNEL", case=case)

    def _left(self) -> int:
        return sum(len(v) for v in self.pending.values())

    def _drop(self, key: str, name) -> None:
        self.pending[key] = [c for c in self.pending[key] if (c if key == "contract" else c["id"]) != name]

    def _read(self, child: ChildRun) -> tuple[str, float]:
        """Handle the child's events until it is done, stops or times out: (outcome, time budget)."""
        self.current = None
        self._mark_log()
        # torch's and the harness's own time in this child, allowed on top of the per-case timeout: its
        # load stage (load_s) and its first contract check (contract_import_s)
        loading, first_contract = True, True
        while True:
            per_case = self.case_timeout
            if loading:
                per_case += DEFAULTS.load_s
            elif first_contract and self.current is not None and self.current[0] == "contract":
                per_case += DEFAULTS.contract_import_s
            budget = min(per_case, max(0.0, self.stage_timeout - (time.monotonic() - self.started)))
            ev = child.next_event(budget)
            if ev == "timeout":
                return "timeout", budget
            if ev is None:
                return "eof", budget
            if self.on_event is not None:
                self.on_event(ev)
            kind = ev.get("event")
            loading = loading and kind != Event.LOAD
            first_contract = first_contract and kind != Event.CONTRACT
            handler = self.handlers.get(kind) if isinstance(kind, str) else None
            if handler is None:
                self._incident("channel", f"unexpected event {ev!r}"[:500])
            elif handler(ev):
                return {Event.DONE: "done", Event.LOST: "lost"}.get(kind, "eof"), budget

    def _begin(self, ev: dict) -> None:
        self.current = (ev["stage"], ev["case"])

    def _load(self, ev: dict) -> bool:
        self.results = replace(self.results, load=ev)
        self.current = None
        return not ev["ok"]  # nothing runs after a failed load

    def _record(self, ev: dict) -> None:
        """A case's, a contract check's or a benchmark's record: no longer pending."""
        kind, rec = ev["event"], ev["record"]
        name = ev["name"] if kind == Event.CONTRACT else rec.get("id")
        if kind == Event.CASE and name not in {c["id"] for c in self.pending["cases"]}:
            self._forged(f"a result for {name!r}, which was not pending (a second or unknown record)")
            return
        if kind == Event.CONTRACT:
            self.results.contract[name] = rec
        else:
            (self.results.cases if kind == Event.CASE else self.results.bench).append(rec)
        self._drop({Event.CASE: "cases", Event.CONTRACT: "contract", Event.BENCH: "bench_cases"}[kind], name)
        self.current = None
        self.timeouts_in_row = 0
        self._mark_log()

    def _mark_log(self) -> None:
        """What the log holds so far belongs to the cases before: a failure's log tail starts here."""
        try:
            self.log_mark = os.path.getsize(self.log_path)
        except OSError:
            self.log_mark = 0

    def _fatal(self, ev: dict) -> None:
        self._incident("worker", ev["reason"])
        if self.results.load is None:
            load = {"ok": False, "reason": ev["reason"], "traceback": ev.get("traceback")}
            self.results = replace(self.results, load=load)

    def _done(self, ev: dict) -> bool:
        if self._left():  # signed with the key (read from this process's memory) but not the harness's
            self._forged(f"'done' with {self._left()} result(s) still pending")
        return True

    def _lost(self, ev: dict) -> bool:
        self.lost_code = SUBJECT_DROPPED if ev.get("code") == SUBJECT_DROPPED else SUBJECT_LOST
        return True

    def _unsigned(self, ev: dict) -> None:  # bytes on the pipe that the harness did not sign
        self._forged(ev["line"], "unsigned data on the result channel: ")

    def _carry_on(self, outcome: str, ended: str, budget: float) -> bool:
        """After a child ended: record what its end means; whether a fresh child continues."""
        load = self.results.load
        if outcome == "done" or (load is not None and not load["ok"]):
            return False
        if load is None:
            load = {
                "ok": False,
                "reason": f"{ended} before loading the op",
                "timed_out": outcome == "timeout",
                "log_tail": _tail(self.log_path),
                "stage": self.current[0] if self.current else None,  # what it was loading
            }
            self.results = replace(self.results, load=load)
            return False
        status = Status.TIMEOUT if outcome == "timeout" else Status.RUNTIME_ERROR
        reason = f"no result within {budget:.0f} s; process group killed" if outcome == "timeout" else ended
        self.timeouts_in_row = self.timeouts_in_row + 1 if outcome == "timeout" else 0
        if self.current is None:
            self._incident(
                "worker", reason, status=status, log_tail=_tail(self.log_path, since=self.log_mark)
            )
        else:
            self._fail_current(status, reason)
        if self.give_up_after and self.timeouts_in_row >= self.give_up_after and self._left():
            self._give_up()
            return False
        if time.monotonic() - self.started >= self.stage_timeout:
            self._incident(
                "worker", f"stage budget of {self.stage_timeout:.0f} s spent", status=Status.TIMEOUT
            )
            return False
        return self._left() > 0

    def _give_up(self) -> None:
        """Record every pending case NOT_RUN: the candidate hung on the last `give_up_after` in a row."""
        reason = (
            f"not run: the last {self.timeouts_in_row} cases in a row timed out (--give-up-after "
            f"{self.give_up_after}); the candidate is taken to hang on every case"
        )
        for case in self.pending["cases"]:
            self.results.cases.append(
                {
                    "id": case["id"],
                    "status": Status.NOT_RUN,
                    "reason": reason,
                    "kind": case["kind"],
                    "dtype": case["dtype"],
                    "params": case["params"],
                }
            )
        for name in self.pending["contract"]:
            self.results.contract[name] = {"status": Status.NOT_RUN, "reason": reason}
        for case in self.pending["bench_cases"]:
            self.results.bench.append({"id": case["id"], "status": Status.NOT_RUN, "reason": reason})
        self._incident("worker", reason, status=Status.NOT_RUN)
        self.pending = {k: [] for k in self.pending}

    def _fail_current(self, status: str, reason: str) -> None:
        """The case the child was on when it crashed or hung gets `status`."""
        stage, case_id = self.current
        failure = {
            "id": case_id,
            "status": status,
            "reason": reason,
            "log_tail": _tail(self.log_path, since=self.log_mark),
        }
        if stage in ("correctness", "inputs"):
            self.broke.append(case_id)
            case = next(c for c in self.pending["cases"] if c["id"] == case_id)
            if stage == "inputs":  # the card's input factory, before any candidate call: the card's fault
                failure.update(
                    status=Status.INVALID_CASE,
                    reason=f"{reason} while the card's input factory made "
                    f"the inputs for params {case['params']}",
                )
            self.results.cases.append(
                {**failure, "kind": case["kind"], "dtype": case["dtype"], "params": case["params"]}
            )
            self._drop("cases", case_id)
        elif stage == "contract":
            self.results.contract[case_id] = failure
            self._drop("contract", case_id)
        else:
            self.results.bench.append(failure)
            self._drop("bench_cases", case_id)
