"""A bytecode cache of mini_kv's own for environments that keep none.

Every mini_kv command imports torch, in its own process and again in each worker. Where the
environment sets `PYTHONDONTWRITEBYTECODE` (container images often do, to keep `__pycache__` out of
read-only or shared trees) and torch was installed without bytecode, every one of those imports
compiles torch's sources anew: about 4 s of each command on the H200 image, against about 2 s from
bytecode (docs/sol-execbench.md). Python can keep bytecode in a directory of its own instead of
beside the sources (`PYTHONPYCACHEPREFIX`); a command redirects it there, so nothing is written into
the trees the environment protects. Python checks each cached file against its source's size and
modification time, so an upgraded package is compiled again, never run stale.

`MINI_KV_PYCACHE` names the directory (default: `$XDG_CACHE_HOME/mini-kv/pycache`, else
`~/.cache/mini-kv/pycache`); `MINI_KV_PYCACHE=off` keeps the environment's choice. An environment
that writes bytecode already, or sets its own `PYTHONPYCACHEPREFIX`, is left as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV = "MINI_KV_PYCACHE"
OFF = ("0", "off", "no", "false")


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mini-kv" / "pycache"


def wanted() -> Path | None:
    """Where this process should keep bytecode, or None where the environment's own choice stands."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in OFF:
        return None
    if not sys.dont_write_bytecode or sys.pycache_prefix or os.environ.get("PYTHONPYCACHEPREFIX"):
        return None  # bytecode is kept already, or kept where the environment says
    return Path(setting).expanduser() if setting else default_dir()


def redirect() -> Path | None:
    """Keep bytecode under `wanted()`, for this process and every process it starts (through the
    environment); returns the directory, or None where nothing changed (off, not needed, or the
    directory cannot be written: then imports compile as before, which is slower, never wrong).
    Call it first thing in a command, before torch is imported."""
    where = wanted()
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(where, os.W_OK | os.X_OK):
        return None
    sys.pycache_prefix = str(where)
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = str(where)
    # the variable goes, so the processes started from here (a batch's workers) write to the directory
    # too; jailed processes get it back (jail.ENV_SCRATCH) and see the cache read-only at most
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return where


def describe() -> tuple[str, bool]:
    """Where this process keeps bytecode, for `doctor`; False where it keeps none (every import
    compiles its sources)."""
    if sys.pycache_prefix:
        return f"kept in {sys.pycache_prefix}", True
    if not sys.dont_write_bytecode:
        return "kept beside the sources (__pycache__)", True
    return "not kept: every start compiles the sources it imports", False
