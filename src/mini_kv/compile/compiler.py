"""Build a candidate into `.build/<key>/`, reusing an identical earlier build.

The key hashes everything that can change the binary: source bytes, flags, torch and CUDA
versions, nvcc, host compiler, arch list. The build itself is a worker child's job (kind `build`,
mini_kv.compile.jit_child: ninja, nvcc, the host compiler, then the load check, which runs the
library's static initializers) in the jail (mini_kv.jail): it sees the candidate's files, the
toolchain, the Python environment and the precompiled header it uses, read-only, and writes only a
private temp dir outside the project. This process then checks the products (a regular file, not a
link), copies them into `.build/<key>/` with the library's SHA-256 in `build.json`, renamed into
place only when complete, under a file lock. Every cache hit hashes the library again: a library that
no longer matches its record is a loud warning, and the entry is discarded and rebuilt.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from mini_kv import environment, jail, torch_flags
from mini_kv.codec import optional, to_json
from mini_kv.compile import nvcc_steps, pch
from mini_kv.compile.diagnostics import first_compiler_error
from mini_kv.jail import JailInfo, JailSpec
from mini_kv.load.files import links_leaving, odd_files
from mini_kv.load.flags import FlagRules, UnsafeFlag, check_flags
from mini_kv.model import Candidate, JailRecord, canonical_json, sha256_file, sha256_text
from mini_kv.runner import default_sandbox, run_one
from mini_kv.settings import DEFAULTS
from mini_kv.status import BuildStatus
from mini_kv.worker.jobs import BuildJob

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
    odd = odd_files(project_root / cand.path)
    if odd:
        return f"{cand.id}: {odd[0][0]} {odd[0][1]}"
    return None


@dataclass(frozen=True)
class Toolchain:
    """The tools a build used, part of its key."""

    build_format: int
    python: str
    torch: str
    torch_cuda: str | None
    with_cuda: bool
    nvcc: str | None
    cxx: str | None
    arch_list: list[str]
    # how nvcc's steps ran (compile/nvcc_steps.py), keyed so that switching it off builds afresh
    nvcc_steps: str | None = optional()

    @classmethod
    def here(cls, with_cuda: bool) -> Toolchain:
        built = torch_flags.torch_installation()  # read from torch's files: no import of torch for the key
        return cls(
            BUILD_FORMAT,
            f"{sys.version_info.major}.{sys.version_info.minor}",
            built.version,
            built.cuda,
            with_cuda,
            environment.nvcc_info().version,
            environment.cxx_info().version,
            environment.cuda_arch_list() if with_cuda else [],
            ("side_by_side" if nvcc_steps.enabled() else "nvcc") if with_cuda else None,
        )


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build needs and the key naming it (build_plan)."""

    candidate_dir: str  # by its real path (not in the key): the jail binds what a path names, and a
    # project's .build/ (where a baseline's sources are staged) may be a symlink
    sources: list[str]
    files: list[dict]
    flags: dict[str, list[str]]
    toolchain: Toolchain
    key: str
    cuda_sources_skipped: list[str]
    python_module: bool
    check_only: bool

    @property
    def module(self) -> str:
        return f"mkv_{self.key[:16]}"


@dataclass(frozen=True)
class CudaCheck:
    """The compile check of CUDA sources that were not built (compile.json's `cuda_check`)."""

    status: str
    checks: list[dict] | None = optional()
    note: str | None = optional()


def build_plan(project_root: Path, cand: Candidate, with_cuda: bool | None = None) -> BuildPlan:
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
    tc = Toolchain.here(with_cuda)
    keyed = {"files": files, "sources": sources, "flags": flags, "toolchain": to_json(tc)}
    if python_module:  # only then, so the keys of existing candidate builds stay as they were
        keyed.update(python_module=True, check_only=check_only)
    return BuildPlan(
        str(Path(cdir).resolve()),
        sources,
        files,
        flags,
        tc,
        sha256_text(canonical_json(keyed)),
        skipped,
        python_module,
        check_only,
    )


def _library_in(d: Path) -> Path | None:
    libs = sorted(d.glob("*.so"))
    return libs[0] if libs else None


