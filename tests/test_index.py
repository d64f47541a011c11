"""The attempt index (artifacts/index.sqlite): rebuild, update, versioning, corruption.

`make_attempt` builds a sealed attempt with AttemptWriter and synthetic benchmark data (no compiler);
the other store tests import it from here.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest

from mini_kv.codec import from_json, to_json
from mini_kv.model import WorkerResults
from mini_kv.store.attempts import AttemptWriter, read_attempt
from mini_kv.store.index import (
    INDEX_NAME,
    IndexUnusable,
    read_index,
    rebuild_index,
    update_index,
)

SUITE = "a" * 64


def fixture_env(tag: str = "cpu-env-0001") -> dict:
    """A synthetic environment.json whose `key` is really its environment key (the tag tells them apart)."""
    from mini_kv.environment import environment_key

    env = {
        "schema_version": 1,
        "python": "3.11",
        "machine": "x86_64",
        "cpu_count": 2,
        "device_kind": "cpu",
        "gpu": None,
        "torch": "2.13.0",
        "tag": tag,
    }
    return {**env, "key": environment_key(env)}


ENV_KEY = fixture_env()["key"]


def env_key_of(tag: str) -> str:
    return fixture_env(tag)["key"]


def synth_samples(
    p50: float, seed: int, repeats: int = 5, n: int = 100, noise: float = 0.01, drift: float = 0.0
) -> list[list[float]]:
    """Timing-like samples: normal around p50 with a small relative spread, strictly positive; `drift`
    shifts each repeat by that fraction more than the previous one (an unstable measurement)."""
    rng = np.random.default_rng(seed)
    arr = rng.normal(p50, p50 * noise, size=(repeats, n)) * (1 + drift * np.arange(repeats))[:, None]
    return np.clip(arr, p50 * 0.5, None).round(6).tolist()


def salt_of(seed: int) -> str:
    """The (per-run, secret) seed salt of the synthetic attempt made with `seed`."""
    return f"{seed:032x}"


SALT = salt_of(0)


def bench_case(
    case_id: str,
    samples: list[list[float]],
    ref_samples: list[list[float]],
    method: str = "wallclock",
    task: str = "vector_add",
    salt: str = SALT,
) -> dict:
    """A benchmark.json case record as the worker writes it (summaries, speedup, stability from the samples)."""
    from mini_kv import stats
    from mini_kv.worker.inputs import case_seed

    cs, rs = stats.summarize_repeats(samples), stats.summarize_repeats(ref_samples)
    stab = {**to_json(stats.stability(cs, rs, 0.03, 0.15)), "max_cv": 0.03, "max_p95_cv": 0.15}
    return {
        "id": case_id,
        "dtype": "float32",
        "params": {"n": 1024},
        "seed": case_seed(task, case_id, salt),
        "method": method,
        "l2": "n/a",
        "timer": "host wall clock",
        "unit": "us",
        "order": [],
        "candidate": {"samples": samples, "summary": to_json(cs)},
        "reference": {"samples": ref_samples, "summary": to_json(rs)},
        "speedup": stats.speedup(rs.overall.p50, cs.overall.p50),
        "stability": stab,
        "post_check": {"ok": True, "reason": None},
    }


def correctness_records(status: str = "PASSED", device: str = "cpu", salt: str = SALT) -> dict:
    """correctness.json's records (load, cases, contract, incidents) of a run that passed or was INCORRECT."""
    kernels = {"CPU": True, "Meta": True, "CUDA": device.startswith("cuda")}
    cases = [
        {"id": "core_0", "kind": "core", "status": "PASSED"},
        {"id": "edge_0", "kind": "edge", "status": "PASSED" if status == "PASSED" else "INCORRECT"},
    ]
    return {
        "schema_version": 2,
        "format": "task-card",
        "device": device,
        "seed_salt": salt,
        "load": {"ok": True, "kernels": kernels},
        "cases": cases,
        "contract": {"opcheck": {"status": "PASSED"}},
        "incidents": [],
    }


def make_attempt(
    artifacts: Path,
    task: str = "vector_add",
    candidate: str = "v0",
    *,
    status: str = "PASSED",
    stable: bool | None = True,
    speedups: dict[str, float] | None = None,
    p50: float = 10.0,
    seed: int = 0,
    suite_hash: str = SUITE,
    env_key: str = ENV_KEY,
    device: str = "cpu",
    task_version: str = "1.0.0",
    op_version: str = "1.0.0",
    created_at: str | None = None,
    repeats: int = 5,
    n: int = 100,
    slowdown: float = 1.0,
    bench: bool = True,
    extra_files: dict | None = None,
    log_text: str = "synthetic\n",
) -> Path:
    """A sealed attempt with synthetic data; `speedups` maps bench case id -> speedup over the reference.

    The header's status and benchmark summary come from the records through the same function `verify`
    uses (store.headline.card_headline). `stable=False` gives drifting (unstable) samples; `env_key` is
    the tag of the environment (see fixture_env) or ENV_KEY."""
    files, header = attempt_records(
        task,
        status=status,
        stable=stable,
        speedups=speedups,
        p50=p50,
        seed=seed,
        suite_hash=suite_hash,
        env_key=env_key,
        device=device,
        task_version=task_version,
        op_version=op_version,
        repeats=repeats,
        n=n,
        slowdown=slowdown,
        bench=bench,
    )
    return write_attempt(
        artifacts,
        task,
        candidate,
        files,
        header,
        created_at=created_at,
        extra_files=extra_files,
        log_text=log_text,
    )


