"""Build a candidate into `.build/<key>/`, reusing an identical earlier build.

The key hashes everything that can change the binary: source bytes, flags, torch and CUDA
versions, nvcc, host compiler, arch list. A build happens in a private temp dir in a child
process and is renamed into place only when complete, under a file lock, so concurrent
builders of one key neither corrupt nor duplicate it. The build itself is a worker child's job (kind
`build`, mini_kv.compile.jit_child).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from mini_kv import environment, torch_flags
from mini_kv.compile import nvcc_steps
from mini_kv.load.flags import FlagRules, UnsafeFlag, check_flags, links_leaving
from mini_kv.model import Candidate, canonical_json, sha256_file, sha256_text
from mini_kv.proc import run_with_timeout
from mini_kv.runner import run_one
from mini_kv.sandbox import disabled
from mini_kv.settings import DEFAULTS
from mini_kv.status import BuildStatus
from mini_kv.worker.jobs import BuildJob, Event

BUILD_FORMAT = 1  # bump when the layout of a build dir changes
NO_CUDA_BUILD = (
    "torch has no CUDA (or CUDA_HOME is missing, or no GPU and no TORCH_CUDA_ARCH_LIST to build for)"
)
# what the key hashes and the attempt keeps; a file of another suffix that a source #includes is read
# by the compiler but not keyed (docs/security.md, limits)
SOURCE_SUFFIXES = {
    ".c",
    ".cpp",
    ".cc",
    ".cxx",
    ".cu",
    ".cuh",
    ".h",
    ".hpp",
    ".inc",
    ".hh",
    ".hxx",
    ".inl",
    ".ipp",
    ".tpp",
    ".tcc",
}


def candidate_files(cdir: Path) -> list[Path]:
    """Every source-like file of the candidate, so an edited header changes the key too."""
    return sorted(p for p in cdir.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def _files_now(cdir: Path) -> list[dict]:
    return [{"path": str(p.relative_to(cdir)), "sha256": sha256_file(p)} for p in candidate_files(cdir)]


def refused_input(project_root: Path, cand: Candidate) -> str | None:
    """Why the candidate's flags or files must not be built at all, or None."""
    try:
        check_flags(
            {
                "cflags": cand.cflags,
                "cuda_cflags": cand.cuda_cflags,
                "ld_flags": getattr(cand, "ldflags", ()),
            },
            FlagRules(project_root / cand.path),
        )
    except UnsafeFlag as exc:
        return f"{cand.id}: {exc}"
    leaving = links_leaving(project_root / cand.path, project_root)
    if leaving:
        link, target = leaving[0]
        return f"{cand.id}: symlink {link} points to {target}, outside the project {project_root.resolve()}"
    return None


def toolchain(with_cuda: bool) -> dict:
    import torch

    return {
        "build_format": BUILD_FORMAT,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "with_cuda": with_cuda,
        "nvcc": environment.nvcc_info()["version"],
        "cxx": environment.cxx_info()["version"],
        "arch_list": environment.cuda_arch_list() if with_cuda else [],
        # how nvcc's steps ran (compile/nvcc_steps.py), keyed so that switching it off builds afresh
        **({"nvcc_steps": "side_by_side" if nvcc_steps.enabled() else "nvcc"} if with_cuda else {}),
    }


