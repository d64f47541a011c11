"""The worker zygote: a fork server that loads Python, torch and the harness once and forks a worker
child per job in milliseconds.

A fresh worker child spends seconds before it runs anything of its job: the interpreter, torch (2-6 s
of CPU), opcheck's modules (about 2 s more). `verify --candidate '*'` starts one per candidate, a crash
or a hang one more per restart, a test suite hundreds. So the first child a process needs starts the
zygote (`python -m mini_kv.worker.zygote`, one per environment), which imports all of that; each child
after it, the first included, is forked from it. The forked child then does what a fresh process did:
a session of its own, fresh sandbox namespaces (`sandbox.enter_here`, its own scratch dir), the worker
log as stdout and stderr, the job on stdin, then `worker.child.main`. The parent sees the same pid,
events, exit status and log as before (ForkedChild stands in for subprocess.Popen).

What keeps it safe: the zygote runs only mini_kv's and torch's own code, never a candidate's, and never
touches CUDA (a CUDA driver initialised before fork is unusable in the child: the child initialises
it, as a fresh process did). It exits when its parent's end of the socket closes (the parent exiting,
even by SIGKILL), killing what it started; its children die with it (PR_SET_PDEATHSIG). `MINI_KV_ZYGOTE=0`
turns it off: children are then started as fresh processes.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from mini_kv.proc import die_with_parent, kill_group
from mini_kv.sandbox import ENTER_FAILED, SCRATCH_ENV, Sandbox, enter_here

# loaded before the first fork: what every worker child imports
PRELOAD = ("torch", "mini_kv.worker.child")
# loaded before the first child of a job kind is forked, once: what only that kind imports (opcheck's
# modules, about 2 s, for a task card's contract checks), so a process that never runs the kind never
# pays for it, and every later child of it finds it loaded
PRELOAD_FOR_KIND = {
    "card": ("torch.testing._internal.optests", "mini_kv.worker.correctness", "mini_kv.worker.benchmark"),
    "sol": ("mini_kv.solexec.evaluate",),
}
RESULT_FD = "{result_fd}"  # in a child's argv: replaced by the result pipe's number in the child
MAX_MSG = 1 << 20
MAX_ZYGOTES = 2  # per parent process, one per environment; an idle one is closed to make room


# ---------------------------------------------------------------------------------------------
# parent side


class ForkedChild:
    """What runner.ChildRun uses of a subprocess.Popen (`pid`, `stdin`, `wait`), for a forked child.
    The pid is known once the zygote has forked (after its imports), so it is looked up when needed."""

    def __init__(self, zygote: Zygote, request: int, stdin):
        self._zygote, self._request, self.stdin = zygote, request, stdin
        self._pid: int | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        """None when the zygote could not fork it (its log says why)."""
        if self._pid is None and self._request is not None:
            self._pid = self._zygote.pid_of(self._request)
            self._request = None
        return self._pid

    def kill(self) -> None:
        """Kill the child's process group; a child not forked yet (its zygote still loading, or stuck
        there) by killing the zygote, which holds nothing but the harness and is started anew."""
        if self._pid is None and self._request is not None and not self._zygote.answered(self._request):
            self._zygote.kill()
            self._request, self.returncode = None, -signal.SIGKILL
        elif self.pid is not None:
            kill_group(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = 1 if self.pid is None else self._zygote.wait(self.pid, timeout)
        return self.returncode

    def zygote_output(self) -> str:
        return self._zygote.output()

    def poll(self) -> int | None:
        try:
            return self.wait(0.0)
        except subprocess.TimeoutExpired:
            return None


class ZygoteGone(OSError):
    """The zygote exited or could not fork: the caller starts a fresh process instead."""


class Zygote:
    """One zygote process and its socket (SOCK_SEQPACKET: one JSON message per request or answer, the
    child's file descriptors riding with a request). Thread-safe: runs in threads share it."""

    def __init__(self, env: dict, key: tuple = ()):
        self.key, self.ready = key, False  # ready: the zygote has loaded everything and forks
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()  # the zygote's own output (an import warning, a traceback)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mini_kv.worker.zygote", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # started by _STARTER's thread, which lives as long as this process
            env=env,
        )
        theirs.close()
        self.sock, self.lock = ours, threading.Lock()
        self.alive, self.next_request = True, 0
        self.pids: dict[int, int | str] = {}  # request -> pid, or why there is none
        self.exits: dict[int, int] = {}  # pid -> exit status as Popen gives it
        self.running = 0  # children spawned and not yet waited for

    def spawn(
        self,
        argv: list[str],
        env: dict | None,
        sandbox: Sandbox,
        log_fd: int,
        result_fd: int,
        kind: str | None,
    ):
        """Ask for a child running `python -m mini_kv.worker.child ARGV` (a job of `kind`, where known:
        PRELOAD_FOR_KIND); returns its ForkedChild."""
        stdin_r, stdin_w = os.pipe()
        with self.lock:
            self.next_request += 1
            request = self.next_request
            msg = {
                "request": request,
                "argv": argv,
                "env": dict(os.environ if env is None else env),
                "cwd": os.getcwd(),
                "sandbox": sandbox.spec(),
                "kind": kind,
            }
            try:
                socket.send_fds(self.sock, [json.dumps(msg).encode()], [stdin_r, log_fd, result_fd])
                self.running += 1
            except OSError as exc:
                self.alive = False
                raise ZygoteGone(f"the zygote is gone: {exc}") from exc
            finally:
                os.close(stdin_r)
        return ForkedChild(self, request, os.fdopen(stdin_w, "wb"))

    def pid_of(self, request: int) -> int | None:
        self._read_until(lambda: request in self.pids, None)
        pid = self.pids.get(request)
        if not isinstance(pid, int):
            with self.lock:
                self.running -= 1
            return None
        return pid

    def answered(self, request: int) -> bool:
        """Whether the zygote has answered `request`, reading what it has sent without waiting."""
        return self._read_until(lambda: request in self.pids, 0.0)

    def kill(self) -> None:
        kill_group(self.proc.pid)
        self.alive = False

    def output(self, n: int = 2000) -> str:
        """The end of the zygote's own output (why it would not load, where it said so)."""
        try:
            self.log.seek(0, os.SEEK_END)
            self.log.seek(max(0, self.log.tell() - n))
            return self.log.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):  # closed
            return ""

    def wait(self, pid: int, timeout: float | None) -> int:
        if not self._read_until(lambda: pid in self.exits, timeout):
            raise subprocess.TimeoutExpired(f"worker child {pid}", timeout)
        with self.lock:
            self.running -= 1
            return self.exits.pop(pid)

    def _read_until(self, done, timeout: float | None) -> bool:
        """Read the zygote's messages until `done()`; False if `timeout` passed first. A zygote that is
        gone took its children with it (SIGKILL): those still unaccounted for are reported so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.lock.acquire(timeout=-1 if left is None else left):
                return done()
            try:
                if done():
                    return True
                if not self.alive:
                    self._lost()
                    return done()
                if select.select([self.sock], [], [], left)[0]:
                    self._read_one()
                elif left is not None:
                    return done()
            finally:
                self.lock.release()

    def _read_one(self) -> None:
        try:
            data = self.sock.recv(MAX_MSG)
        except OSError:
            data = b""
        if not data:
            self.alive = False
            return
        msg = json.loads(data)
        if "ready" in msg:
            self.ready = True
        elif "exit" in msg:
            self.exits[msg["exit"]] = msg["code"]
        else:
            self.pids[msg["request"]] = msg.get("pid") or msg.get("error", "no pid")

    def _lost(self) -> None:
        """The zygote is gone; its children were killed with it (PR_SET_PDEATHSIG, SIGKILL). One that
        never got ready cannot load here: this environment's children start as fresh processes."""
        if not self.ready:
            _broken.add(self.key)
        for request in range(1, self.next_request + 1):
            self.pids.setdefault(request, "the zygote exited")
        for pid in [p for p in self.pids.values() if isinstance(p, int)]:
            self.exits.setdefault(pid, -signal.SIGKILL)

    def close(self) -> None:
        """Close the socket: the zygote kills what is still running and exits."""
        self.sock.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(self.proc.pid)
            self.proc.wait()
        self.log.close()


