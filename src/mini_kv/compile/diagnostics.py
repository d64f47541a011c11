"""A compiler's diagnostics in a build's output: the first error on a source line, as the report shows it
and as the compiler tells a failure on the sources from one of the machine's (compiler.failed_alike)."""

from __future__ import annotations

import re

# gcc/clang `file:line:col: error: msg` (also `fatal error:`), nvcc `file(line): error: msg` (also its
# front end's `catastrophic error:`)
COMPILER_ERROR = re.compile(
    r"^(?P<loc>[^\s:()]+(?::\d+(?::\d+)?|\(\d+\))):\s*(?:(?:fatal|catastrophic)\s+)?error\b:?\s*(?P<msg>.*)$"
)


def first_compiler_error(text: str) -> tuple[str, list[str]] | None:
    """(`file:line`, the error line and the compiler's context lines after it) of the first error."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        m = COMPILER_ERROR.match(ln.strip())
        if m:
            context = []
            for nxt in lines[i + 1 : i + 4]:  # the source line and the caret, as the compiler prints them
                if COMPILER_ERROR.match(nxt.strip()) or not nxt.startswith(" "):
                    break
                context.append(nxt)
            return m.group("loc"), [ln.strip(), *context]
    return None
