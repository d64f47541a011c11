"""Garbage under artifacts/ is reported and skipped; tampering is detected; future versions are refused."""

from __future__ import annotations

import json
import os

import pytest
from test_index import make_attempt, snapshot

from mini_kv.leaderboard import build_leaderboard
from mini_kv.store.attempts import AttemptInvalid, AttemptWriter, read_attempt
from mini_kv.store.index import rebuild_index


def _problems_by_name(problems) -> dict[str, object]:
    return {os.path.basename(p.path): p for p in problems}


def _rewrite_header(attempt, **changes):
    meta = attempt / "attempt.json"
    header = json.loads(meta.read_text())
    header.update(changes)
    meta.write_text(json.dumps(header))


def test_every_kind_of_garbage_is_reported_and_skipped(tmp_path):
    good = make_attempt(tmp_path, candidate="v0")
    task = tmp_path / "vector_add"
    (tmp_path / "notes.txt").write_text("stray file at the top")
    (task / "stray.json").write_text("{}")
    (task / "empty_dir").mkdir()
    (task / "20260101T000000000000Z-v9-abcdef.partial").mkdir()
    bad_json = task / "bad_json"
    bad_json.mkdir()
    (bad_json / "attempt.json").write_text("{ not json")
    not_obj = task / "not_object"
    not_obj.mkdir()
    (not_obj / "attempt.json").write_text("[1, 2]")
    future = make_attempt(tmp_path, candidate="v_future", seed=1)
    _rewrite_header(future, schema_version=2)
    tampered = make_attempt(tmp_path, candidate="v_tampered", seed=2)
    (tampered / "benchmark.json").write_text((tampered / "benchmark.json").read_text().replace("1", "2", 1))
    truncated = make_attempt(tmp_path, candidate="v_truncated", seed=3)
    data = (truncated / "correctness.json").read_bytes()
    (truncated / "correctness.json").write_bytes(data[: len(data) // 2])
    missing = make_attempt(tmp_path, candidate="v_missing", seed=4)
    (missing / "logs" / "worker.log").unlink()
    renamed = make_attempt(tmp_path, candidate="v_renamed", seed=5)
    renamed.rename(task / "renamed_by_hand")
    wrong_task = make_attempt(tmp_path, task="rmsnorm", candidate="v_moved", seed=6)
    (tmp_path / "vector_add").joinpath(wrong_task.name).mkdir()
    for p in wrong_task.iterdir():
        p.rename(task / wrong_task.name / p.name)
    wrong_task.rmdir()
    no_fields = make_attempt(tmp_path, candidate="v_nofields", seed=7)
    header = json.loads((no_fields / "attempt.json").read_text())
    del header["suite_hash"]
    (no_fields / "attempt.json").write_text(json.dumps(header))
    (task / "link").symlink_to(good)
    bad_list = make_attempt(tmp_path, candidate="v_badlist", seed=8)
    header = json.loads((bad_list / "attempt.json").read_text())
    del header["files"][0]["size"]
    (bad_list / "attempt.json").write_text(json.dumps(header))
    escape = make_attempt(tmp_path, candidate="v_escape", seed=9)
    header = json.loads((escape / "attempt.json").read_text())
    header["files"][0]["path"] = "../../notes.txt"
    (escape / "attempt.json").write_text(json.dumps(header))

    result = rebuild_index(tmp_path)

    assert set(snapshot(tmp_path)) == {good.name}
    by = _problems_by_name(result.problems)
    expect = {
        "notes.txt": ("stray", "stray file"),
        "stray.json": ("stray", "not an attempt directory"),
        "empty_dir": ("invalid", "no attempt.json"),
        "20260101T000000000000Z-v9-abcdef.partial": ("partial", "incomplete"),
        "bad_json": ("invalid", "unreadable"),
        "not_object": ("invalid", "not a JSON object"),
        future.name: ("version", "written by another mini_kv version"),
        tampered.name: ("tampered", "tampered"),
        truncated.name: ("tampered", "tampered or truncated"),
        missing.name: ("invalid", "is missing"),
        "renamed_by_hand": ("misplaced", "differs from its attempt_id"),
        wrong_task.name: ("misplaced", "belongs to task 'rmsnorm'"),
        no_fields.name: ("invalid", "suite_hash"),
        "link": ("stray", "link"),
        bad_list.name: ("invalid", "files[0].size"),
        escape.name: ("invalid", "files[0].path"),
    }
    assert set(by) == set(expect)
    for name, (kind, text) in expect.items():
        assert by[name].kind == kind, (name, by[name])
        assert text in by[name].message, (name, by[name].message)
    # the leaderboard sees the same store and still works
    board = build_leaderboard(tmp_path, rebuild=True)
    assert [e.candidate for g in board.groups for e in g.entries] == ["v0"]
    assert len(board.problems) == len(expect)


def test_future_attempt_schema_version_is_refused_with_what_to_do(tmp_path):
    a = make_attempt(tmp_path)
    _rewrite_header(a, schema_version=7)
    with pytest.raises(AttemptInvalid) as exc:
        read_attempt(a)
    msg = str(exc.value)
    assert "schema_version 7" in msg and "read it with that version" in msg


def test_future_version_of_an_inner_file_is_refused(tmp_path):
    w = AttemptWriter(tmp_path, "vector_add", "v0")
    w.json("benchmark.json", {"schema_version": 3, "cases": []})
    a = w.commit(
        {
            "task_id": "vector_add",
            "task_version": "1.0.0",
            "operator": {"name": "x", "version": "1.0.0"},
            "candidate": "v0",
            "created_at": "2026-01-01T00:00:00+00:00",
            "suite_hash": "s",
            "environment_key": "e",
            "status": "PASSED",
            "device": "cpu",
        }
    )
    read_attempt(a)  # the seal is intact ...
    result = rebuild_index(tmp_path)  # ... but the index cannot read benchmark.json version 3
    (p,) = result.problems
    assert p.kind == "version" and "benchmark.json" in p.message and "another mini_kv version" in p.message
    assert snapshot(tmp_path) == {}


def test_tampering_after_indexing_is_caught_by_the_leaderboard(tmp_path):
    old = make_attempt(
        tmp_path, candidate="v0", seed=1, created_at="2026-01-01T00:00:00+00:00", speedups={"bench_a": 1.2}
    )
    new = make_attempt(
        tmp_path, candidate="v0", seed=2, created_at="2026-01-02T00:00:00+00:00", speedups={"bench_a": 2.0}
    )
    rebuild_index(tmp_path)
    # a changed listed file breaks the seal; the leaderboard falls back to the previous valid attempt
    (new / "correctness.json").write_text("{}")
    board = build_leaderboard(tmp_path)
    (entry,) = board.groups[0].entries
    assert entry.attempt_id == old.name
    assert [p.path for p in board.problems] == [str(new)]
    # editing attempt.json itself (not covered by its own hash list) is caught against the index
    header = json.loads((old / "attempt.json").read_text())
    original = header["benchmark"]["geomean_speedup"]
    header["benchmark"]["geomean_speedup"] = 99.0
    (old / "attempt.json").write_text(json.dumps(header))
    board = build_leaderboard(tmp_path)
    assert board.groups == ()
    # the edited headline differs from the recomputation from the hashed records
    assert any(
        p.kind == "tampered" and "attempt.json benchmark.geomean_speedup" in p.message for p in board.problems
    )
    # an edit outside the headline is still caught against the SHA-256 the index recorded
    header = json.loads((old / "attempt.json").read_text())
    header["benchmark"]["geomean_speedup"] = original
    header["duration_s"] = 7.0
    (old / "attempt.json").write_text(json.dumps(header))
    board = build_leaderboard(tmp_path)
    assert board.groups == ()
    assert any("rewritten after it was indexed" in p.message for p in board.problems)


def test_a_store_without_attempts_is_fine(tmp_path):
    (tmp_path / "vector_add").mkdir()
    result = rebuild_index(tmp_path)
    assert result.attempts == 0 and result.problems == []
    assert build_leaderboard(tmp_path).groups == ()
