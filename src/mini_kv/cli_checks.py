"""Checks of command-line arguments that run before any work starts.

argparse `type=` functions reject a malformed value at parse time (exit 2, naming the option and what
is allowed); `check_store_writable` refuses an artifact store this process cannot write before anything
is built or run, so a long run never ends in a crash while archiving its result.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path

from mini_kv.errors import UserError

DEVICE_RE = re.compile(r"cpu|cuda|cuda:(0|[1-9][0-9]*)")


def device(value: str) -> str:
    """`cpu`, `cuda` or `cuda:N`, spelled exactly so (torch accepts others, e.g. `CPU`, that the case
    filters and records would then treat as a different device)."""
    if not DEVICE_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a device; allowed: cpu, cuda, cuda:N (N = 0, 1, ...)"
        )
    return value


def positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: expected a positive, finite number")
    return x


def fraction(value: str) -> float:
    """A positive fraction such as 0.03 (= 3%) for the stability gates."""
    x = positive_float(value)
    if x >= 1:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a fraction between 0 and 1 (0.03 = 3%)")
    return x


def _int_at_least(lowest: int):
    def parse(value: str) -> int:
        try:
            x = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if x < lowest:
            raise argparse.ArgumentTypeError(f"{value!r}: expected at least {lowest}")
        return x

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


positive_int = _int_at_least(1)
nonnegative_int = _int_at_least(0)


def existing_file(value: str) -> str:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value}: no such file")
    return value


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def store_write_problem(store: Path) -> str | None:
    """Why this process cannot write attempts under `store` (None: it can). Tried for real with a
    probe file: permission bits alone do not tell (root, read-only mounts, ACLs)."""
    store = Path(store)
    if store.exists() and not store.is_dir():
        return f"{store} exists and is not a directory"
    where = store if store.exists() else _nearest_existing(store.absolute())
    if not where.is_dir():
        return f"{where} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".mini-kv-write-probe-", dir=where)
    except OSError as exc:
        return f"{where} is not writable ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


def check_store_writable(store: Path, option: str = "--artifacts") -> None:
    """Exit CONFIG before any work when attempts could not be archived under `store`."""
    problem = store_write_problem(store)
    if problem:
        raise UserError(
            f"artifact store {store}: {problem}; nothing was run. Make it a writable directory, or pass "
            f"{option} DIR with a directory this user can write"
        )
    from mini_kv.store.signing import operator_key

    operator_key(store)  # a misplaced or unreadable signing key is refused now, not after the run
