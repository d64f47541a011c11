"""An OS sandbox for the processes that run candidate code: no network, a read-only file system
except a scratch directory, and the usual credential files of the home directory hidden.

A process boundary (runner.py) keeps a crashing or cheating candidate from corrupting results, but
the child still runs as the user who started mini_kv: without more it could read ~/.ssh, write into
the project (the card, the baseline, another candidate) or talk to the network. Here the child
command is started through `unshare` (util-linux) in new mount and network namespaces, as root
directly and otherwise inside a user namespace (`unshare -r`). Inside, before the real command is
exec'd, this module (`python -m mini_kv.sandbox enter ...`) re-mounts every mount read-only
except the scratch dir, masks credential paths, and brings the (empty) network namespace's
loopback down. Device nodes stay usable (a read-only mount does not stop ioctl or writes on a
device node), so /dev/nvidia* keep working; pipes and file descriptors passed by the parent
(the worker's signed result channel, its log) are inherited unchanged.

Where namespaces are unavailable (no `unshare`, a container without CAP_SYS_ADMIN and no user
namespaces, a non-Linux system) the child runs without the sandbox, and the reason is recorded
with the attempt (`sandbox` in correctness.json). `--no-sandbox` turns it off on purpose.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

# files and dirs under $HOME that hold credentials; each one that exists is hidden from the child
SECRET_PATHS = tuple(
    (
        ".ssh .gnupg .aws .azure .kube .docker .netrc .git-credentials .pypirc .npmrc .config/gcloud "
        ".config/gh .config/git/credentials .cache/huggingface .huggingface"
    ).split()
)
# where a process writes caches and temp files: pointed at the scratch dir, which alone is writable
SCRATCH_ENV = tuple(
    (
        "TMPDIR TEMP TMP XDG_CACHE_HOME TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR CUDA_CACHE_PATH "
        "TORCH_EXTENSIONS_DIR CUTE_DSL_CACHE_DIR"
    ).split()
)
ENTER_FAILED = 121  # the sandbox could not be set up inside the namespaces: nothing of the job ran

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
_KEPT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}


@dataclass(frozen=True)
class SandboxInfo:
    """Whether children run sandboxed, how, and why not when they do not (recorded with the attempt)."""

    enabled: bool
    mechanism: str | None = None  # "unshare" or "unshare -r" (a user namespace)
    reason: str = ""
    network: bool = True  # the child can reach the network

    def to_dict(self) -> dict:
        return asdict(self)


def disabled(reason: str) -> SandboxInfo:
    return SandboxInfo(enabled=False, reason=reason)


def _unshare_argv(user_ns: bool) -> list[str]:
    exe = shutil.which("unshare")
    return [exe, *(["--map-root-user"] if user_ns else []), "--mount", "--net", "--propagation", "private"]


def _enter_argv(scratch: str, masks: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "mini_kv.sandbox", "enter", "--rw", scratch]
    for m in masks:
        argv += ["--mask", m]
    return [*argv, "--"]


def _secret_paths() -> list[str]:
    homes = {os.path.expanduser("~")}
    try:
        import pwd

        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except (ImportError, KeyError):
        pass
    return sorted(
        str(Path(h) / p)
        for h in homes
        if h and h != "/"
        for p in SECRET_PATHS
        if os.path.lexists(Path(h) / p)
    )


@functools.cache
def probe() -> SandboxInfo:
    """Find a way to sandbox children here (cached for the process): the first that passes its own
    check (file system read-only, network unreachable) inside the namespaces wins."""
    if not sys.platform.startswith("linux"):
        return disabled(f"the sandbox needs Linux namespaces; this is {sys.platform}")
    if shutil.which("unshare") is None:
        return disabled("`unshare` (util-linux) not found: install util-linux for the sandbox")
    reasons = []
    for user_ns in [False, True] if os.geteuid() == 0 else [True]:
        scratch = tempfile.mkdtemp(prefix="mini-kv-sandbox-probe-")
        try:
            cmd = [
                *_unshare_argv(user_ns),
                *_enter_argv(scratch, []),
                sys.executable,
                "-m",
                "mini_kv.sandbox",
                "check",
                scratch,
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{'unshare -r' if user_ns else 'unshare'}: {exc}")
            continue
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if res.returncode == 0:
            return SandboxInfo(
                enabled=True,
                mechanism="unshare -r" if user_ns else "unshare",
                reason="mount and network namespaces: file system read-only except the scratch "
                "dir, credential files of $HOME hidden, no network",
                network=False,
            )
        reasons.append(
            f"{'unshare -r' if user_ns else 'unshare'}: "
            + ((res.stderr or res.stdout).strip().splitlines() or [f"exit {res.returncode}"])[-1]
        )
    return disabled("namespaces unavailable here (" + "; ".join(reasons) + "); children run unsandboxed")


class Sandbox:
    """One sandboxed child's command line, environment and scratch dir (removed by `close`)."""

    def __init__(self, info: SandboxInfo):
        self.info = info
        self.scratch = tempfile.mkdtemp(prefix="mini-kv-scratch-") if info.enabled else None

    def argv(self, cmd: list[str]) -> list[str]:
        if not self.info.enabled:
            return cmd
        return [
            *_unshare_argv(self.info.mechanism == "unshare -r"),
            *_enter_argv(self.scratch, _secret_paths()),
            *cmd,
        ]

    def spec(self) -> dict | None:
        """`enter_here`'s arguments, for a child forked by the worker zygote; None without the sandbox."""
        if not self.info.enabled:
            return None
        return {
            "user_ns": self.info.mechanism == "unshare -r",
            "rw": [self.scratch],
            "masks": _secret_paths(),
        }

    def env(self, base: dict | None) -> dict | None:
        if not self.info.enabled:
            return base
        env = dict(os.environ if base is None else base)
        for name in SCRATCH_ENV:
            env[name] = self.scratch
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # __pycache__ dirs are read-only
        return env

    def close(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def resolve(requested: bool) -> SandboxInfo:
    """The sandbox for this run: `requested` False (--no-sandbox) turns it off."""
    if not requested:
        return disabled("turned off (--no-sandbox)")
    if os.environ.get("MINI_KV_NO_SANDBOX") == "1":
        return disabled("turned off (MINI_KV_NO_SANDBOX=1)")
    return probe()


# ---------------------------------------------------------------------------------------------
# inside the namespaces (python -m mini_kv.sandbox enter ...): no imports beyond the standard library


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)  # the interpreter's own libc: no ldconfig lookup


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) from /proc/self/mountinfo, parents before children."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])  # \040 is a space
            out.append((point, set(parts[5].split(","))))
    return out


