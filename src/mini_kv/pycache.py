"""A bytecode cache of mini_kv's own for environments that keep none.

Every mini_kv command imports torch, in its own process and again in each worker. Where the
environment sets `PYTHONDONTWRITEBYTECODE` (container images often do, to keep `__pycache__` out of
read-only or shared trees) and torch was installed without bytecode, every one of those imports
compiles torch's sources anew: about 4 s of each command on the H200 image, against about 2 s from
bytecode (docs/sol-execbench.md). Python can keep bytecode in a directory of its own instead of
beside the sources (`PYTHONPYCACHEPREFIX`); a command redirects it there, so nothing is written into
the trees the environment protects. Python checks each cached file against its source's size and
modification time, so an upgraded package is compiled again, never run stale.

Jailed processes (the worker's judge and subject, builds) read the cache and never write it: the
jail shows it read-only (jail.environment, jail.read_paths), so no candidate can plant bytecode that
another run would execute. What they import beyond a command's own process (the worker's modules,
torch's compiler stack for opcheck: 14 s to compile from source on the H100 image) is written by
`warm_for_children`, once: a trusted process that imports only the environment's and mini_kv's modules.

`MINI_KV_PYCACHE` names the directory (default: `$XDG_CACHE_HOME/mini-kv/pycache`, else
`~/.cache/mini-kv/pycache`; as root `/var/cache/mini-kv/pycache`, which a jail running under a uid of
its own can read); `MINI_KV_PYCACHE=off` keeps the environment's choice. An environment that writes
bytecode already, or sets its own `PYTHONPYCACHEPREFIX`, is left as it is.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from mini_kv.settings import cache_dir

ENV = "MINI_KV_PYCACHE"
OFF = ("0", "off", "no", "false")
# What a worker child imports besides what the command's own process does, warmed for jailed children.
CHILD_MODULES = (
    "mini_kv.worker.child",
    "mini_kv.worker.subject",
    "mini_kv.worker.formats",
    "mini_kv.worker.contract",
    "mini_kv.worker.timing",
    "torch._dynamo",
    "torch.testing._internal.optests",
    "torch.utils.cpp_extension",
    "triton.language",
)
_WARM = "import importlib, sys\nfor m in sys.argv[1:]:\n    try: importlib.import_module(m)\n    except Exception: pass\n"


def wanted() -> Path | None:
    """Where this process should keep bytecode, or None where the environment's own choice stands."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in OFF:
        return None
    if not sys.dont_write_bytecode or sys.pycache_prefix or os.environ.get("PYTHONPYCACHEPREFIX"):
        return None  # bytecode is kept already, or kept where the environment says
    return Path(setting).expanduser() if setting else cache_dir("pycache")


def redirect() -> Path | None:
    """Keep bytecode under `wanted()`, for this process and every process it starts (through the
    environment); returns the directory, or None where nothing changed (off, not needed, or the
    directory cannot be written: then imports compile as before, which is slower, never wrong).
    Call it first thing in a command, before torch is imported."""
    where = wanted()
    if where is None:
        return None
    try:
        where.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError:
        return None
    if not _ours(where):
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


def _ours(where: Path) -> bool:
    """Only a directory this user owns and nobody else may write: bytecode found there is executed."""
    try:
        st = where.stat()
        if st.st_uid == os.geteuid() and st.st_mode & 0o022:  # ours, left open by an earlier umask
            os.chmod(where, st.st_mode & ~0o022 & 0o7777)
            st = where.stat()
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and os.access(where, os.W_OK | os.X_OK)


@functools.cache
def warm_for_children(timeout: float = 600.0) -> bool:
    """Bytecode for CHILD_MODULES in this process's cache (redirect's), written once per environment by
    a trusted child that imports them, so that jailed children, which only read the cache, do not
    compile them on every start. True where it is there (or nothing needs it); a failure only costs
    the compile it would have saved."""
    prefix = sys.pycache_prefix
    if not prefix or sys.dont_write_bytecode:
        return True  # bytecode beside the sources, or none kept at all: nothing to warm
    stamp = Path(prefix) / f"mini-kv-children-{_environment_digest()}"
    if stamp.exists():
        return True
    from filelock import FileLock

    with FileLock(str(Path(prefix) / ".children.lock")):
        if stamp.exists():
            return True
        print(f"mini_kv: writing Python bytecode for jailed workers to {prefix} (once)", file=sys.stderr)
        try:  # -P: nothing of the working directory on sys.path; only the environment's modules import
            res = subprocess.run(
                [sys.executable, "-P", "-c", _WARM, *CHILD_MODULES],
                cwd=prefix,
                env={
                    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                    "PYTHONPYCACHEPREFIX": prefix,
                },
                capture_output=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if res.returncode != 0:
            return False
        stamp.write_text("")
        return True


def _environment_digest() -> str:
    """The interpreter and where and which version each package the children import is (not sys.path,
    whose first entry is the working directory: every project would warm again), and the state of
    mini_kv's own sources: an edited or reinstalled module whose version did not change would
    otherwise leave its cached bytecode stale, and every jailed child, which cannot write the cache,
    would compile it again."""
    parts = [sys.version, sys.prefix, *CHILD_MODULES, sources_state(Path(__file__).parent)]
    for dist in ("torch", "triton", "mini_kv"):
        spec = importlib.util.find_spec(dist)  # a top-level name: found, not imported
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        parts.append(f"{dist}={version} at {spec.origin if spec else None}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def file_stamps(paths) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of each path, what Python checks cached bytecode against; (-1, -1) for one that
    cannot be read. Also the runner's watch on the harness's files while a worker runs."""
    out = {}
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out[str(p)] = (-1, -1)
            continue
        out[str(p)] = (st.st_mtime_ns, st.st_size)
    return out


def sources_state(package: Path) -> str:
    """A digest of every .py file under `package`: its path, modification time and size (a few
    milliseconds for mini_kv's files)."""
    stamps = file_stamps(sorted(package.rglob("*.py")))
    return hashlib.sha256("\n".join(f"{p} {t} {n}" for p, (t, n) in stamps.items()).encode()).hexdigest()
