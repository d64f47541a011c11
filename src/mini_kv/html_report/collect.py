"""What the report shows, read from the attempt store alone: typed, read-only views of attempts.

Attempts are listed and read with the store's own reader (store.index.check_attempt: every listed
file's SHA-256, the ids, and the headline recomputed from the per-case records, exactly as the index
and the leaderboard check them) and their JSON files are turned into the small frozen records below
once, here, so the charts and the page never touch raw dicts. An attempt that fails a check (tampered,
misplaced) or whose files do not have the expected shape becomes a `Skipped` entry with the reason;
the page still builds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mini_kv.codec import from_json
from mini_kv.errors import UserError
from mini_kv.judge.regression import RegressionVerdict
from mini_kv.profile.compare import Ident, MetricRow
from mini_kv.profile.store import PROFILES_DIR  # Nsight Compute profiles, not attempts
from mini_kv.solexec.workload import DEFAULT_TOLERANCE
from mini_kv.status import Status
from mini_kv.store.attempts import AttemptInvalid, iter_attempt_dirs
from mini_kv.store.index import check_attempt
from mini_kv.store.records import SOL_FORMAT


class MalformedAttempt(Exception):
    """An attempt whose files pass their hash check but do not hold what the report reads."""


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass(frozen=True)
class Side:
    """One side (candidate or reference) of a timed case: raw samples in µs, flattened over repeats."""

    samples: tuple[float, ...]
    p50: float | None
    p95: float | None
    cv: float | None


@dataclass(frozen=True)
class BenchCase:
    id: str
    dtype: str | None
    method: str | None
    timer: str | None
    l2: str | None
    candidate: Side | None  # None: the benchmark of this case failed (see `status`)
    reference: Side | None
    speedup: float | None
    stable: bool | None
    unstable_why: str
    bytes: float | None
    flops: float | None
    gbps: float | None
    tflops: float | None
    peak_bw: float | None  # bytes/s of the environment's measured copy bandwidth, as the case recorded it
    status: str | None
    reason: str  # why the benchmark of this case failed, when it did


@dataclass(frozen=True)
class CorrCase:
    id: str
    base: str  # the case id without its dtype suffix: the heat map's row
    dtype: str
    kind: str
    status: str
    max_abs: float | None
    max_rel: float | None
    atol: float | None
    rtol: float | None
    reason: str


@dataclass(frozen=True)
class Attempt:
    task_id: str
    candidate: str
    attempt_id: str
    created_at: str
    status: str
    device: str
    environment_key: str
    suite_hash: str
    fmt: str  # "task" or "sol-execbench"
    path: Path
    files: tuple[str, ...]
    environment: dict
    geomean: float | None
    stable: bool | None
    bench: tuple[BenchCase, ...]
    correctness: tuple[CorrCase, ...]
    contract: tuple[tuple[str, str], ...]  # (check, status): opcheck, gradcheck, integrity, kernels
    regression: RegressionVerdict | None  # regression.json, when the attempt was judged against a baseline
    source: str = "-"  # the candidate's git commit (store.index.source_label)

    @property
    def group(self) -> tuple[str, str, str, str]:
        """What the leaderboard groups by: only timings of one suite, environment and device compare."""
        return (self.task_id, self.suite_hash, self.environment_key, self.device)


@dataclass(frozen=True)
class ProfilePair:
    """Two profiles of one (task, case): their metric rows, or why they do not compare."""

    A: Ident
    B: Ident
    refused: str  # "" when they compare
    rows: tuple[MetricRow, ...]


@dataclass
class Store:
    artifacts: Path
    attempts: list[Attempt] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def tasks(self) -> list[str]:
        return sorted({a.task_id for a in self.attempts})


# ------------------------------------------------------------------------------------------ reading


def _num(x) -> float | None:
    """A finite number, else None (NaN and infinities would break axis limits and mean nothing here)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _flat(samples) -> tuple[float, ...]:
    """Samples as stored: a list of repeats (lists) or one flat list."""
    if not isinstance(samples, list):
        raise MalformedAttempt("samples is not a list")
    out: list[float] = []
    for s in samples:
        for x in s if isinstance(s, list) else [s]:
            v = _num(x)
            if v is None:
                raise MalformedAttempt(f"sample {x!r} is not a number")
            out.append(v)
    return tuple(out)


def _side(rec) -> Side | None:
    if not isinstance(rec, dict):
        return None
    summary = rec.get("summary") or {}
    overall = summary.get("overall") or {}
    return Side(
        _flat(rec.get("samples", [])),
        _num(overall.get("p50")),
        _num(overall.get("p95")),
        _num(summary.get("p50_robust_cv")),
    )


def _bench_case(c: dict) -> BenchCase:
    stab = c.get("stability") or {}
    roof = c.get("roofline") or {}
    why = stab.get("reasons") or stab.get("reason") or ""
    return BenchCase(
        id=str(c.get("id")),
        dtype=c.get("dtype"),
        method=c.get("method"),
        timer=c.get("timer"),
        l2=c.get("l2"),
        candidate=_side(c.get("candidate")),
        reference=_side(c.get("reference")),
        speedup=_num(c.get("speedup")),
        stable=stab.get("stable") if isinstance(stab.get("stable"), bool) else None,
        unstable_why="; ".join(map(str, why)) if isinstance(why, list) else str(why),
        bytes=_num(c.get("bytes")),
        flops=_num(c.get("flops")),
        gbps=_num(roof.get("gbps")),
        tflops=_num(roof.get("tflops")),
        peak_bw=_num(c.get("peak_bw_Bps")),
        status=c.get("status"),
        reason=str(c.get("reason") or c.get("integrity") or ""),
    )


