"""correctness.json / benchmark.json: one layout (schema_version 2) for both front doors, validated against
schemas/ on write and read; version 1 records (both layouts, PASS/FAIL words) migrate in memory."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from test_index import make_attempt, snapshot
from test_store_forgery import _reseal

from mini_kv.codec import from_json, to_json
from mini_kv.load.schema import is_valid
from mini_kv.model import WorkerResults
from mini_kv.status import Status
from mini_kv.store.attempts import AttemptInvalid, AttemptTampered, read_attempt
from mini_kv.store.headline import CorrectnessSummary
from mini_kv.store.index import INDEX_NAME, check_attempt, rebuild_index
from mini_kv.store.jsonfile import RecordUnusable
from mini_kv.store.records import (
    CARD_FORMAT,
    SOL_FORMAT,
    BenchmarkRecord,
    MalformedRecord,
    correctness_document,
    read_record,
)

REPO = Path(__file__).resolve().parents[1]
# real attempts of an H200 run on 2026-12-01, as version 1 wrote them (sealed: never reformatted)
EVIDENCE = REPO / "tests" / "fixtures" / "v1-attempts"


def _v1_card(doc: dict) -> dict:
    """A version 2 task-card record as version 1 wrote it (PASS/FAIL, ERROR; no format, no settings)."""
    words = {"PASSED": "PASS", "INCORRECT": "FAIL", "FAILED": "FAIL", "BENCHMARK_ERROR": "ERROR"}
    out = {k: v for k, v in doc.items() if k not in ("format", "settings")}
    out["schema_version"] = 1
    out["cases"] = [{**c, "status": words.get(c.get("status"), c.get("status"))} for c in doc["cases"]]
    if "contract" in doc:
        out["contract"] = {k: {**v, "status": words[v["status"]]} for k, v in doc["contract"].items()}
        out["summary"] = {
            **doc["summary"],
            "contract": {k: words[v] for k, v in doc["summary"]["contract"].items()},
        }
    return out


def _rewrite(attempt: Path, rel: str, fn) -> None:
    path = attempt / rel
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def test_card_writer_documents_validate_and_name_their_format(tmp_path):
    a = make_attempt(tmp_path, status="INCORRECT", speedups={"bench_a": 1.5})
    corr, bench = read_record(a / "correctness.json"), read_record(a / "benchmark.json")
    results = WorkerResults(**{k: corr[k] for k in ("load", "cases", "contract", "incidents")})
    doc = correctness_document(
        CARD_FORMAT, "cpu", corr["seed_salt"], results, from_json(CorrectnessSummary, corr["summary"])
    )
    assert is_valid(json.loads(json.dumps(to_json(doc))), "correctness") and doc.format == CARD_FORMAT
    errored = [*bench["cases"], {"id": "b2", "status": Status.BENCHMARK_ERROR, "reason": "x"}]
    assert is_valid(to_json(BenchmarkRecord(CARD_FORMAT, "cpu", None, errored, {})), "benchmark")
    with pytest.raises(Exception, match="status"):  # a v1 word is refused on write
        correctness_document(
            CARD_FORMAT, "cpu", "s", replace(results, cases=[{"id": "c", "status": "PASS"}]), None
        )


def test_sol_writer_documents_validate():
    wl = {
        "id": "0b7d-uuid",
        "status": Status.INCORRECT_NUMERICAL,
        "log": "3 elements off",
        "correctness": {"max_absolute_error": 0.5, "max_relative_error": 0.1},
        "performance": None,
    }
    doc = correctness_document(
        SOL_FORMAT, "cpu", "salt", WorkerResults(cases=[wl]), CorrectnessSummary(False, {})
    )
    assert is_valid(to_json(doc), "correctness") and doc.contract == {}
    bench = BenchmarkRecord(SOL_FORMAT, "cpu", {"warmup": 1}, [], {"ran": False})
    assert is_valid(to_json(bench), "benchmark") and bench.settings == {"warmup": 1}


def test_v1_card_records_migrate_and_the_index_reads_them_as_before(tmp_path):
    art = tmp_path / "artifacts"
    a = make_attempt(art, status="INCORRECT", speedups={"bench_a": 1.5})
    rebuild_index(art)
    before = snapshot(art)
    _rewrite(a, "correctness.json", _v1_card)
    _rewrite(
        a,
        "benchmark.json",
        lambda b: {
            **_v1_card(b),
            "cases": b["cases"] + [{"id": "bench_z", "status": "ERROR", "reason": "boom"}],
        },
    )
    _reseal(a)
    corr = json.loads((a / "correctness.json").read_text())
    assert corr["schema_version"] == 1 and {c["status"] for c in corr["cases"]} == {"PASS", "FAIL"}
    migrated = read_record(a / "correctness.json")
    assert migrated["schema_version"] == 2 and migrated["format"] == CARD_FORMAT
    assert [c["status"] for c in migrated["cases"]] == [Status.PASSED, Status.INCORRECT]
    assert migrated["contract"]["opcheck"]["status"] == Status.PASSED
    bench = read_record(a / "benchmark.json")
    assert bench["settings"] is None and bench["cases"][-1]["status"] == Status.BENCHMARK_ERROR
    (art / INDEX_NAME).unlink()
    result = rebuild_index(art)
    assert result.problems == [] and result.attempts == 1
    ((row, cases),) = snapshot(art).values()
    assert row[6] == "INCORRECT" and cases == before[a.name][1]
    # the typed records every reader uses read the version 1 files the same way
    typed = check_attempt(a).records
    assert [c.status for c in typed.correctness] == [Status.PASSED, Status.INCORRECT]
    assert ("opcheck", Status.PASSED) in typed.contract
    *timed, failed = typed.bench
    assert (failed.id, failed.status, failed.reason, failed.candidate) == (
        "bench_z",
        Status.BENCHMARK_ERROR,
        "boom",
        None,
    )
    assert [(c.id, c.speedup, len(c.candidate.samples)) for c in timed] == [
        (r.case_id, r.speedup, 5 * 100) for r in check_attempt(a).cases
    ]


def test_v1_contract_failure_becomes_failed_not_incorrect(tmp_path):
    a = make_attempt(tmp_path)
    _rewrite(a, "correctness.json", lambda c: {**_v1_card(c), "contract": {"gradcheck": {"status": "FAIL"}}})
    assert read_record(a / "correctness.json")["contract"]["gradcheck"]["status"] == Status.FAILED


def test_unknown_schema_version_is_refused_naming_file_version_and_what_to_do(tmp_path):
    path = tmp_path / "correctness.json"
    path.write_text(json.dumps({"schema_version": 9, "cases": []}))
    with pytest.raises(RecordUnusable) as exc:
        read_record(path)
    msg = str(exc.value)
    assert str(path) in msg and "schema_version 9" in msg and "reads version 1 or 2" in msg
    assert "read it with that version" in msg and exc.value.reason == "version"


def test_sol_attempt_records_validate_and_its_v1_layout_still_reads(tmp_path_factory):
    from test_sol_bench import run_bench

    result = run_bench(tmp_path_factory.mktemp("sol"), "good_dps")
    assert result.exit_code == 0, result
    src = Path(result.attempt)
    corr, bench = (json.loads((src / f).read_text()) for f in ("correctness.json", "benchmark.json"))
    assert corr["format"] == bench["format"] == SOL_FORMAT and "workloads" not in corr
    assert is_valid(corr, "correctness") and is_valid(bench, "benchmark") and corr["cases"]
    art = tmp_path_factory.mktemp("v1") / "artifacts"
    a = art / src.parent.name / src.name
    shutil.copytree(src, a)
    _rewrite(
        a,
        "correctness.json",
        lambda c: {
            **{k: v for k, v in c.items() if k not in ("format", "cases", "contract")},
            "schema_version": 1,
            "workloads": c["cases"],
        },
    )
    _rewrite(
        a, "benchmark.json", lambda b: {**{k: v for k, v in b.items() if k != "format"}, "schema_version": 1}
    )
    _reseal(a)
    rebuilt = rebuild_index(art)
    assert rebuilt.problems == [] and rebuilt.attempts == 1
    migrated = read_record(a / "correctness.json")
    assert migrated["format"] == SOL_FORMAT and [c["id"] for c in migrated["cases"]] == [
        c["id"] for c in corr["cases"]
    ]


def test_the_h200_evidence_attempts_written_as_version_1_still_read(tmp_path):
    art = tmp_path / "artifacts"
    shutil.copytree(EVIDENCE, art)
    dirs = sorted(p.parent for p in art.glob("*/*/attempt.json"))
    assert dirs and all(json.loads((d / "correctness.json").read_text())["schema_version"] == 1 for d in dirs)
    result = rebuild_index(art)
    assert result.problems == [] and result.attempts == len(dirs)
    for d in dirs:
        checked = check_attempt(d)
        assert checked.header["status"] == read_attempt(d)["status"]
        typed = checked.records  # the typed reading of version 1 records, as the report reads them
        assert typed.correctness and {c.status for c in typed.correctness} <= {Status.PASSED, Status.SKIPPED}
        assert all(c.atol is not None and c.rtol is not None for c in typed.correctness)
        p50s = {r.case_id: r.p50_us for r in checked.cases}
        assert p50s and {c.id: c.candidate.p50 for c in typed.bench if c.candidate} == p50s
        corr = read_record(d / "correctness.json")
        assert {c["status"] for c in corr["cases"]} <= {Status.PASSED, Status.SKIPPED}
        assert all(v == Status.PASSED for v in corr["summary"].get("contract", {}).values())


def test_a_record_the_checks_pass_but_no_reader_can_read_is_refused_naming_the_attempt(tmp_path):
    """A case's roofline rewritten to a string and the attempt resealed: the store's checks do not read the
    roofline, the typed reading does, and refuses it (the report skips it, the API calls it INVALID)."""
    a = make_attempt(tmp_path / "artifacts")

    def junk(b: dict) -> dict:
        return {**b, "cases": [{**b["cases"][0], "roofline": "fast"}, *b["cases"][1:]]}

    _rewrite(a, "benchmark.json", junk)
    _reseal(a)
    checked = check_attempt(a)
    with pytest.raises(MalformedRecord) as exc:
        _ = checked.records
    assert str(a) in str(exc.value) and "AttributeError" in str(exc.value)
    assert isinstance(exc.value, AttemptInvalid)


def test_a_workload_file_changed_after_the_stores_check_is_refused_when_read(tmp_path):
    """The typed reading of a SOL attempt reads workload.jsonl (its tolerances) after the store checked
    every file: it checks what it read against the manifest, so a file swapped in between is not used."""
    art = tmp_path / "artifacts"
    shutil.copytree(EVIDENCE, art)
    (a,) = [p.parent for p in art.glob("rmsnorm_h4096/*/attempt.json")]
    checked = check_attempt(a)
    wl = a / "workload.jsonl"
    wl.write_text(wl.read_text().replace('"tolerance"', '"tolerance_was"', 1) + "\n")
    with pytest.raises(AttemptTampered) as exc:
        _ = checked.records
    assert "workload.jsonl" in str(exc.value) and str(a) in str(exc.value)
