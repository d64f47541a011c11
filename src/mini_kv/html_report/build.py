"""`mini-kv report`: select attempts, read them once, draw the charts, write one HTML file (and PNGs)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.errors import ConfigError, UserError
from mini_kv.html_report import page as pg
from mini_kv.html_report.collect import ProfilePair, SkippedAttempt, Store, load_store
from mini_kv.profile.store import PROFILES_DIR
from mini_kv.status import ProfileStatus

if TYPE_CHECKING:
    from mini_kv.leaderboard import Group
    from mini_kv.store.index import StoreProblem


@dataclass(frozen=True)
class ReportOptions:
    artifacts: Path
    output: Path
    tasks: tuple[str, ...] = ()
    attempts: tuple[Path, ...] = ()
    png_dir: Path | None = None


@dataclass
class ReportResult:
    output: Path
    size: int
    attempts: int
    charts: int
    skipped: list[SkippedAttempt] = field(default_factory=list)
    pngs: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(
            "mini-kv report draws its charts with matplotlib, which is not installed: "
            "`python -m pip install matplotlib` (or install mini-kv again)"
        ) from None


def _select(store: Store, wanted: tuple[str, ...], artifacts: Path) -> Store:
    """Only the wanted tasks; exit 2 listing what exists when one of them has no attempt."""
    if not wanted:
        return store
    known = store.tasks()
    missing = [t for t in wanted if t not in known]
    if missing:
        raise ConfigError(
            str(artifacts),
            "--task/--problem",
            f"no readable attempt of {', '.join(map(repr, missing))}; tasks and problems with "
            f"attempts here: {', '.join(known) or 'none'}",
        )
    keep = set(wanted)
    return Store(
        store.artifacts,
        [a for a in store.attempts if a.task_id in keep],
        [s for s in store.skipped if Path(s.path).parent.name in keep],
    )


def _board(artifacts: Path, tasks: list[str]) -> tuple[list[Group], list[StoreProblem], str | None]:
    """The leaderboard exactly as `mini-kv leaderboard` computes it, one task at a time: its groups, its
    problems, and why there is none (or None)."""
    from mini_kv.leaderboard import build_leaderboard

    groups: list[Group] = []
    problems: list[StoreProblem] = []
    try:
        for t in tasks:
            board = build_leaderboard(artifacts, task=t)
            groups.extend(board.groups)
            problems.extend(board.problems)
    except (UserError, OSError) as exc:  # e.g. a read-only store without an index: the rest still builds
        return [], [], str(exc)
    return groups, problems, None


def _profiles(artifacts: Path, tasks: set[str]) -> tuple[list[ProfilePair], list[SkippedAttempt]]:
    """Comparisons of the verified profiles of each (task, case): the first candidate against each other."""
    from mini_kv.profile.compare import ident, metric_rows, refusals
    from mini_kv.profile.store import ProfileUnusable, read_profile

    root = artifacts / PROFILES_DIR
    docs, skipped = [], []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not d.is_dir():
            continue
        try:
            doc = read_profile(d)
        except (ProfileUnusable, OSError) as exc:
            skipped.append(SkippedAttempt(str(d), getattr(exc, "message", str(exc))))
            continue
        if doc.status == ProfileStatus.OK and doc.task.id in tasks:
            docs.append(doc)
    by_case: dict[tuple, list] = {}
    for doc in docs:
        by_case.setdefault((doc.task.id, doc.case.id), []).append(doc)
    out = []
    for _, group in sorted(by_case.items()):
        group.sort(key=lambda d: (d.candidate.id, d.created_at))
        a = group[0]
        for b in group[1:]:
            why = refusals(a, b)
            refused = "; ".join(f"{r.code} ({r.message})" for r in why)
            out.append(ProfilePair(ident(a), ident(b), refused, () if why else metric_rows(a, b)))
    return out, skipped


def _write(path: Path, data: bytes, flag: str) -> Path:
    """Atomically, readable as the umask allows: the atomic writer makes private (0600) files, and a report
    is made to be shared."""
    from mini_kv.store.atomic import write_bytes

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, data)
        umask = os.umask(0)
        os.umask(umask)
        path.chmod(0o666 & ~umask)
    except OSError as exc:
        raise ConfigError(str(path), flag, f"cannot write the report here ({exc.strerror or exc})") from None
    return path


def build_report(opts: ReportOptions) -> ReportResult:
    _need_matplotlib()
    from mini_kv.html_report.charts import style

    with style():
        return _build(opts)


def _load(artifacts: Path, attempts: tuple[Path, ...]) -> Store:
    """The store's attempts (or the `attempts` named); ConfigError when there is nothing to report."""
    if not attempts and not artifacts.is_dir():
        raise ConfigError(
            str(artifacts),
            "--artifacts",
            "no artifact store here (no such directory); run "
            "`mini-kv verify` or `mini-kv bench` first, or pass --artifacts DIR",
        )
    store = load_store(artifacts, list(attempts) or None)
    if not store.attempts and not store.skipped:
        raise ConfigError(
            str(artifacts),
            "--artifacts",
            "the store holds no attempt yet; run `mini-kv verify` or `mini-kv bench` first",
        )
    return store


