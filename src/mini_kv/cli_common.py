"""What every command module shares: the consoles, the progress line, candidate selection and the
exit-code mapping of a command's errors. It imports no command module, so each of them can import it."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mini_kv.errors import ConfigError, ExitCode, UserError


def _width(stream) -> int | None:
    """COLUMNS when set (rich reads it), the terminal's width on a terminal, else wide: a CI log or file
    has no width of its own, and rich would otherwise fold the tables to 80 columns."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or stream.isatty():
        return None
    return 180


console = Console(highlight=False, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def progress_line(line: str) -> None:
    """A finished case as one plain, flushed line on stderr when it is not a terminal (a CI log, a pipe):
    rich's live display shows nothing there, and a long run would otherwise be silent until its end."""
    if not err_console.is_terminal:
        print(line, file=sys.stderr, flush=True)


def selected_candidates(card, requested: list[str]) -> list:
    import fnmatch

    if not requested:
        return [card.candidate(card.default_candidate)]
    out = []
    for pattern in requested:
        matched = [c for c in card.candidates if fnmatch.fnmatchcase(c.id, pattern)]
        if not matched:
            raise ConfigError(
                card.path,
                "candidates",
                f"no candidate matches {pattern!r}; known: " + ", ".join(c.id for c in card.candidates),
            )
        out.extend(c for c in matched if c not in out)
    return out


def options_from(cls, args, **given):
    """The options dataclass `cls` from the parsed `args` of the same names, `given` for the others."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)} - set(given)
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given)


def artifacts_dir(args, root: Path | None = None) -> Path:
    """--artifacts, else the artifacts/ folder of `root` (default: the project around the working directory)."""
    if args.artifacts:
        return Path(args.artifacts)
    from mini_kv.load.task_card import find_project_root

    return (root or find_project_root(Path.cwd())) / "artifacts"


def run_command(func, args) -> int:
    """`func(args)` as an exit code: a UserError is one red line, a bug a traceback (exit INTERNAL)."""
    try:
        return int(func(args))
    except UserError as exc:
        # the message quotes user text (ids, keys, file names): never read it as rich markup
        err_console.print(Text.assemble(("error:", "red"), " ", str(exc)), soft_wrap=True)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - a bug in mini_kv: say so, keep the traceback
        err_console.print("[red]internal error[/] (a bug in mini_kv; please report it):")
        traceback.print_exc(file=sys.stderr)
        return int(ExitCode.INTERNAL)
