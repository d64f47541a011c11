"""Precompiled torch headers for the host (.cpp) files of a build, shared by every build on the machine.

Most of a host file's compile is parsing the torch header it begins with: a shipped candidate's
op.cpp took 164-214 s without and 59 s with a precompiled ATen/ATen.h on the 2-core CI machine
(docs/sol-execbench.md). As CMake does, the build's host compiles get `-include <dir>/<stub>.h`,
a stub that includes the header, with `<stub>.h.gch` beside it: GCC reads the .gch in place of the
stub when it was made by the same compiler with compatible options and macros, otherwise the stub
itself. So a .gch that does not fit costs time, never correctness, and the candidate's own -D/-U
flags (which torch's headers do not test) can be left out of it: one .gch serves every candidate of
the project. It is used only where every host file of the build begins with that header, so
including it first changes nothing. nvcc never gets it; a `.cu` is compiled as before.

The .gch files live in mini_kv's machine-wide cache, `<cache>/pch/<key>/` (`root`), keyed by the
compiler, the torch installation and the flags, made once under a file lock by the trusted parent (the
compile itself jailed, in a private dir that holds only the stub: no candidate file is in it) and moved
into place when complete. Builds see them read-only, so no candidate can change what another build
includes. One header serves every project: a new project's first build does not pay it again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

from filelock import FileLock

from mini_kv import jail
from mini_kv.model import canonical_json, sha256_text
from mini_kv.settings import cache_dir

PCH_FORMAT = 2  # bump when the layout of a pch/<key>/ dir changes (2: stub + its .gch)
# headers worth precompiling: each is most of a host file's compile
PCH_HEADERS = ("torch/extension.h", "ATen/ATen.h", "torch/all.h", "torch/torch.h", "torch/library.h")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
_SAFE_PATH = re.compile(r"[A-Za-z0-9_.,+=:/@%-]+")


def root() -> Path:
    """Where precompiled headers are kept (settings.cache_dir), by its real path: the jail binds what
    the path names."""
    return cache_dir("pch").resolve()


def first_include(path: Path) -> str | None:
    """The header `path` includes before anything else (blank lines, comments and `#pragma once`
    aside), or None when something else comes first (then no precompiled header can apply)."""
    try:
        text = _COMMENT.sub("", path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    for line in text.splitlines():
        s = line.strip()
        if not s or re.fullmatch(r"#\s*pragma\s+once", s):
            continue
        m = _INCLUDE.match(s)
        return m.group(1) if m else None
    return None


def _pch_flags(cflags: list[str]) -> list[str]:
    """What torch's extension builder gives a host compile (`-DTORCH_API_INCLUDE_EXTENSION_H`, its and
    Python's include dirs, -fPIC, then the build's cflags), less the extension's name and the
    candidate's -D/-U/-I: GCC refuses the .gch where a macro it depends on differs."""
    from torch.utils.cpp_extension import include_paths

    keep = [f for f in cflags if not f.startswith(("-D", "-U", "-I"))]
    dirs = [*include_paths(), sysconfig.get_paths()["include"]]
    return ["-DTORCH_API_INCLUDE_EXTENSION_H", *[a for d in dirs for a in ("-isystem", d)], "-fPIC", *keep]


def _compiler() -> str:
    try:
        from torch.utils.cpp_extension import get_cxx_compiler

        return get_cxx_compiler()
    except ImportError:  # a torch without it: the same rule (CXX, else c++)
        return os.environ.get("CXX", "c++")


def common_header(sources: list[str]) -> str | None:
    """The header every one of these host files begins with, if it is one worth precompiling."""
    firsts = {first_include(Path(src)) for src in sources}
    header = firsts.pop() if len(firsts) == 1 else None
    return header if header in PCH_HEADERS else None


def _stub_name(header: str) -> str:
    return "mini_kv_pch_" + re.sub(r"[^A-Za-z0-9]", "_", header) + ".h"


def _key(compiler: str, flags: list[str], header: str) -> str:
    import torch

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    return sha256_text(
        canonical_json(
            {
                "format": PCH_FORMAT,
                "compiler": shutil.which(compiler) or compiler,
                "compiler_version": version,
                "torch": [torch.__version__, str(Path(torch.__file__).parent)],
                "flags": flags,
                "header": header,
            }
        )
    )


def _make(compiler: str, flags: list[str], header: str, final: Path, log, sandbox) -> bool:
    """Write the stub that includes `header` and compile it (jailed) into `<stub>.gch` in a private dir,
    then move that dir into place as `final`."""
    # a build killed while making it (its timeout) leaves its tmp dir: the lock held, it is stale
    for stale in final.parent.glob(f"tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"tmp-{final.name}-", dir=final.parent))
    try:
        with jail.scratch("pch") as box:
            stub = box / _stub_name(header)
            stub.write_text(f"#include <{header}>\n")
            cmd = [compiler, *flags, "-x", "c++-header", str(stub), "-o", f"{stub}.gch"]
            log(f"precompiling {header}: {' '.join(cmd)}")
            res = jail.run(cmd, jail.JailSpec(writable=(str(box),)), sandbox, timeout=1800)
            for name in (stub.name, f"{stub.name}.gch"):
                jail.take_out(box, name, tmp / name)
        if res.returncode != 0:
            log(
                f"precompiling {header} failed (exit {res.returncode}); building without it:\n{res.stderr[-2000:]}"
            )
            return False
        # builds run as the jail's own uid where no pids cgroup caps them: the header was silently
        # missing from every build's view while its dir was 0700
        jail.open_to_jail(tmp)
        os.replace(tmp, final)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pch_cflags(
    pch_root: str | None, sources: list[str], cflags: list[str], log=print, sandbox=None
) -> list[str]:
    """`-include <stub>` for this build's host compiles when a precompiled header fits them all (made
    where missing and worth it: two or more host files, or no .cu to hold up), else []. `sandbox`: the
    jail (mini_kv.jail.JailInfo) the header is compiled in."""
    host = [s for s in sources if not s.endswith((".cu", ".cuh"))]
    header = common_header(host) if pch_root and host else None
    if header is None:
        return []
    compiler, flags = _compiler(), _pch_flags(cflags)
    root = Path(pch_root)
    final = root / _key(compiler, flags, header)[:32]
    stub = final / _stub_name(header)
    if Path(f"{stub}.gch").is_file():
        # made before, maybe by an earlier mini_kv that left it 0700 (as the build cache's hit does):
        # a jail running as a uid of its own failed the build on the missing `-include`
        jail.open_tree(final)
    elif len(host) < 2 and len(sources) > len(host):
        return []
    else:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(final) + ".lock"):
            if not Path(f"{stub}.gch").is_file() and not _make(compiler, flags, header, final, log, sandbox):
                return []
    # ninja passes cflags to a shell unquoted: a path it would split is not offered
    return ["-include", str(stub)] if _SAFE_PATH.fullmatch(str(stub)) else []
