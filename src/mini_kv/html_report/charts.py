"""The report's charts, drawn with matplotlib into SVG text (inlined in the page) and optionally PNG.

Figures are built with `matplotlib.figure.Figure` directly, never pyplot: no global figure state and
no GUI backend. Text stays text in the SVG (`svg.fonttype: none`), which keeps files small and lets a
browser test find labels in the DOM. Colours are the Okabe-Ito palette, readable with the common
colour-vision deficiencies; every series also differs in line style or marker, and every number drawn
is also in a table beside the chart.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import threading
from dataclasses import dataclass

import numpy as np

from mini_kv.html_report.collect import Attempt, BenchCase
from mini_kv.status import INCORRECT_STATUSES, Status, Verdict

OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")
STATUS_COLOURS = {
    "pass": "#009E73",
    "fail": "#D55E00",
    "error": "#CC79A7",
    "skip": "#BBBBBB",
    "none": "#FFFFFF",
}
ECDF_POINTS = 120  # an ECDF drawn through this many quantiles looks the same and keeps the SVG small
TAIL_SPAN = (
    1.5  # the latency axis ends at this multiple of the largest P95 when slower samples lie far beyond
)
RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "mini_kv",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


@dataclass(frozen=True)
class Chart:
    """One drawn chart: a file-name-safe id, a title for the page, its SVG text and the PNG bytes if asked."""

    chart_id: str
    title: str
    svg: str
    png: bytes | None


_styled = threading.local()


@contextlib.contextmanager
def style():
    """The report's matplotlib settings, around every chart function; entered once around a whole build
    (rc_context copies every setting on entry, which added up over dozens of charts), nested uses are free."""
    if getattr(_styled, "on", False):
        yield
        return
    import matplotlib

    with matplotlib.rc_context(RC):
        _styled.on = True
        try:
            yield
        finally:
            _styled.on = False


def colour(i: int) -> str:
    return OKABE_ITO[i % len(OKABE_ITO)]


def _render(fig, ax, chart_id: str, title: str, png: bool, legend: bool = True) -> Chart:
    """The chart with its legend to the right of the axes (the room _figure left for it)."""
    if legend:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog and DOCTYPE: the SVG is inlined in HTML
    raw = None
    if png:
        pbuf = io.BytesIO()
        fig.savefig(pbuf, format="png", dpi=110)
        raw = pbuf.getvalue()
    return Chart(chart_id, title, svg, raw)


def _figure(
    w: float, h: float, left: float = 0.75, right: float = 2.3, bottom: float = 0.55, top: float = 0.3
):
    """A figure with fixed margins in inches (room for the legend on the right). Fixed margins instead of
    a layout engine or a tight bounding box: those measure every text twice and doubled the build time."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h))
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h)
    return fig


def legend_room(labels) -> float:
    """Inches to the right of the axes for a legend of these labels (8 pt: about 0.065 in a character)."""
    return 0.5 + 0.065 * max([len(str(x)) for x in labels] + [10])


def _plain_log(axis) -> None:
    """Log-axis tick labels as plain numbers: the default scientific labels go through mathtext, whose
    parser took most of the report's build time."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _ecdf(samples: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    arr = np.sort(np.asarray(samples, dtype=float))
    if arr.size > ECDF_POINTS:
        q = np.linspace(0.0, 1.0, ECDF_POINTS)
        return np.quantile(arr, q), q
    return arr, np.arange(1, arr.size + 1) / arr.size


def _ecdf_curve(ax, side, idx: int, dash: str, label: str) -> tuple[float, float, float]:
    """One side's ECDF with its P50 (●) and P95 (▲); returns (fastest, TAIL_SPAN × P95, slowest sample)."""
    x, y = _ecdf(side.samples)
    ax.step(
        x,
        y,
        where="post",
        color=colour(idx),
        linestyle=dash,
        linewidth=1.4 if dash == "-" else 1,
        label=label,
    )
    for q, mk in ((side.p50, "o"), (side.p95, "^")):
        if q is not None:
            ax.plot(
                [q],
                [0.5 if mk == "o" else 0.95],
                marker=mk,
                color=colour(idx),
                markersize=5,
                markerfacecolor="white" if dash == "--" else colour(idx),
                linestyle="none",
            )
    return float(x[0]), TAIL_SPAN * float(np.quantile(side.samples, 0.95)), float(x[-1])


