"""Precompiled torch headers for the host (.cpp) files of a build, shared by every build of a project.

Most of a host file's compile is parsing the torch header it begins with: a shipped candidate's
op.cpp took 164-214 s without and 59 s with a precompiled ATen/ATen.h on the 2-core CI machine
(docs/sol-execbench.md). GCC reads `<dir>/<header>.gch` in place of `<header>` when `<dir>` comes
first on the include path, the header is the file's first include, and the .gch was made by the
same compiler with compatible options and macros; otherwise it reads the header itself. So a .gch
that does not fit costs time, never correctness, and the candidate's own -D/-U flags (which torch's
headers do not test) can be left out of it: one .gch serves every candidate of the project. nvcc's
preprocessor and front ends never read .gch files; a `.cu` is compiled as before.

The .gch files live in the project's build cache, `.build/pch/<key>/`, keyed by the compiler, the
torch installation and the flags, made once under a file lock, and renamed into place when complete.
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

from mini_kv.model import canonical_json, sha256_text

# headers worth precompiling: each is most of a host file's compile
PCH_HEADERS = ("torch/extension.h", "ATen/ATen.h", "torch/all.h", "torch/torch.h", "torch/library.h")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')


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


def wanted_headers(sources: list[str], cuda_sources: int) -> list[str]:
    """Headers to precompile for these host sources: one that two or more begin with, or any one
    when the build has no .cu (then making it first cannot lengthen the build)."""
    counts: dict[str, int] = {}
    for src in sources:
        header = first_include(Path(src))
        if header in PCH_HEADERS:
            counts[header] = counts.get(header, 0) + 1
    return [h for h, n in counts.items() if n >= 2 or cuda_sources == 0]


def _key(compiler: str, flags: list[str], header: str) -> str:
    import torch

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    return sha256_text(
        canonical_json(
            {
                "compiler": shutil.which(compiler) or compiler,
                "compiler_version": version,
                "torch": [torch.__version__, str(Path(torch.__file__).parent)],
                "flags": flags,
                "header": header,
            }
        )
    )


def _make(compiler: str, flags: list[str], header: str, final: Path, log) -> bool:
    """Compile `header` into `final/<header>.gch` (a fresh dir renamed into place)."""
    from torch.utils.cpp_extension import include_paths

    source = next((Path(d) / header for d in include_paths() if (Path(d) / header).is_file()), None)
    if source is None:
        return False
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=final.parent))
    try:
        out = tmp / (header + ".gch")
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [compiler, *flags, "-x", "c++-header", str(source), "-o", str(out)]
        log(f"precompiling {header}: {' '.join(cmd)}")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            log(
                f"precompiled header {header} failed (exit {res.returncode}), building without it:\n{res.stderr[-2000:]}"
            )
            return False
        os.replace(tmp, final)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pch_include_dirs(pch_root: str | None, sources: list[str], cflags: list[str], log=print) -> list[str]:
    """Include dirs holding precompiled headers for this build's host sources (made where missing and
    worth it), to go first on its include path."""
    host = [s for s in sources if not s.endswith((".cu", ".cuh"))]
    if not pch_root or not host:
        return []
    compiler, flags = _compiler(), _pch_flags(cflags)
    root, wanted = Path(pch_root), wanted_headers(host, len(sources) - len(host))
    found = []
    for header in sorted({first_include(Path(s)) for s in host} & set(PCH_HEADERS)):
        final = root / _key(compiler, flags, header)[:32]
        if (final / (header + ".gch")).is_file():
            found.append(str(final))
        elif header in wanted:
            root.mkdir(parents=True, exist_ok=True)
            with FileLock(str(final) + ".lock"):
                if (final / (header + ".gch")).is_file() or _make(compiler, flags, header, final, log):
                    found.append(str(final))
    return found