def _under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _read_only_proc_sys() -> None:
    """Kernel settings (/proc/sys) read-only: a bind of it onto itself, then a read-only remount."""
    if not os.path.isdir("/proc/sys"):
        return
    try:
        _mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
        _mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        print(f"mini_kv sandbox: /proc/sys stays as it was ({exc})", file=sys.stderr)


def read_only_view(rw: list[str], masks: list[str]) -> None:
    """The read-only view (we are root of fresh mount and network namespaces): every mount read-only
    except `rw`, `masks` hidden. Raises OSError when it cannot be set up."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    rw = [os.path.realpath(d) for d in rw]
    for d in rw:  # a mount of its own, so the read-only pass below can leave it alone
        _mount(d, d, None, MS_BIND | MS_REC)
    for m in masks:
        if os.path.isdir(m) and not os.path.islink(m):
            _mount("tmpfs", m, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=000")
        elif os.path.isfile(m) and not os.path.islink(m):
            _mount("/dev/null", m, None, MS_BIND)
    # device nodes work on a read-only mount; /dev itself is not the project. /proc stays writable
    # because the CUDA driver writes there at initialisation (with /proc read-only, cudaGetDeviceCount
    # fails with error 304 on an H200); its /proc/sys is made read-only below instead.
    keep_writable = [*rw, "/dev", "/proc"]
    for point, opts in _mounts():
        if _under(point, keep_writable) and not point.startswith("/dev/shm"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in _KEPT_FLAGS.items():  # locked flags must be kept in a user namespace
            flags |= bit if name in opts else 0
        try:
            _mount(None, point, None, flags)
        except OSError as exc:
            if point == "/":
                raise
            if os.path.exists(point):  # a hidden (over-mounted) point cannot be reached anyway
                print(f"mini_kv sandbox: {point} stays as it was ({exc})", file=sys.stderr)
    _read_only_proc_sys()


def enter(rw: list[str], masks: list[str], cmd: list[str]) -> int:
    """`read_only_view`, then exec `cmd` (python -m mini_kv.sandbox enter, after `unshare`)."""
    try:
        read_only_view(rw, masks)
    except OSError as exc:
        print(f"mini_kv sandbox: cannot set up the read-only view: {exc}", file=sys.stderr)
        return ENTER_FAILED
    os.execvp(cmd[0], cmd)
    return ENTER_FAILED  # not reached


def enter_here(user_ns: bool, rw: list[str], masks: list[str]) -> None:
    """What `unshare [--map-root-user] --mount --net` and `enter` do, done in this process (a child
    just forked by the worker zygote, single-threaded, no candidate code yet): fresh mount and network
    namespaces (and a user namespace whose root is the caller), then the read-only view. Raises OSError."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | (CLONE_NEWUSER if user_ns else 0)
    if _libc().unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if user_ns:  # map root inside to the caller outside, as `unshare --map-root-user` does
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text + "\n")
    read_only_view(rw, masks)


def check(scratch: str) -> int:
    """The probe's self-test inside the sandbox: 0 when the view is read-only and the network gone."""
    import socket

    try:
        with open(os.path.join(scratch, "ok"), "w") as f:
            f.write("ok")
    except OSError as exc:
        print(f"scratch dir not writable: {exc}", file=sys.stderr)
        return 1
    probe_file = os.path.join(os.path.dirname(scratch.rstrip("/")), f"mini-kv-sandbox-check-{os.getpid()}")
    try:
        with open(probe_file, "w"):
            pass
        os.unlink(probe_file)
        print(f"{probe_file}: writable inside the sandbox", file=sys.stderr)
        return 1
    except OSError:
        pass
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", 9))
    except ConnectionRefusedError:  # something answered: loopback is up, so the namespace is not empty
        print("loopback reachable inside the sandbox", file=sys.stderr)
        return 1
    except OSError:
        return 0
    finally:
        s.close()
    print("network reachable inside the sandbox", file=sys.stderr)
    return 1


def _main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        return check(argv[1])
    if argv[:1] != ["enter"] or "--" not in argv:
        print(
            "usage: python -m mini_kv.sandbox enter [--rw DIR]... [--mask PATH]... -- CMD...", file=sys.stderr
        )
        return 2
    sep = argv.index("--")
    opts, cmd = argv[1:sep], argv[sep + 1 :]
    rw = [opts[i + 1] for i in range(len(opts) - 1) if opts[i] == "--rw"]
    masks = [opts[i + 1] for i in range(len(opts) - 1) if opts[i] == "--mask"]
    return enter(rw, masks, cmd)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
