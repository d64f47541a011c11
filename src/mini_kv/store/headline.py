"""An attempt's headline (status, stability, per-case speedups, geometric mean), derived from its records.

The headline is what the index and the leaderboard rank by. It is never taken from what an attempt
*says* about itself (attempt.json's `status` / `benchmark`, or a `summary` block): it is recomputed
here from the per-case records — correctness.json's case verdicts (a SOL workload is a case) and benchmark.json's raw
timing samples — whose SHA-256 attempt.json lists and `read_attempt` checks. The writers (`verify`
and `bench`) build the header with these same functions, so the writer and the verifier cannot
disagree: any difference between a stored claim and the recomputation is a forgery (`claims_mismatch`).

Records come from disk (their layout checked against schemas/ by store.records) and their contents may be
anything; every malformed record raises `RecordError` (naming the file and what is wrong), never a bare
KeyError/TypeError.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from mini_kv import roofline
from mini_kv.clocks import throttled
from mini_kv.codec import optional
from mini_kv.judge.regression import timed
from mini_kv.model import WorkerResults
from mini_kv.settings import DEFAULTS
from mini_kv.status import VIOLATION_STATUSES, BuildStatus, Status, verdict_of, verdict_of_statuses

# the statuses a SOL attempt that did not pass may carry (solexec.run.record_attempt)
SOL_FAILED_STATUSES = (Status.COMPILE_ERROR, Status.FAILED)


class RecordError(Exception):
    """A per-case record that cannot be used; `file` names it, the message says what is wrong."""

    def __init__(self, file: str, message: str):
        super().__init__(f"{file}: {message}")
        self.file = file


@dataclass(frozen=True)
class CaseHeadline:
    """One bench case, recomputed from its raw samples."""

    id: str
    p50_us: float
    p95_us: float
    speedup: float
    stable: bool
    impossible: str | None = None  # why its time is below the roofline floor (roofline.impossible_time)


@dataclass(frozen=True)
class CorrectnessSummary:
    """correctness.json's (and attempt.json's) `correctness` summary: whether every case passed and the
    counts (a card's by kind: passed, total, skipped; a SOL attempt's by status); a card's also the
    kernels it registered and lacks, the cases its own factory broke, the defences that fired, the
    contract checks' statuses."""

    ok: bool
    counts: dict
    kernels: dict | None = optional()
    missing_kernels: list | None = optional()
    invalid_cases: list | None = optional()
    integrity_failures: list | None = optional()
    contract: dict | None = optional()


@dataclass(frozen=True)
class Headline:
    status: str
    correctness: CorrectnessSummary | None  # None when nothing ran
    benchmark: dict | None  # {"ran", "ok", "stable", "geomean_speedup", ...}; None when nothing ran
    cases: tuple[CaseHeadline, ...]  # the bench cases that produced timings


def _need(cond: bool, file: str, message: str) -> None:
    if not cond:
        raise RecordError(file, message)


def _samples(rec: dict, who: str, where: str) -> list[list[float]]:
    side = rec.get(who)
    _need(isinstance(side, dict), "benchmark.json", f"{where}: `{who}` is not an object")
    samples = side.get("samples")
    ok = (
        isinstance(samples, list)
        and samples
        and all(isinstance(r, list) and r for r in samples)
        and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for r in samples
            for x in r
        )
    )
    # exactly what the worker's statistics accept (stats._as_array); the speedup then needs positive P50s
    _need(bool(ok), "benchmark.json", f"{where}: `{who}.samples` must be non-empty lists of finite times")
    return samples


def _limit(stab: dict, key: str, default: float, where: str) -> float:
    value = stab.get(key, default)
    _need(
        isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
        "benchmark.json",
        f"{where}: `stability.{key}` must be a number >= 0",
    )
    return float(value)