def _latency_xaxis(ax, first: BenchCase, lo: float, hi: float, top: float) -> None:
    """Clip far outliers (a preempted CPU would squash every curve into a step), else log over wide ranges."""
    clipped = top > hi > 0
    if clipped:
        ax.set_xlim(lo - 0.05 * (hi - lo), hi)
    elif hi > 0 and lo > 0 and top / lo > 20:
        ax.set_xscale("log")
        _plain_log(ax.xaxis)
    ax.set_xlabel(
        f"latency per call (µs), timer: {first.timer or first.method or 'not recorded'}, "
        f"L2: {first.l2 or 'not recorded'}"
        + (f"\naxis ends at {TAIL_SPAN:g} × the largest P95; slowest sample {top:,.0f} µs" if clipped else "")
    )


@style()
def latency(chart_id: str, case_id: str, rows: list[tuple[str, int, BenchCase]], png: bool) -> Chart:
    """ECDF of candidate (solid) and reference (dashed) samples of one bench case, one colour per candidate;
    P50 and P95 marked on every curve."""
    room = legend_room(
        [f"reference ({label})" for label, _, _ in rows] + [f"{label}  [UNSTABLE]" for label, _, _ in rows]
    )
    fig = _figure(4.9 + room, 3.2, right=room, bottom=0.75)  # room for a second x-label line
    ax = fig.add_subplot()
    lo, hi, top = np.inf, 0.0, 0.0
    for label, idx, c in rows:
        unstable_mark = "" if c.stable is not False else "  [UNSTABLE]"
        for side, dash, who in (
            (c.candidate, "-", label + unstable_mark),
            (c.reference, "--", f"reference ({label})"),
        ):
            if side is not None and side.samples:
                first, tail, last = _ecdf_curve(ax, side, idx, dash, who)
                lo, hi, top = min(lo, first), max(hi, tail), max(top, last)
    _latency_xaxis(ax, rows[0][2], lo, hi, top)
    ax.set_ylabel("fraction of samples ≤ x")
    ax.set_ylim(0, 1.02)
    ax.axhline(0.5, color="#777777", linewidth=0.6, linestyle=":")
    ax.axhline(0.95, color="#777777", linewidth=0.6, linestyle=":")
    unstable = [label for label, _, c in rows if c.stable is False]
    ax.set_title(
        f"{case_id}: ● P50  ▲ P95" + (f"   UNSTABLE: {', '.join(unstable)}" if unstable else ""),
        color="#D55E00" if unstable else "black",
        loc="left",
    )
    return _render(fig, ax, chart_id, f"latency {case_id}", png)


def _marks(ax, marks: list[tuple[str, int, float, float]]) -> None:
    """One marker per (label, colour index, x, y); each label once in the legend."""
    seen = set()
    for label, idx, x, y in marks:
        style_ = {"marker": MARKERS[idx % len(MARKERS)], "color": colour(idx), "markersize": 7}
        ax.plot([x], [y], linestyle="none", label=None if label in seen else label, **style_)
        seen.add(label)


