"""Leaderboard: selection, grouping, ranking, JSON/CSV export; plus the one end-to-end CLI test."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_index import ENV_KEY, env_key_of, make_attempt

from mini_kv.codec import to_json
from mini_kv.leaderboard import CSV_COLUMNS, build_leaderboard, export_csv, export_json

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

REPO = Path(__file__).resolve().parents[1]


def _day(d: int) -> str:
    return f"2026-01-{d:02d}T00:00:00+00:00"


@pytest.fixture
def store(tmp_path) -> tuple[Path, dict[str, Path]]:
    art = tmp_path / "artifacts"
    a = {}
    # vector_add on env A: v0 (1.5x, older 3.0x attempt superseded), v1 (2.0x), v2 (1.0x)
    a["v0_old"] = make_attempt(art, candidate="v0", seed=1, speedups={"bench_a": 3.0}, created_at=_day(1))
    a["v0"] = make_attempt(art, candidate="v0", seed=2, speedups={"bench_a": 1.5}, created_at=_day(2))
    a["v1"] = make_attempt(
        art, candidate="v1", seed=3, speedups={"bench_a": 2.0, "bench_b": 2.0}, created_at=_day(2)
    )
    a["v2"] = make_attempt(art, candidate="v2", seed=4, speedups={"bench_a": 1.0}, created_at=_day(3))
    # v3: its newest attempt is incorrect, the newer-still one unstable: the older valid one is shown
    a["v3"] = make_attempt(art, candidate="v3", seed=5, speedups={"bench_a": 1.2}, created_at=_day(1))
    a["v3_bad"] = make_attempt(art, candidate="v3", seed=6, status="INCORRECT", created_at=_day(4))
    a["v3_unstable"] = make_attempt(art, candidate="v3", seed=7, stable=False, created_at=_day(5))
    # never valid: only unstable / skipped benchmark
    a["v4"] = make_attempt(art, candidate="v4", seed=8, stable=False, created_at=_day(1))
    a["v5"] = make_attempt(art, candidate="v5", seed=9, bench=False, stable=None, created_at=_day(1))
    # another environment and another device: separate groups
    a["v6"] = make_attempt(
        art,
        candidate="v6",
        seed=10,
        env_key="gpu-env-0002",
        device="cuda:0",
        speedups={"bench_a": 5.0},
        created_at=_day(2),
    )
    # another task
    a["r0"] = make_attempt(
        art, task="rmsnorm", candidate="r0", seed=11, speedups={"bench_a": 1.1}, created_at=_day(1)
    )
    return art, a


def _entries(board) -> dict[tuple, list[tuple[int, str]]]:
    return {
        (g.task_id, g.environment_key, g.device): [(e.rank, e.candidate) for e in g.entries]
        for g in board.groups
    }


def test_latest_valid_attempt_per_candidate_grouped_and_ranked(store):
    art, a = store
    board = build_leaderboard(art)
    assert board.schema_version == 1 and board.problems == ()
    assert _entries(board) == {
        ("rmsnorm", ENV_KEY, "cpu"): [(1, "r0")],
        ("vector_add", ENV_KEY, "cpu"): [(1, "v1"), (2, "v0"), (3, "v3"), (4, "v2")],
        ("vector_add", env_key_of("gpu-env-0002"), "cuda:0"): [(1, "v6")],
    }
    group = next(g for g in board.groups if g.task_id == "vector_add" and g.device == "cpu")
    by = {e.candidate: e for e in group.entries}
    assert by["v0"].attempt_id == a["v0"].name  # latest, not the faster older one
    assert by["v3"].attempt_id == a["v3"].name  # newer attempts were incorrect / unstable
    assert by["v1"].geomean_speedup == pytest.approx(2.0, rel=0.05)
    assert set(by["v1"].cases) == {"bench_a", "bench_b"}
    speeds = [e.geomean_speedup for e in group.entries]
    assert speeds == sorted(speeds, reverse=True)


def test_task_filter(store):
    art, _ = store
    board = build_leaderboard(art, task="rmsnorm")
    assert _entries(board) == {("rmsnorm", ENV_KEY, "cpu"): [(1, "r0")]}


def test_json_and_csv_export(store, tmp_path):
    art, a = store
    board = build_leaderboard(art)
    export_json(board, tmp_path / "out" / "lb.json")
    export_csv(board, tmp_path / "out" / "lb.csv")
    doc = json.loads((tmp_path / "out" / "lb.json").read_text())
    assert doc == json.loads(json.dumps(to_json(board)))
    # the layout readers of the export rely on
    assert set(doc) == {
        "schema_version",
        "generated_at",
        "artifacts",
        "task",
        "groups",
        "problems",
        "signing",
    }
    assert set(doc["groups"][0]) == {"task_id", "suite_hash", "environment_key", "device", "entries"}
    assert set(doc["groups"][0]["entries"][0]) == {
        "rank", "candidate", "geomean_speedup", "attempt_id", "created_at", "path", "regression", "signature", "cases", "source"
    }  # fmt: skip
    assert doc["signing"] == {"key_id": None, "required": False}
    with open(tmp_path / "out" / "lb.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(r["task_id"], r["device"], r["rank"], r["candidate"]) for r in rows] == [
        ("rmsnorm", "cpu", "1", "r0"),
        ("vector_add", "cpu", "1", "v1"),
        ("vector_add", "cpu", "2", "v0"),
        ("vector_add", "cpu", "3", "v3"),
        ("vector_add", "cpu", "4", "v2"),
        ("vector_add", "cuda:0", "1", "v6"),
    ]
    assert all(r["schema_version"] == "1" for r in rows)
    v1 = next(r for r in rows if r["candidate"] == "v1")
    assert v1["attempt_id"] == a["v1"].name
    assert float(v1["geomean_speedup"]) == board.groups[1].entries[0].geomean_speedup


def test_cli_leaderboard_exports(store, tmp_path, capsys):
    from mini_kv.cli import main

    art, _ = store
    rc = main(
        [
            "leaderboard",
            "--artifacts",
            str(art),
            "--task",
            "vector_add",
            "--json",
            str(tmp_path / "l.json"),
            "--csv",
            str(tmp_path / "l.csv"),
        ]
    )
    assert rc == 0
    board = json.loads((tmp_path / "l.json").read_text())
    assert {g["task_id"] for g in board["groups"]} == {"vector_add"}
    assert (tmp_path / "l.csv").read_text().count("\n") == 1 + 5
    assert "v1" in capsys.readouterr().out


def test_new_attempts_reach_the_leaderboard_through_update_index(store):
    from mini_kv.store.index import update_index

    art, _ = store
    build_leaderboard(art)  # builds the index
    newer = make_attempt(art, candidate="v2", seed=20, speedups={"bench_a": 9.0}, created_at=_day(9))
    update_index(art, newer)
    board = build_leaderboard(art, task="vector_add")
    assert board.groups[0].entries[0].attempt_id == newer.name


# ------------------------------------------------------------------------------ end to end (real verify)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler"
)
def test_end_to_end_verify_index_leaderboard_promote(tmp_path):
    art = tmp_path / "artifacts"
    # 1 s of adaptive timing, not the default 3: the test follows the attempt, not its times
    v = run_cli(
        "verify", "--task", "tasks/vector_add.yaml", "--artifacts", str(art), "--json", "--budget", "1"
    )
    assert v.returncode == 0, v.stdout + v.stderr
    summary = json.loads(v.stdout.strip().splitlines()[-1])
    attempt = Path(summary["attempt"])
    assert summary["status"] == "PASSED" and attempt.parent.parent == art
    assert (art / "index.sqlite").is_file()  # verify updated the index itself

    r = run_cli("rebuild-index", "--artifacts", str(art), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["attempts"] == 1 and out["problems"] == []

    r = run_cli(
        "leaderboard",
        "--artifacts",
        str(art),
        "--json",
        str(tmp_path / "lb.json"),
        "--csv",
        str(tmp_path / "lb.csv"),
    )
    assert r.returncode == 0, r.stderr
    board = json.loads((tmp_path / "lb.json").read_text())
    stable = summary["benchmark"]["stable"] is True
    shown = [e["attempt_id"] for g in board["groups"] for e in g["entries"]]
    assert shown == ([attempt.name] if stable else [])  # CPU timings may be unstable on a busy machine

    out_file = tmp_path / "baselines" / "vector_add.json"
    r = run_cli("promote-baseline", "--attempt", str(attempt), "--output", str(out_file))
    if stable:
        assert r.returncode == 0, r.stderr
        base = json.loads(out_file.read_text())
        assert base["source"]["attempt_id"] == attempt.name and base["device"] == "cpu"
        r = run_cli("promote-baseline", "--attempt", str(attempt), "--output", str(out_file))
        assert r.returncode == 2 and "--force" in r.stderr
    else:
        assert r.returncode == 2 and "not stable" in r.stderr
        assert not out_file.exists()


def test_an_empty_leaderboard_explains_itself(tmp_path, capsys):
    """Finding 7 of issue 35: "no complete, correct and stable attempts" said nothing of why."""
    from mini_kv.cli import main

    art = tmp_path / "artifacts"
    make_attempt(art, candidate="v0", seed=1, stable=False)
    make_attempt(art, candidate="v1", seed=2, bench=False, stable=None)
    make_attempt(art, candidate="v2", seed=3, status="INCORRECT", bench=False, stable=None)
    assert main(["leaderboard", "--artifacts", str(art)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "nothing to rank: of 3 indexed attempt(s)" in out
    assert "1 timing unstable" in out and "1 not benchmarked" in out and "1 not PASSED (INCORRECT)" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["leaderboard", "--artifacts", str(empty)]) == 0
    assert "no attempt in the index" in capsys.readouterr().out