def case_headline(rec: dict) -> CaseHeadline:
    """P50/P95, speedup and stability of one bench case, recomputed from its raw samples.

    The stability limits are the ones recorded with the case (the card's, or --max-cv's)."""
    from mini_kv import stats

    cid = rec["id"]
    where = f"case {cid}"
    cs = stats.summarize_repeats(_samples(rec, "candidate", where))
    rs = stats.summarize_repeats(_samples(rec, "reference", where))
    stab = rec.get("stability") if isinstance(rec.get("stability"), dict) else {}
    stable = stats.stability(
        cs,
        rs,
        _limit(stab, "max_cv", DEFAULTS.max_cv, where),  # a record without its own: the defaults
        _limit(stab, "max_p95_cv", DEFAULTS.max_p95_cv, where),
    ).stable
    p50 = cs.overall.p50
    return CaseHeadline(
        cid,
        p50,
        cs.overall.p95,
        stats.speedup(rs.overall.p50, p50),
        bool(stable),
        roofline.impossible_time(rec, p50),
    )


def _geomean(cases: list[CaseHeadline]) -> float | None:
    from mini_kv import stats

    return stats.geomean([c.speedup for c in cases]) if cases else None


# --------------------------------------------------------------------------------- task-card format


def summarize_correctness(results: WorkerResults, device: str) -> CorrectnessSummary:
    """correctness.json's summary from its records: load, cases, contract checks, incidents."""
    counts: dict[str, dict[str, int]] = {}
    for rec in results.cases:
        group = {"core": "core", "extra": "extra", "edge": "edge/illegal", "illegal": "edge/illegal"}[
            rec["kind"]
        ]
        c = counts.setdefault(group, {"passed": 0, "total": 0, "skipped": 0})
        if rec["status"] == Status.SKIPPED:
            c["skipped"] += 1
            continue
        c["total"] += 1
        c["passed"] += rec["status"] == Status.PASSED
    load = results.load or {"ok": False}
    kernels = load.get("kernels", {})
    needed = ["CPU", "Meta"] + (["CUDA"] if device.startswith("cuda") else [])
    missing = [k for k in needed if not kernels.get(k)]
    contract = results.contract
    contract_ok = all(r.get("status") == Status.PASSED for r in contract.values())
    # reason codes of the defences (mini_kv.worker.integrity), wherever they fired
    integrity = [
        r["integrity"]
        for r in [*results.incidents, load, *results.cases, *contract.values()]
        if r.get("integrity")
    ]
    cases_ok = all(r["status"] in (Status.PASSED, Status.SKIPPED) for r in results.cases)
    ok = bool(load.get("ok")) and cases_ok and contract_ok and not missing and not integrity
    # cases whose params broke the card's own input factory: the card's fault, not the candidate's
    invalid = [r["id"] for r in results.cases if r["status"] == Status.INVALID_CASE]
    statuses = {k: v.get("status") for k, v in contract.items()}
    return CorrectnessSummary(ok, counts, kernels, missing, invalid, integrity, statuses)


def _untimed(records: list) -> tuple[list, list]:
    """(skipped, failed) ids of the cases without timings: a case SKIPPED (too large for the device
    within the budget) says why in its record and is not a failure."""
    untimed = [r for r in records if not timed(r)]
    return (
        [r["id"] for r in untimed if r.get("status") == Status.SKIPPED],
        [r["id"] for r in untimed if r.get("status") != Status.SKIPPED],
    )


def summarize_benchmark(records: list, skipped: bool) -> tuple[dict, list[CaseHeadline]]:
    """benchmark.json's summary and the recomputed bench cases, from the per-case records."""
    if skipped:
        return {"ran": False, "ok": True, "stable": None, "reason": "--skip-benchmark"}, []
    good = [r for r in records if timed(r)]
    skipped_cases, failed = _untimed(records)
    post_bad = [r["id"] for r in good if not r["post_check"]["ok"]]
    cases = [case_headline(r) for r in good]
    stable = all(c.stable for c in cases) if cases else None
    impossible = [c.impossible for c in cases if c.impossible]
    integrity = [r["integrity"] for r in records if r.get("integrity")] + [
        r["post_check"]["integrity"] for r in good if r["post_check"].get("integrity")
    ]
    return (
        {
            "ran": True,
            "ok": not failed and not post_bad,
            "stable": stable,
            "failed": failed,
            **({"skipped": skipped_cases} if skipped_cases else {}),
            **({"impossible": impossible} if impossible else {}),
            # the timed cases whose SM clock was held back while they were timed (mini_kv.clocks)
            **({"throttled": hot} if (hot := throttled(good)) else {}),
            "post_check_failed": post_bad,
            "integrity_failures": integrity,
            "geomean_speedup": _geomean(cases),
        },
        cases,
    )