@style()
def bandwidth(
    chart_id: str, title: str, points: list[tuple[str, int, str, float]], ceiling: float | None, png: bool
) -> Chart:
    """Achieved GB/s per bench case (x) and candidate (marker/colour) under the measured copy bandwidth."""
    cases = sorted({p[2] for p in points})
    room = legend_room([p[0] for p in points] + ["measured copy bandwidth 00,000.0 GB/s"])
    bottom = 0.45 + 0.03 * max(len(c) for c in cases)  # labels turned 20°: a third of their length
    fig = _figure(4.9 + room, 2.2 + bottom, right=room, bottom=bottom)
    ax = fig.add_subplot()
    _marks(ax, [(label, idx, cases.index(case), gbps) for label, idx, case, gbps in points])
    if ceiling:
        ax.axhline(
            ceiling / 1e9,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"measured copy bandwidth {ceiling / 1e9:,.1f} GB/s",
        )
    else:
        ax.text(0.01, 0.97, "copy bandwidth: not recorded", transform=ax.transAxes, va="top", fontsize=8)
    ax.set_xticks(range(len(cases)), cases, rotation=20, ha="right")
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_ylabel("achieved GB/s (at P50)")
    ax.set_ylim(0, 1.15 * max([p[3] for p in points] + [ceiling / 1e9 if ceiling else 0.0]))
    ax.set_title(title, loc="left")
    return _render(fig, ax, chart_id, title, png)