def _torch_extension_includes(plan: BuildPlan) -> list[str]:
    """What torch's extension builder puts on the include path, for checking a torch extension's sources."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    return [f"-DTORCH_EXTENSION_NAME={plan.module}"] + [
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


def _build_spec(plan: BuildPlan, out_dir: Path, extra_read: tuple[str, ...] = ()) -> JailSpec:
    """A build's jail: the candidate's dir and the absolute include/library dirs of its plan (the
    allow-list admits only the candidate's own and those mini_kv adds) read-only, `out_dir` writable;
    each process's address space capped (environment.build_memory_limit) where the build loads no CUDA,
    and the whole build's memory, CUDA's included, where the machine allows a memory cgroup."""
    flags = plan.flags
    dirs = [d for d in flags["include_dirs"] if os.path.isabs(d)]
    dirs += [f[2:] for f in flags.get("ldflags", []) if f.startswith("-L") and os.path.isabs(f[2:])]
    return JailSpec(
        read_only=(plan.candidate_dir, *dirs, *extra_read),
        writable=(str(out_dir),),
        limits=jail.Limits(
            file_size_bytes=2 << 30,
            address_space_bytes=None if plan.toolchain.with_cuda else environment.build_memory_limit(),
            memory_bytes=environment.build_memory_limit(),
        ),
    )


def _cuda_compile_check(plan: BuildPlan, out_dir: Path, timeout: float, sandbox: JailInfo) -> CudaCheck:
    """Without CUDA torch, still prove the torch-free .cu files compile for sm_90.

    A check-only plan (a torch extension module where torch has no CUDA) checks every source,
    with torch's headers on the include path. If the machine lacks a header the source needs,
    the check is `inconclusive` (not the source's fault), and names the header."""
    check_all = plan.check_only
    cu = [s for s in plan.cuda_sources_skipped if check_all or s.endswith(".cu")]
    if not cu:
        return CudaCheck(BuildStatus.SKIPPED, note="no .cu sources")
    nvcc = environment.nvcc_info().path
    if nvcc is None:
        return CudaCheck(BuildStatus.SKIPPED, note="nvcc not found: .cu files were not compile-checked")
    extra = _torch_extension_includes(plan) if plan.python_module else []
    include_dirs = [str(Path(plan.candidate_dir) / d) for d in plan.flags["include_dirs"]]
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
            str(Path(plan.candidate_dir) / src),
            "-o",
            str(obj),
        ]
        res = jail.run(cmd, _build_spec(plan, out_dir), sandbox, timeout=timeout, env=env)
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
                else _missing_environment_header(res.output, plan.candidate_dir)
            )
            if missing is not None:
                why = f"this machine lacks {missing} (needed by {src}): not fully compile-checked"
                return CudaCheck(BuildStatus.INCONCLUSIVE, results, why)
            return CudaCheck(BuildStatus.TIMEOUT if res.timed_out else BuildStatus.ERROR, results)
    return CudaCheck(BuildStatus.OK, results)


@dataclass(frozen=True)
class CompileRecord:
    """compile.json: how the build ended (`status`, a cache hit, its seconds, the library and its SHA-256,
    the logs), what it built from (the build key and what it hashes, the jail), and why it is not the
    whole build where it is not (a CUDA compile check only, refused files, a failed build's directory).
    The cache entry's build.json is this record before the outcome. A --prebuilt library's has only the
    outcome and `prebuilt`."""

    schema_version: int = 1
    status: str | None = None
    cache_hit: bool | None = None  # None: --prebuilt
    duration_s: float = 0.0
    library: str | None = None
    library_sha256: str | None = optional()
    logs: dict | None = optional()  # log name -> path
    key: str | None = optional()
    candidate: str | None = optional()
    build_dir: str | None = optional()
    with_cuda: bool | None = optional()
    sources: list | None = optional()
    files: list | None = optional()
    flags: dict | None = optional()
    toolchain: dict | None = optional()
    sandbox: JailRecord | None = optional()
    module: str | None = optional()
    check_only: bool | None = optional()
    cuda_note: str | None = optional()
    refused: str | None = optional()
    failed_build_dir: str | None = optional()
    cuda_check: dict | None = optional()
    command: list | None = optional()
    prebuilt: bool | None = optional()


# a failed build's log that says the compiler was killed or ran short of memory, disk, processes or
# files: beside a batch's other builds (another candidate's among them) that can be the machine's state,
# not the sources', so such a failure is built again alone
_NOT_THE_SOURCES = re.compile(
    r"Killed signal|terminated program|out of memory|Cannot allocate memory|No space left|"
    r"Disk quota|Resource temporarily unavailable|Too many open files",
    re.I,
)


