"""Leaderboard: the latest valid attempt per (task, candidate), ranked by geometric-mean speedup.

Valid means complete (read_attempt verifies every file's SHA-256, and attempt.json still has the hash
the index recorded), PASSED (fully correct) and stable, with a geometric-mean speedup. Attempts are
grouped by (task, suite_hash, environment_key, device): only timings measured on the same suite, in the
same environment and on the same device are ranked against each other.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

from mini_kv.model import sha256_file
from mini_kv.store.atomic import write_bytes, write_json
from mini_kv.store.attempts import AttemptInvalid, read_attempt
from mini_kv.store.index import Problem, index_path, read_index, rebuild_index

LEADERBOARD_SCHEMA_VERSION = 1
GROUP_KEYS = ("task_id", "suite_hash", "environment_key", "device")
CSV_COLUMNS = ("schema_version", "task_id", "suite_hash", "environment_key", "device", "rank", "candidate",
               "geomean_speedup", "attempt_id", "created_at", "regression", "case_speedups")


def build_leaderboard(artifacts: Path, task: str | None = None, rebuild: bool = False) -> dict:
    """The leaderboard as plain data: {"schema_version", "generated_at", "groups": [...], "problems": [...]}.

    Reads the index (building it first when there is none, or when `rebuild`); every attempt that would
    be shown is re-verified, and one that fails is reported and replaced by that candidate's previous
    valid attempt.
    """
    artifacts = Path(artifacts)
    problems: list[Problem] = []
    if rebuild or not index_path(artifacts).exists():
        problems.extend(rebuild_index(artifacts).problems)
    where = "status='PASSED' AND stable=1 AND geomean_speedup IS NOT NULL"
    params: tuple = ()
    if task:
        where += " AND task_id=?"
        params = (task,)
    rows, cases = read_index(artifacts, where, params)
    latest: dict[tuple[str, str], dict] = {}
    for row in sorted(rows, key=lambda r: (r["created_at"], r["attempt_id"]), reverse=True):
        key = (row["task_id"], row["candidate"])
        if key in latest:
            continue
        path = artifacts / row["path"]
        try:
            read_attempt(path)
            if sha256_file(path / "attempt.json") != row["attempt_sha256"]:
                raise AttemptInvalid(f"{path}: attempt.json changed after it was indexed (tampered?); "
                                     "inspect it, then run `mini-kv rebuild-index`")
        except (AttemptInvalid, OSError) as exc:
            problems.append(Problem(str(path), "invalid", str(exc)))
            continue
        latest[key] = row
    groups: dict[tuple, list[dict]] = {}
    for row in latest.values():
        groups.setdefault(tuple(row[k] for k in GROUP_KEYS), []).append(row)
    out_groups = []
    for gkey in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        members = sorted(groups[gkey], key=lambda r: (-r["geomean_speedup"], r["candidate"]))
        entries = []
        for rank, r in enumerate(members, start=1):
            entries.append({
                "rank": rank, "candidate": r["candidate"], "geomean_speedup": r["geomean_speedup"],
                "attempt_id": r["attempt_id"], "created_at": r["created_at"], "path": r["path"],
                "regression": r["regression"],
                "cases": {c["case_id"]: c["speedup"] for c in cases[r["attempt_id"]]},
            })
        out_groups.append({**dict(zip(GROUP_KEYS, gkey, strict=True)), "entries": entries})
    return {
        "schema_version": LEADERBOARD_SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "artifacts": str(artifacts),
        "task": task,
        "groups": out_groups,
        "problems": [p.to_dict() for p in problems],
    }


def to_csv(board: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g in board["groups"]:
        for e in g["entries"]:
            w.writerow([board["schema_version"], g["task_id"], g["suite_hash"], g["environment_key"], g["device"],
                        e["rank"], e["candidate"], repr(e["geomean_speedup"]), e["attempt_id"], e["created_at"],
                        e["regression"] or "",
                        ";".join(f"{k}={v!r}" for k, v in sorted(e["cases"].items()))])
    return buf.getvalue()


def export_json(board: dict, path: Path) -> None:
    write_json(Path(path), board)


def export_csv(board: dict, path: Path) -> None:
    write_bytes(Path(path), to_csv(board).encode("utf-8"))


def rich_tables(board: dict) -> list:
    from rich.table import Table

    tables = []
    for g in board["groups"]:
        t = Table(title=f"{g['task_id']}  suite {str(g['suite_hash'])[:12]}  env {g['environment_key']}  "
                        f"device {g['device']}")
        for col in ("rank", "candidate", "geomean speedup", "per case", "regression", "attempt", "created"):
            t.add_column(col)
        for e in g["entries"]:
            per_case = ", ".join(f"{k} {v:.3f}x" for k, v in sorted(e["cases"].items()) if v is not None)
            t.add_row(str(e["rank"]), e["candidate"], f"{e['geomean_speedup']:.3f}x", per_case,
                      e["regression"] or "-", e["attempt_id"], e["created_at"])
        tables.append(t)
    return tables