def attempt_records(
    task: str = "vector_add",
    *,
    status: str = "PASSED",
    stable: bool | None = True,
    speedups: dict[str, float] | None = None,
    p50: float = 10.0,
    seed: int = 0,
    suite_hash: str = SUITE,
    env_key: str = ENV_KEY,
    device: str = "cpu",
    task_version: str = "1.0.0",
    op_version: str = "1.0.0",
    repeats: int = 5,
    n: int = 100,
    slowdown: float = 1.0,
    bench: bool = True,
) -> tuple[dict, dict]:
    """The JSON files of a synthetic attempt (by name) and its header without the candidate's fields."""
    from mini_kv.store.headline import card_headline

    speedups = {"bench_a": 1.5} if speedups is None else speedups
    cases = []
    for i, (cid, sp) in enumerate(sorted(speedups.items())):
        drift = 0.2 if stable is False else 0.0
        cand = synth_samples(p50 * slowdown, seed * 1000 + i, repeats, n, drift=drift)
        ref = synth_samples(p50 * sp, seed * 1000 + i + 500, repeats, n)
        cases.append(bench_case(cid, cand, ref, task=task, salt=salt_of(seed)))
    env = fixture_env() if env_key == ENV_KEY else fixture_env(env_key)
    corr = correctness_records(status, device, salt_of(seed))
    head = card_headline("ok", from_json(WorkerResults, corr), cases if bench else [], not bench, device)
    assert head.status == status, (head.status, status)
    corr["summary"] = to_json(head.correctness)
    files = {
        "task_card.json": {"path": f"tasks/{task}.yaml", "card": {"id": task}, "suite_hash": suite_hash},
        "environment.json": env,
        "correctness.json": corr,
        "benchmark.json": {
            "schema_version": 2,
            "format": "task-card",
            "device": device,
            "settings": None,
            "cases": cases if bench else [],
            "summary": head.benchmark,
        },
    }
    header = {
        "task_id": task,
        "task_version": task_version,
        "operator": {"name": task, "version": op_version},
        "suite_hash": suite_hash,
        "environment_key": env["key"],
        "build_key": None,
        "status": status,
        "exit_code": 0 if status == "PASSED" else 4,
        "device": device,
        "correctness": to_json(head.correctness),
        "benchmark": head.benchmark,
        "duration_s": 0.1,
    }
    return files, header