def card_headline(
    compile_status: str, correctness: WorkerResults, bench_records: list, skipped: bool, device: str
) -> Headline:
    """The headline of a task-card attempt from the worker's results (or correctness.json's, read back);
    `bench_records` benchmark.json's `cases`."""
    if compile_status != BuildStatus.OK:
        status = Status.COMPILE_ERROR if compile_status == BuildStatus.ERROR else Status.COMPILE_TIMEOUT
        return Headline(status, None, None, ())
    try:
        corr = summarize_correctness(correctness, device)
    except (KeyError, TypeError, AttributeError) as exc:
        raise RecordError("correctness.json", f"records malformed ({type(exc).__name__}: {exc})") from None
    try:
        bench, cases = summarize_benchmark(bench_records, skipped)
    except (KeyError, TypeError, AttributeError) as exc:
        raise RecordError("benchmark.json", f"records malformed ({type(exc).__name__}: {exc})") from None
    # a defence that fired decides the status, whichever stage saw it (status.VIOLATIONS)
    violated = verdict_of([*corr.integrity_failures, *(bench.get("integrity_failures") or [])])
    if corr.invalid_cases:
        status = Status.INVALID_CASE
    elif violated:
        status = violated
    elif not corr.ok:
        status = Status.INCORRECT
    elif bench["ran"] and not bench["ok"]:
        status = Status.BENCHMARK_ERROR
    elif bench.get("impossible"):
        status = Status.IMPOSSIBLE_TIME
    else:
        status = Status.PASSED
    return Headline(status, corr, bench, tuple(cases))


# ---------------------------------------------------------------------------------- SOL format


def _sol_passed(workloads: list, counts: dict, impossible: bool) -> bool:
    """Every workload passed (a SKIPPED one, too large for the device within its budget, neither passes
    nor fails), or was timed below its floor: bench marks that IMPOSSIBLE_TIME (solexec.floor), and it is
    recomputed here from the bench record, so a workload relabelled PASSED still gives the attempt that
    status."""
    passed = counts.get(Status.PASSED, 0)
    if passed > 0 and passed + counts.get(Status.SKIPPED, 0) == len(workloads):
        return True
    ok = (Status.PASSED, Status.SKIPPED, Status.IMPOSSIBLE_TIME)
    return impossible and all(w["status"] in ok for w in workloads)


def sol_headline(workloads: list, bench_records: list, failed_status: str = Status.FAILED) -> Headline:
    """The headline of a SOL-ExecBench attempt: PASSED only when there are workloads and every one
    passed; `failed_status` is the status otherwise (COMPILE_ERROR or FAILED)."""
    counts = dict(Counter(w["status"] for w in workloads))
    records = [r for r in bench_records if timed(r)]
    cases = [case_headline(r) for r in records]
    impossible = [c.impossible for c in cases if c.impossible]
    passed = _sol_passed(workloads, counts, bool(impossible))
    bench = {
        "ran": bool(records),
        "ok": passed,
        "stable": all(c.stable for c in cases) if passed and cases else None,
        "geomean_speedup": _geomean(cases) if passed else None,
        **({"impossible": impossible} if impossible else {}),
        **({"throttled": hot} if (hot := throttled(records)) else {}),
    }
    status = (Status.IMPOSSIBLE_TIME if impossible else Status.PASSED) if passed else failed_status
    if failed_status != Status.COMPILE_ERROR:  # a defence that fired decides it (status.VIOLATIONS)
        status = verdict_of_statuses(counts) or status
    return Headline(status, CorrectnessSummary(passed, counts), bench, tuple(cases))


