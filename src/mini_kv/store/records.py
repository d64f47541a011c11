"""correctness.json and benchmark.json: the one layout both front doors write (schema_version 2,
schemas/correctness.schema.json and schemas/benchmark.schema.json), built here for both writers and
read here for every reader, older versions migrated in memory (the stored files are sealed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mini_kv.model import JailRecord, WorkerResults
from mini_kv.status import V1_BENCH_WORDS, V1_CASE_WORDS, V1_CHECK_WORDS
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
    settings: dict | None
    cases: list
    summary: dict | None
    schema_version: int = RECORD_VERSION


def correctness_document(
    fmt: str, device: str, salt: str, results: WorkerResults, summary: CorrectnessSummary | None
) -> CorrectnessRecord:
    """correctness.json of a run: the worker's load, cases, contract, incidents and sandbox."""
    r = results
    return CorrectnessRecord(fmt, device, salt, r.load, r.cases, r.contract, r.incidents, r.sandbox, summary)
