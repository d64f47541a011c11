"""Run a command in its own process group, with a timeout that kills the whole group."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass

try:  # looked up once here: a preexec_fn must not load libraries between fork and exec
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1


def exit_text(code: int) -> str:
    """How a process ended, from its Popen-style return code (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def die_with_parent() -> None:
    """A Popen preexec_fn: the child gets SIGKILL when the thread that started it dies, even by SIGKILL
    (a cluster worker lost mid-candidate, an interrupted client), so no child outlives its parent.
    Linux only; elsewhere a no-op."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def settle_worker(device: str | None, limit: int | None) -> None:
    """A judge's or a subject's process made ready before any candidate code: its CUDA device current, one
    intra-op thread (the reference gets no parallelism the candidate lacks, and CPU timings do not swing
    with the other core's load), then its memory capped (cap_memory). `device` None: the cap alone."""
    if device is not None:
        import torch

        if torch.device(device).type == "cuda" and torch.device(device).index is not None:
            torch.cuda.set_device(torch.device(device))
        torch.set_num_threads(1)
    cap_memory(device or "cpu", limit)


def cap_memory(device: str, limit: int | None) -> None:
    """This worker process's memory capped at `limit` bytes (None: not), before any candidate code runs
    (an unprivileged process cannot raise its hard limit again): on CPU its address space (RLIMIT_AS), so
    an op that allocates without bound fails inside it (a MemoryError) instead of taking the machine; on
    CUDA its data (RLIMIT_DATA: private writable memory), since the driver reserves far more address
    space than it uses and fails under an address-space cap, and its reservations are not data (CUDA,
    cuBLAS, pinned memory and Triton ran under a 6 GiB data cap that stopped a 10 GiB host allocation:
    docs/measurements/jail.md). Per process; the jail's memory cgroup, where there is one, caps the tree."""
    if limit:
        import resource

        which = resource.RLIMIT_DATA if str(device).startswith("cuda") else resource.RLIMIT_AS
        resource.setrlimit(which, (limit, limit))


@dataclass
class ProcResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_with_timeout(
    cmd: list[str], timeout: float, env: dict | None = None, cwd: str | None = None
) -> ProcResult:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return ProcResult(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        return ProcResult(proc.returncode if proc.returncode is not None else -9, out, err, True)


@dataclass(frozen=True)
class ProcessTree:
    """Every live process's children, from one scan of /proc (Linux; empty where it is unavailable)."""

    children: dict[int, list[int]]

    @classmethod
    def scan(cls) -> ProcessTree:
        children: dict[int, list[int]] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return cls(children)
        for name in entries:
            stat = _stat(name) if name.isdigit() else None
            if stat is not None:
                children.setdefault(int(stat[1]), []).append(int(name))
        return cls(children)

    def below(self, pid: int) -> list[int]:
        """Every process below `pid`."""
        out, todo = [], [pid]
        while todo:
            for child in self.children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out


# a process's resident memory that no file backs (what the kernel cannot drop for it): each page it
# maps whole (status, cheap), or each page's share among the processes that map it (smaps_rollup's
# proportional sizes: the page tables walked, about 5 ms for a process with torch loaded)
_RESIDENT = {
    False: ("status", (b"RssAnon:", b"RssShmem:")),
    True: ("smaps_rollup", (b"Pss_Anon:", b"Pss_Shmem:")),
}


def _resident_bytes(pid: int, proportional: bool) -> int:
    """`pid`'s resident anonymous and shared-memory pages (_RESIDENT); 0 for one that is gone."""
    name, keys = _RESIDENT[proportional]
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    return sum(int(ln.split()[1]) for ln in lines if ln.startswith(keys)) << 10


def tree_resident_bytes(pid: int, proportional: bool = False, tree: ProcessTree | None = None) -> int:
    """The resident memory no file backs of `pid` and every process below it, summed. Not `proportional`,
    a page two of them share (a fork's copy-on-write pages, a memfd mapped twice) counts twice, so the
    sum errs high (20 forks of a process holding 350 MiB: 7 GiB); `proportional` counts it once.
    `tree`: a scan of /proc already made."""
    below = (tree or ProcessTree.scan()).below(pid)
    return sum(_resident_bytes(p, proportional) for p in [pid, *below])


def signal_tree(pid: int, sig: int, below: bool = False) -> list[int]:
    """Send `sig` to `pid` (not with `below`) and every process below it (SIGSTOP, SIGCONT:
    runner.AheadOfTurn; kill_group's freeze), scanning again until no new one turns up: one forked while
    a scan ran is signalled too. A SIGSTOP lands when its process is next scheduled, so a process still
    running may fork after the scan: the next scan waits until those signalled have stopped
    (_wait_stopped). Returns the processes signalled."""
    done: set[int] = set()
    while new := [p for p in [*([] if below else [pid]), *ProcessTree.scan().below(pid)] if p not in done]:
        _signal_all(new, sig)
        done.update(new)
        if sig == signal.SIGSTOP:
            _wait_stopped(new)
    return list(done)


# A SIGSTOP lands when its process is next scheduled: a runnable one is waited for until it has (a loaded
# host may take a while to schedule it), one in an uninterruptible wait (state D: it stops when that
# read ends) only briefly
STOP_WAIT_S = 0.1
RUNNABLE_STOP_WAIT_S = 2.0


def _wait_stopped(pids: list[int]) -> None:
    """Until every one of `pids` is stopped, gone or a zombie: for at most RUNNABLE_STOP_WAIT_S, and at most
    STOP_WAIT_S once all those left are in an uninterruptible wait."""
    import time

    start = time.monotonic()
    running = list(pids)
    while running:
        states = {p: _state(p) for p in running}
        running = [p for p, s in states.items() if s not in "TtZX"]
        waited = time.monotonic() - start
        if waited > RUNNABLE_STOP_WAIT_S or (waited > STOP_WAIT_S and all(states[p] == "D" for p in running)):
            return
        if running:
            time.sleep(0.001)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[1].split()  # the name may hold spaces
    except OSError:
        return None


def _state(pid: int) -> str:
    """The state letter of `pid`, 'X' where it is gone."""
    stat = _stat(pid)
    return stat[0] if stat else "X"


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(pid: int) -> None:
    """Kill the process group of `pid` and every descendant outside it. Ninja, for one, starts each
    compiler in a process group of its own, so killing the group alone would leave compilers running."""
    tree = signal_tree(pid, signal.SIGSTOP, below=True)  # frozen first, so nothing forks past the last scan
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_all(tree, signal.SIGKILL)


def exit_without_teardown(code: int) -> None:
    """End a command-line process with `code` as the interpreter would, less its module teardown:
    the atexit handlers run (temporary directories removed, logs flushed), then stdout and stderr are
    flushed and the process exits. With torch loaded the teardown took about 0.8 s of every command on
    a 2-core machine (docs/sol-execbench.md). Where a thread other than the main one is still running,
    the interpreter's own exit waits for it, as usual."""
    import atexit
    import sys
    import threading

    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if busy:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said on it
            pass
    os._exit(int(code or 0))