def failed_alike(known: CompileRecord | None, key: str) -> bool:
    """`known` (the same candidate's build, made ahead by a batch: cluster.prebuild) failed on its
    sources with the compiler's own error (a diagnostic on a source line), under build key `key`, and its
    logs are still there: the same compiler on the same sources, flags and toolchain fails the same way,
    so it is the result. A timeout, a refusal, a failure with no diagnostic, or a compiler killed or short
    of a resource is built again."""
    if known is None or known.key != key or known.status != BuildStatus.ERROR or known.refused:
        return False
    if not known.failed_build_dir or not Path(known.failed_build_dir).is_dir():
        return False
    logs = [Path(p) for p in (known.logs or {}).values()]
    outputs = [p.read_text(errors="replace") for p in logs if p.is_file()]
    checks = (known.cuda_check or {}).get("checks") or []  # a compile check of CUDA sources: their output
    outputs += [check.get("output") or "" for check in checks]
    return any(map(first_compiler_error, outputs)) and not any(map(_NOT_THE_SOURCES.search, outputs))


def compile_candidate(
    project_root: Path,
    cand: Candidate,
    timeout: float = DEFAULTS.compile_s,
    with_cuda: bool | None = None,
    sandbox: JailInfo | None = None,
    known: CompileRecord | None = None,
) -> CompileRecord:
    """Build (or reuse) the candidate; returns the compile.json record. Never raises for candidate errors.
    `sandbox`: the jail the build runs in (default: runner.default_sandbox). `known`: this candidate's
    build made ahead in the same batch; where it failed on its sources (`failed_alike`) that record is
    returned instead of compiling again (a failed build is never cached)."""
    t0 = time.perf_counter()
    sandbox = sandbox if sandbox is not None else default_sandbox()
    plan = build_plan(project_root, cand, with_cuda)
    build_root = project_root / ".build"
    build_root.mkdir(parents=True, exist_ok=True)
    final = build_root / plan.key[:32]
    keyed, with_cuda = to_json(plan), plan.toolchain.with_cuda
    note = (
        f"{NO_CUDA_BUILD}: the extension module was not built; "
        "every source was compile-checked with nvcc against torch's headers"
        if plan.check_only
        else f"{NO_CUDA_BUILD}: the CUDA kernel was not built; .cu files were compile-checked with plain nvcc"
        if not with_cuda and cand.cuda_sources
        else None
    )
    record = CompileRecord(
        key=plan.key,
        candidate=cand.id,
        build_dir=str(final),
        with_cuda=with_cuda,
        **{k: keyed[k] for k in ("sources", "files", "flags", "toolchain")},
        sandbox=sandbox.record(),
        module=plan.module if plan.python_module else None,
        check_only=plan.check_only if plan.python_module else None,
        cuda_note=note,
    )
    refused = refused_input(project_root, cand)  # the loaders refuse these first; this guards every other way
    if refused is not None:
        record = replace(record, refused=f"{refused} (nothing was compiled)")
        return _finish(record, build_root / "refused", cache_hit=False, t0=t0, status=BuildStatus.ERROR)

    if failed_alike(known, plan.key):
        return known

    def built() -> bool:  # a check-only build has no library, only its recorded check
        return _cache_entry_holds(final, plan.check_only)

    if built():
        jail.open_to_jail(final)  # a cache made before, as the jail's uid could not read it
        return _finish(record, final, cache_hit=True, t0=t0, status=BuildStatus.OK)
    with FileLock(str(build_root / f"{plan.key[:32]}.lock")):
        if built():  # another process built it while we waited
            return _finish(record, final, cache_hit=True, t0=t0, status=BuildStatus.OK)
        # under this key's lock no other build of it runs: its older scratch dirs are leftovers of a
        # killed build or an earlier failure (whose logs its attempt already copied)
        for stale in build_root.glob(f"tmp-{plan.key[:12]}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"tmp-{plan.key[:12]}-", dir=build_root))
        try:
            with jail.scratch("build") as box:  # the jail's only writable dir
                status, record = _build_into(plan, tmp, box, timeout, record, sandbox)
            if status == BuildStatus.OK and _files_now(Path(plan.candidate_dir)) != plan.files:
                # the compiler may have read other bytes than the key names: never cache that library
                why = (
                    f"{cand.id}: the candidate's files changed while it was built; the library was discarded"
                )
                record = replace(record, refused=why + " (build again once they stay put)")
                status = BuildStatus.ERROR
            if status != BuildStatus.OK:
                record = replace(record, failed_build_dir=str(tmp))  # kept for its logs
                return _finish(record, tmp, cache_hit=False, t0=t0, status=status)
            lib = _library_in(tmp)
            record = replace(record, library_sha256=sha256_file(lib) if lib else None)
            (tmp / "build.json").write_text(json.dumps(to_json(record), indent=2))
            if final.exists():  # a stale, incomplete dir from a killed build
                shutil.rmtree(final)
            jail.open_to_jail(tmp)  # a profile's jail binds the library where it lies
            os.replace(tmp, final)
        finally:
            if tmp.exists() and record.failed_build_dir is None:
                shutil.rmtree(tmp, ignore_errors=True)
    return _finish(record, final, cache_hit=False, t0=t0, status=BuildStatus.OK)


def _cache_entry_holds(final: Path, check_only: bool) -> bool:
    """A complete cache entry whose library still has the SHA-256 its build.json recorded. One that
    does not (edited, swapped by another candidate, a torn copy) is discarded, loudly, to be rebuilt."""
    done = final / "build.json"
    if not done.is_file():
        return False
    if check_only:
        return True
    lib = _library_in(final)
    try:
        recorded = json.loads(done.read_text()).get("library_sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None
    actual = sha256_file(lib) if lib is not None and lib.is_file() and not lib.is_symlink() else None
    if actual is not None and actual == recorded:
        return True
    print(
        f"mini_kv: warning: the cached build {final} does not match its record "
        f"(library sha256 {actual or 'missing'}, build.json says {recorded or 'nothing'}): "
        "the entry is discarded and rebuilt",
        file=sys.stderr,
    )
    shutil.rmtree(final, ignore_errors=True)
    return False


def _build_into(
    plan: BuildPlan, tmp: Path, box: Path, timeout: float, record: CompileRecord, sandbox: JailInfo
) -> tuple[str, CompileRecord]:
    """Build in the jail into `box` (outside the project), then move the checked products into `tmp`: the
    status and `record` with the CUDA compile check and the build's command."""
    if plan.cuda_sources_skipped:
        check = _cuda_compile_check(plan, box, timeout, sandbox)
        record = replace(record, cuda_check=to_json(check))
        if check.status in (BuildStatus.ERROR, BuildStatus.TIMEOUT):
            return check.status, record
    if plan.check_only:
        return BuildStatus.OK, record
    sources = [str(Path(plan.candidate_dir) / s) for s in plan.sources]
    # the precompiled torch header is made (jailed, from torch's headers only) and kept by this process;
    # the build sees it read-only, so no candidate can change what other builds include
    pch_flags = pch.pch_cflags(str(pch.root()), sources, plan.flags["cflags"], sandbox=sandbox)
    job = BuildJob(
        name=plan.module,
        build_dir=str(box / "out"),
        sources=sources,
        include_dirs=[str(Path(plan.candidate_dir) / d) for d in plan.flags["include_dirs"]],
        flags={**plan.flags, "cflags": [*plan.flags["cflags"], *pch_flags]},
        arch_list=plan.toolchain.arch_list,
        python_module=plan.python_module,
        with_cuda=True if plan.python_module else None,
    )
    record = replace(
        record, command=[sys.executable, "-m", "mini_kv.worker.child"]
    )  # job kind `build`, jailed
    return _built_in_jail(plan, tmp, box, timeout, sandbox, pch_flags, job), record


def _built_in_jail(plan: BuildPlan, tmp: Path, box: Path, timeout: float, sandbox, pch_flags, job) -> str:
    """The `build` job in its jail; the library and build.ninja it made copied into `tmp`."""
    pch_dirs = tuple(str(Path(f).parent) for f in pch_flags[1:2])
    # the compiler's output is the child's: stdout.log; why the build failed (torch's exception): stderr.log
    ev = run_one(
        job,
        timeout,
        sandbox=sandbox,
        log_path=str(tmp / "stdout.log"),
        spec=_build_spec(plan, box, pch_dirs),
    )
    if ev.timed_out:
        return BuildStatus.TIMEOUT
    if not ev.ok:
        (tmp / "stderr.log").write_text(f"{ev.reason}\n{ev.traceback or ''}")
        return BuildStatus.ERROR
    lib = _library_in(box / "out")
    # copies: nothing in the cache links back to the jail's dir
    if lib is None or not jail.take_out(lib.parent, lib.name, tmp / lib.name):
        (tmp / "stderr.log").write_text("build produced no shared library (a regular file)\n")
        return BuildStatus.ERROR
    jail.take_out(box / "out", "build.ninja", tmp / "build.ninja")
    return BuildStatus.OK


def _finish(record: CompileRecord, d: Path, cache_hit: bool, t0: float, status: str) -> CompileRecord:
    lib = _library_in(d)
    return replace(
        record,
        status=status,
        cache_hit=cache_hit,
        duration_s=round(time.perf_counter() - t0, 4),
        library=str(lib) if lib else None,
        library_sha256=sha256_file(lib) if lib else None,  # as build.json records it
        logs={
            name: str(d / name)
            for name in ("stdout.log", "stderr.log", "build.ninja")
            if (d / name).is_file()
        },
    )
