"""The first program inside the jail (mini_kv.jail): apply Landlock, then exec the jailed command.

Run as `python -I -S _jail_prelude.py RULES_JSON -- ARGV...` by bwrap after it has built the
namespaces, the file-system view and the seccomp filter. Landlock cannot be applied before bwrap (a
Landlock-restricted process may not mount), so this step runs inside, before any candidate code. It
imports nothing but the standard library (the interpreter runs isolated: -I -S) and is small on purpose.
A jailed command that is mini_kv's own Python entry (the worker child) applies the same rules itself,
first thing (`restrict_from_env`, rules in $MINI_KV_JAIL_LANDLOCK), which saves an interpreter start.

RULES_JSON: {"read": [paths], "write": [paths], "net": bool, "abi_min": int}. `read` paths get read
and execute rights, `write` paths every file-system right; everything else is denied, on top of
bwrap's view. `net` false also denies TCP bind/connect where the kernel's Landlock can (ABI 4+).
A kernel without Landlock (or an older ABI than asked for) is reported on stderr and the command runs
anyway: the parent's probe already recorded the layer as unavailable.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

_SYS_CREATE, _SYS_ADD, _SYS_RESTRICT = 444, 445, 446  # landlock_* on x86_64 and aarch64 alike
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_*: execute, write_file, read_file, read_dir = 1, 2, 4, 8; then the rest up to
# refer (ABI 2), truncate (ABI 3), ioctl_dev (ABI 5)
_FS_READ = 1 | 4 | 8
_FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_FS_FILE = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # execute, write, read, truncate, ioctl_dev
_NET_BIND, _NET_CONNECT = 1, 2
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def abi_version(libc) -> int:
    """The kernel's Landlock ABI version, 0 where it has none (or it is switched off)."""
    v = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, v)


def restrict(rules: dict) -> int:
    """Apply the rules to this process (and everything it execs or forks); the ABI used, 0 for none."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = abi_version(libc)
    if abi < rules.get("abi_min", 1):
        return 0
    fs_all = _FS_ALL_BY_ABI.get(abi, _FS_ALL_BY_ABI[5])
    attr = _RulesetAttr(fs_all, 0, 0)
    size = 8
    if abi >= 4:
        attr.net, size = (0 if rules.get("net") else _NET_BIND | _NET_CONNECT), 16
    if abi >= 6:  # abstract unix sockets and signals only within the jail's own domain
        attr.scoped, size = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL, 24
    ruleset = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    for access, paths in ((_FS_READ, rules.get("read", ())), (fs_all, rules.get("write", ()))):
        for path in paths:
            _allow(libc, ruleset, path, access)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # bwrap sets it already; Landlock insists on it
    if libc.syscall(_SYS_RESTRICT, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
    return abi


def _allow(libc, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:  # not in this view (an optional path): nothing to allow
        return
    try:
        if not os.path.isdir(path):  # a file's rule may hold only the rights that apply to files
            access &= _FS_FILE
        rule = _PathBeneath(access, fd)
        if libc.syscall(_SYS_ADD, ruleset, _PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


ENV = "MINI_KV_JAIL_LANDLOCK"


def restrict_from_env() -> None:
    """In a jailed mini_kv entry point, before anything else: the rules the jail handed over, if any.
    Exits the process (status 121) when they cannot be applied, so nothing runs unrestricted."""
    text = os.environ.pop(ENV, None)
    if text is None:
        return
    try:
        restrict(json.loads(text))
    except (OSError, ValueError) as exc:
        print(f"mini_kv jail: Landlock could not be applied: {exc}", file=sys.stderr)
        os._exit(121)


def main(argv: list[str]) -> int:
    rules, cmd = json.loads(argv[0]), argv[2:]
    try:
        abi = restrict(rules)
    except OSError as exc:
        print(f"mini_kv jail: Landlock could not be applied: {exc}", file=sys.stderr)
        return 121
    if not abi and rules.get("abi_min", 1) and rules.get("required"):
        print("mini_kv jail: Landlock is unavailable and was required", file=sys.stderr)
        return 121
    os.execvp(cmd[0], cmd)
    return 121  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