def build_plan(project_root: Path, cand: Candidate, with_cuda: bool | None = None) -> dict:
    """Everything the build needs and the key naming it (no side effects).

    `cand` is a task-card Candidate or any record with the same fields; one that also sets
    `python_module` (plus optional `ldflags`, `include_dirs`) is built as an importable torch
    extension module named after the key, as SOL-ExecBench C++ solutions are. Such a module cannot
    be half-built, so where torch has no CUDA every source is only compile-checked (`check_only`).
    """
    python_module = bool(getattr(cand, "python_module", False))
    if with_cuda is None:
        # a CUDA torch without a GPU to build for (no TORCH_CUDA_ARCH_LIST): nothing to target, so the
        # CUDA sources are compile-checked as where torch has no CUDA (the PyPI torch is a CUDA build)
        with_cuda = (
            environment.torch_has_cuda_build()
            and (bool(cand.cuda_sources) or python_module)
            and bool(environment.cuda_arch_list())
        )
    check_only = python_module and not with_cuda
    cdir = project_root / cand.path
    all_sources = list(cand.cpu_sources) + list(cand.cuda_sources)
    if check_only:
        sources, skipped = [], all_sources
    else:
        sources = list(cand.cpu_sources) + (list(cand.cuda_sources) if with_cuda else [])
        skipped = [] if with_cuda else list(cand.cuda_sources)
    files = _files_now(cdir)
    flags = {
        "cflags": [*torch_flags.base_cflags(), *cand.cflags],
        "cuda_cflags": [*torch_flags.base_cuda_cflags(), *cand.cuda_cflags] if with_cuda else [],
        "include_dirs": [".", *getattr(cand, "include_dirs", ())],
    }
    # the candidate's own link flags, then those mini_kv adds for a language's libraries
    ldflags = [*getattr(cand, "ldflags", ()), *getattr(cand, "extra_ldflags", ())]
    if ldflags:
        flags["ldflags"] = ldflags
    tc = toolchain(with_cuda)
    keyed = {"files": files, "sources": sources, "flags": flags, "toolchain": tc}
    if python_module:  # only then, so the keys of existing candidate builds stay as they were
        keyed.update(python_module=True, check_only=check_only)
    key = sha256_text(canonical_json(keyed))
    return {
        "candidate": cand.id,
        "candidate_dir": str(cdir),
        "sources": sources,
        "files": files,
        "flags": flags,
        "toolchain": tc,
        "key": key,
        "with_cuda": with_cuda,
        "cuda_sources_skipped": skipped,
        "python_module": python_module,
        "check_only": check_only,
        "module": f"mkv_{key[:16]}",
    }


def _library_in(d: Path) -> Path | None:
    libs = sorted(d.glob("*.so"))
    return libs[0] if libs else None