def _strip_dtype(case_id: str, dtype: str) -> str:
    return case_id[: -len(dtype) - 1] if dtype and case_id.endswith("-" + dtype) else case_id


def _task_corr(correctness: dict, card: dict) -> tuple[CorrCase, ...]:
    tols = card.get("tolerances") or {}
    out = []
    for r in correctness.get("cases") or []:
        dtype = str(r.get("dtype") or "-")
        tol = tols.get(dtype) or {}
        out.append(
            CorrCase(
                str(r["id"]),
                _strip_dtype(str(r["id"]), dtype),
                dtype,
                str(r.get("kind", "")),
                str(r.get("status")),
                _num(r.get("max_abs_err")),
                _num(r.get("max_rel_err")),
                _num(tol.get("atol")),
                _num(tol.get("rtol")),
                str(r.get("reason") or r.get("integrity") or ""),
            )
        )
    return tuple(out)


def _sol_corr(correctness: dict, definition: dict, workloads: dict[str, dict]) -> tuple[CorrCase, ...]:
    outs = (definition.get("outputs") or {}).values()
    dtype = "/".join(sorted({str(o.get("dtype")) for o in outs if isinstance(o, dict)})) or "-"
    out = []
    for r in correctness.get("cases") or []:
        c = r.get("correctness") or {}
        tol = workloads.get(str(r.get("id")), {}).get("tolerance") or {}
        status = str(r.get("status"))
        out.append(
            CorrCase(
                str(r["id"]),
                str(r["id"]),
                dtype,
                "workload",
                status,
                _num(c.get("max_absolute_error")),
                _num(c.get("max_relative_error")),
                _num(tol.get("max_atol", DEFAULT_TOLERANCE["max_atol"])),
                _num(tol.get("max_rtol", DEFAULT_TOLERANCE["max_rtol"])),
                "" if status == Status.PASSED else str(r.get("log") or "")[:300],
            )
        )
    return tuple(out)


def _contract(correctness: dict, benchmark: dict) -> tuple[tuple[str, str], ...]:
    """The contract checks as correctness.json and benchmark.json summarise them (claims_mismatch holds
    those summaries to what the per-case records give)."""
    summ = correctness.get("summary") or {}
    checks = [(k, str(v)) for k, v in sorted((summ.get("contract") or {}).items())]
    bench = benchmark.get("summary") or {}
    integrity = list(summ.get("integrity_failures") or []) + list(bench.get("integrity_failures") or [])
    checks.append(
        ("integrity", f"{Status.FAILED}: " + ", ".join(map(str, integrity)) if integrity else Status.PASSED)
    )
    missing = summ.get("missing_kernels")
    if missing:
        checks.append(("kernels", f"{Status.FAILED}: missing " + ", ".join(map(str, missing))))
    return tuple(checks)


def _workloads(path: Path, listed: set[str]) -> dict[str, dict]:
    if "workload.jsonl" not in listed:
        return {}
    out = {}
    for line in (path / "workload.jsonl").read_text().splitlines():
        if line.strip():
            w = json.loads(line)
            out[str(w.get("uuid"))] = w
    return out


def read_one(path: Path) -> Attempt:
    """One attempt as the report sees it; AttemptInvalid or MalformedAttempt when it cannot be used."""
    checked = check_attempt(path)
    header, files, row = checked.header, checked.files, checked.row
    listed = {f["path"] for f in header["files"]}
    try:
        bench, corr = files["benchmark.json"], files["correctness.json"]
        sol = header.get("format") == SOL_FORMAT
        if sol:
            cases = _sol_corr(corr, files["definition.json"], _workloads(path, listed))
        else:
            cases = _task_corr(corr, files["task_card.json"].get("card") or {})
        return Attempt(
            task_id=row.task_id,
            candidate=row.candidate,
            attempt_id=row.attempt_id,
            created_at=str(row.created_at or ""),
            status=row.status,
            device=str(row.device),
            environment_key=str(row.environment_key),
            suite_hash=str(row.suite_hash),
            fmt="sol-execbench" if sol else "task",
            path=Path(path),
            files=tuple(sorted(listed)),
            environment=files["environment.json"],
            geomean=_num(row.geomean_speedup),
            stable=None if row.stable is None else bool(row.stable),
            bench=tuple(_bench_case(c) for c in bench["cases"]),
            correctness=cases,
            contract=_contract(corr, bench),
            regression=from_json(RegressionVerdict, files["regression.json"])
            if "regression.json" in files
            else None,
            source=row.source,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedAttempt(f"unexpected content ({type(exc).__name__}: {exc})") from None


def load_store(artifacts: Path, explicit: list[Path] | None = None) -> Store:
    """Every attempt under `artifacts` (or only the `explicit` directories), each verified and typed."""
    store = Store(Path(artifacts))
    dirs = (
        list(explicit)
        if explicit
        else [d for d in iter_attempt_dirs(artifacts) if d.parent.name != PROFILES_DIR]
    )
    for d in dirs:
        if not d.is_dir():
            store.skipped.append(Skipped(str(d), "not a directory"))
            continue
        try:
            store.attempts.append(read_one(d))
        except (AttemptInvalid, MalformedAttempt, OSError, UserError) as exc:  # UserError: unreadable JSON
            store.skipped.append(Skipped(str(d), str(exc).removeprefix(f"{d}: ")))
    store.attempts.sort(key=lambda a: (a.task_id, a.candidate, a.created_at, a.attempt_id))
    return store
