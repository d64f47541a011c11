"""Red team: forgeries of the attempt store and escapes out of it. Each one must be reported (TAMPERED,
or skipped as invalid) with the file it concerns named, and never ranked; a corrupt attempt or index
never stops the rest of the store from being indexed and ranked.

The attacker can write anything under artifacts/: files inside sealed attempts, attempt.json (fixing
up the SHA-256 list so the seal checks), index.sqlite. `_reseal` is that attacker's tool.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_index import env_key_of, fixture_env, make_attempt, snapshot

from mini_kv.cli import main
from mini_kv.leaderboard import build_leaderboard
from mini_kv.store.index import INDEX_NAME, IndexUnusable, StoreProblem, read_index, rebuild_index

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

# ------------------------------------------------------------------------------------------- tools


def _reseal(attempt: Path, header_changes: dict | None = None, drop: tuple = ()) -> None:
    """The attacker's fix-up: list every file's real SHA-256 and size in attempt.json (plus header edits)."""
    meta = attempt / "attempt.json"
    header = json.loads(meta.read_text())
    files = []
    for e in header["files"]:
        if e["path"] in drop:
            continue
        p = attempt / e["path"]
        if p.is_file():
            data = p.read_bytes()
            e = {**e, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        files.append(e)
    header["files"] = files
    for k, v in (header_changes or {}).items():
        if isinstance(v, dict) and isinstance(header.get(k), dict):
            header[k] = {**header[k], **v}
        else:
            header[k] = v
    meta.write_text(json.dumps(header))


def _edit_json(path: Path, fn) -> None:
    obj = json.loads(path.read_text())
    fn(obj)
    path.write_text(json.dumps(obj))


def _problem(problems, attempt: Path | str) -> StoreProblem:
    found = [p for p in problems if p.path == str(attempt)]
    assert found, f"{attempt} not reported; problems: {problems}"
    return found[0]


def _caught(problems, attempt: Path | str, file: str, kinds=("tampered",)) -> StoreProblem:
    p = _problem(problems, attempt)
    assert p.kind in kinds, p
    assert file in p.message, p
    return p


def _ranked(board) -> dict[str, tuple[str, float]]:
    return {e.candidate: (e.attempt_id, e.geomean_speedup) for g in board.groups for e in g.entries}


def _sql(art: Path, stmt: str, params: tuple = ()) -> None:
    con = sqlite3.connect(str(art / INDEX_NAME))
    with con:
        con.execute(stmt, params)
    con.close()


@pytest.fixture
def store(tmp_path):
    art = tmp_path / "artifacts"
    slow = make_attempt(
        art, candidate="v0", seed=1, speedups={"bench_a": 1.5}, created_at="2026-01-01T00:00:00+00:00"
    )
    fast = make_attempt(
        art, candidate="v1", seed=2, speedups={"bench_a": 3.0}, created_at="2026-01-01T00:00:00+00:00"
    )
    skipped = make_attempt(
        art, candidate="v2", seed=3, bench=False, stable=None, created_at="2026-01-01T00:00:00+00:00"
    )
    rebuild_index(art)
    assert set(_ranked(build_leaderboard(art))) == {"v0", "v1"}
    return art, slow, fast, skipped


# ------------------------------------------------------------------------------ the measured findings


def test_index_row_edited_to_speedup_99_is_tampered_not_ranked(store):
    art, slow, _, _ = store
    _sql(art, "UPDATE attempts SET geomean_speedup=99 WHERE attempt_id=?", (slow.name,))
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board) and 99 not in [s for _, s in _ranked(board).values()]
    p = _caught(board.problems, slow, INDEX_NAME)
    assert "geomean_speedup" in p.message and "rebuild-index" in p.message
    assert "v0" in _ranked(build_leaderboard(art, rebuild=True))  # the attempt itself is fine


def test_skip_benchmark_row_relabelled_stable_at_50x_is_tampered_not_ranked(store):
    art, _, _, skipped = store
    _sql(art, "UPDATE attempts SET stable=1, geomean_speedup=50 WHERE attempt_id=?", (skipped.name,))
    board = build_leaderboard(art)
    assert "v2" not in _ranked(board)
    _caught(board.problems, skipped, INDEX_NAME)


def test_headline_geomean_42_in_attempt_json_is_tampered_even_after_rebuild(store):
    art, slow, _, _ = store
    _edit_json(slow / "attempt.json", lambda h: h["benchmark"].update(geomean_speedup=42.0))
    result = rebuild_index(art)
    p = _caught(result.problems, slow, "attempt.json")
    assert "benchmark.geomean_speedup" in p.message and "42" in p.message
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board) and 42.0 not in [s for _, s in _ranked(board).values()]


def test_skip_benchmark_attempt_given_a_stable_benchmark_is_tampered_even_after_rebuild(store):
    art, _, _, skipped = store
    _edit_json(
        skipped / "attempt.json",
        lambda h: h["benchmark"].update(ran=True, stable=True, ok=True, geomean_speedup=77.0),
    )
    _edit_json(
        skipped / "benchmark.json",
        lambda b: b["summary"].update(ran=True, stable=True, ok=True, geomean_speedup=77.0),
    )
    _reseal(skipped)
    result = rebuild_index(art)
    _caught(result.problems, skipped, "benchmark.json")
    assert "v2" not in _ranked(build_leaderboard(art))


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


CORRUPT_HEADERS = {
    "files_empty_object": lambda h: h.update(files=[{}]),
    "files_string": lambda h: h.update(files="benchmark.json"),
    "files_path_number": lambda h: h.update(files=[{"path": 5, "sha256": "0" * 64, "size": 1}]),
    "files_size_bool": lambda h: h["files"][0].update(size=True),
    "benchmark_list": lambda h: h.update(benchmark=[1]),
    "operator_string": lambda h: h.update(operator="x"),
    "format_list": lambda h: h.update(format=["sol-execbench"]),
}
RESEALED_EDITS = {  # (file, edit) made by an attacker who then fixes up the SHA-256 list
    "environment_schema_version_list": ("environment.json", lambda e: e.update(schema_version=[])),
    "benchmark_schema_version_dict": ("benchmark.json", lambda b: b.update(schema_version={})),
}


@pytest.mark.parametrize(
    "name",
    [
        *CORRUPT_HEADERS,
        *RESEALED_EDITS,
        "deep_attempt_json",
        "deep_benchmark_json",
        "benchmark_cases_garbage",
        "correctness_cases_garbage",
    ],
)
def test_one_corrupt_attempt_never_blocks_the_store(store, name, capsys):
    """rebuild-index, leaderboard and promote-baseline report the bad attempt (file and reason) and go on."""
    art, slow, fast, _ = store
    bad = make_attempt(art, candidate="v9", seed=9, speedups={"bench_a": 2.0})
    if name in CORRUPT_HEADERS:
        _edit_json(bad / "attempt.json", CORRUPT_HEADERS[name])
    elif name in RESEALED_EDITS:
        _edit_json(bad / RESEALED_EDITS[name][0], RESEALED_EDITS[name][1])
        _reseal(bad)
    elif name == "deep_attempt_json":
        (bad / "attempt.json").write_text(_deep())
    elif name == "deep_benchmark_json":
        (bad / "benchmark.json").write_text(_deep())
        _reseal(bad)
    elif name == "benchmark_cases_garbage":
        _edit_json(bad / "benchmark.json", lambda b: b.update(cases=[1, "x", {"id": 3, "candidate": 4}]))
        _reseal(bad)
    else:
        _edit_json(bad / "correctness.json", lambda c: c.update(cases=[{"kind": "nope"}], load=[]))
        _reseal(bad)
    capsys.readouterr()
    assert main(["rebuild-index", "--artifacts", str(art)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and bad.name in err
    assert main(["leaderboard", "--artifacts", str(art)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "v0" in out and "v1" in out
    assert {"v0", "v1"} <= set(_ranked(build_leaderboard(art))) and "v9" not in _ranked(
        build_leaderboard(art)
    )
    rc = main(["promote-baseline", "--attempt", str(bad), "--output", str(art.parent / "b.json")])
    assert rc == 2 and "Traceback" not in capsys.readouterr().err
    assert main(["promote-baseline", "--attempt", str(fast), "--output", str(art.parent / "b.json")]) == 0


@pytest.mark.parametrize("what", ["directory", "symlink", "garbage"])
def test_a_broken_index_file_is_a_clear_error_with_the_fix(store, what, capsys):
    art = store[0]
    db = art / INDEX_NAME
    db.unlink()
    if what == "directory":
        db.mkdir()
    elif what == "symlink":
        db.symlink_to(art.parent / "elsewhere.sqlite")
    else:
        db.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    for cmd in (["leaderboard", "--artifacts", str(art)], ["rebuild-index", "--artifacts", str(art)]):
        rc = main(cmd)
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if what == "garbage" and cmd[0] == "rebuild-index":
            assert rc == 0  # a regular file that is not an index is simply rebuilt
        else:
            assert rc == 2 and str(db) in err and "rebuild-index" in err, err
    if what != "garbage":
        assert db.is_dir() or db.is_symlink()  # never removed for the user


def test_a_lock_path_that_is_a_directory_is_a_clear_error(store, capsys):
    art = store[0]
    (art / ".index.lock").unlink(missing_ok=True)
    (art / ".index.lock").mkdir()
    assert main(["leaderboard", "--artifacts", str(art)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ".index.lock" in err


def test_an_index_missing_columns_is_a_clear_error(store):
    art = store[0]
    _sql(art, "ALTER TABLE attempts DROP COLUMN attempt_sha256")
    with pytest.raises(IndexUnusable, match="rebuild-index"):
        build_leaderboard(art)


# ------------------------------------------------------------------------------- red team: new


def test_swapped_benchmark_json_with_fixed_up_hashes_and_headline(store):
    """The fast candidate's measurements moved into the slow one's attempt, attempt.json made consistent."""
    art, slow, fast, _ = store
    shutil.copyfile(fast / "benchmark.json", slow / "benchmark.json")
    fast_head = json.loads((fast / "attempt.json").read_text())
    _reseal(slow, {"benchmark": fast_head["benchmark"]})
    result = rebuild_index(art)
    p = _caught(result.problems, slow, "benchmark.json")
    assert "seed_salt" in p.message
    assert _ranked(build_leaderboard(art))["v1"][0] == fast.name and "v0" not in _ranked(
        build_leaderboard(art)
    )


@pytest.mark.parametrize("key", ["load", "contract", "incidents"])
def test_correctness_records_with_a_block_deleted_are_tampered(store, key):
    """Deleting a failed opcheck's block (or the load, or the incidents) instead of rewriting it: the
    headline would read an empty block as nothing failed, so a record without one is refused."""
    art, slow, _, _ = store
    _edit_json(slow / "correctness.json", lambda doc: doc.pop(key))
    _reseal(slow)
    p = _caught(rebuild_index(art).problems, slow, "correctness.json")
    assert f"no {key}" in p.message and "v0" not in _ranked(build_leaderboard(art))


def test_candidate_relabelled_in_a_consistent_attempt_json(store):
    art, slow, _, _ = store
    _reseal(slow, {"candidate": "v_champion"})
    _caught(rebuild_index(art).problems, slow, "attempt.json")
    assert "v_champion" not in _ranked(build_leaderboard(art))


def test_attempt_copied_under_another_task_with_its_header_relabelled(store):
    art, slow, _, _ = store
    copy = art / "rmsnorm" / slow.name
    shutil.copytree(slow, copy)
    _reseal(copy, {"task_id": "rmsnorm"})
    result = rebuild_index(art)
    _caught(result.problems, copy, "task_card.json")
    assert "rmsnorm" not in {g.task_id for g in build_leaderboard(art).groups}


def test_duplicate_attempt_ids_are_both_reported(store):
    """A consistent copy (card id and task relabelled too) gives two directories one id: neither is trusted."""
    art, _, _, skipped = store
    copy = art / "rmsnorm" / skipped.name
    shutil.copytree(skipped, copy)
    _edit_json(copy / "task_card.json", lambda t: t["card"].update(id="rmsnorm"))
    _reseal(copy, {"task_id": "rmsnorm"})
    result = rebuild_index(art)
    for d in (skipped, copy):
        p = _caught(result.problems, f"{d.parent.name}/{d.name}", "attempt.json")
        assert "also claimed" in p.message
    assert skipped.name not in snapshot(art)


def test_attempt_directory_that_is_a_symlink_out_of_the_store(store, tmp_path):
    art, slow, _, _ = store
    outside = tmp_path / "outside" / slow.name
    shutil.move(str(slow), str(outside))
    slow.symlink_to(outside, target_is_directory=True)
    result = rebuild_index(art)
    assert _problem(result.problems, slow).kind == "stray"
    # and an index row that still points there (indexed before the swap) is not ranked either
    _sql(art, "DELETE FROM attempts")
    shutil.move(str(outside), str(art / "tmp"))
    slow.unlink()
    shutil.move(str(art / "tmp"), str(slow))
    rebuild_index(art)
    shutil.move(str(slow), str(outside))
    slow.symlink_to(outside, target_is_directory=True)
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board)
    _caught(board.problems, slow, INDEX_NAME)


def test_listed_file_that_is_a_symlink(store):
    art, slow, fast, _ = store
    (slow / "benchmark.json").unlink()
    (slow / "benchmark.json").symlink_to(fast / "benchmark.json")
    _reseal(slow)
    p = _caught(rebuild_index(art).problems, slow, "benchmark.json")
    assert "symbolic link" in p.message


def test_listed_directory_that_is_a_symlink(store, tmp_path):
    art, slow, _, _ = store
    outside = tmp_path / "logs_elsewhere"
    shutil.move(str(slow / "logs"), str(outside))
    (slow / "logs").symlink_to(outside, target_is_directory=True)
    p = _caught(rebuild_index(art).problems, slow, "logs")
    assert "symbolic link" in p.message


@pytest.mark.parametrize(
    "name", ["../v1/benchmark.json", "/etc/passwd", "./benchmark.json", "logs//worker.log", "attempt.json"]
)
def test_dotdot_absolute_and_unnormalised_manifest_names(store, name):
    art, slow, _, _ = store
    _edit_json(
        slow / "attempt.json", lambda h: h["files"].append({"path": name, "sha256": "0" * 64, "size": 0})
    )
    p = _caught(rebuild_index(art).problems, slow, "attempt.json", kinds=("tampered", "invalid"))
    assert "files[" in p.message


def test_extra_unlisted_file(store):
    art, slow, _, _ = store
    (slow / "regression.json").write_text(json.dumps({"schema_version": 1, "verdict": "PASS"}))
    p = _caught(rebuild_index(art).problems, slow, "regression.json")
    assert "not listed" in p.message


def test_unlisted_fifo_is_reported_without_hanging(store):
    art, slow, _, _ = store
    os.mkfifo(slow / "pipe")
    _caught(rebuild_index(art).problems, slow, "pipe")


def test_index_row_pointing_to_a_missing_attempt(store):
    art, slow, _, _ = store
    _sql(
        art,
        "UPDATE attempts SET attempt_id='20260101T000000000000Z-v0-ffffff', "
        "path='vector_add/20260101T000000000000Z-v0-ffffff', created_at='2099' WHERE attempt_id=?",
        (slow.name,),
    )
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board)
    _caught(board.problems, art / "vector_add" / "20260101T000000000000Z-v0-ffffff", INDEX_NAME)


def test_index_row_relabelled_to_another_task(store):
    art, slow, _, _ = store
    _sql(art, "UPDATE attempts SET task_id='rmsnorm' WHERE attempt_id=?", (slow.name,))
    board = build_leaderboard(art)
    assert "rmsnorm" not in {g.task_id for g in board.groups}
    _caught(board.problems, slow, INDEX_NAME)


def test_index_row_citing_a_path_outside_the_store(store):
    art, slow, _, _ = store
    _sql(art, "UPDATE attempts SET path='../../' || path WHERE attempt_id=?", (slow.name,))
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board)
    assert any(p.kind == "tampered" and INDEX_NAME in p.message for p in board.problems)


def test_index_bench_case_speedup_edited(store):
    art, slow, _, _ = store
    _sql(art, "UPDATE bench_cases SET speedup=40 WHERE attempt_id=?", (slow.name,))
    board = build_leaderboard(art)
    assert "v0" not in _ranked(board)
    p = _caught(board.problems, slow, INDEX_NAME)
    assert "bench_cases" in p.message


def test_case_changed_manifest_names(store):
    art, slow, _, _ = store
    # a second listing of the same name in another case: one file on a case-insensitive file system
    shutil.copyfile(slow / "benchmark.json", slow / "Benchmark.json")
    _edit_json(
        slow / "attempt.json",
        lambda h: h["files"].append(
            {**next(f for f in h["files"] if f["path"] == "benchmark.json"), "path": "Benchmark.json"}
        ),
    )
    p = _caught(rebuild_index(art).problems, slow, "attempt.json")
    assert "listed twice" in p.message


def test_case_changed_name_replacing_the_listed_record(store):
    """The manifest lists Benchmark.json (forged, faster) instead of benchmark.json."""
    art, slow, _, _ = store
    forged = json.loads((slow / "benchmark.json").read_text())
    forged["summary"]["geomean_speedup"] = 9.0
    (slow / "Benchmark.json").write_text(json.dumps(forged))
    _edit_json(
        slow / "attempt.json",
        lambda h: [f.update(path="Benchmark.json") for f in h["files"] if f["path"] == "benchmark.json"],
    )
    _reseal(slow)
    _caught(rebuild_index(art).problems, slow, "benchmark.json")


def test_environment_key_forged_to_join_another_environment(store):
    art, slow, _, _ = store
    other = env_key_of("the-fast-machine")
    _edit_json(slow / "environment.json", lambda e: e.update(key=other))
    _reseal(slow, {"environment_key": other})
    p = _caught(rebuild_index(art).problems, slow, "environment.json")
    assert "not the key of the environment" in p.message


def test_environment_key_in_header_only(store):
    art, slow, _, _ = store
    _reseal(slow, {"environment_key": fixture_env("x")["key"]})
    _caught(rebuild_index(art).problems, slow, "environment.json")


@pytest.mark.parametrize("size", [10**15, 2**63 - 1])
def test_huge_declared_size_is_tampered_without_reading(store, size):
    art, slow, _, _ = store
    _edit_json(
        slow / "attempt.json",
        lambda h: [f.update(size=size) for f in h["files"] if f["path"] == "benchmark.json"],
    )
    p = _caught(rebuild_index(art).problems, slow, "benchmark.json")
    assert "SHA-256 and size" in p.message


def test_per_case_speedup_forged_in_benchmark_json(store):
    art, slow, _, _ = store
    _edit_json(slow / "benchmark.json", lambda b: b["cases"][0].update(speedup=9.0))
    _reseal(slow)
    p = _caught(rebuild_index(art).problems, slow, "benchmark.json")
    assert "case bench_a speedup" in p.message


def test_unstable_measurement_relabelled_stable(tmp_path):
    art = tmp_path / "artifacts"
    shaky = make_attempt(art, candidate="v0", seed=4, stable=False)
    _edit_json(
        shaky / "benchmark.json",
        lambda b: (
            b["cases"][0]["stability"].update(stable=True, reasons=[]),
            b["summary"].update(stable=True),
        ),
    )
    _reseal(shaky, {"benchmark": {"stable": True}})
    p = _caught(rebuild_index(art).problems, shaky, "benchmark.json")
    assert "stability.stable" in p.message or "summary.stable" in p.message
    assert build_leaderboard(art).groups == ()


def test_incorrect_attempt_relabelled_passed(tmp_path):
    art = tmp_path / "artifacts"
    wrong = make_attempt(art, candidate="v0", seed=5, status="INCORRECT")
    _edit_json(wrong / "correctness.json", lambda c: c["summary"].update(ok=True))
    _reseal(wrong, {"status": "PASSED", "correctness": {"ok": True}, "exit_code": 0})
    _caught(rebuild_index(art).problems, wrong, "attempt.json")
    assert build_leaderboard(art).groups == ()


def test_format_relabelled_to_sol(store):
    art, slow, _, _ = store
    _reseal(slow, {"format": "sol-execbench"})
    _caught(rebuild_index(art).problems, slow, "definition.json")


def test_device_relabelled(store):
    art, slow, _, _ = store
    _reseal(slow, {"device": "cuda:0"})
    _caught(rebuild_index(art).problems, slow, "correctness.json")


def test_listed_file_replaced_by_a_directory(store):
    art, slow, _, _ = store
    (slow / "logs" / "worker.log").unlink()
    (slow / "logs" / "worker.log").mkdir()
    _caught(rebuild_index(art).problems, slow, "worker.log")


def test_benchmark_json_dropped_from_the_manifest(store):
    art, slow, _, _ = store
    (slow / "benchmark.json").unlink()
    _reseal(slow, drop=("benchmark.json",))
    _caught(rebuild_index(art).problems, slow, "benchmark.json")


def test_index_is_the_same_after_every_forgery_is_removed(store):
    """Control: the checks do not reject honest attempts (all three are indexed, two ranked)."""
    art, slow, fast, skipped = store
    result = rebuild_index(art)
    assert result.problems == [] and result.attempts == 3
    rows, _ = read_index(art)
    assert {r.attempt_id for r in rows} == {slow.name, fast.name, skipped.name}


# ------------------------------------------------------------------------ SOL-ExecBench attempts


@pytest.fixture(scope="module")
def sol_attempt(tmp_path_factory) -> Path:
    """One real SOL attempt (the shipped good_dps solution, benchmarked on the CPU, briefly)."""
    from test_sol_bench import run_bench

    result = run_bench(tmp_path_factory.mktemp("sol"), "good_dps")
    assert result.exit_code == 0 and result.index_warning is None, result
    return Path(result.attempt)


@pytest.fixture
def sol_store(sol_attempt, tmp_path) -> tuple[Path, Path]:
    art = tmp_path / "artifacts"
    shutil.copytree(sol_attempt.parent.parent, art, symlinks=True)
    (art / INDEX_NAME).unlink()
    return art, art / sol_attempt.parent.name / sol_attempt.name


def test_sol_attempt_headline_is_reproduced_from_its_records(sol_store):
    art, a = sol_store
    result = rebuild_index(art)
    assert result.problems == [] and result.attempts == 1
    (row,) = read_index(art)[0]
    header = json.loads((a / "attempt.json").read_text())
    assert row.status == header["status"] == "PASSED"
    assert row.geomean_speedup == pytest.approx(header["benchmark"]["geomean_speedup"], rel=1e-12)


def test_sol_headline_forged_in_attempt_json(sol_store):
    art, a = sol_store
    _edit_json(a / "attempt.json", lambda h: h["benchmark"].update(geomean_speedup=42.0, stable=True))
    _caught(rebuild_index(art).problems, a, "attempt.json")


def test_sol_failed_workload_relabelled_passed(sol_store):
    art, a = sol_store
    _edit_json(a / "correctness.json", lambda c: c["cases"][0].update(status="INCORRECT_NUMERICAL"))
    _reseal(a)
    p = _caught(rebuild_index(art).problems, a, "attempt.json")
    assert "status" in p.message


def test_sol_per_workload_speedup_forged(sol_store):
    art, a = sol_store
    _edit_json(a / "benchmark.json", lambda b: b["cases"][0].update(speedup=1000.0))
    _reseal(a)
    _caught(rebuild_index(art).problems, a, "benchmark.json")


def test_sol_workloads_changed_so_the_suite_is_another(sol_store):
    """Editing the measured workloads (fixing the hashes) breaks the suite hash, so it is never ranked
    against the suite it claims."""
    art, a = sol_store
    lines = (a / "workload.jsonl").read_text().splitlines()
    (a / "workload.jsonl").write_text("\n".join(lines[:1]) + "\n")
    _reseal(a)
    p = _caught(rebuild_index(art).problems, a, "attempt.json")
    assert "suite_hash" in p.message


def test_sol_solution_relabelled(sol_store):
    art, a = sol_store
    _edit_json(a / "solution.json", lambda s: s.update(name="someone_else"))
    _reseal(a)
    _caught(rebuild_index(art).problems, a, "solution.json")


def test_a_listed_regression_verdict_that_breaks_its_schema_is_tampered(store):
    """A verdict slipped in and listed with its real hash (a PASS with no cases, to hide a FAIL): the
    index checks regression.json against schemas/regression.schema.json, so it is never ranked."""
    art, slow, _, _ = store
    (slow / "regression.json").write_text(json.dumps({"schema_version": 1, "verdict": "PASS", "reasons": []}))
    _edit_json(
        slow / "attempt.json",
        lambda h: h["files"].append({"path": "regression.json", "sha256": "0" * 64, "size": 0}),
    )
    _reseal(slow)
    p = _caught(rebuild_index(art).problems, slow, "regression.json")
    assert "required field is missing" in p.message
