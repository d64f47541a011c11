"""solution.json: schema, sources (inline or beside the file, never outside its directory), entry point."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from mini_kv.errors import ConfigError
from mini_kv.load.files import file_refusal
from mini_kv.load.schema import validate
from mini_kv.model import CPP_LANGUAGES, PYTHON_LANGUAGES, Candidate, SourceFile
from mini_kv.solexec.jsonfile import read_json

CPP_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
CPP_ENTRY_SUFFIXES = (*CPP_SUFFIXES, ".h", ".hpp", ".cuh")


MAX_NAME_BYTES = 255  # one path component (NAME_MAX on Linux)


def _check_path(rel: str, where: str, file: str) -> str:
    """The normalized relative path of a source, or a ConfigError: it must name a file inside the
    solution's directory that every file system here can create."""
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise ConfigError(file, where, f"{rel!r} must be a relative path inside the solution's directory")
    if not pure.parts:
        raise ConfigError(file, where, f"{rel!r} names the solution's directory itself, not a file")
    for part in pure.parts:
        try:
            size = len(part.encode("utf-8"))
        except UnicodeEncodeError:
            raise ConfigError(file, where, f"{rel!r} is not valid UTF-8 text (a lone surrogate)") from None
        if size > MAX_NAME_BYTES or "\0" in part:
            raise ConfigError(
                file, where, f"{rel!r}: each part of the path must be 1 to {MAX_NAME_BYTES} bytes without NUL"
            )
    return str(pure)


def _check_text(value, where: str, file: str) -> None:
    """Every string of solution.json must be text that can be written out again (sources are staged as
    UTF-8 files, the attempt keeps a copy): JSON's `\\ud800` escapes decode to lone surrogates, which
    cannot. A ConfigError naming the field, not a crash halfway through a run."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{where} (a key)" if where else "(a key)", file)
            _check_text(item, f"{where}.{key}" if where else str(key), file)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]", file)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                file,
                where,
                f"not valid text: {value[exc.start]!r} at character {exc.start} is a lone surrogate, "
                "which no file can hold; write the character itself, or a pair of surrogates",
            ) from None


def _source(entry: dict, i: int, sol_dir: Path, file: str) -> SourceFile:
    rel = entry["path"]
    where = f"sources[{i}].path"
    norm = _check_path(rel, where, file)
    # upstream reads a source whose `content` is missing or empty from the file beside solution.json
    if entry.get("content"):
        return SourceFile(norm, entry["content"])
    target = (sol_dir / norm).resolve()
    if sol_dir not in target.parents:  # a symlink that leads out of the solution's directory
        raise ConfigError(
            file, where, f"{rel!r} resolves to {target}, outside the solution's directory {sol_dir}"
        )
    empty = "an empty `content`" if "content" in entry else "no `content`"
    try:
        why = file_refusal(sol_dir / norm) or file_refusal(target)
        if why is not None:
            raise ConfigError(file, where, f"{rel!r} {why}")
        return SourceFile(norm, target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            file, where, f"{empty} given and no file {rel!r} beside solution.json (looked for {target})"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = (
            "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or type(exc).__name__)
        )
        raise ConfigError(file, where, f"{empty} given and the file {target} is unreadable ({why})") from None


def _check_layout(sources: list[SourceFile], file: str) -> None:
    """No source twice, and no source that is also another source's directory (`a` and `a/b.py`)."""
    seen: dict[str, int] = {}
    for i, s in enumerate(sources):
        if s.path in seen:
            raise ConfigError(
                file, f"sources[{i}].path", f"duplicate source {s.path!r} (also sources[{seen[s.path]}])"
            )
        seen[s.path] = i
    for i, s in enumerate(sources):
        for parent in PurePosixPath(s.path).parents:
            if str(parent) in seen:
                raise ConfigError(
                    file,
                    f"sources[{i}].path",
                    f"{s.path!r} puts a file inside "
                    f"sources[{seen[str(parent)]}] {str(parent)!r}, which is a file",
                )


def _check_languages(languages: list[str], entry_file: str, file: str) -> None:
    py = [lang for lang in languages if lang in PYTHON_LANGUAGES]
    cpp = [lang for lang in languages if lang in CPP_LANGUAGES]
    if py and cpp:
        raise ConfigError(
            file, "spec.languages", f"Python languages {py} and C++ languages {cpp} cannot be mixed"
        )
    suffix = PurePosixPath(entry_file).suffix
    if py and suffix != ".py":
        raise ConfigError(
            file, "spec.entry_point", f"Python languages need a .py entry file, got {entry_file!r}"
        )
    if cpp and suffix not in CPP_ENTRY_SUFFIXES:
        raise ConfigError(
            file,
            "spec.entry_point",
            f"C++ languages need a C++/CUDA entry file ({', '.join(CPP_ENTRY_SUFFIXES)}), got {entry_file!r}",
        )


def load_solution(path: str | Path, definition_name: str | None = None) -> Candidate:
    """The solution as the shared Candidate: its build spec (languages, sources, flags) and entry point."""
    path = Path(path)
    file = str(path)
    why = file_refusal(path) if path.exists() else None
    if why is not None:
        raise ConfigError(file, "", f"solution.json {why}")
    raw = read_json(path)
    _check_text(raw, "", file)
    validate(raw, "sol_solution", file)
    spec = raw["spec"]
    if definition_name is not None and raw["definition"] != definition_name:
        raise ConfigError(
            file, "definition", f"{raw['definition']!r} is not the problem's definition {definition_name!r}"
        )
    sol_dir = path.parent.resolve()
    sources = [_source(e, i, sol_dir, file) for i, e in enumerate(raw["sources"])]
    _check_layout(sources, file)
    entry_file, _, entry_function = spec["entry_point"].rpartition("::")
    if str(PurePosixPath(entry_file)) not in {s.path for s in sources}:
        raise ConfigError(
            file,
            "spec.entry_point",
            f"entry file {entry_file!r} is not among the sources ({', '.join(s.path for s in sources)})",
        )
    _check_languages(spec["languages"], entry_file, file)
    opts = spec.get("compile_options") or {}
    compiled = [s.path for s in sources if PurePosixPath(s.path).suffix in CPP_SUFFIXES]
    return Candidate(
        id=raw["name"],
        path=file,
        op=spec["entry_point"],
        cpu_sources=tuple(p for p in compiled if not p.endswith(".cu")),
        cuda_sources=tuple(p for p in compiled if p.endswith(".cu")),
        cflags=tuple(opts.get("cflags", [])),
        cuda_cflags=tuple(opts.get("cuda_cflags", [])),
        ldflags=tuple(opts.get("ld_flags", [])),
        languages=tuple(spec["languages"]),
        dependencies=tuple(spec.get("dependencies", [])),
        dps=spec.get("destination_passing_style", True),
        sources=tuple(sources),
        raw=raw,
    )
