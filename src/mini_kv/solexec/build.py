"""Staging a solution's sources, and building the C++ ones with mini_kv's content-addressed compiler."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

from mini_kv.compile.compiler import CompileRecord, compile_candidate
from mini_kv.errors import ConfigError
from mini_kv.model import Candidate
from mini_kv.solexec import languages
from mini_kv.solexec.languages import CppFlags
from mini_kv.solexec.solution import load_solution
from mini_kv.status import BuildStatus
from mini_kv.store.baseline import BaselineBuildError, checked_source_attempt, find_source_attempt


def stage_sources(solution: Candidate, dest: Path) -> Path:
    """Write every source under `dest`, keeping its relative path (paths were checked at load)."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in solution.sources:
        target = dest / PurePosixPath(src.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(src.content, encoding="utf-8")
    return dest


def solution_build(solution: Candidate, staged: Path, extra: CppFlags) -> Candidate:
    """The staged copy as the compiler builds it, with what mini_kv adds for the language's libraries."""
    return dataclasses.replace(
        solution, path=str(staged.resolve()), include_dirs=extra.include_dirs, extra_ldflags=extra.ldflags
    )


@dataclasses.dataclass(frozen=True)
class SolutionEntry:
    """How the worker loads a staged solution: the SOL job's `solution` (and its `baseline`, the
    regression gate's same-run comparison); `module` and `library` are the build's, None for Python."""

    group: str
    dir: str
    entry_file: str
    entry_function: str
    dps: bool
    module: str | None
    library: str | None


def job_entry(solution: Candidate, staged: Path, rec: CompileRecord | None) -> SolutionEntry:
    s = solution
    module, library = (rec.module, rec.library) if rec else (None, None)
    return SolutionEntry(s.group, str(staged), s.entry_file, s.entry_function, s.dps, module, library)


def build_log(record: CompileRecord, limit: int = 8000) -> str:
    """The part of a failed build's output that says why."""
    parts = [record.refused] if record.refused else []
    for check in (record.cuda_check or {}).get("checks", []):
        if check["returncode"] != 0:
            parts.append(f"$ {' '.join(check['command'])}\n{check['output']}")
    for name in ("stderr.log", "stdout.log"):
        path = (record.logs or {}).get(name)
        if path and Path(path).is_file():
            text = Path(path).read_text(errors="replace").strip()
            if text:
                parts.append(text)
    return "\n".join(parts)[-limit:]


def stage_sol_baseline(
    baseline: dict, project_root: Path, artifacts: Path, dest: Path, definition: str, timeout: float
) -> SolutionEntry:
    """The baseline's own SOL-ExecBench solution, ready to load beside the candidate (the SOL job's
    `baseline` entry): the solution.json (every source inlined, as in its sources/) of the attempt it was
    promoted from, checked like a card's, staged under `dest` and built when it is C++ (a Python module
    name or a built module of its own: no namespace to rename). Raises BaselineBuildError or BaselineTampered."""
    attempt_dir = find_source_attempt(baseline, artifacts)
    checked_source_attempt(attempt_dir, baseline)
    try:
        sol = load_solution(attempt_dir / "solution.json", definition)
    except ConfigError as exc:
        raise BaselineBuildError(f"the baseline's solution does not load: {exc}") from None
    stage_sources(sol, dest)
    rec = None
    if sol.group == "cpp":
        flags, reason = languages.cpp_flags(sol.languages, sol.dependencies)
        rec = (
            None
            if reason
            else compile_candidate(Path(project_root), solution_build(sol, dest, flags), timeout)
        )
        if rec is None or rec.status != BuildStatus.OK:
            raise BaselineBuildError(f"the baseline's solution did not build: {reason or rec.status}")
    return job_entry(sol, dest, rec)
