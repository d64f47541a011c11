"""`compare-profiles A B`: refuse what is not comparable, then lay the metrics that explain
performance side by side.

Two profiles compare only when they measured the same task and case, on the same environment
(machine, driver, torch, compilers, ncu), with the same inputs; a failed or altered profile never
compares. The profiler's duration is shown for completeness but labelled as a replay duration:
the latency comparison is the A/B timing (`mini_kv.profile.ab`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mini_kv.codec import optional
from mini_kv.profile.metrics import ProfileSummary
from mini_kv.profile.reasons import CompareRefused
from mini_kv.profile.store import Profile, ProfileUnusable, read_profile, resolve
from mini_kv.status import ProfileStatus

# (label, summary key, how to show it); "ratio" rows get B/A
ROWS = (
    ("kernel", "kernel_name", "text"),
    ("grid size (blocks)", "grid_size", "int"),
    ("block size (threads)", "block_size", "int"),
    ("registers / thread", "registers_per_thread", "int"),
    ("waves per SM", "waves_per_sm", "float"),
    ("theoretical occupancy %", "theoretical_occupancy_pct", "pct"),
    ("achieved occupancy %", "achieved_occupancy_pct", "pct"),
    ("DRAM throughput % of peak", "dram_throughput_pct", "pct"),
    ("DRAM bandwidth GB/s", "dram_bandwidth_Bps", "GBps"),
    ("SM throughput % of peak", "sm_throughput_pct", "pct"),
    ("ncu replay duration µs (not latency)", "duration_ns", "us"),
)


@dataclass(frozen=True)
class Refusal:
    """Why two profiles do not compare: a code of reasons.COMPARE_REASONS."""

    code: str
    message: str
    profile: str | None = optional()  # "A" or "B": the side at fault
    fields: dict | None = optional()  # field -> {"A": ..., "B": ...}


@dataclass(frozen=True)
class Ident:
    """Which profile a side of the comparison is."""

    profile_id: str
    path: str
    candidate: str
    task: str
    case: str
    kernel: str


@dataclass(frozen=True)
class MetricRow:
    label: str
    key: str  # the summary's field
    kind: str  # how to show it (fmt)
    A: object
    B: object
    ratio: float | None  # B/A, for numbers


@dataclass(frozen=True)
class StallRow:
    reason: str
    A: float | None
    B: float | None


@dataclass(frozen=True)
class Comparison:
    """compare-profiles' result (its --json, with the timing beside)."""

    A: Ident
    B: Ident
    rows: tuple[MetricRow, ...]
    stalls: tuple[StallRow, ...]


def load_pair(a: str, b: str, artifacts: Path) -> tuple[Profile, Profile]:
    """Both profiles, verified; CompareRefused with every reason found (either side)."""
    docs, problems = [], []
    for label, spec in (("A", a), ("B", b)):
        try:
            doc = read_profile(resolve(spec, artifacts))
        except ProfileUnusable as exc:
            problems.append(Refusal(exc.code, f"{label}: {exc.message}", label))
            docs.append(None)
            continue
        if doc.status != ProfileStatus.OK:
            r = doc.reason
            why = f"{label} ({doc.profile_id}) failed: {r and r.code}: {r and r.message}"
            problems.append(Refusal("PROFILE_FAILED", why, label))
        docs.append(doc)
    if problems:
        raise CompareRefused(problems)
    return docs[0], docs[1]


# what must be equal for two profiles to compare: (refusal code, the fields, read from profile.json)
CHECKS = (
    ("TASK_MISMATCH", lambda d: {"id": d.task.id, "version": d.task.version,
                                 "operator_version": d.task.operator["version"]}),
    ("CASE_MISMATCH", lambda d: {k: getattr(d.case, k) for k in ("id", "dtype", "params")}),
    ("ENVIRONMENT_MISMATCH", lambda d: {"environment_key": d.environment_key, "device": d.device,
                                        "ncu": d.ncu.version}),
    ("INPUT_MISMATCH", lambda d: {k: getattr(d.case, k) for k in ("seed", "input_sha256")}),
)  # fmt: skip


def refusals(a: Profile, b: Profile) -> list[Refusal]:
    """Every comparability check that fails, with the differing fields."""
    out = []
    for code, key in CHECKS:
        ka, kb = key(a), key(b)
        diff = {k: {"A": ka[k], "B": kb[k]} for k in ka if ka[k] != kb[k]}
        if code == "INPUT_MISMATCH" and not diff and ka["input_sha256"] is None:
            diff = {"input_sha256": {"A": None, "B": None}}  # an unknown digest proves nothing
        if diff:
            shown = ", ".join(f"{k} {v['A']!r} vs {v['B']!r}" for k, v in diff.items())
            out.append(Refusal(code, shown, fields=diff))
    return out


def _stall_rows(sa: ProfileSummary, sb: ProfileSummary) -> tuple[StallRow, ...]:
    """The union of both profiles' top stall reasons, by the larger of the two values."""
    va = {s.reason: s.value for s in sa.top_stalls}
    vb = {s.reason: s.value for s in sb.top_stalls}
    reasons = sorted(set(va) | set(vb), key=lambda r: (-max(va.get(r, 0.0), vb.get(r, 0.0)), r))
    return tuple(StallRow(r, va.get(r), vb.get(r)) for r in reasons)


def metric_rows(a: Profile, b: Profile) -> tuple[MetricRow, ...]:
    """The comparison rows (A, B, B/A) of two profiles' summaries."""
    rows = []
    for label, key, kind in ROWS:
        va, vb = getattr(a.summary, key), getattr(b.summary, key)
        numbers = kind != "text" and isinstance(va, (int, float)) and isinstance(vb, (int, float))
        rows.append(MetricRow(label, key, kind, va, vb, vb / va if numbers and va else None))
    return tuple(rows)


def compare(a_spec: str, b_spec: str, artifacts: Path) -> tuple[Comparison, Profile, Profile]:
    """Both profiles read and checked, then the deltas (and both profile.json documents);
    CompareRefused if they do not compare."""
    a, b = load_pair(a_spec, b_spec, artifacts)
    problems = refusals(a, b)
    if problems:
        raise CompareRefused(problems)
    return Comparison(ident(a), ident(b), metric_rows(a, b), _stall_rows(a.summary, b.summary)), a, b


def ident(d: Profile) -> Ident:
    return Ident(d.profile_id, d.path, d.candidate.id, d.task.id, d.case.id, d.summary.kernel_name)


def fmt(value, kind: str) -> str:
    if value is None:
        return "n/a"
    if kind == "text":
        return str(value)
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "pct":
        return f"{value:.1f}"
    if kind == "GBps":
        return f"{value / 1e9:,.1f}"
    if kind == "us":
        return f"{value / 1e3:,.2f}"
    return f"{value:.3g}"