def _build(opts: ReportOptions) -> ReportResult:
    t0 = time.perf_counter()
    artifacts = Path(opts.artifacts)
    store = _select(_load(artifacts, opts.attempts), opts.tasks, artifacts)
    tasks = store.tasks()
    out = Path(opts.output)
    links = pg.Links(out.parent)
    png = opts.png_dir is not None
    selected_ids = {a.attempt_id for a in store.attempts} if opts.attempts else None
    groups, problems, board_error = _board(artifacts, tasks) if tasks else ([], [], None)
    comparisons, prof_skipped = _profiles(artifacts, set(tasks))
    skipped = list(store.skipped) + prof_skipped
    listed = {s.path for s in skipped}
    # the leaderboard's own refusals (tampered after indexing, ...)
    for p in problems:
        if p.path not in listed and Path(p.path).parent.name in set(tasks):
            skipped.append(SkippedAttempt(p.path, p.message))
            listed.add(p.path)

    title = "mini_kv report: " + (", ".join(tasks) if tasks else "no readable attempt")
    page = pg.Page(title)
    by_task = {t: [a for a in store.attempts if a.task_id == t] for t in tasks}

    def per_task(fn) -> list[pg.Block]:
        blocks = [pg.Block("task", t, children=tuple(fn(t, by_task[t]))) for t in tasks]
        return blocks or [pg.note("no readable attempt.")]

    page.sections += [
        (
            "leaderboard",
            "Leaderboard",
            pg.leaderboard_section(groups, board_error, store, links, selected_ids),
        ),
        ("attempts", "Attempts", pg.attempts_section(store, links)),
        ("latency", "Latency distributions", per_task(lambda t, a: pg.latency_section(page, a, png))),
        ("roofline", "Roofline", per_task(lambda t, a: pg.roofline_section(page, a, png))),
        ("correctness", "Correctness", per_task(lambda t, a: pg.correctness_section(page, t, a, png, links))),
        ("history", "History", per_task(lambda t, a: pg.history_section(page, a, png))),
        ("profiles", "Nsight Compute profiles", pg.profiles_section(comparisons)),
        ("environment", "Environment", pg.environment_section(store.attempts)),
        ("skipped", f"Skipped ({len(skipped)})", pg.skipped_section(skipped)),
        ("about", "About this report", pg.footer(store, pg.now())),
    ]

    data = page.html().encode("utf-8")
    _write(out, data, "-o")
    pngs = []
    for c in page.charts if opts.png_dir is not None else []:
        if c.png is not None:
            pngs.append(_write(opts.png_dir / f"{c.chart_id}.png", c.png, "--png"))
    return ReportResult(
        out, len(data), len(store.attempts), len(page.charts), skipped, pngs, time.perf_counter() - t0
    )
