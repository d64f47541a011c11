"""The report page: sections of tables and inline SVG charts, assembled into one self-contained HTML file.

No script and no external resource: the page opens from disk, from a mail attachment or a CI artifact
viewer alike. Every string from the store is escaped; links are relative to the HTML file's folder.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mini_kv.html_report import charts
from mini_kv.html_report.collect import Attempt, BenchCase, Skipped, Store
from mini_kv.status import Status

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;
padding:0 16px 48px;color:#111}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;border-bottom:2px solid #0072B2;padding-bottom:2px;
margin-top:34px}h3{font-size:16px;margin:22px 0 6px}h4{font-size:13.5px;margin:14px 0 4px;color:#333}nav a{margin-right:12px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}th,td{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{background:#d6f0e7}.fail{background:#f8d4c0}.error{background:#f2d6e6}.skip{background:#eee}
.badge{display:inline-block;border-radius:3px;padding:0 6px;margin:0 4px 2px 0;font-size:12px;
border:1px solid #888}.badge.pass{border-color:#009E73}.badge.fail,.badge.error{border-color:#D55E00}
.note{color:#555;font-size:12.5px}.warn{color:#B24A00;font-weight:600}figure{margin:8px 0 4px}
figure svg{max-width:100%;height:auto}code{font-size:12px}.files a{margin-right:8px;font-size:12px}
"""


@dataclass
class Page:
    """Sections in order; each is (anchor id, title, html body)."""

    title: str
    sections: list[tuple[str, str, str]] = field(default_factory=list)
    charts: list[charts.Chart] = field(default_factory=list)

    def add_chart(self, chart: charts.Chart) -> str:
        taken = {c.chart_id for c in self.charts}
        n = 1
        while chart.chart_id in taken:  # two groups can slug alike: ids (and PNG names) stay unique
            chart = charts.Chart(f"{chart.chart_id.rsplit('~', 1)[0]}~{n}", chart.title, chart.svg, chart.png)
            n += 1
        self.charts.append(chart)
        return (
            f'<figure class="chart" id="chart-{chart.chart_id}" data-chart="{esc(chart.title)}">'
            f"{chart.svg}</figure>"
        )

    def html(self) -> str:
        nav = " ".join(f'<a href="#{sid}">{esc(title)}</a>' for sid, title, _ in self.sections)
        body = "\n".join(
            f'<section id="{sid}"><h2>{esc(title)}</h2>\n{content}</section>'
            for sid, title, content in self.sections
        )
        return (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{CSS}</style></head>\n<body><h1>{esc(self.title)}</h1>"
            f"<nav>{nav}</nav>\n{body}\n</body></html>\n"
        )