def _torch_extension_includes(plan: dict) -> list[str]:
    """What torch's extension builder puts on the include path, for checking a torch extension's sources."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    return [f"-DTORCH_EXTENSION_NAME={plan['module']}"] + [
        f"-I{d}" for d in (*include_paths(), sysconfig.get_paths()["include"])
    ]


# gcc: "<file>:9:10: fatal error: <header>: No such file or directory"; nvcc's EDG front end:
# "<file>(9): catastrophic error: cannot open source file \"<header>\""
_MISSING_HEADER = re.compile(
    r"^(?P<file>[^\s:(]+)(?::\d+:\d+: fatal error: (?P<h1>[^:\s]+): No such file or directory"
    r'|\(\d+\): catastrophic error: cannot open source file "(?P<h2>[^"]+)")',
    re.M,
)
_TOOLKIT_HEADER_PREFIXES = ("c10/", "ATen/", "torch/", "cu", "nv", "thrust/", "cooperative_groups", "mma")


def _missing_environment_header(output: str, source_dir: str) -> str | None:
    """The header a torch-extension check stopped on when the machine, not the source, lacks it:
    one included from outside the source dir (e.g. a CPU torch wheel's incomplete c10/cuda), or a
    CUDA/torch library header the source includes itself (cusparse.h where the toolkit is partial)."""
    m = _MISSING_HEADER.search(output)
    if m is None:
        return None
    header = m.group("h1") or m.group("h2")
    from_outside = not os.path.realpath(m.group("file")).startswith(os.path.realpath(source_dir) + os.sep)
    return header if from_outside or header.startswith(_TOOLKIT_HEADER_PREFIXES) else None


def _cuda_compile_check(plan: dict, out_dir: Path, timeout: float) -> dict:
    """Without CUDA torch, still prove the torch-free .cu files compile for sm_90.

    A check-only plan (a torch extension module where torch has no CUDA) checks every source,
    with torch's headers on the include path. If the machine lacks a header the source needs,
    the check is `inconclusive` (not the source's fault), and names the header."""
    check_all = plan.get("check_only", False)
    cu = [s for s in plan["cuda_sources_skipped"] if check_all or s.endswith(".cu")]
    if not cu:
        return {"status": BuildStatus.SKIPPED, "note": "no .cu sources"}
    nvcc = environment.nvcc_info()["path"]
    if nvcc is None:
        return {"status": BuildStatus.SKIPPED, "note": "nvcc not found: .cu files were not compile-checked"}
    extra = _torch_extension_includes(plan) if plan.get("python_module") else []
    include_dirs = [str(Path(plan["candidate_dir"]) / d) for d in plan["flags"]["include_dirs"]]
    results = []
    start, env = nvcc_steps.launcher(nvcc)  # front ends side by side, as in a build
    for src in cu:
        obj = out_dir / (Path(src).stem + ".o")
        cmd = [
            *start,
            "-c",
            "-arch=sm_90",
            torch_flags.installed_std_flag(),
            "-O3",
            *torch_flags.nvcc_defines(),
            *[a for d in include_dirs for a in ("-I", d)],
            *extra,
            str(Path(plan["candidate_dir"]) / src),
            "-o",
            str(obj),
        ]
        res = run_with_timeout(cmd, timeout=timeout, env=env)
        results.append(
            {
                "source": src,
                "command": cmd,
                "returncode": res.returncode,
                "timed_out": res.timed_out,
                "output": res.output[-4000:],
            }
        )
        if res.returncode != 0:
            missing = (
                None
                if res.timed_out or not check_all
                else _missing_environment_header(res.output, plan["candidate_dir"])
            )
            if missing is not None:
                return {
                    "status": BuildStatus.INCONCLUSIVE,
                    "checks": results,
                    "note": f"this machine lacks {missing} (needed by {src}): not fully compile-checked",
                }
            return {"status": BuildStatus.TIMEOUT if res.timed_out else BuildStatus.ERROR, "checks": results}
    return {"status": BuildStatus.OK, "checks": results}


def compile_candidate(
    project_root: Path, cand: Candidate, timeout: float = DEFAULTS.compile_s, with_cuda: bool | None = None
) -> dict:
    """Build (or reuse) the candidate; returns the compile.json record. Never raises for candidate errors."""
    t0 = time.perf_counter()
    plan = build_plan(project_root, cand, with_cuda)
    build_root = project_root / ".build"
    build_root.mkdir(parents=True, exist_ok=True)
    final = build_root / plan["key"][:32]
    record = {
        "schema_version": 1,
        "key": plan["key"],
        "candidate": cand.id,
        "build_dir": str(final),
        "with_cuda": plan["with_cuda"],
        "sources": plan["sources"],
        "files": plan["files"],
        "flags": plan["flags"],
        "toolchain": plan["toolchain"],
    }
    if plan["python_module"]:
        record.update(module=plan["module"], check_only=plan["check_only"])
    if plan["check_only"]:
        record["cuda_note"] = (
            f"{NO_CUDA_BUILD}: the extension module was not built; "
            "every source was compile-checked with nvcc against torch's headers"
        )
    elif not plan["with_cuda"] and cand.cuda_sources:
        record["cuda_note"] = (
            f"{NO_CUDA_BUILD}: the CUDA kernel was not built; .cu files were compile-checked with plain nvcc"
        )
    refused = refused_input(project_root, cand)  # the loaders refuse these first; this guards every other way
    if refused is not None:
        record["refused"] = f"{refused} (nothing was compiled)"
        return _finish(record, build_root / "refused", cache_hit=False, t0=t0, status=BuildStatus.ERROR)
    done = final / "build.json"

    def built() -> bool:  # a check-only build has no library, only its recorded check
        return done.is_file() and (plan["check_only"] or _library_in(final) is not None)

    if built():
        return _finish(record, final, cache_hit=True, t0=t0, status=BuildStatus.OK)
    with FileLock(str(build_root / f"{plan['key'][:32]}.lock")):
        if built():  # another process built it while we waited
            return _finish(record, final, cache_hit=True, t0=t0, status=BuildStatus.OK)
        tmp = Path(tempfile.mkdtemp(prefix=f"tmp-{plan['key'][:12]}-", dir=build_root))
        try:
            status = _build_into(plan, tmp, timeout, record)
            if status == BuildStatus.OK and _files_now(Path(plan["candidate_dir"])) != plan["files"]:
                # the compiler may have read other bytes than the key names: never cache that library
                record["refused"] = (
                    f"{cand.id}: the candidate's files changed while it was built; the "
                    "library was discarded (build again once they stay put)"
                )
                status = BuildStatus.ERROR
            if status != BuildStatus.OK:
                record["failed_build_dir"] = str(tmp)
                return _finish(record, tmp, cache_hit=False, t0=t0, status=status)
            (tmp / "build.json").write_text(json.dumps(record, indent=2))
            if final.exists():  # a stale, incomplete dir from a killed build
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists() and record.get("failed_build_dir") is None:
                shutil.rmtree(tmp, ignore_errors=True)
    return _finish(record, final, cache_hit=False, t0=t0, status=BuildStatus.OK)


def _build_into(plan: dict, tmp: Path, timeout: float, record: dict) -> str:
    if plan["cuda_sources_skipped"]:
        check = _cuda_compile_check(plan, tmp, timeout)
        record["cuda_check"] = check
        if check["status"] in (BuildStatus.ERROR, BuildStatus.TIMEOUT):
            return BuildStatus.ERROR if check["status"] == BuildStatus.ERROR else BuildStatus.TIMEOUT
    if plan["check_only"]:
        return BuildStatus.OK
    job = BuildJob(
        name=plan["module"],
        build_dir=str(tmp / "out"),
        sources=[str(Path(plan["candidate_dir"]) / s) for s in plan["sources"]],
        include_dirs=[str(Path(plan["candidate_dir"]) / d) for d in plan["flags"]["include_dirs"]],
        flags=plan["flags"],
        arch_list=plan["toolchain"]["arch_list"],
        python_module=plan["python_module"],
        with_cuda=True if plan["python_module"] else None,
        pch_root=str(tmp.parent / "pch"),  # tmp lies in the project's .build/
    )
    record["command"] = [sys.executable, "-m", "mini_kv.worker.child"]  # job kind `build`
    # the compiler's output is the child's: stdout.log; why the build failed (torch's exception): stderr.log
    ev = run_one(
        job,
        timeout,
        sandbox=disabled("a build runs the compiler, not candidate code"),
        log_path=str(tmp / "stdout.log"),
    )
    if ev.get("timed_out"):
        return BuildStatus.TIMEOUT
    if ev["event"] != Event.RESULT:
        (tmp / "stderr.log").write_text(f"{ev['reason']}\n{ev.get('traceback') or ''}")
        return BuildStatus.ERROR
    lib = _library_in(tmp / "out")
    if lib is None:
        (tmp / "stderr.log").write_text("build produced no shared library\n")
        return BuildStatus.ERROR
    shutil.move(str(lib), tmp / lib.name)
    if (tmp / "out" / "build.ninja").is_file():
        shutil.copy(tmp / "out" / "build.ninja", tmp / "build.ninja")
    shutil.rmtree(tmp / "out", ignore_errors=True)
    return BuildStatus.OK


def _finish(record: dict, d: Path, cache_hit: bool, t0: float, status: str) -> dict:
    lib = _library_in(d)
    record.update(
        {
            "status": status,
            "cache_hit": cache_hit,
            "duration_s": round(time.perf_counter() - t0, 4),
            "library": str(lib) if lib else None,
            "library_sha256": sha256_file(lib) if lib else None,
            "logs": {
                name: str(d / name)
                for name in ("stdout.log", "stderr.log", "build.ninja")
                if (d / name).is_file()
            },
        }
    )
    return record
