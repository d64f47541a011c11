"""Allow-list for compile and link flags that come from a task card or a submitted solution.

torch's extension builder writes the flags into `build.ninja`, and ninja runs every build line
through `/bin/sh -c`: a flag such as ``-DX=1; touch /tmp/p #`` or ``-DX=`id` `` would run a command
on the verifying machine. Quoting is not enough (nvcc and ninja each re-split the line), so a flag
from outside the trust boundary must be one whole token from a small grammar of compiler options,
made only of characters no shell or ninja treats specially. Anything else is refused by name.

Options that make the compiler load or write arbitrary files (``-fplugin``, ``-fprofile-*``,
``-Xlinker``, ``-Wl,-rpath``, ``-o``, ``--keep-dir``, ...) are refused too; an include or library
dir must lie inside the sources' own directory, and no symlink under a candidate's directory may
lead out of the project (`links_leaving`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# no whitespace, quotes, `$`, backquote, `;&|<>()*?[]{}~#!\` and no NUL: safe for sh and ninja alike
_SAFE = re.compile(r"[A-Za-z0-9_.,+=:/@%-]+")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VALUE = r"[A-Za-z0-9_.+-]*"

# one-token compile options, for gcc/clang (cflags) and nvcc (cuda_cflags) alike
_COMPILE_PATTERNS = tuple(
    re.compile(p)
    for p in (
        rf"-D{_NAME}(={_VALUE})?",
        rf"-U{_NAME}",
        r"-O[0-3sgz]?|-Ofast",
        r"-g[0-3]?|-G|-lineinfo|--generate-line-info|-w|-pedantic|-pthread|-DNDEBUG",
        r"-std=(c|gnu)\+\+(11|14|17|20|23|2a|2b|2c|26|1z)",
        r"-W(no-)?(error=)?[A-Za-z0-9_+=-]+",  # warnings; no comma: -Wl,/-Wp,/-Wa, pass options on
        r"-f(no-)?[a-z0-9+-]+(=[A-Za-z0-9_.+-]+)?",  # value without `/`: nothing outside the build dir
        r"-m(no-)?[a-z0-9.+-]+(=[A-Za-z0-9_.+-]+)?",
        r"-{1,2}use_fast_math|--expt-relaxed-constexpr|--expt-extended-lambda|--extended-lambda",
        r"-{1,2}(ftz|prec-div|prec-sqrt|fmad|restrict|relocatable-device-code|rdc)(=(true|false))?",
        r"-{1,2}(maxrregcount|threads|t)=[0-9]+",
        r"-{1,2}(default-stream)=(legacy|per-thread|null)",
        r"-{1,2}(diag-suppress|diag_suppress|diag-warn|diag-error)=[A-Za-z0-9_,-]+",
        r"--resource-usage|--display-error-number|-Xptxas=-v|--ptxas-options=-v",
        r"-arch=(sm|compute|native|all|all-major)(_[0-9]+[af]?)?",
        r"-code=(sm|compute)_[0-9]+[af]?(,(sm|compute)_[0-9]+[af]?)*",
        r"-{1,2}gencode=arch=compute_[0-9]+[af]?,code=\[?(sm|compute)_[0-9]+[af]?(,(sm|compute)_[0-9]+[af]?)*\]?",
    )
)
# options that write or load files of the attacker's choosing, or hand options to another tool
_COMPILE_DENY = re.compile(
    r"-f(no-)?(plugin|profile|auto-profile|dump|save|coverage|opt-info|record|"
    r"stack-usage|callgraph-info|debug-prefix-map|file-prefix-map|macro-prefix-map|"
    r"spec|diagnostics-format|lto)|-Werror=.*/"
)
_LINK_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"-l:?[A-Za-z0-9_.+-]+",
        r"-pthread|-s|-O[0-3]|-static-libstdc\+\+|-static-libgcc|-shared",
    )
)
# -Wl, items a solution may pass to the linker (no -rpath, --script, --wrap, --plugin, ...)
_LINKER_ITEMS = {
    "--exclude-libs",
    "ALL",
    "--as-needed",
    "--no-as-needed",
    "--gc-sections",
    "--no-gc-sections",
    "-O1",
    "-O2",
    "--strip-all",
    "--strip-debug",
    "-s",
    "--no-undefined",
    "-z",
    "now",
    "relro",
    "defs",
    "noexecstack",
    "--hash-style=gnu",
    "--build-id",
    "--start-group",
    "--end-group",
}
_LIB_NAME = re.compile(r"lib[A-Za-z0-9_.+-]+\.(a|so)(\.[0-9]+)*")


class UnsafeFlag(ValueError):
    """A flag outside the allow-list; the message names it and says why."""

    def __init__(self, field: str, flag: str, why: str):
        self.field, self.flag, self.why = field, flag, why
        super().__init__(f"{field}: flag {flag!r} refused: {why}")


@dataclass(frozen=True)
class FlagRules:
    """`inside`: the directory -I/-L paths must stay in (the candidate's or the staged solution's)."""

    inside: Path


def _inside(path: str, rules: FlagRules) -> bool:
    base = rules.inside.resolve()
    resolved = (base / path).resolve()  # an absolute `path` replaces `base`
    return resolved == base or base in resolved.parents


def _why_compile(flag: str, rules: FlagRules) -> str | None:
    if flag.startswith(("-I", "-isystem")):
        path = flag[2:] if flag.startswith("-I") else flag[len("-isystem") :]
        if not path:
            return "give the include dir in the same token (-Idir)"
        return None if _inside(path, rules) else f"include dir outside {rules.inside}"
    if flag.startswith("-Xcompiler=") or flag.startswith("--compiler-options="):
        for item in flag.split("=", 1)[1].split(","):
            why = _why_compile(item, rules)
            if why is not None:
                return f"host-compiler option {item!r}: {why}"
        return None
    if _COMPILE_DENY.match(flag):
        return "this option makes the compiler read or write files of the flag's choosing"
    if any(p.fullmatch(flag) for p in _COMPILE_PATTERNS):
        return None
    return (
        "not an allowed compile option (allowed: -D/-U with a plain name and value, -O, -g, -std=, -W..., "
        "-f..., -m..., -I inside the sources' dir, -arch=/-gencode=, nvcc's --use_fast_math and kin)"
    )


def _why_link(flag: str, rules: FlagRules) -> str | None:
    if flag.startswith("-L"):
        return None if flag[2:] and _inside(flag[2:], rules) else f"library dir outside {rules.inside}"
    if flag.startswith("-Wl,"):
        items = flag[len("-Wl,") :].split(",")
        for i, item in enumerate(items):
            after_exclude = i > 0 and items[i - 1] == "--exclude-libs" and _LIB_NAME.fullmatch(item)
            if item not in _LINKER_ITEMS and not after_exclude:
                return f"linker option {item!r} is not allowed (allowed: {', '.join(sorted(_LINKER_ITEMS))})"
        return None
    if any(p.fullmatch(flag) for p in _LINK_PATTERNS):
        return None
    return "not an allowed link option (allowed: -l<name>, -L inside the sources' dir, -Wl,<safe subset>, -pthread)"


def why_refused(flag: object, kind: str, rules: FlagRules) -> str | None:
    """None when `flag` may go to the compiler (`kind` "compile") or linker (`kind` "link"), else why not."""
    if not isinstance(flag, str):
        return f"a flag is a string, not {type(flag).__name__}"
    if not _SAFE.fullmatch(flag):
        bad = sorted({c for c in flag if not _SAFE.fullmatch(c)})
        return (
            "contains " + " ".join(repr(c) for c in bad) + ": build lines run through a shell, "
            "so a flag is one token of letters, digits and _.,+=:/@%-"
        )
    if not flag.startswith("-"):
        return "not an option (does not start with '-')"
    return _why_compile(flag, rules) if kind == "compile" else _why_link(flag, rules)


def check_flags(groups: dict[str, tuple[str, ...] | list[str]], rules: FlagRules) -> None:
    """Raise UnsafeFlag for the first refused flag. `groups`: field name -> flags; a field whose
    name contains "ld" holds link flags."""
    for field, flags in groups.items():
        kind = "link" if "ld" in field.rsplit(".", 1)[-1] else "compile"
        for i, flag in enumerate(flags):
            why = why_refused(flag, kind, rules)
            if why is not None:
                raise UnsafeFlag(f"{field}[{i}]", flag if isinstance(flag, str) else repr(flag), why)