def write_attempt(
    artifacts: Path,
    task: str,
    candidate: str,
    files: dict,
    header: dict,
    *,
    created_at: str | None = None,
    extra_files: dict | None = None,
    log_text: str = "synthetic\n",
) -> Path:
    """Seal `files` (from attempt_records) as an attempt of `candidate` through AttemptWriter."""
    w = AttemptWriter(artifacts, task, candidate)
    for rel, obj in files.items():
        w.json(rel, obj)
    w.text("logs/worker.log", log_text)
    for rel, obj in (extra_files or {}).items():
        w.json(rel, obj)
    return w.commit(
        {
            **header,
            "candidate": candidate,
            "op": f"ns_{candidate}::{task}",
            "created_at": created_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
    )


def snapshot(artifacts: Path) -> dict[str, tuple]:
    """The index content as comparable plain data: attempt id -> (row values, bench-case values)."""
    rows, cases = read_index(artifacts)
    return {r.attempt_id: (astuple(r), tuple(astuple(c) for c in cases[r.attempt_id])) for r in rows}


def valid_attempt_ids(artifacts: Path) -> set[str]:
    """Attempt ids of every directory that read_attempt accepts (the ground truth for the index)."""
    out = set()
    for task_dir in Path(artifacts).iterdir():
        if not task_dir.is_dir() or task_dir.name.startswith("."):
            continue
        for d in task_dir.iterdir():
            try:
                out.add(read_attempt(d)["attempt_id"])
            except Exception:  # noqa: BLE001 - anything unreadable is not an attempt
                pass
    return out


# ------------------------------------------------------------------------------------------ tests


def test_rebuild_indexes_every_attempt_and_is_idempotent(tmp_path):
    ids = {make_attempt(tmp_path, candidate=c, seed=i).name for i, c in enumerate(["v0", "v1", "v2"])}
    ids.add(make_attempt(tmp_path, task="rmsnorm", candidate="v0", status="INCORRECT", seed=9).name)
    result = rebuild_index(tmp_path)
    assert result.attempts == 4 and result.problems == []
    snap = snapshot(tmp_path)
    assert set(snap) == ids == valid_attempt_ids(tmp_path)
    rebuild_index(tmp_path)
    assert snapshot(tmp_path) == snap
    assert not list(tmp_path.glob(".index.sqlite.*.tmp"))


def test_rows_carry_the_header_and_bench_cases(tmp_path):
    a = make_attempt(tmp_path, candidate="v1", speedups={"bench_a": 2.0, "bench_b": 1.0})
    rebuild_index(tmp_path)
    rows, cases = read_index(tmp_path)
    (row,) = rows
    assert row.attempt_id == a.name and row.path == f"vector_add/{a.name}"
    assert row.status == "PASSED" and row.stable == 1 and row.device == "cpu"
    assert row.suite_hash == SUITE and row.environment_key == ENV_KEY
    assert row.geomean_speedup == pytest.approx(np.sqrt(2.0), rel=0.05)
    assert {c.case_id for c in cases[a.name]} == {"bench_a", "bench_b"}


def test_update_creates_the_index_then_adds_attempts(tmp_path):
    first = make_attempt(tmp_path, candidate="v0")
    assert not (tmp_path / INDEX_NAME).exists()
    assert update_index(tmp_path, first) == []  # no index yet: built by a rebuild, which includes `first`
    assert set(snapshot(tmp_path)) == {first.name}
    second = make_attempt(tmp_path, candidate="v1", seed=1)
    update_index(tmp_path, second)
    update_index(tmp_path, second)  # idempotent
    live = snapshot(tmp_path)
    rebuild_index(tmp_path)
    assert live == snapshot(tmp_path) and set(live) == {first.name, second.name}


def test_update_refuses_an_invalid_attempt(tmp_path):
    a = make_attempt(tmp_path)
    (a / "benchmark.json").write_text("{}")
    with pytest.raises(IndexUnusable, match="SHA-256"):
        update_index(tmp_path, a)


def test_future_index_version_is_refused_with_what_to_do(tmp_path):
    make_attempt(tmp_path)
    rebuild_index(tmp_path)
    con = sqlite3.connect(tmp_path / INDEX_NAME)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(IndexUnusable) as exc:
        read_index(tmp_path)
    msg = str(exc.value)
    assert "schema_version 99" in msg and "rebuild-index" in msg
    with pytest.raises(IndexUnusable, match="rebuild-index"):
        update_index(tmp_path, make_attempt(tmp_path, candidate="v1"))
    assert rebuild_index(tmp_path).attempts == 2
    assert len(snapshot(tmp_path)) == 2


@pytest.mark.parametrize(
    "content", [b"", b"this is not a database at all" * 100, b"SQLite format 3\x00" + b"\x00" * 200]
)
def test_corrupt_or_foreign_index_is_reported_and_rebuilt(tmp_path, content):
    a = make_attempt(tmp_path)
    (tmp_path / INDEX_NAME).write_bytes(content)
    with pytest.raises(IndexUnusable, match="rebuild-index"):
        read_index(tmp_path)
    with pytest.raises(IndexUnusable):
        update_index(tmp_path, a)
    rebuild_index(tmp_path)
    assert set(snapshot(tmp_path)) == {a.name}


def test_rebuild_removes_stale_temp_files_and_sidecars(tmp_path):
    a = make_attempt(tmp_path)
    rebuild_index(tmp_path)
    stale = tmp_path / ".index.sqlite.123.deadbeef.tmp"
    stale.write_bytes(b"half a database")
    stale_journal = tmp_path / ".index.sqlite.123.deadbeef.tmp-journal"
    stale_journal.write_bytes(b"its journal")
    rebuild_index(tmp_path)
    assert not stale.exists() and not stale_journal.exists()
    assert set(snapshot(tmp_path)) == {a.name}
    assert not (tmp_path / (INDEX_NAME + "-journal")).exists()


def test_rebuild_of_a_missing_store_is_a_user_error(tmp_path):
    from mini_kv.errors import UserError

    with pytest.raises(UserError, match="no artifact store"):
        rebuild_index(tmp_path / "nope")


def test_cli_rebuild_index_json(tmp_path, capsys):
    import json

    from mini_kv.cli import main

    a = make_attempt(tmp_path)
    (tmp_path / "vector_add" / "junk.txt").write_text("x")
    assert main(["rebuild-index", "--artifacts", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["attempts"] == 1
    assert [p["kind"] for p in out["problems"]] == ["stray"]
    assert set(snapshot(tmp_path)) == {a.name}