# Every zygote is started from this one thread: PR_SET_PDEATHSIG kills a process when the thread that
# started it ends, and this thread lasts as long as the process (a run's own thread may not: a Dask
# worker's), so a parent killed outright takes its zygote, and the zygote its children, at once.
STARTER_NAME = "mini-kv-zygote"  # its thread's name prefix: proc.exit_without_teardown does not wait for it
_STARTER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=STARTER_NAME)
_zygotes: dict[tuple, Zygote] = {}
_broken: set[tuple] = set()  # environments whose zygote died before it was ready
_zygotes_lock = threading.Lock()


def _key(env: dict) -> tuple:
    """What a zygote's imports may depend on: the interpreter, the directory, the environment (less the
    scratch-dir variables each sandboxed child gets anew)."""
    varying = {*SCRATCH_ENV, "PYTHONDONTWRITEBYTECODE"}
    return (sys.executable, os.getcwd(), tuple(sorted((k, v) for k, v in env.items() if k not in varying)))


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("MINI_KV_ZYGOTE", "1") != "0"


def spawn_child(
    argv: list[str],
    base_env: dict | None,
    sandbox: Sandbox,
    log_fd: int,
    result_fd: int,
    kind: str | None = None,
):
    """A worker child forked by this process's zygote for `base_env` (started on first use), or None
    where the zygote is off or cannot be had (the caller then starts a fresh process)."""
    if not enabled():
        return None
    env = dict(os.environ if base_env is None else base_env)
    key = _key(env)
    if key in _broken:
        return None
    for _ in range(2):  # a zygote found gone is replaced once
        with _zygotes_lock:
            z = _zygotes.get(key)
            if z is None or not z.alive:
                if z is not None:
                    _zygotes.pop(key).close()
                idle = [k for k, other in _zygotes.items() if other.running == 0]
                for k in idle[: max(0, len(_zygotes) - MAX_ZYGOTES + 1)]:  # never one a run still uses
                    _zygotes.pop(k).close()
                z = _zygotes[key] = _STARTER.submit(Zygote, env, key).result()
        try:
            return z.spawn(argv, sandbox.env(env), sandbox, log_fd, result_fd, kind)
        except ZygoteGone:
            continue
    return None


