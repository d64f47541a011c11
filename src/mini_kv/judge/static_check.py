"""The static pre-check: the candidate's source files read by kernelguard (a rule-based detector of the
hacks GPU MODE's competitions met: output caches keyed on the input's address, patched timers, silent
fallbacks to torch, hard-coded shapes...) before anything of it runs. Its findings go into the attempt
(`static_check.json`) and the run's progress; they are a reviewer's lead, never a verdict: the verdict
is what the judge saw the code do (docs/integrity.md).

The sources are hostile text: kernelguard parses and pattern-matches them (it runs none of them), in a
child forked from this process under a CPU-time and memory cap and a wall-clock timeout, so that input
crafted to make a parser or a regular expression run away costs that child, never the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import select
import signal
import time
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from mini_kv.codec import optional
from mini_kv.load.schema import read_record
from mini_kv.proc import exit_text

STATIC_CHECK_SCHEMA_VERSION = 1
TIMEOUT_S = 10.0  # for every file of one candidate together
MEMORY_BYTES = 1 << 30  # the child's address space beyond what it inherits from the parent
MAX_FILE_BYTES = 1 << 20  # a larger source file is named, not read
_SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hxx")


@dataclass(frozen=True)
class Finding:
    """One rule that matched one file: kernelguard's pattern name, severity and evidence."""

    file: str
    pattern: str
    severity: str
    evidence: str


@dataclass(frozen=True)
class StaticCheck:
    """static_check.json of an attempt. `ran` False: why not (`reason`); else kernelguard's overall
    classification (`valid`, `hacked` or another of its own: the worst of the files) and every finding."""

    ran: bool
    tool: str
    reason: str | None = optional()
    classification: str | None = optional()
    findings: tuple[Finding, ...] = ()
    files: tuple[str, ...] = ()  # the files read
    skipped: tuple[str, ...] = ()  # source files too large to read
    schema_version: int = STATIC_CHECK_SCHEMA_VERSION

    def line(self) -> str | None:
        """The run's progress line where something matched (or the check could not run), else None."""
        if not self.ran:
            return f"static check ({self.tool}): not run: {self.reason}"
        if not self.findings:
            return None
        shown = "; ".join(f"{f.pattern} ({f.severity}) in {f.file}" for f in self.findings[:4])
        more = f"; {len(self.findings) - 4} more" if len(self.findings) > 4 else ""
        return f"static check ({self.tool}): {self.classification}: {shown}{more} (static_check.json)"


_ANSWERS: dict[str, dict] = {}  # kernelguard's answers by the sources' hash, in this process
_ANSWERS_KEPT = 256
_RANK = {"valid": 0, "hacked": 2}  # kernelguard's other classifications (configurable) rank between


@cache  # read from the installed package's metadata once, not for every attempt
def tool_name() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kernelguard {version('kernelguard')}"
    except PackageNotFoundError:
        return "kernelguard"


def read_static_check(attempt: Path | str) -> StaticCheck | None:
    """An attempt's static_check.json as its record, checked against its schema (a ConfigError naming the
    file and field where it does not pass); None where the attempt has none (written before the check)."""
    path = Path(attempt) / "static_check.json"
    if not path.is_file():
        return None
    return read_record(StaticCheck, json.loads(path.read_text()), "static_check", str(path))


def check_sources(sources: dict[str, str | bytes]) -> StaticCheck:
    """`sources` (path -> its text or bytes) read by kernelguard: the files with a source suffix, each
    up to MAX_FILE_BYTES."""
    tool = tool_name()
    try:
        import kernelguard  # noqa: F401 - imported here, before the fork, so that the child has it
    except ImportError as exc:
        return StaticCheck(False, tool, reason=f"kernelguard is not installed ({exc})")
    texts, skipped = {}, []
    for path, content in sorted(sources.items()):
        if not path.endswith(_SOURCE_SUFFIXES):
            continue
        data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        if len(data) > MAX_FILE_BYTES:
            skipped.append(path)
            continue
        texts[path] = data.decode("utf-8", "replace")
    if not texts:
        return StaticCheck(True, tool, classification="valid", skipped=tuple(skipped))
    # texts are in path order already (sorted above)
    key = hashlib.sha256(json.dumps([tool, list(texts.items())]).encode()).hexdigest()
    answer = _ANSWERS.get(key)
    why = ""
    if answer is None:
        answer, why = _in_child(texts)
        if answer is not None:  # the same sources again (a batch's duplicates, a re-run): read once
            if len(_ANSWERS) >= _ANSWERS_KEPT:
                _ANSWERS.clear()
            _ANSWERS[key] = answer
    if answer is None:
        return StaticCheck(False, tool, reason=why, files=tuple(texts), skipped=tuple(skipped))
    findings = tuple(
        Finding(path, str(m.get("pattern")), str(m.get("severity")), str(m.get("evidence"))[:500])
        for path, res in answer.items()
        for m in res["matched_patterns"]
    )
    worst = max((res["classification"] for res in answer.values()), key=lambda c: _RANK.get(c, 1))
    return StaticCheck(
        True, tool, classification=worst, findings=findings, files=tuple(texts), skipped=tuple(skipped)
    )


def _in_child(texts: dict[str, str]) -> tuple[dict | None, str]:
    """kernelguard's answer for each file, from a forked child (capped, timed out), or (None, why)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads: the child runs only this
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: analyse, answer in one JSON document, exit without the parent's cleanup
        code = 1
        try:
            os.close(read_end)
            # on top of the parent's address space, which it inherits (torch, a CUDA context: gigabytes)
            cap = _address_space() + MEMORY_BYTES
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            cpu = int(TIMEOUT_S) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            import kernelguard

            out = {}
            for path, text in texts.items():
                res = kernelguard.analyze_code(text, compute_structural_hash=False)
                out[path] = {
                    "classification": res.get("classification"),
                    "matched_patterns": res.get("matched_patterns") or [],
                }
            data = json.dumps(out).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        return _collect(pid, read_end)
    except BaseException:  # Ctrl-C, SIGTERM: the child ends with the run
        _end(pid)
        raise
    finally:
        os.close(read_end)


def _address_space() -> int:
    """This process's virtual memory size in bytes (/proc/self/statm's first field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _end(pid: int) -> None:
    """The child killed unless it has ended, and reaped (a pid already reaped is never signalled: it may
    be another process's by now)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _collect(pid: int, fd: int) -> tuple[dict | None, str]:
    chunks, deadline = [], time.monotonic() + TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            _end(pid)
            return None, f"kernelguard did not finish within {TIMEOUT_S:.0f} s"
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return None, f"kernelguard failed ({exit_text(os.waitstatus_to_exitcode(status))})"
    try:
        return json.loads(b"".join(chunks)), ""
    except ValueError:
        return None, "kernelguard's answer was not JSON"
