"""Parse ncu's raw-page CSV (`ncu --import R --csv --page raw`), pick the target kernel's row,
check the required metrics, and derive the summary that `compare-profiles` lays side by side.

The raw page is one header row (identity columns such as "ID", "Kernel Name", "Block Size",
then one column per metric), a units row (empty identity cells, then each metric's unit), and
one data row per profiled kernel launch. Numbers may carry thousands separators ("1,234.5");
a metric the GPU does not support reads "n/a".
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from mini_kv.profile.reasons import ProfileFailure


@dataclass(frozen=True)
class RawCsv:
    """ncu's raw-page CSV: the header, each metric column's unit, the data rows (column -> cell)."""

    header: tuple[str, ...]
    units: dict[str, str]
    rows: tuple[dict[str, str], ...]
    metric_columns: tuple[str, ...]  # ncu metric names are <unit>__<counter>...


@dataclass(frozen=True)
class Metric:
    """One metric of the target row, as ncu printed it and as a number (None: n/a)."""

    raw: str
    unit: str
    value: float | None


@dataclass(frozen=True)
class Analysis:
    """The target kernel's row: its launch columns, its metrics (metrics.json) and the summary
    (profile.json's `summary`, schemas/profile.schema.json)."""

    kernel: dict[str, str]
    metrics: dict[str, Metric]
    summary: ProfileSummary
    rows: int  # data rows in the CSV


@dataclass(frozen=True)
class Stall:
    """A warp stall reason: average warps stalled for it per issue-active cycle, and the metric saying so."""

    reason: str
    metric: str
    value: float


@dataclass(frozen=True)
class ProfileSummary:
    """The comparison's view of one kernel (profile.json's `summary`): each concept of REQUIRED and
    OPTIONAL in base units (None: not measured), the metric each came from, the stalls."""

    kernel_name: str
    sources: dict[str, str]  # concept -> the metric it was read from
    grid_size: float
    block_size: float
    waves_per_sm: float
    achieved_occupancy_pct: float
    dram_throughput_pct: float
    dram_bandwidth_Bps: float
    duration_ns: float
    registers_per_thread: float | None
    theoretical_occupancy_pct: float | None
    sm_throughput_pct: float | None
    memory_throughput_pct: float | None
    shared_mem_per_block_bytes: float | None
    stalls_total: float
    top_stalls: tuple[Stall, ...]


# Each concept of the summary, and the metric names that provide it, preferred first. Alternatives
# exist because sections name some quantities differently across GPUs and ncu versions.
REQUIRED = {
    "grid_size": ("launch__grid_size",),
    "block_size": ("launch__block_size",),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "dram_throughput_pct": (
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "dram_bandwidth_Bps": ("dram__bytes.sum.per_second",),
    "duration_ns": ("gpu__time_duration.sum",),
}
OPTIONAL = {
    "registers_per_thread": ("launch__registers_per_thread",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "shared_mem_per_block_bytes": ("launch__shared_mem_per_block_static",),
}
# WarpStateStats: average number of warps stalled for each reason per issue-active cycle
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
STALL_REQUIRED = "smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio"
# "selected" is the issuing warp itself, not a reason for waiting
NOT_STALLS = {"selected"}
TOP_STALLS = 5

_GROUPED = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?$")
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME = {
    "second": 1e9,
    "msecond": 1e6,
    "usecond": 1e3,
    "nsecond": 1.0,
    "s": 1e9,
    "ms": 1e6,
    "us": 1e3,
    "ns": 1.0,
}


def parse_number(text: str) -> float | None:
    """A metric cell as a float; None for n/a, empty or non-numeric cells (e.g. "(128, 1, 1)")."""
    s = (text or "").strip()
    if _GROUPED.match(s):
        s = s.replace(",", "")
    try:
        return float(s)
    except ValueError:
        return None


def _byte_scale(unit: str) -> float | None:
    m = re.fullmatch(r"([KMGTP]?)(byte|B)", unit)
    return _PREFIX[m.group(1)] if m else None


def to_base(value: float | None, unit: str, concept: str) -> float | None:
    """Convert to the summary's unit: bytes/second for bandwidth, nanoseconds for durations.

    ncu prints base units with `--print-units base`; scaled ones ("Gbyte/second", "usecond")
    appear without it and are converted here with decimal prefixes, as ncu uses them.
    """
    if value is None:
        return None
    unit = (unit or "").strip()
    if concept.endswith("_Bps"):
        num, _, den = unit.partition("/")
        scale = _byte_scale(num)
        per = _TIME.get(den or "second")
        if scale is None or per is None:
            raise ValueError(f"unexpected bandwidth unit {unit!r}")
        return value * scale * 1e9 / per
    if concept.endswith("_ns"):
        if unit not in _TIME:
            raise ValueError(f"unexpected time unit {unit!r}")
        return value * _TIME[unit]
    return value


def _records(text: str) -> list[list[str]]:
    """CSV rows from ncu's output, skipping ==PROF==/==WARNING== lines ncu may interleave."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_raw_csv(text: str) -> RawCsv:
    """Header, units and data rows of a raw-page CSV; CSV_UNPARSABLE if it is not one."""
    try:
        rows = _records(text)
    except csv.Error as exc:
        raise ProfileFailure("CSV_UNPARSABLE", f"not CSV: {exc}") from None
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        raise ProfileFailure(
            "CSV_UNPARSABLE",
            'no header row starting with "ID" (is this `--page raw` output?)',
            head=text[:400],
        )
    header = rows[start]
    if "Kernel Name" not in header:
        raise ProfileFailure("CSV_UNPARSABLE", 'the header has no "Kernel Name" column', header=header[:20])
    if len(set(header)) != len(header):
        raise ProfileFailure("CSV_UNPARSABLE", "the header repeats a column name")
    body = rows[start + 1 :]
    units = {}
    if body and body[0] and body[0][0] == "":  # the units row: no launch ID
        units = dict(zip(header, body[0], strict=False))
        body = body[1:]
    data = []
    for n, r in enumerate(body, start=start + 2):
        if len(r) != len(header):
            raise ProfileFailure("CSV_UNPARSABLE", f"row {n} has {len(r)} cells, the header {len(header)}")
        data.append(dict(zip(header, r, strict=True)))
    return RawCsv(tuple(header), units, tuple(data), tuple(h for h in header if "__" in h))


def kernel_regex(names: list[str]) -> str:
    """A regex matching exactly these kernel names, bounded so that `add` never matches `vector_add`
    and a library kernel never matches by substring. The same pattern works whether the name is
    the bare function, a namespaced one or a full demangled signature, and whether the matcher
    searches or must match the whole name."""
    if not names:
        raise ValueError("no kernel names")
    alt = "|".join(re.escape(n) for n in sorted(set(names)))
    return rf"^(.*[^A-Za-z0-9_])?({alt})([^A-Za-z0-9_].*)?$"


def select_row(parsed: RawCsv, pattern: str) -> dict[str, str]:
    """The single data row whose kernel name matches; NO_MATCHING_KERNEL or MULTIPLE_MATCHING_KERNELS."""
    rx = re.compile(pattern)
    names = [r["Kernel Name"] for r in parsed.rows]
    hits = [r for r in parsed.rows if rx.search(r["Kernel Name"])]
    if not hits:
        raise ProfileFailure(
            "NO_MATCHING_KERNEL",
            f"none of the {len(names)} profiled row(s) matches {pattern}",
            kernels=names[:20],
            filter=pattern,
        )
    if len(hits) > 1:
        raise ProfileFailure(
            "MULTIPLE_MATCHING_KERNELS",
            f"{len(hits)} profiled rows match {pattern}",
            kernels=[r["Kernel Name"] for r in hits][:20],
            ids=[r.get("ID") for r in hits][:20],
            filter=pattern,
        )
    return hits[0]


def _pick(metrics: dict[str, Metric], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in metrics and metrics[n].value is not None), None)


def summarize(metrics: dict[str, Metric], kernel_name: str) -> ProfileSummary:
    """The comparison's view of one kernel; MISSING_METRICS names every absent concept."""
    missing = [
        f"{c} ({' or '.join(names)})" for c, names in REQUIRED.items() if _pick(metrics, names) is None
    ]
    stalls = []
    for name, m in metrics.items():
        hit = STALL.match(name)
        reason = hit.group("reason") if hit else ""
        # "<reason>_not_issued" variants count a subset of the same stalls: never a reason of their own
        if hit and reason not in NOT_STALLS and not reason.endswith("_not_issued") and m.value is not None:
            stalls.append(Stall(reason, name, m.value))
    if not stalls:
        missing.append(f"warp stall reasons ({STALL_REQUIRED})")
    if missing:
        raise ProfileFailure("MISSING_METRICS", "missing or n/a: " + ", ".join(missing), missing=missing)
    values, sources = {}, {}
    for concept, names in {**REQUIRED, **OPTIONAL}.items():
        name, values[concept] = _pick(metrics, names), None
        if name is None:
            continue
        try:
            values[concept] = to_base(metrics[name].value, metrics[name].unit, concept)
        except ValueError as exc:
            raise ProfileFailure("CSV_UNPARSABLE", f"{name}: {exc}") from None
        sources[concept] = name
    stalls.sort(key=lambda s: (-s.value, s.reason))
    total = round(sum(s.value for s in stalls), 6)  # stable when re-derived from the CSV
    return ProfileSummary(
        kernel_name, sources, **values, stalls_total=total, top_stalls=tuple(stalls[:TOP_STALLS])
    )


def analyze(text: str, pattern: str) -> Analysis:
    """parse -> select the target row -> metrics -> summary; raises ProfileFailure with the reason."""
    parsed = parse_raw_csv(text)
    row = select_row(parsed, pattern)
    metrics = {
        m: Metric(row[m], parsed.units.get(m, ""), parse_number(row[m])) for m in parsed.metric_columns
    }
    return Analysis(
        {h: row[h] for h in parsed.header if h not in parsed.metric_columns},
        metrics,
        summarize(metrics, row["Kernel Name"]),
        len(parsed.rows),
    )
