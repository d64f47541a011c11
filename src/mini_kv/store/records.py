"""correctness.json and benchmark.json: the one layout both front doors write (schema_version 2,
schemas/correctness.schema.json and schemas/benchmark.schema.json), built here for both writers and
read here for every reader, older versions migrated in memory (the stored files are sealed): once an
attempt has passed the store's checks, read_records types its per-case records for every reader."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from mini_kv.codec import from_json
from mini_kv.judge.regression import RegressionVerdict
from mini_kv.model import JailRecord, WorkerResults
from mini_kv.settings import DEFAULT_TOLERANCE, RunSettings
from mini_kv.status import V1_BENCH_WORDS, V1_CASE_WORDS, V1_CHECK_WORDS, Status
from mini_kv.store.attempts import AttemptInvalid, AttemptTampered
from mini_kv.store.headline import CorrectnessSummary
from mini_kv.store.jsonfile import read_versioned

RECORD_VERSION = 2
CARD_FORMAT = "task-card"
SOL_FORMAT = "sol-execbench"


def _word(status, words: dict):
    return words.get(status, status) if isinstance(status, str) else status


def _renamed(records, words: dict):
    if not isinstance(records, list):
        return records
    return [
        {**r, "status": _word(r["status"], words)} if isinstance(r, dict) and "status" in r else r
        for r in records
    ]


def correctness_v1_to_v2(doc: dict) -> dict:
    """Version 1 (task card: `cases`; SOL: `workloads`; PASS/FAIL) as version 2."""
    sol = "workloads" in doc
    out = {k: v for k, v in doc.items() if k != "workloads"}
    out.update(
        schema_version=2,
        format=SOL_FORMAT if sol else CARD_FORMAT,
        cases=_renamed(doc.get("workloads") if sol else doc.get("cases"), V1_CASE_WORDS),
    )
    if isinstance(doc.get("contract"), dict):
        out["contract"] = {
            k: {**v, "status": _word(v.get("status"), V1_CHECK_WORDS)} if isinstance(v, dict) else v
            for k, v in doc["contract"].items()
        }
    summary = doc.get("summary")
    if isinstance(summary, dict) and isinstance(summary.get("contract"), dict):
        out["summary"] = {
            **summary,
            "contract": {k: _word(v, V1_CHECK_WORDS) for k, v in summary["contract"].items()},
        }
    return out


def benchmark_v1_to_v2(doc: dict) -> dict:
    """Version 1 (SOL with `settings`, task card without; ERROR) as version 2."""
    return {
        "settings": None,
        **doc,
        "schema_version": 2,
        "format": SOL_FORMAT if "settings" in doc else CARD_FORMAT,
        "cases": _renamed(doc.get("cases"), V1_BENCH_WORDS),
    }


_KINDS = {
    "correctness.json": ("correctness", correctness_v1_to_v2),
    "benchmark.json": ("benchmark", benchmark_v1_to_v2),
}


def read_record(path: Path) -> dict:
    """correctness.json or benchmark.json (by `path`'s name) as version 2, checked against its schema;
    store.jsonfile.RecordUnusable naming the file otherwise."""
    schema, migrate = _KINDS[Path(path).name]
    return read_versioned(path, RECORD_VERSION, schema, migrations={1: migrate})


class _Checked:
    """A record checked against schemas/<SCHEMA>.schema.json when it is made: validated on write as on read."""

    SCHEMA = ""

    def __post_init__(self):
        from mini_kv.load.schema import validate
        from mini_kv.store.atomic import _default

        validate(json.loads(json.dumps(self, default=_default)), self.SCHEMA, f"{self.SCHEMA}.json")


@dataclass(frozen=True)
class CorrectnessRecord(_Checked):
    """correctness.json: load, cases (a SOL workload is a case), contract, incidents, sandbox, summary."""

    SCHEMA = "correctness"
    format: str
    device: str
    seed_salt: str
    load: dict | None
    cases: list
    contract: dict
    incidents: list
    sandbox: JailRecord | None
    summary: CorrectnessSummary | None
    schema_version: int = RECORD_VERSION


@dataclass(frozen=True)
class BenchmarkRecord(_Checked):
    """benchmark.json: one record per bench case; `settings`: the timing settings the run used (mini_kv.settings)."""

    SCHEMA = "benchmark"
    format: str
    device: str
    settings: RunSettings | None  # as written; a reader of stored ones gets its JSON (a dict)
    cases: list
    summary: dict | None
    schema_version: int = RECORD_VERSION


def correctness_document(
    fmt: str, device: str, salt: str, results: WorkerResults, summary: CorrectnessSummary | None
) -> CorrectnessRecord:
    """correctness.json of a run: the worker's load, cases, contract, incidents and sandbox."""
    r = results
    return CorrectnessRecord(fmt, device, salt, r.load, r.cases, r.contract, r.incidents, r.sandbox, summary)


# ------------------------------------------------------------------------------------------ reading


class MalformedRecord(AttemptInvalid):
    """An attempt's records pass their hash and schema checks but do not hold what a reader reads."""


def finite(x) -> float | None:
    """A finite number, else None (NaN and infinities would break axis limits and mean nothing here)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return float(x)
    return None


def _flat(samples) -> tuple[float, ...]:
    """Samples as stored: a list of repeats (lists) or one flat list."""
    if not isinstance(samples, list):
        raise MalformedRecord("samples is not a list")
    out: list[float] = []
    for x in (x for s in samples for x in (s if isinstance(s, list) else [s])):
        if finite(x) is None:
            raise MalformedRecord(f"sample {x!r} is not a number")
        out.append(float(x))
    return tuple(out)


@dataclass(frozen=True)
class SideTimes:
    """One side (candidate or reference) of a timed case: raw samples in µs, flattened over repeats, and
    the summary the record gives (engine.Side as written)."""

    samples: tuple[float, ...]
    p50: float | None
    p95: float | None
    cv: float | None

    @classmethod
    def of(cls, rec) -> SideTimes | None:
        if not isinstance(rec, dict):
            return None
        summary = rec.get("summary") or {}
        overall = summary.get("overall") or {}
        p50, p95, cv = overall.get("p50"), overall.get("p95"), summary.get("p50_robust_cv")
        return cls(_flat(rec.get("samples", [])), finite(p50), finite(p95), finite(cv))


@dataclass(frozen=True)
class BenchCase:
    """benchmark.json's record of one case, as read: how it was timed, both sides, the speedup and the
    stability verdict, the roofline; or (candidate None) the status and reason of a benchmark that failed."""

    id: str
    dtype: str | None
    method: str | None
    timer: str | None
    l2: str | None
    candidate: SideTimes | None  # None: the benchmark of this case failed (see `status`)
    reference: SideTimes | None
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
    throttled: str = ""  # the GPU's throttle reasons while it was timed (mini_kv.clocks), "" if none

    @classmethod
    def of(cls, c: dict) -> BenchCase:
        stab, roof, clk = c.get("stability") or {}, c.get("roofline") or {}, c.get("clocks") or {}
        why = stab.get("reasons") or stab.get("reason") or ""
        return cls(
            id=str(c.get("id")),
            dtype=c.get("dtype"),
            method=c.get("method"),
            timer=c.get("timer"),
            l2=c.get("l2"),
            candidate=SideTimes.of(c.get("candidate")),
            reference=SideTimes.of(c.get("reference")),
            speedup=finite(c.get("speedup")),
            stable=stab.get("stable") if isinstance(stab.get("stable"), bool) else None,
            unstable_why="; ".join(map(str, why)) if isinstance(why, list) else str(why),
            bytes=finite(c.get("bytes")),
            flops=finite(c.get("flops")),
            gbps=finite(roof.get("gbps")),
            tflops=finite(roof.get("tflops")),
            peak_bw=finite(c.get("peak_bw_Bps")),
            status=c.get("status"),
            reason=str(c.get("reason") or c.get("integrity") or ""),
            throttled=", ".join(map(str, clk.get("reasons") or [])) if clk.get("throttled") is True else "",
        )


@dataclass(frozen=True)
class CorrCase:
    """correctness.json's record of one case (a SOL workload), as read, with the tolerance it was held to."""

    id: str
    base: str  # the case id without its dtype suffix
    dtype: str
    kind: str
    status: str
    max_abs: float | None
    max_rel: float | None
    atol: float | None
    rtol: float | None
    reason: str  # why it failed (a SOL workload's log)


def _strip_dtype(case_id: str, dtype: str) -> str:
    return case_id[: -len(dtype) - 1] if dtype and case_id.endswith("-" + dtype) else case_id


def _card_corr(correctness: dict, card: dict) -> tuple[CorrCase, ...]:
    tols, out = card.get("tolerances") or {}, []
    for r in correctness.get("cases") or []:
        cid, dtype = str(r["id"]), str(r.get("dtype") or "-")
        tol = tols.get(dtype) or {}
        errs = finite(r.get("max_abs_err")), finite(r.get("max_rel_err"))
        kind, status = str(r.get("kind", "")), str(r.get("status"))
        out.append(CorrCase(cid, _strip_dtype(cid, dtype), dtype, kind, status, *errs, *_tol(tol), _why(r)))
    return tuple(out)


def _why(r: dict) -> str:
    return str(r.get("reason") or r.get("log") or r.get("integrity") or "")


def _tol(tol: dict, prefix: str = "") -> tuple[float | None, float | None]:
    return finite(tol.get(f"{prefix}atol")), finite(tol.get(f"{prefix}rtol"))


def _sol_corr(correctness: dict, definition: dict, attempt: Path, header: dict) -> tuple[CorrCase, ...]:
    data = (attempt / "workload.jsonl").read_bytes()
    listed = {e.get("path"): e.get("sha256") for e in header.get("files") or [] if isinstance(e, dict)}
    if hashlib.sha256(data).hexdigest() != listed.get("workload.jsonl"):  # read once, checked here
        raise AttemptTampered(f"{attempt}: workload.jsonl changed after the store checked it")
    lines = data.decode().splitlines()
    tols = {str(w.get("uuid")): w.get("tolerance") for w in map(json.loads, filter(str.strip, lines))}
    outs = (definition.get("outputs") or {}).values()
    dtype = "/".join(sorted({str(o.get("dtype")) for o in outs if isinstance(o, dict)})) or "-"
    out = []
    for r in correctness.get("cases") or []:
        c, cid, status = r.get("correctness") or {}, str(r["id"]), str(r.get("status"))
        tol = {**DEFAULT_TOLERANCE, **(tols.get(cid) or {})}
        errs = finite(c.get("max_absolute_error")), finite(c.get("max_relative_error"))
        out.append(CorrCase(cid, cid, dtype, "workload", status, *errs, *_tol(tol, "max_"), _why(r)))
    return tuple(out)


def _contract(correctness: dict, benchmark: dict) -> tuple[tuple[str, str], ...]:
    """The contract checks as correctness.json and benchmark.json summarise them (claims_mismatch holds
    those summaries to what the per-case records give)."""
    summ, bench = correctness.get("summary") or {}, benchmark.get("summary") or {}
    checks = [(k, str(v)) for k, v in sorted((summ.get("contract") or {}).items())]
    integrity = list(summ.get("integrity_failures") or []) + list(bench.get("integrity_failures") or [])
    checks.append(
        ("integrity", f"{Status.FAILED}: " + ", ".join(map(str, integrity)) if integrity else Status.PASSED)
    )
    missing = summ.get("missing_kernels")
    if missing:
        checks.append(("kernels", f"{Status.FAILED}: missing " + ", ".join(map(str, missing))))
    return tuple(checks)


@dataclass(frozen=True)
class AttemptRecords:
    """An attempt's records, typed once for every reader: benchmark.json's and correctness.json's cases,
    the contract checks (opcheck, gradcheck, integrity, kernels: (check, status)), regression.json."""

    bench: tuple[BenchCase, ...]
    correctness: tuple[CorrCase, ...]
    contract: tuple[tuple[str, str], ...]
    regression: RegressionVerdict | None


def read_records(path: Path, header: dict, files: dict[str, dict]) -> AttemptRecords:
    """The records of an attempt that passed the store's checks (index.check_attempt: `header`, `files`),
    typed; MalformedRecord when they do not hold what they should."""
    try:
        bench, corr = files["benchmark.json"], files["correctness.json"]
        if header.get("format") == SOL_FORMAT:
            cases = _sol_corr(corr, files["definition.json"], Path(path), header)
        else:
            cases = _card_corr(corr, files["task_card.json"].get("card") or {})
        reg = files.get("regression.json")
        return AttemptRecords(
            tuple(map(BenchCase.of, bench["cases"])),
            cases,
            _contract(corr, bench),
            None if reg is None else from_json(RegressionVerdict, reg),
        )
    except MalformedRecord as exc:  # a sample that is not one
        raise MalformedRecord(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedRecord(f"{path}: unexpected content ({type(exc).__name__}: {exc})") from None