@atexit.register
def close_all() -> None:
    with _zygotes_lock:
        while _zygotes:
            _zygotes.popitem()[1].close()


# ---------------------------------------------------------------------------------------------
# the zygote process: python -m mini_kv.worker.zygote FD


def serve(sock: socket.socket) -> int:
    for name in PRELOAD:
        importlib.import_module(name)
    if _cuda_touched():
        return 3
    sys.stdout.flush()
    sys.stderr.flush()
    sock.send(json.dumps({"ready": True}).encode())
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of exits
    signal.set_wakeup_fd(wake_w)
    live: set[int] = set()
    try:
        while True:
            readable = select.select([sock, wake_r], [], [])[0]
            if wake_r in readable:
                _drain(wake_r)
                _reap(sock, live)
            if sock in readable and not _serve_one(sock, live, (sock.fileno(), wake_r, wake_w)):
                break
    except OSError:  # the parent's end is gone
        pass
    for pid in live:
        kill_group(pid)
    return 0


def _cuda_touched() -> bool:
    """CUDA initialised in the zygote: a fork would leave the children an unusable driver."""
    import torch

    if torch.cuda.is_initialized():
        print("mini_kv zygote: CUDA was initialised while loading the harness; not forking", file=sys.stderr)
        return True
    return False


def _serve_one(sock: socket.socket, live: set[int], ours: tuple[int, ...]) -> bool:
    """Fork the child one request asks for (its job kind's modules loaded first; where that initialised
    CUDA, answer that it cannot, so the parent starts a fresh process); False when the parent has
    closed the socket."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MSG, 3)
    if not data:
        return False
    req = json.loads(data)
    zygote = os.getpid()
    try:
        for name in PRELOAD_FOR_KIND.get(req.get("kind"), ()):
            importlib.import_module(name)
        if _cuda_touched():  # checked at every fork: a zygote whose CUDA is up never forks again
            raise OSError("CUDA was initialised in the zygote")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(req, fds, ours, zygote)
            finally:
                os._exit(code)
        os.setpgid(pid, pid)  # its own process group before the parent hears its pid (as a shell does)
        live.add(pid)
        answer = {"request": req["request"], "pid": pid}
    except OSError as exc:
        os.write(fds[1], f"mini_kv: the worker zygote could not fork the worker: {exc}\n".encode())
        answer = {"request": req["request"], "error": f"fork: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    sock.send(json.dumps(answer).encode())
    return True


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(sock: socket.socket, live: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        sock.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _child(req: dict, fds: list[int], ours: tuple[int, ...], zygote: int) -> int:
    """In the forked child: become what `python -m mini_kv.worker.child` started fresh would be."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in ours:
        os.close(fd)
    os.setpgid(0, 0)  # a process group of its own (the zygote sets it too): the parent kills the group
    die_with_parent()
    if os.getppid() != zygote:  # the zygote died before the line above: so do we
        return 1
    stdin_fd, log_fd, result_fd = fds
    os.dup2(stdin_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.pycache_prefix = os.environ.get("PYTHONPYCACHEPREFIX") or None  # as a fresh process reads it
    tempfile.tempdir = None  # found again from TMPDIR: the child's scratch dir
    try:
        if req["sandbox"]:
            try:
                enter_here(**req["sandbox"])
            except OSError as exc:
                print(f"mini_kv sandbox: cannot set up the sandbox: {exc}", file=sys.stderr)
                return ENTER_FAILED
        from mini_kv.worker import child

        return child.main([str(result_fd) if a == RESULT_FD else a for a in req["argv"]])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a harness error: in the log, as a fresh process would print it
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    code = serve(socket.socket(fileno=int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (seconds with torch loaded): the parent waits for this exit