@style()
def roofline(
    chart_id: str,
    title: str,
    points: list[tuple[str, int, str, float, float]],
    ceiling: float | None,
    png: bool,
) -> Chart:
    """Classic roofline: arithmetic intensity (FLOP/byte) against achieved FLOP/s, with the memory roof
    from the measured copy bandwidth. The compute roof is drawn only when recorded (it is not, today)."""
    room = legend_room([p[0] for p in points] + ["memory roof 00,000.0 GB/s × FLOP/byte"])
    fig = _figure(4.9 + room, 3.0, right=room)
    ax = fig.add_subplot()
    _marks(ax, [(label, idx, ai, gflops) for label, idx, _case, ai, gflops in points])
    for case in sorted({p[2] for p in points}):  # one label per case, above its highest point
        ai, top = max(((p[3], p[4]) for p in points if p[2] == case), key=lambda t: t[1])
        ax.annotate(case, (ai, top), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ais = [p[3] for p in points]
    xs = np.geomspace(min(ais) / 4, max(ais) * 4, 20)
    if ceiling:
        ax.plot(
            xs,
            xs * ceiling / 1e9,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"memory roof {ceiling / 1e9:,.1f} GB/s × FLOP/byte",
        )
    ax.text(
        0.01,
        0.97,
        "compute peak: not recorded" + ("" if ceiling else "; copy bandwidth: not recorded"),
        transform=ax.transAxes,
        va="top",
        fontsize=8,
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [p[4] for p in points] + ([min(ais) * ceiling / 1e9, max(ais) * ceiling / 1e9] if ceiling else [])
    ax.set_xlim(min(ais) / 4, max(ais) * 4)  # at least a decade each way: readable log ticks
    ax.set_ylim(min(ys) / 4, max(ys) * 4)
    _plain_log(ax.xaxis)
    _plain_log(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s (at P50)")
    ax.set_title(title, loc="left")
    return _render(fig, ax, chart_id, title, png)


def status_class(status: str) -> str:
    if status == Status.PASSED:
        return "pass"
    if status == Status.SKIPPED:
        return "skip"
    return "fail" if status == Status.FAILED or status in INCORRECT_STATUSES else "error"


# pass cells stay unlabelled: dark green against the white "not in suite" cells, and each label costs
# ~200 bytes of SVG (a 30 x 6 matrix of "ok" was most of the page)
_SHORT = {"pass": "", "fail": Verdict.FAIL, "error": "ERR", "skip": "skip", "none": ""}


@style()
def correctness(chart_id: str, title: str, attempts: list[Attempt], png: bool) -> Chart:
    """Heat map: rows are cases, one column per (candidate, dtype); each cell says its status in words too."""
    from matplotlib.colors import ListedColormap

    keys = ["pass", "fail", "error", "skip", "none"]
    rows = sorted({c.base for a in attempts for c in a.correctness})
    dtypes = sorted({c.dtype for a in attempts for c in a.correctness})
    cols = [(a, d) for a in attempts for d in dtypes]
    grid = np.full((len(rows), len(cols)), keys.index("none"))
    for j, (a, d) in enumerate(cols):
        for c in a.correctness:
            if c.dtype == d:
                grid[rows.index(c.base), j] = keys.index(status_class(c.status))
    left = 0.3 + 0.065 * max(len(r) for r in rows)
    bottom = 0.35 + 0.07 * max(len(f"{a.candidate} {d}") for a, d in cols)
    width = max(left + 0.2 + 0.55 * len(cols), 0.3 + 0.075 * len(title))  # the title must fit too
    fig = _figure(
        width,
        bottom + 0.4 + 0.2 * len(rows),
        left=left,
        right=width - left - 0.55 * len(cols),
        bottom=bottom,
        top=0.4,
    )
    ax = fig.add_subplot()
    ax.imshow(
        grid,
        cmap=ListedColormap([STATUS_COLOURS[k] for k in keys]),
        vmin=0,
        vmax=len(keys) - 1,
        aspect="auto",
        interpolation="nearest",
    )
    for i in range(len(rows)):
        for j in range(len(cols)):
            k = keys[grid[i, j]]
            if not _SHORT[k]:
                continue
            ax.text(
                j,
                i,
                _SHORT[k],
                ha="center",
                va="center",
                fontsize=6.5,
                color="white" if k in ("fail", "error", "pass") else "black",
            )
    ax.set_xticks(range(len(cols)), [f"{a.candidate} {d}" for a, d in cols], fontsize=7, rotation=90)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.tick_params(length=0)
    ax.grid(False)
    ax.set_xticks(np.arange(-0.5, len(cols)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.set_title(title, loc="left", fontsize=9)
    return _render(fig, ax, chart_id, title, png, legend=False)


def _when(created_at: str) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(created_at)
    except ValueError:
        return None


VERDICT_MARKERS = {
    Verdict.PASS: "o",
    Verdict.WARN: "s",
    Verdict.UNCONFIRMED: "s",
    Verdict.FAIL: "X",
    Verdict.INCOMPARABLE: "d",
    Verdict.MISSING: "d",
}


@style()
def history(
    chart_id: str,
    case_id: str,
    series: list[tuple[str, int, list[tuple[Attempt, float]]]],
    band: tuple[float, float] | None,
    png: bool,
) -> Chart:
    """P50 of one bench case over each candidate's attempts; the baseline band (baseline P50 up to the
    regression threshold) shaded; the marker shape is the attempt's regression verdict."""
    room = legend_room([label for label, _, _ in series] + ["verdict INCOMPARABLE"])
    fig = _figure(4.9 + room, 3.0, right=room, bottom=0.8)
    ax = fig.add_subplot()
    if band:
        ax.axhspan(band[0], band[1], color="#56B4E9", alpha=0.25, label="baseline band")
    used = set()
    for label, idx, pts in series:
        pts = [(a, _when(a.created_at), p) for a, p in pts]
        pts = [(a, t, p) for a, t, p in pts if t is not None]
        if not pts:
            continue
        ax.plot([t for _, t, _ in pts], [p for _, _, p in pts], color=colour(idx), linewidth=1.2, label=label)
        for a, t, p in pts:
            v = a.regression.verdict if a.regression else "none"
            ax.plot(
                [t],
                [p],
                marker=VERDICT_MARKERS.get(v, "."),
                color=colour(idx),
                linestyle="none",
                markersize=7 if v != "none" else 4,
                markeredgecolor="black" if v == Verdict.FAIL else colour(idx),
            )
            used.add(v)
    for v in sorted(used - {"none"}):
        ax.plot(
            [],
            [],
            marker=VERDICT_MARKERS.get(v, "."),
            color="#555555",
            linestyle="none",
            label=f"verdict {v}",
        )
    ax.set_ylabel("candidate P50 (µs)")
    ax.set_title(f"{case_id}: P50 per attempt", loc="left")
    from matplotlib.dates import DateFormatter

    ax.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
    ax.tick_params(axis="x", labelrotation=25)
    return _render(fig, ax, chart_id, f"history {case_id}", png)
