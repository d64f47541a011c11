"""What every command module shares: the consoles, the progress line, candidate selection and the
exit-code mapping of a command's errors. It imports no command module, so each of them can import it."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mini_kv.errors import ConfigError, ExitCode, UserError
from mini_kv.settings import DEFAULTS


def _width(stream) -> int | None:
    """COLUMNS when set (rich reads it), the terminal's width on a terminal, else wide: a CI log or file
    has no width of its own, and rich would otherwise fold the tables to 80 columns."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or stream.isatty():
        return None
    return 180


# what -v means on every command that has it (verify, bench, batch): one text, one behaviour
VERBOSE_HELP = (
    "every case, not only failures; every failure log and compiler error whole; the settings, the build "
    "and where the time went"
)

HEARTBEAT_S = 30.0  # seconds between "still running" lines of a long stage when stderr is not a terminal

console = Console(highlight=False, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=_width(sys.stderr))


def progress_line(line: str) -> None:
    """A finished case as one plain, flushed line on stderr when it is not a terminal (a CI log, a pipe):
    rich's live display shows nothing there, and a long run would otherwise be silent until its end."""
    if not err_console.is_terminal:
        print(line, file=sys.stderr, flush=True)


def selected_candidates(card, requested: list[str]) -> list:
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
    names = {f.name for f in dataclasses.fields(cls)} - set(given)
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given)


def artifacts_dir(args, root: Path | None = None) -> Path:
    """--artifacts, else the artifacts/ folder of `root` (default: the project around the working directory)."""
    if args.artifacts:
        return Path(args.artifacts)
    from mini_kv.load.task_card import find_project_root

    return (root or find_project_root(Path.cwd())) / "artifacts"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so that every stop path is the same: the
    running workers' trees killed, their jails' dirs removed, what was stored left whole."""


def _on_sigterm(signum, frame) -> None:
    # once: a second SIGTERM must not cut the clean-up short (SIGKILL still ends the process)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def console_entry(main) -> None:
    """A console script's entry: bytecode kept (pycache.redirect), SIGTERM stopping it as Ctrl-C does,
    `main()`, then the process ends without the interpreter's teardown."""
    from mini_kv.proc import exit_without_teardown
    from mini_kv.pycache import redirect

    redirect()  # before torch is imported: see pycache.py
    signal.signal(signal.SIGTERM, _on_sigterm)
    exit_without_teardown(main())


def run_command(func, args) -> int:
    """`func(args)` as an exit code: a UserError is one red line, a bug a traceback (exit INTERNAL)."""
    from mini_kv.store.signing import held_from_environment

    try:
        with held_from_environment():  # the signing key: for this process only, never its children
            return int(func(args))
    except UserError as exc:
        # the message quotes user text (ids, keys, file names): never read it as rich markup
        err_console.print(Text.assemble(("error:", "red"), " ", str(exc)), soft_wrap=True)
        return int(exc.exit_code)
    except KeyboardInterrupt as stop:
        return int(ExitCode.TERMINATED if isinstance(stop, Terminated) else ExitCode.INTERRUPTED)
    except Exception:  # noqa: BLE001 - a bug in mini_kv: say so, keep the traceback
        err_console.print("[red]internal error[/] (a bug in mini_kv; please report it):")
        traceback.print_exc(file=sys.stderr)
        return int(ExitCode.INTERNAL)


class BatchDisplay:
    """One live display on stderr for a whole batch (stdout stays clean for --json): a bar over the
    items, and while an item runs here, a row with its stage and case. Rich hides it when stderr is not
    a terminal; a finished item is then one plain line (progress_line)."""

    def __init__(self, total: int):
        from rich import progress as rp

        self.progress = rp.Progress(
            rp.SpinnerColumn(),
            rp.TextColumn("{task.description}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self.total = total
        self.bar = self.progress.add_task("batch", total=total) if total > 1 else None
        self.current = None
        # where rich shows nothing (stderr not a terminal): each stage as a plain line when it starts, and
        # a line every HEARTBEAT_S while it lasts, so a long build or timing is never silent
        self.stage: tuple[str, float, float] | None = None  # (text, started, last printed)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self) -> BatchDisplay:
        self.progress.__enter__()
        if not err_console.is_terminal:
            self._beat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.progress.__exit__(*exc)

    def _heartbeat(self) -> None:
        while not self._stop.wait(1.0):
            stage = self.stage
            now = time.monotonic()
            if stage is not None and now - stage[2] >= HEARTBEAT_S:
                self.stage = (stage[0], stage[1], now)
                progress_line(f"{stage[0]}: still running, {now - stage[1]:.0f} s so far")

    def row(self, label: str):
        """The pipeline's progress callback for an item running here."""
        self.current = self.progress.add_task(label, total=None)

        def update(msg: str, completed: int | None = None, total: int | None = None) -> None:
            self.progress.update(self.current, description=msg, completed=completed, total=total)
            text = f"{label}: {msg}"
            if total is None and (self.stage is None or self.stage[0] != text):  # a new stage, not a count
                now = time.monotonic()
                self.stage = (text, now, now)
                progress_line(text)

        return update

    def line(self, text: str) -> None:
        progress_line(text)

    def note(self, text: str) -> None:
        self.progress.console.print(text, markup=False, soft_wrap=True)

    def done(self, label: str, status: str, where: dict | None = None) -> None:
        self.stage = None
        if self.current is not None:
            self.progress.remove_task(self.current)
            self.current = None
        if self.bar is not None:
            self.progress.advance(self.bar)
        if self.total > 1:
            on = f" on {where['worker']}" if where else ""
            self.progress.console.print(f"{label}: {status}{on}", markup=False, soft_wrap=True)


def task_id_of(spec: str, flag: str) -> str:
    """A task id, or the id inside a task card (`tasks/x.yaml`) or SOL problem directory (its definition name)."""
    p = Path(spec)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            card = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(str(p), flag, f"unreadable task card ({exc})") from None
        if not isinstance(card, dict) or not isinstance(card.get("id"), str):
            raise ConfigError(str(p), f"{flag}: id", "a task card with a string `id`")
        return card["id"]
    if p.is_dir() and (p / "definition.json").is_file():
        try:
            name = json.loads((p / "definition.json").read_text()).get("name")
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(str(p / "definition.json"), flag, f"unreadable definition ({exc})") from None
        if not isinstance(name, str):
            raise ConfigError(str(p / "definition.json"), "name", "a string: the problem's name")
        from mini_kv.model import safe_name

        return safe_name(name)  # the task id `bench` stores a problem under
    return spec


def add_reference_argument(p) -> None:
    """--interleave-reference (verify and bench with several candidates or solutions, batch)."""
    p.add_argument(
        "--interleave-reference",
        action="store_true",
        default=DEFAULTS.interleave_reference,
        help="in a batch, time the reference beside every solution, interleaved, as a single run does, "
        "instead of once per case and device with a short drift re-check for the later solutions; also "
        "$MINI_KV_INTERLEAVE_REFERENCE=1 (docs/benchmarking.md)",
    )