# ------------------------------------------------------------------------------ claims vs derived

HEADLINE_FIELDS = ("ran", "stable", "geomean_speedup")


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0) or (math.isnan(a) and math.isnan(b))
    return a == b


def _benchmark_claims(head: Headline, header: dict, benchmark: dict, check, out: list[str]) -> None:
    for file, block in (
        ("attempt.json", header.get("benchmark")),
        ("benchmark.json", benchmark.get("summary")),
    ):
        if head.benchmark is None:
            if isinstance(block, dict) and (
                block.get("ran") or block.get("stable") or block.get("geomean_speedup") is not None
            ):
                out.append(f"{file} benchmark: claims a benchmark, but nothing ran ({head.status})")
        elif not isinstance(block, dict):
            out.append(f"{file} benchmark: {block!r} is not the summary its records give")
        else:
            for key in HEADLINE_FIELDS:
                check(
                    file,
                    f"benchmark.{key}" if file == "attempt.json" else f"summary.{key}",
                    block.get(key),
                    head.benchmark.get(key),
                )


def _case_claims(head: Headline, records: list, check) -> None:
    by_id = {c.id: c for c in head.cases}
    for rec in records:
        c = by_id.get(rec["id"]) if timed(rec) else None
        if c is None:
            continue
        where = f"case {c.id}"
        check("benchmark.json", f"{where} speedup", rec.get("speedup"), c.speedup)
        stab = rec.get("stability")
        check(
            "benchmark.json",
            f"{where} stability.stable",
            stab.get("stable") if isinstance(stab, dict) else None,
            c.stable,
        )
        overall = (rec.get("candidate") or {}).get("summary") or {}
        overall = overall.get("overall") if isinstance(overall, dict) else None
        overall = overall if isinstance(overall, dict) else {}
        check("benchmark.json", f"{where} candidate p50", overall.get("p50"), c.p50_us)
        check("benchmark.json", f"{where} candidate p95", overall.get("p95"), c.p95_us)


# an attempt's status before each violation had one status (status.VIOLATIONS): a caught task card was
# INCORRECT or BENCHMARK_ERROR, a caught SOL solution FAILED. Neither word nor the new one is ranked, so
# reading the old one as the new one lets no rewrite gain anything.
_WORDS_BEFORE_VIOLATIONS = frozenset({Status.INCORRECT, Status.BENCHMARK_ERROR, Status.FAILED})


def _status_word(said, derived):
    """`said`, or `derived` where `said` is what an attempt written before the one vocabulary says."""
    if derived in VIOLATION_STATUSES and said in _WORDS_BEFORE_VIOLATIONS:
        return derived
    return said


def claims_mismatch(head: Headline, header: dict, correctness: dict, benchmark: dict) -> list[str]:
    """Every place where a stored claim differs from the recomputation, as 'file field: says X, records give Y'."""
    out = []

    def check(file: str, field: str, said, derived) -> None:
        if not _same(said, derived):
            out.append(f"{file} {field}: says {said!r}, its records give {derived!r}")

    check("attempt.json", "status", _status_word(header.get("status"), head.status), head.status)
    _benchmark_claims(head, header, benchmark, check, out)
    derived_ok = None if head.correctness is None else head.correctness.ok
    for file, block in (
        ("attempt.json", header.get("correctness")),
        ("correctness.json", correctness.get("summary")),
    ):
        said = block.get("ok") if isinstance(block, dict) else None
        if said is not None or derived_ok:
            check(file, "correctness.ok" if file == "attempt.json" else "summary.ok", said, derived_ok)
    _case_claims(head, benchmark["cases"], check)
    ids = [r["id"] for r in benchmark["cases"]]
    if len(ids) != len(set(ids)):
        out.append("benchmark.json cases: a case id appears twice")
    return out