def esc(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def num(x: float | None, spec: str = ".3g", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def us(x: float | None) -> str:
    """Microseconds for a table: no exponent notation, three significant digits at least."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 1000 else (f"{x:.1f}" if x >= 10 else f"{x:.3g}")


def slug(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts)).strip("_")[:120]


def table(headers: str | list[str], rows: list[list[str]], cls: str = "") -> str:
    """`headers`: a list, or one line "a | b | c"; `rows` are already-escaped cell HTML; a cell starting
    with '#' is right-aligned (a number)."""
    heads = headers.split(" | ") if isinstance(headers, str) else headers
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    body = []
    for r in rows:
        cells = []
        for c in r:
            if c.startswith("#"):
                cells.append(f'<td class="num">{c[1:]}</td>')
            elif c.startswith("!"):  # "!class!content": a coloured status cell
                _, k, content = c.split("!", 2)
                cells.append(f'<td class="{k}">{content}</td>')
            else:
                cells.append(f"<td>{c}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>' + "".join(body) + "</tbody></table>"


def status_cell(status: str) -> str:
    return f"!{charts.status_class(status)}!{esc(status)}"


class Links:
    """Relative links from the HTML file's folder to attempt files."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir.resolve()

    def to(self, path: Path, text: str) -> str:
        rel = os.path.relpath(Path(path).resolve(), self.out_dir)
        return f'<a href="{esc(Path(rel).as_posix())}">{esc(text)}</a>'

    def files(self, a: Attempt) -> str:
        shown = [
            f for f in ("attempt.json", *a.files) if f.count("/") == 0
        ]  # top-level files; sources/ and logs/ as dirs
        dirs = sorted({f.split("/")[0] for f in a.files if "/" in f})
        return (
            '<span class="files">'
            + " ".join(self.to(a.path / f, f) for f in dict.fromkeys(shown))
            + " "
            + " ".join(self.to(a.path / d, d + "/") for d in dirs)
            + "</span>"
        )


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
    board: dict | None, error: str | None, store: Store, links: Links, selected_ids: set[str] | None
) -> str:
    parts = [
        '<p class="note">The latest complete, correct (PASSED) and stable attempt of each candidate, '
        "ranked by geometric-mean speedup over the reference, grouped by task, suite, environment and "
        "device exactly as <code>mini-kv leaderboard</code> groups them.</p>"
    ]
    if error:
        return "".join(parts) + f'<p class="warn">leaderboard unavailable: {esc(error)}</p>'
    by_id = {a.attempt_id: a for a in store.attempts}
    shown = 0
    for g in (board or {}).get("groups", []):
        entries = [
            e for e in g.get("entries", []) if selected_ids is None or e.get("attempt_id") in selected_ids
        ]
        if not entries:
            continue
        shown += 1
        parts.append(
            f"<h3>{esc(group_title((g['task_id'], str(g['suite_hash']), g['environment_key'], g['device'])))}</h3>"
        )
        rows = []
        for e in entries:
            a = by_id.get(e.get("attempt_id"))
            cases = ", ".join(
                f"{k} {v:.3f}×"
                for k, v in sorted((e.get("cases") or {}).items())
                if isinstance(v, (int, float))
            )
            where = links.to(store.artifacts / e["path"], str(e.get("attempt_id"))) if e.get("path") else "-"
            speed = e.get("geomean_speedup")
            rows.append(
                [
                    f"#{esc(e.get('rank'))}",
                    esc(e.get("candidate")),
                    f"#{num(speed if isinstance(speed, (int, float)) else None, '.3f')}×",
                    esc(cases),
                    esc(e.get("regression") or "-"),
                    where + ("<br>" + links.files(a) if a else ""),
                    esc(e.get("created_at")),
                ]
            )
        parts.append(
            table(
                "rank | candidate | geomean speedup | per case | regression | attempt / files | created",
                rows,
                "leaderboard",
            )
        )
    if not shown:
        parts.append(
            '<p class="warn">no attempt of the selection qualifies (none is PASSED and stable); '
            "every attempt is listed under Attempts.</p>"
        )
    return "".join(parts)


def attempts_section(store: Store, links: Links) -> str:
    rows = []
    for a in sorted(store.attempts, key=lambda a: (a.task_id, a.candidate, a.created_at)):
        rows.append(
            [
                esc(a.task_id),
                esc(a.candidate),
                status_cell(a.status),
                "yes" if a.stable else ("!fail!no" if a.stable is False else "-"),
                f"#{num(a.geomean, '.3f')}",
                esc(a.regression.verdict if a.regression else "-"),
                esc(a.device),
                esc(a.environment_key),
                esc(a.created_at),
                links.to(a.path, a.attempt_id) + "<br>" + links.files(a),
            ]
        )
    return table(
        "task | candidate | status | stable | geomean speedup"
        " | regression | device | environment | created | attempt / files",
        rows,
        "attempts",
    )


def _side_cells(c: BenchCase) -> list[str]:
    cs, rs = c.candidate, c.reference
    n = f"{len(cs.samples)}/{len(rs.samples) if rs else 0}" if cs else "-"
    return [
        f"#{us(cs.p50 if cs else None)}",
        f"#{us(cs.p95 if cs else None)}",
        f"#{us(rs.p50 if rs else None)}",
        f"#{us(rs.p95 if rs else None)}",
        f"#{num(c.speedup, '.3f')}",
        f"#{num(cs.cv * 100 if cs and cs.cv is not None else None, '.1f')}",
        f"#{n}",
    ]


def latency_section(page: Page, task: str, attempts: list[Attempt], png: bool) -> str:
    parts = []
    for g, members in groups(attempts).items():
        latest = latest_per_candidate(members)
        case_ids = list(dict.fromkeys(c.id for a in latest for c in a.bench))
        if not case_ids:
            continue
        parts.append(f"<h4>{esc(group_title(g))}</h4>")
        for cid in case_ids:
            rows_chart, rows = [], []
            for i, a in enumerate(latest):
                for c in a.bench:
                    if c.id != cid:
                        continue
                    stable = (
                        "yes"
                        if c.stable
                        else ("!fail!UNSTABLE: " + esc(c.unstable_why) if c.stable is False else "-")
                    )
                    if c.candidate is None:
                        rows.append(
                            [
                                esc(a.candidate),
                                status_cell(c.status or Status.BENCHMARK_ERROR),
                                *["-"] * 8,
                                "!fail!" + esc(c.reason or "no timing"),
                            ]
                        )
                        continue
                    rows_chart.append((a.candidate, i, c))
                    rows.append(
                        [
                            esc(a.candidate),
                            esc(c.method or "-") + " / " + esc(c.timer or "-"),
                            esc(c.l2 or "-"),
                            *_side_cells(c),
                            stable,
                        ]
                    )
            if rows_chart:
                parts.append(
                    page.add_chart(
                        charts.latency(slug("latency", *g[:1], g[3], g[2], cid), cid, rows_chart, png)
                    )
                )
            parts.append(
                table(
                    "candidate | method / timer | L2 | P50 µs | P95 µs"
                    " | ref P50 µs | ref P95 µs | speedup | CV % | samples cand/ref | stable",
                    rows,
                    "latency",
                )
            )
    return "".join(parts) or '<p class="note">no bench case was timed (benchmark skipped or failed).</p>'


def _copy_ceiling(latest: list[Attempt]) -> float | None:
    """The memory ceiling: the peak bandwidth a bench case recorded, else the environment's copy bandwidth."""
    return next((c.peak_bw for a in latest for c in a.bench if c.peak_bw), None) or next(
        (a.environment.get("copy_bandwidth_Bps") for a in latest if a.environment.get("copy_bandwidth_Bps")),
        None,
    )


def _roofline_row(a: Attempt, c: BenchCase, ceiling: float | None) -> list[str]:
    share = c.gbps * 1e9 / ceiling if c.gbps and ceiling else None
    return [
        esc(c.id),
        esc(a.candidate),
        f"#{num(c.bytes, ',.0f', 'not recorded')}",
        f"#{num(c.flops, ',.0f', 'not recorded')}",
        f"#{us(c.candidate.p50)}",
        f"#{num(c.gbps, ',.1f', 'not recorded')}",
        f"#{num(share * 100 if share else None, '.0f', 'not recorded')}",
        f"#{num(c.tflops * 1e3 if c.tflops is not None else None, ',.2f', 'not recorded')}",
    ]


def _roofline_group(page: Page, g: tuple, latest: list[Attempt], png: bool) -> str:
    """One group's bandwidth and roofline charts and table; empty when no case of it was timed."""
    timed = [(i, a, c) for i, a in enumerate(latest) for c in a.bench if c.candidate is not None]
    if not timed:
        return ""
    ceiling = _copy_ceiling(latest)
    bw_pts = [(a.candidate, i, c.id, c.gbps) for i, a, c in timed if c.gbps is not None]
    roof_pts = [
        (a.candidate, i, c.id, c.flops / c.bytes, c.tflops * 1e3)
        for i, a, c in timed
        if c.flops and c.bytes and c.tflops is not None
    ]
    bw = f"{ceiling / 1e9:,.1f} GB/s" if ceiling else "not recorded"
    parts = [
        f"<h4>{esc(group_title(g))}</h4>",
        f'<p class="note">memory ceiling: measured copy bandwidth {esc(bw)}; compute peak: not '
        "recorded (no attempt stores one). Bytes and FLOPs come from the task card's expressions "
        "as benchmark.json recorded them.</p>",
    ]
    for kind, pts, draw, title in (
        ("bandwidth", bw_pts, charts.bandwidth, "achieved bandwidth"),
        ("roofline", roof_pts, charts.roofline, "roofline"),
    ):
        if pts:
            chart = draw(slug(kind, g[0], g[3], g[2]), f"{g[0]}: {title}", pts, ceiling, png)
            parts.append(page.add_chart(chart))
    parts.append(
        table(
            ["case", "candidate", "bytes", "FLOPs", "P50 µs", "GB/s", "% of copy BW", "GFLOP/s"],
            [_roofline_row(a, c, ceiling) for _, a, c in timed],
            "roofline",
        )
    )
    return "".join(parts)


def roofline_section(page: Page, task: str, attempts: list[Attempt], png: bool) -> str:
    parts = [_roofline_group(page, g, latest_per_candidate(ms), png) for g, ms in groups(attempts).items()]
    return "".join(parts) or '<p class="note">no timed case: bytes, FLOPs and bandwidth not recorded.</p>'


def _ratio(err: float | None, tol: float | None) -> str:
    return "-" if err is None or not tol else f"{err / tol:.3g}"


def correctness_section(page: Page, task: str, attempts: list[Attempt], png: bool, links: Links) -> str:
    # a run limited with --case may check nothing: show each candidate's latest attempt that checked cases
    latest = latest_per_candidate([a for a in attempts if a.correctness])
    if not latest:
        return '<p class="note">no correctness record.</p>'
    parts = [
        '<p class="note">Latest attempt of each candidate that checked cases. Error over tolerance: max abs error / atol and '
        "max rel error / rtol; a case fails where an element exceeds atol + rtol·|ref|.</p>"
    ]
    for a in latest:
        badges = " ".join(
            f'<span class="badge {charts.status_class(s.split(":")[0])}">{esc(k)}: {esc(s)}</span>'
            for k, s in a.contract
        )
        parts.append(f"<p><b>{esc(a.candidate)}</b> ({links.to(a.path, a.attempt_id)}): {badges}</p>")
    parts.append(
        '<p class="note">Cells: dark green = pass, FAIL = wrong values or contract, ERR = crash '
        "or timeout, skip = not applicable on this device, white = not in the suite.</p>"
    )
    parts.append(
        page.add_chart(
            charts.correctness(slug("correctness", task), f"{task}: pass/fail per case × dtype", latest, png)
        )
    )
    rows = []
    for a in latest:
        for c in a.correctness:
            rows.append(
                [
                    esc(a.candidate),
                    esc(c.base),
                    esc(c.dtype),
                    esc(c.kind),
                    status_cell(c.status),
                    f"#{num(c.max_abs, '.3g')}",
                    f"#{num(c.atol, '.1g')}",
                    f"#{_ratio(c.max_abs, c.atol)}",
                    f"#{num(c.max_rel, '.3g')}",
                    f"#{num(c.rtol, '.1g')}",
                    f"#{_ratio(c.max_rel, c.rtol)}",
                    esc(c.reason[:200]),
                ]
            )
    parts.append(
        "<details><summary>every case, with the error over tolerance</summary>"
        + table(
            "candidate | case | dtype | kind | status | max abs err"
            " | atol | abs/atol | max rel err | rtol | rel/rtol | detail",
            rows,
            "correctness",
        )
        + "</details>"
    )
    return "".join(parts)


def baseline_band(attempts: list[Attempt], case_id: str) -> tuple[float, float] | None:
    """(baseline P50, P50 × (1 + threshold)) of a bench case, as the newest attempt of any candidate that
    was judged against a baseline recorded it; None when none was."""
    band = None
    for a in sorted(attempts, key=lambda a: (a.created_at, a.attempt_id)):
        for case, _, base in a.regression.cases if a.regression else ():
            if case == case_id and base is not None:
                band = (base, base * (1 + (a.regression.threshold or 0.0)))
    return band


def _history_charts(
    page: Page, g: tuple, members: list[Attempt], by_cand: dict[str, list[Attempt]], png: bool
) -> list[str]:
    """One chart per timed case: each candidate's P50 over its attempts, on the baseline band."""
    out = [
        '<p class="note">Shaded: the baseline band, from the baseline\'s P50 up to the regression '
        "threshold above it (from regression.json). Marker shape: the attempt's regression "
        "verdict; a small dot: no baseline.</p>"
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
        out.append(
            page.add_chart(
                charts.history(
                    slug("history", g[0], g[3], g[2], cid), cid, series, baseline_band(members, cid), png
                )
            )
        )
    return out


def _history_group(page: Page, g: tuple, members: list[Attempt], png: bool) -> str:
    by_cand: dict[str, list[Attempt]] = {}
    for a in sorted(members, key=lambda a: (a.created_at, a.attempt_id)):
        by_cand.setdefault(a.candidate, []).append(a)
    rows = [
        [
            esc(a.candidate),
            esc(a.created_at),
            esc(a.regression.verdict if a.regression else "no baseline"),
            esc(a.regression.baseline_attempt or "-" if a.regression else "-"),
            ", ".join(f"{esc(c.id)} {us(c.candidate.p50)}" for c in a.bench if c.candidate),
        ]
        for cand in sorted(by_cand)
        for a in by_cand[cand]
    ]
    if not rows:
        return ""
    parts = [f"<h4>{esc(group_title(g))}</h4>"]
    if max(len(v) for v in by_cand.values()) < 2:
        parts.append('<p class="note">one attempt per candidate so far: no history to draw.</p>')
    else:
        parts.extend(_history_charts(page, g, members, by_cand, png))
    parts.append(
        table(
            ["candidate", "created", "regression verdict", "baseline attempt", "P50 µs per case"],
            rows,
            "history",
        )
    )
    return "".join(parts)


def history_section(page: Page, task: str, attempts: list[Attempt], png: bool) -> str:
    parts = [_history_group(page, g, members, png) for g, members in groups(attempts).items()]
    return "".join(parts) or '<p class="note">no timed attempt.</p>'


def profiles_section(comparisons: list[dict], skipped: list[Skipped]) -> str:
    if not comparisons:
        return (
            '<p class="note">no pair of comparable Nsight Compute profiles under artifacts/profiles/ '
            "for this selection (<code>mini-kv profile</code> records them).</p>"
        )
    from mini_kv.profile.compare import fmt

    parts = []
    for cmp in comparisons:
        a, b = cmp["A"], cmp["B"]
        parts.append(
            f"<h3>{esc(a['task'])} / {esc(a['case'])}: A = {esc(a['candidate'])}, "
            f"B = {esc(b['candidate'])}</h3>"
        )
        if cmp.get("refused"):
            parts.append(f'<p class="warn">not comparable: {esc(cmp["refused"])}</p>')
            continue
        rows = [
            [
                esc(r["label"]),
                "#" + esc(fmt(r["A"], r["kind"])),
                "#" + esc(fmt(r["B"], r["kind"])),
                "#" + (f"{r['ratio']:.3g}" if r["ratio"] is not None else "-"),
            ]
            for r in cmp["rows"]
        ]
        parts.append(table(["metric", "A", "B", "B/A"], rows, "profiles"))
    return "".join(parts)


ENV_ROWS = (
    ("GPU", lambda e: (e.get("gpu") or {}).get("name") or "none (CPU run)"),
    ("compute capability", lambda e: (e.get("gpu") or {}).get("capability")),
    ("driver", lambda e: e.get("driver")),
    ("torch", lambda e: e.get("torch")),
    ("CUDA (torch)", lambda e: e.get("torch_cuda")),
    ("nvcc", lambda e: e.get("nvcc")),
    ("host compiler", lambda e: e.get("cxx")),
    ("python", lambda e: e.get("python")),
    ("platform", lambda e: e.get("platform")),
    ("CPUs", lambda e: e.get("cpu_count")),
    (
        "copy bandwidth GB/s",
        lambda e: (
            num(e["copy_bandwidth_Bps"] / 1e9, ",.1f") if e.get("copy_bandwidth_Bps") else "not recorded"
        ),
    ),
    ("environment tag", lambda e: e.get("tag")),
    ("environment key", lambda e: e.get("key")),
)


def environment_section(attempts: list[Attempt]) -> str:
    envs: dict[str, dict] = {}
    for a in attempts:
        envs.setdefault(a.environment_key, a.environment)
    keys = sorted(envs)
    rows = []
    for label, get in ENV_ROWS:
        vals = []
        for k in keys:
            try:
                v = get(envs[k])
            except (TypeError, AttributeError):
                v = None
            vals.append(esc("not recorded" if v is None else v))
        rows.append([esc(label), *vals])
    return table(["", *[f"environment {k}" for k in keys]], rows, "environment")


def skipped_section(skipped: list[Skipped]) -> str:
    if not skipped:
        return '<p class="note">every attempt directory in the selection was read and verified.</p>'
    return (
        '<p class="warn">These directories are not usable attempts (incomplete, tampered or unreadable) '
        "and are left out of every section:</p>"
        + table(["path", "why"], [[esc(s.path), esc(s.reason)] for s in skipped], "skipped")
    )


def footer(store: Store, generated: str) -> str:
    return (
        f'<p class="note">Generated {esc(generated)} by <code>mini-kv report</code> from '
        f"{len(store.attempts)} attempt(s) in {esc(store.artifacts)}; nothing was re-run.</p>"
    )


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
