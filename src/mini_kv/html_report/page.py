"""The report page: what each section shows, as blocks (headings, notes, tables, charts) that the Jinja2
template `templates/report.html.j2` lays out into one self-contained HTML file.

The template autoescapes, so every string from the store is escaped there; only the charts' SVG and the
links and badges built here (`Markup`, with their parts escaped) are inserted as they are. Links are
relative to the HTML file's folder.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2
from markupsafe import Markup

from mini_kv.html_report import charts
from mini_kv.html_report.collect import Attempt, ProfilePair, SkippedAttempt, Store
from mini_kv.status import Status
from mini_kv.store.records import BenchCase
from mini_kv.tables import num

if TYPE_CHECKING:
    from mini_kv.leaderboard import Group


@dataclass(frozen=True)
class Cell:
    """A table cell with a class: `num` (right-aligned) or a status colour (charts.status_class)."""

    text: object
    cls: str


@dataclass(frozen=True)
class Block:
    """One piece of a section: kind h3, h4, note, warn, p, chart (text: the Chart), table (text: its
    class), details (text: the summary) or task (text: the task's name)."""

    kind: str
    text: object = ""
    headers: tuple = ()
    rows: tuple = ()
    children: tuple = ()


def note(text) -> Block:
    return Block("note", text)


def table(cls: str, headers: str | list[str], rows: list[list]) -> Block:
    """`headers`: a list, or one line "a | b | c"; a row's cells are strings, Markup or Cells."""
    heads = headers.split(" | ") if isinstance(headers, str) else headers
    return Block("table", cls, tuple(heads), tuple(tuple(r) for r in rows))


def n(text) -> Cell:
    return Cell(text, "num")


def status_cell(status: str) -> Cell:
    return Cell(status, charts.status_class(status))


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("mini_kv.html_report", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)
_ENV.tests["cell"] = lambda x: isinstance(x, Cell)


@dataclass
class Page:
    """Sections in order, each (anchor id, title, blocks), and the charts they hold."""

    title: str
    sections: list[tuple[str, str, list[Block]]] = field(default_factory=list)
    charts: list[charts.Chart] = field(default_factory=list)

    def add_chart(self, chart: charts.Chart) -> Block:
        taken = {c.chart_id for c in self.charts}
        i = 1
        while chart.chart_id in taken:  # two groups can slug alike: ids (and PNG names) stay unique
            chart = charts.Chart(f"{chart.chart_id.rsplit('~', 1)[0]}~{i}", chart.title, chart.svg, chart.png)
            i += 1
        self.charts.append(chart)
        return Block("chart", chart)

    def html(self) -> str:
        sections = [{"id": sid, "title": title, "blocks": blocks} for sid, title, blocks in self.sections]
        return _ENV.get_template("report.html.j2").render(title=self.title, sections=sections)


def us(x: float | None) -> str:
    """Microseconds for a table: no exponent notation, three significant digits at least."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 1000 else (f"{x:.1f}" if x >= 10 else f"{x:.3g}")


def slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts)).strip("_")[:120]


class Links:
    """Relative links from the HTML file's folder to attempt files."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir.resolve()

    def to(self, path: Path, text: str) -> Markup:
        rel = os.path.relpath(Path(path).resolve(), self.out_dir)
        return Markup('<a href="{}">{}</a>').format(Path(rel).as_posix(), text)

    def files(self, a: Attempt) -> Markup:
        # top-level files one by one; sources/ and logs/ as directories
        shown = dict.fromkeys(f for f in ("attempt.json", *a.files) if "/" not in f)
        dirs = sorted({f.split("/")[0] for f in a.files if "/" in f})
        links = [self.to(a.path / f, f) for f in shown] + [self.to(a.path / d, d + "/") for d in dirs]
        return Markup('<span class="files">{}</span>').format(Markup(" ").join(links))


def below(*parts) -> Markup:
    """Parts one under the other in a cell."""
    return Markup("<br>").join(parts)


# ------------------------------------------------------------------------------------------ sections


def latest_per_candidate(attempts: list[Attempt]) -> list[Attempt]:
    latest: dict[str, Attempt] = {}
    for a in sorted(attempts, key=lambda a: (a.created_at, a.attempt_id)):
        latest[a.candidate] = a
    return [latest[k] for k in sorted(latest)]


def groups(attempts: list[Attempt]) -> dict[tuple, list[Attempt]]:
    out: dict[tuple, list[Attempt]] = {}
    for a in attempts:
        out.setdefault(a.group, []).append(a)
    return dict(sorted(out.items()))


def group_title(g: tuple) -> str:
    task, suite, env, device = g
    return f"{task} — device {device}, environment {env}, suite {suite[:12]}"


def leaderboard_section(
    groups: list[Group], error: str | None, store: Store, links: Links, selected_ids: set[str] | None
) -> list[Block]:
    out = [
        note(
            Markup(
                "The latest complete, correct (PASSED) and stable attempt of each candidate, ranked by "
                "geometric-mean speedup over the reference, grouped by task, suite, environment and device "
                "exactly as <code>mini-kv leaderboard</code> groups them."
            )
        )
    ]
    if error:
        return [*out, Block("warn", f"leaderboard unavailable: {error}")]
    by_id = {a.attempt_id: a for a in store.attempts}
    shown = 0
    for g in groups:
        entries = [e for e in g.entries if selected_ids is None or e.attempt_id in selected_ids]
        if not entries:
            continue
        shown += 1
        out.append(Block("h3", group_title((g.task_id, g.suite_hash, g.environment_key, g.device))))
        rows = []
        for e in entries:
            a = by_id.get(e.attempt_id)
            cases = ", ".join(f"{k} {v:.3f}×" for k, v in sorted(e.cases.items()))
            where = links.to(store.artifacts / e.path, e.attempt_id)
            rows.append(
                [
                    n(e.rank),
                    e.candidate,
                    n(f"{num(e.geomean_speedup, '.3f')}×"),
                    cases,
                    e.regression or "-",
                    e.source,
                    below(where, links.files(a)) if a else where,
                    e.created_at,
                ]
            )
        out.append(
            table(
                "leaderboard",
                "rank | candidate | geomean speedup | per case | regression | commit | attempt / files | created",
                rows,
            )
        )
    if not shown:
        out.append(
            Block(
                "warn",
                "no attempt of the selection qualifies (none is PASSED and stable); every attempt is "
                "listed under Attempts.",
            )
        )
    return out


def attempts_section(store: Store, links: Links) -> list[Block]:
    rows = [
        [
            a.task_id,
            a.candidate,
            status_cell(a.status),
            "yes" if a.stable else (Cell("no", "fail") if a.stable is False else "-"),
            n(num(a.geomean, ".3f")),
            a.regression.verdict if a.regression else "-",
            a.device,
            a.environment_key,
            a.source,
            a.created_at,
            below(links.to(a.path, a.attempt_id), links.files(a)),
        ]
        for a in sorted(store.attempts, key=lambda a: (a.task_id, a.candidate, a.created_at))
    ]
    return [
        table(
            "attempts",
            "task | candidate | status | stable | geomean speedup"
            " | regression | device | environment | commit | created | attempt / files",
            rows,
        )
    ]


def _side_cells(c: BenchCase) -> list[Cell]:
    cs, rs = c.candidate, c.reference
    count = f"{len(cs.samples)}/{len(rs.samples) if rs else 0}" if cs else "-"
    return [
        n(us(cs.p50 if cs else None)),
        n(us(cs.p95 if cs else None)),
        n(us(rs.p50 if rs else None)),
        n(us(rs.p95 if rs else None)),
        n(num(c.speedup, ".3f")),
        n(num(cs.cv * 100 if cs and cs.cv is not None else None, ".1f")),
        n(count),
    ]


def _latency_rows(a: Attempt, i: int, cid: str, rows: list, rows_chart: list) -> None:
    for c in a.bench:
        if c.id != cid:
            continue
        if c.candidate is None:
            rows.append(
                [
                    a.candidate,
                    status_cell(c.status or Status.BENCHMARK_ERROR),
                    *["-"] * 8,
                    Cell(c.reason or "no timing", "fail"),
                ]
            )
            continue
        word = "-" if c.stable is None else "yes" if c.stable else f"UNSTABLE: {c.unstable_why}"
        if c.throttled:  # its times read slow: the GPU held its clock back while it was timed
            word += f"; GPU throttled ({c.throttled})"
        stable = Cell(word, "fail") if c.stable is False or c.throttled else word
        rows_chart.append((a.candidate, i, c))
        rows.append(
            [a.candidate, f"{c.method or '-'} / {c.timer or '-'}", c.l2 or "-", *_side_cells(c), stable]
        )


def latency_section(page: Page, attempts: list[Attempt], png: bool) -> list[Block]:
    out = []
    for g, members in groups(attempts).items():
        latest = latest_per_candidate(members)
        case_ids = list(dict.fromkeys(c.id for a in latest for c in a.bench))
        if not case_ids:
            continue
        out.append(Block("h4", group_title(g)))
        for cid in case_ids:
            rows_chart, rows = [], []
            for i, a in enumerate(latest):
                _latency_rows(a, i, cid, rows, rows_chart)
            if rows_chart:
                chart = charts.latency(slug("latency", *g[:1], g[3], g[2], cid), cid, rows_chart, png)
                out.append(page.add_chart(chart))
            out.append(
                table(
                    "latency",
                    "candidate | method / timer | L2 | P50 µs | P95 µs"
                    " | ref P50 µs | ref P95 µs | speedup | CV % | samples cand/ref | stable",
                    rows,
                )
            )
    return out or [note("no bench case was timed (benchmark skipped or failed).")]


def _copy_ceiling(latest: list[Attempt]) -> float | None:
    """The memory ceiling: the peak bandwidth a bench case recorded, else the environment's copy bandwidth."""
    return next((c.peak_bw for a in latest for c in a.bench if c.peak_bw), None) or next(
        (a.environment.get("copy_bandwidth_Bps") for a in latest if a.environment.get("copy_bandwidth_Bps")),
        None,
    )


def _roofline_row(a: Attempt, c: BenchCase, ceiling: float | None) -> list:
    share = c.gbps * 1e9 / ceiling if c.gbps and ceiling else None
    return [
        c.id,
        a.candidate,
        n(num(c.bytes, ",.0f", "not recorded")),
        n(num(c.flops, ",.0f", "not recorded")),
        n(us(c.candidate.p50)),
        n(num(c.gbps, ",.1f", "not recorded")),
        n(num(share * 100 if share else None, ".0f", "not recorded")),
        n(num(c.tflops * 1e3 if c.tflops is not None else None, ",.2f", "not recorded")),
    ]


def _roofline_group(page: Page, g: tuple, latest: list[Attempt], png: bool) -> list[Block]:
    """One group's bandwidth and roofline charts and table; empty when no case of it was timed."""
    timed = [(i, a, c) for i, a in enumerate(latest) for c in a.bench if c.candidate is not None]
    if not timed:
        return []
    ceiling = _copy_ceiling(latest)
    bw_pts = [(a.candidate, i, c.id, c.gbps) for i, a, c in timed if c.gbps is not None]
    roof_pts = [
        (a.candidate, i, c.id, c.flops / c.bytes, c.tflops * 1e3)
        for i, a, c in timed
        if c.flops and c.bytes and c.tflops is not None
    ]
    bw = f"{ceiling / 1e9:,.1f} GB/s" if ceiling else "not recorded"
    out = [
        Block("h4", group_title(g)),
        note(
            f"memory ceiling: measured copy bandwidth {bw}; compute peak: not recorded (no attempt stores "
            "one). Bytes and FLOPs come from the task card's expressions as benchmark.json recorded them."
        ),
    ]
    for kind, pts, draw, title in (
        ("bandwidth", bw_pts, charts.bandwidth, "achieved bandwidth"),
        ("roofline", roof_pts, charts.roofline, "roofline"),
    ):
        if pts:
            out.append(
                page.add_chart(draw(slug(kind, g[0], g[3], g[2]), f"{g[0]}: {title}", pts, ceiling, png))
            )
    out.append(
        table(
            "roofline",
            ["case", "candidate", "bytes", "FLOPs", "P50 µs", "GB/s", "% of copy BW", "GFLOP/s"],
            [_roofline_row(a, c, ceiling) for _, a, c in timed],
        )
    )
    return out


def roofline_section(page: Page, attempts: list[Attempt], png: bool) -> list[Block]:
    out = [
        b
        for g, ms in groups(attempts).items()
        for b in _roofline_group(page, g, latest_per_candidate(ms), png)
    ]
    return out or [note("no timed case: bytes, FLOPs and bandwidth not recorded.")]


def _ratio(err: float | None, tol: float | None) -> str:
    return "-" if err is None or not tol else f"{err / tol:.3g}"


def correctness_section(
    page: Page, task: str, attempts: list[Attempt], png: bool, links: Links
) -> list[Block]:
    # a run limited with --case may check nothing: show each candidate's latest attempt that checked cases
    latest = latest_per_candidate([a for a in attempts if a.correctness])
    if not latest:
        return [note("no correctness record.")]
    out = [
        note(
            "Latest attempt of each candidate that checked cases. Error over tolerance: max abs error / "
            "atol and max rel error / rtol; a case fails where an element exceeds atol + rtol·|ref|."
        )
    ]
    for a in latest:
        badges = Markup(" ").join(
            Markup('<span class="badge {}">{}: {}</span>').format(charts.status_class(s.split(":")[0]), k, s)
            for k, s in a.contract
        )
        out.append(
            Block(
                "p", Markup("<b>{}</b> ({}): {}").format(a.candidate, links.to(a.path, a.attempt_id), badges)
            )
        )
    out.append(
        note(
            "Cells: dark green = pass, FAIL = wrong values or contract, ERR = crash or timeout, skip = not "
            "applicable on this device, white = not in the suite."
        )
    )
    title = f"{task}: pass/fail per case × dtype"
    out.append(page.add_chart(charts.correctness(slug("correctness", task), title, latest, png)))
    rows = [
        [
            a.candidate,
            c.base,
            c.dtype,
            c.kind,
            status_cell(c.status),
            n(num(c.max_abs, ".3g")),
            n(num(c.atol, ".1g")),
            n(_ratio(c.max_abs, c.atol)),
            n(num(c.max_rel, ".3g")),
            n(num(c.rtol, ".1g")),
            n(_ratio(c.max_rel, c.rtol)),
            c.reason[:200],
        ]
        for a in latest
        for c in a.correctness
    ]
    every = table(
        "correctness",
        "candidate | case | dtype | kind | status | max abs err | atol | abs/atol | max rel err | rtol | rel/rtol | detail",
        rows,
    )
    return [*out, Block("details", "every case, with the error over tolerance", children=(every,))]


def baseline_band(attempts: list[Attempt], case_id: str) -> tuple[float, float] | None:
    """(baseline P50, P50 × (1 + threshold)) of a bench case, as the newest attempt of any candidate that
    was judged against a baseline recorded it; None when none was."""
    band = None
    for a in sorted(attempts, key=lambda a: (a.created_at, a.attempt_id)):
        for c in a.regression.cases if a.regression else ():
            if c.id == case_id and c.baseline is not None:
                band = (c.baseline.p50, c.baseline.p50 * (1 + a.regression.thresholds.p50_threshold))
    return band


def _history_charts(
    page: Page, g: tuple, members: list[Attempt], by_cand: dict[str, list[Attempt]], png: bool
) -> list[Block]:
    """One chart per timed case: each candidate's P50 over its attempts, on the baseline band."""
    out = [
        note(
            "Shaded: the baseline band, from the baseline's P50 up to the regression threshold above it "
            "(from regression.json). Marker shape: the attempt's regression verdict; a small dot: no baseline."
        )
    ]
    for cid in dict.fromkeys(c.id for a in members for c in a.bench if c.candidate):
        series = []
        for i, cand in enumerate(sorted(by_cand)):
            pts = [
                (a, c.candidate.p50)
                for a in by_cand[cand]
                for c in a.bench
                if c.id == cid and c.candidate and c.candidate.p50 is not None
            ]
            series.append((cand, i, pts))
        band = baseline_band(members, cid)
        out.append(
            page.add_chart(charts.history(slug("history", g[0], g[3], g[2], cid), cid, series, band, png))
        )
    return out


def _history_group(page: Page, g: tuple, members: list[Attempt], png: bool) -> list[Block]:
    by_cand: dict[str, list[Attempt]] = {}
    for a in sorted(members, key=lambda a: (a.created_at, a.attempt_id)):
        by_cand.setdefault(a.candidate, []).append(a)
    rows = [
        [
            a.candidate,
            a.created_at,
            a.regression.verdict if a.regression else "no baseline",
            a.regression.baseline.get("attempt_id") or "-" if a.regression else "-",
            ", ".join(f"{c.id} {us(c.candidate.p50)}" for c in a.bench if c.candidate),
        ]
        for cand in sorted(by_cand)
        for a in by_cand[cand]
    ]
    if not rows:
        return []
    out = [Block("h4", group_title(g))]
    if max(len(v) for v in by_cand.values()) < 2:
        out.append(note("one attempt per candidate so far: no history to draw."))
    else:
        out.extend(_history_charts(page, g, members, by_cand, png))
    headers = ["candidate", "created", "regression verdict", "baseline attempt", "P50 µs per case"]
    return [*out, table("history", headers, rows)]


def history_section(page: Page, attempts: list[Attempt], png: bool) -> list[Block]:
    out = [b for g, members in groups(attempts).items() for b in _history_group(page, g, members, png)]
    return out or [note("no timed attempt.")]


def profiles_section(comparisons: list[ProfilePair]) -> list[Block]:
    if not comparisons:
        return [
            note(
                Markup(
                    "no pair of comparable Nsight Compute profiles under artifacts/profiles/ for this "
                    "selection (<code>mini-kv profile</code> records them)."
                )
            )
        ]
    from mini_kv.profile.compare import fmt

    out = []
    for cmp in comparisons:
        a, b = cmp.A, cmp.B
        out.append(Block("h3", f"{a.task} / {a.case}: A = {a.candidate}, B = {b.candidate}"))
        if cmp.refused:
            out.append(Block("warn", f"not comparable: {cmp.refused}"))
            continue
        rows = [
            [
                r.label,
                n(fmt(r.A, r.kind)),
                n(fmt(r.B, r.kind)),
                n(f"{r.ratio:.3g}" if r.ratio is not None else "-"),
            ]
            for r in cmp.rows
        ]
        out.append(table("profiles", ["metric", "A", "B", "B/A"], rows))
    return out


# (label, the environment.json field, dotted where nested)
ENV_ROWS = (
    ("GPU", "gpu.name"),
    ("compute capability", "gpu.capability"),
    ("driver", "driver"),
    ("torch", "torch"),
    ("CUDA (torch)", "torch_cuda"),
    ("nvcc", "nvcc"),
    ("host compiler", "cxx"),
    ("python", "python"),
    ("platform", "platform"),
    ("CPUs", "cpu_count"),
    ("copy bandwidth GB/s", "copy_bandwidth_Bps"),
    ("environment tag", "tag"),
    ("environment key", "key"),
)


def _env_value(env: dict, field: str) -> str:
    v = env
    for key in field.split("."):  # a field of another shape than this environment.json's reads as absent
        v = v.get(key) if isinstance(v, dict) else None
    if field == "gpu.name":
        return v or "none (CPU run)"
    if field == "copy_bandwidth_Bps":
        return num(v / 1e9, ",.1f") if isinstance(v, (int, float)) and v else "not recorded"
    return "not recorded" if v is None else str(v)


def environment_section(attempts: list[Attempt]) -> list[Block]:
    envs: dict[str, dict] = {}
    for a in attempts:
        envs.setdefault(a.environment_key, a.environment)
    keys = sorted(envs)
    rows = [[label, *(_env_value(envs[k], field) for k in keys)] for label, field in ENV_ROWS]
    return [table("environment", ["", *[f"environment {k}" for k in keys]], rows)]


def skipped_section(skipped: list[SkippedAttempt]) -> list[Block]:
    if not skipped:
        return [note("every attempt directory in the selection was read and verified.")]
    return [
        Block(
            "warn",
            "These directories are not usable attempts (incomplete, tampered or unreadable) and are left "
            "out of every section:",
        ),
        table("skipped", ["path", "why"], [[s.path, s.reason] for s in skipped]),
    ]


def footer(store: Store, generated: str) -> list[Block]:
    return [
        note(
            Markup(
                "Generated {} by <code>mini-kv report</code> from {} attempt(s) in {}; nothing was re-run."
            ).format(generated, len(store.attempts), store.artifacts)
        )
    ]


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
