"""The attempt index: `artifacts/index.sqlite`, a cache derived from the attempt directories alone.

The attempt directories are the evidence; the index only makes them quick to query (leaderboard,
"latest attempt of X"). It can always be thrown away and rebuilt with `rebuild_index`.

Concurrency and crash safety:
  * every access (readers included) holds the file lock `artifacts/.index.lock`, so writers from
    several processes are serialised and a rebuild never swaps the file under anyone's feet;
  * each update is one SQLite transaction (journal_mode=WAL, synchronous=FULL): a writer killed
    mid-update leaves the previous state, which the next opener recovers from the WAL;
  * the busy timeout is a second line of defence for tools that open the file without the lock;
  * `rebuild_index` writes a temporary database next to the index and `os.replace`s it in, after
    checkpointing the old one, so the index is either the old or the new one, never a mixture.

Directories that are not valid attempts (`.partial`, stray files, invalid JSON, tampered files,
unknown schema versions) are returned as `Problem`s and skipped; they never stop a rebuild.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock
from filelock import Timeout as LockTimeout

from mini_kv.errors import ConfigError, UserError
from mini_kv.model import sha256_file
from mini_kv.store.atomic import fsync_dir
from mini_kv.store.attempts import PARTIAL, AttemptInvalid, read_attempt

INDEX_SCHEMA_VERSION = 1
INDEX_NAME = "index.sqlite"
LOCK_NAME = ".index.lock"
TMP_PREFIX = ".index.sqlite."
TMP_SUFFIX = ".tmp"
SIDECARS = ("-wal", "-shm", "-journal")
LOCK_TIMEOUT_S = 300.0
BUSY_TIMEOUT_S = 30.0
# schema_version of the JSON files inside an attempt that the index reads
KNOWN_FILE_VERSIONS = {"benchmark.json": {1}, "regression.json": {1}, "environment.json": {1}}

_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE attempts (
    attempt_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    task_version TEXT,
    operator_name TEXT,
    operator_version TEXT,
    candidate TEXT NOT NULL,
    status TEXT NOT NULL,
    device TEXT,
    suite_hash TEXT,
    environment_key TEXT,
    created_at TEXT,
    stable INTEGER,
    geomean_speedup REAL,
    regression TEXT,
    path TEXT NOT NULL,
    attempt_sha256 TEXT NOT NULL
);
CREATE TABLE bench_cases (
    attempt_id TEXT NOT NULL REFERENCES attempts(attempt_id) ON DELETE CASCADE,
    case_id TEXT NOT NULL,
    p50_us REAL,
    p95_us REAL,
    speedup REAL,
    stable INTEGER,
    PRIMARY KEY (attempt_id, case_id)
);
CREATE INDEX attempts_by_candidate ON attempts (task_id, candidate, created_at);
"""

ATTEMPT_COLUMNS = ("attempt_id", "task_id", "task_version", "operator_name", "operator_version", "candidate",
                   "status", "device", "suite_hash", "environment_key", "created_at", "stable",
                   "geomean_speedup", "regression", "path", "attempt_sha256")
CASE_COLUMNS = ("attempt_id", "case_id", "p50_us", "p95_us", "speedup", "stable")


class _Misplaced(AttemptInvalid):
    kind = "misplaced"


class _UnknownVersion(AttemptInvalid):
    kind = "version"


class IndexUnusable(UserError):
    """The index cannot be read or written; the message says what to do (usually `rebuild-index`)."""


@dataclass(frozen=True)
class Problem:
    """A directory or file under artifacts/ that is not a usable attempt; reported and skipped."""

    path: str
    kind: str  # partial | stray | invalid | version | misplaced
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RebuildResult:
    index: Path
    attempts: int
    problems: list[Problem]


def index_path(artifacts: Path) -> Path:
    return Path(artifacts) / INDEX_NAME


@contextlib.contextmanager
def index_lock(artifacts: Path, timeout: float = LOCK_TIMEOUT_S):
    """The one lock every index reader and writer holds."""
    artifacts = Path(artifacts)
    artifacts.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(artifacts / LOCK_NAME), timeout=timeout)
    try:
        lock.acquire()
    except LockTimeout:
        raise IndexUnusable(f"{artifacts / LOCK_NAME}: another mini_kv process has held the index lock for "
                            f"{timeout:.0f} s; wait for it to finish (or end it) and retry") from None
    try:
        yield
    finally:
        lock.release()


def _attempt_json_file(path: Path, rel: str):
    try:
        obj = json.loads((path / rel).read_text())
    except (OSError, ValueError) as exc:
        raise AttemptInvalid(f"{path / rel}: unreadable ({exc})") from None
    if not isinstance(obj, dict):
        raise AttemptInvalid(f"{path / rel}: not a JSON object")
    known = KNOWN_FILE_VERSIONS.get(rel)
    if known is not None and obj.get("schema_version") not in known:
        raise _UnknownVersion(f"{path / rel}: schema_version {obj.get('schema_version')!r} is not one this mini_kv "
                             f"reads ({', '.join(map(str, sorted(known)))}); it was written by another mini_kv "
                             "version: read it with that version")
    return obj


@functools.cache
def _attempt_validator():
    import jsonschema

    from mini_kv.load.schema import load_schema

    return jsonschema.Draft202012Validator(load_schema("attempt"))


def record_for_attempt(attempt_dir: Path) -> tuple[dict, list[dict]]:
    """The index row and bench-case rows of one attempt; raises AttemptInvalid if it is not usable.

    Reads the attempt through read_attempt, so every listed file's SHA-256 is checked first.
    """
    from mini_kv.load.schema import validate

    attempt_dir = Path(attempt_dir)
    header = read_attempt(attempt_dir, verify=False)  # JSON object of a known schema_version
    plain = {k: v for k, v in header.items() if k != "path"}
    if not _attempt_validator().is_valid(plain):
        try:
            validate(plain, "attempt", str(attempt_dir / "attempt.json"))  # for the message naming the field
        except ConfigError as exc:
            raise AttemptInvalid(str(exc)) from None
    header = read_attempt(attempt_dir)  # now the file list is well formed: check every size and SHA-256
    if header["attempt_id"] != attempt_dir.name:
        raise _Misplaced(f"{attempt_dir}: directory name differs from its attempt_id {header['attempt_id']!r} "
                             "(renamed or copied by hand); move it back to artifacts/<task>/<attempt_id>")
    if header["task_id"] != attempt_dir.parent.name:
        raise _Misplaced(f"{attempt_dir}: lies under {attempt_dir.parent.name!r} but belongs to task "
                             f"{header['task_id']!r}; move it to artifacts/{header['task_id']}/")
    listed = {f["path"] for f in header["files"]}
    bench = _attempt_json_file(attempt_dir, "benchmark.json") if "benchmark.json" in listed else None
    regression = _attempt_json_file(attempt_dir, "regression.json") if "regression.json" in listed else None
    bsum = header.get("benchmark") or {}
    stable = bsum.get("stable")
    row = {
        "attempt_id": header["attempt_id"], "task_id": header["task_id"], "task_version": header["task_version"],
        "operator_name": header["operator"]["name"], "operator_version": header["operator"]["version"],
        "candidate": header["candidate"], "status": header["status"], "device": header.get("device"),
        "suite_hash": header["suite_hash"], "environment_key": header["environment_key"],
        "created_at": header["created_at"], "stable": None if stable is None else int(bool(stable)),
        "geomean_speedup": bsum.get("geomean_speedup"),
        "regression": (regression or {}).get("verdict"),
        "path": f"{attempt_dir.parent.name}/{attempt_dir.name}",
        "attempt_sha256": sha256_file(attempt_dir / "attempt.json"),
    }
    cases = []
    for c in (bench or {}).get("cases", []):
        if not isinstance(c, dict) or "candidate" not in c:
            continue
        overall = c["candidate"].get("summary", {}).get("overall", {})
        cases.append({"attempt_id": row["attempt_id"], "case_id": c.get("id"), "p50_us": overall.get("p50"),
                      "p95_us": overall.get("p95"), "speedup": c.get("speedup"),
                      "stable": int(bool((c.get("stability") or {}).get("stable")))})
    return row, cases


def _classify(exc: AttemptInvalid) -> str:
    kind = getattr(exc, "kind", None)
    if kind:
        return kind
    # read_attempt's refusal of an attempt.json schema_version it does not read
    return "version" if "schema_version" in str(exc) and "another mini_kv version" in str(exc) else "invalid"


def scan(artifacts: Path) -> tuple[list[tuple[dict, list[dict]]], list[Problem]]:
    """Every valid attempt's rows, plus a Problem for everything else found under artifacts/."""
    artifacts = Path(artifacts)
    records: list[tuple[dict, list[dict]]] = []
    problems: list[Problem] = []
    if not artifacts.is_dir():
        return records, problems
    own = {INDEX_NAME} | {INDEX_NAME + s for s in SIDECARS}
    for entry in sorted(artifacts.iterdir()):
        if entry.name.startswith(".") or entry.name in own:
            continue  # the lock, temporary index files, hidden tool state
        if entry.is_symlink() or not entry.is_dir():
            problems.append(Problem(str(entry), "stray", "not a task directory (stray file); remove it"))
            continue
        for d in sorted(entry.iterdir()):
            if d.is_symlink() or not d.is_dir():
                problems.append(Problem(str(d), "stray", "not an attempt directory (stray file or link); remove it"))
            elif d.name.endswith(PARTIAL):
                problems.append(Problem(str(d), "partial", "incomplete attempt (.partial): still being written, "
                                        "or its writer died; never used. Remove it once no verify is running"))
            else:
                try:
                    records.append(record_for_attempt(d))
                except AttemptInvalid as exc:
                    msg = str(exc)
                    msg = msg[len(str(d)) + 2:] if msg.startswith(f"{d}: ") else msg
                    problems.append(Problem(str(d), _classify(exc), msg))
    return records, problems


def store_read_only(artifacts: Path) -> bool:
    """An existing store this process cannot write (read-only mount, permissions): neither the lock file
    nor sqlite's WAL files can be created there, and no writer of this user can be at work in it."""
    artifacts = Path(artifacts)
    return artifacts.is_dir() and not os.access(artifacts, os.W_OK | os.X_OK)


def _connect(db: Path, read_only: bool = False) -> sqlite3.Connection:
    """An open connection to an existing, current-version index; IndexUnusable otherwise."""
    if not db.is_file():
        raise IndexUnusable(f"{db}: no index yet; create it with `mini-kv rebuild-index --artifacts {db.parent}`")
    if read_only:  # immutable unless a WAL file is left over, whose pages only a WAL-aware read sees
        wal = Path(f"{db}-wal").exists()
        uri = f"{db.absolute().as_uri()}?{'mode=ro' if wal else 'immutable=1'}"
        con = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    else:
        con = sqlite3.connect(str(db), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        con.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        if not read_only:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
        con.execute("PRAGMA foreign_keys=ON")
        try:
            row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:
            row = None
        if row is None:
            raise IndexUnusable(f"{db}: not a mini_kv index (no schema_version); rebuild it from the attempt "
                                f"directories with `mini-kv rebuild-index --artifacts {db.parent}`")
        if row[0] != str(INDEX_SCHEMA_VERSION):
            raise IndexUnusable(f"{db}: index schema_version {row[0]} is not {INDEX_SCHEMA_VERSION}, the one this "
                                "mini_kv reads; it was written by another mini_kv version. The index is derived "
                                "data: rebuild it for this version with "
                                f"`mini-kv rebuild-index --artifacts {db.parent}`, or use the mini_kv that wrote it")
    except sqlite3.DatabaseError as exc:
        con.close()
        raise IndexUnusable(f"{db}: unreadable ({exc}); rebuild it with "
                            f"`mini-kv rebuild-index --artifacts {db.parent}`") from None
    except BaseException:
        con.close()
        raise
    return con


def _insert(con: sqlite3.Connection, row: dict, cases: list[dict]) -> None:
    con.execute("DELETE FROM bench_cases WHERE attempt_id=?", (row["attempt_id"],))
    con.execute(f"INSERT OR REPLACE INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})", [row[c] for c in ATTEMPT_COLUMNS])
    con.executemany(f"INSERT OR REPLACE INTO bench_cases ({', '.join(CASE_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(CASE_COLUMNS))})", [[c[k] for k in CASE_COLUMNS] for c in cases])


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _retire(db: Path) -> None:
    """Fold any WAL of the old index into it and drop its sidecar files, so the new file can replace it.

    Runs under the lock. If this process dies after it, the old index is still whole and self-contained.
    """
    if db.is_file():
        try:
            con = sqlite3.connect(str(db), timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                con.execute("PRAGMA journal_mode=DELETE")
            finally:
                con.close()
        except sqlite3.DatabaseError:
            pass  # garbage or another version's file: it is replaced whole anyway
    for suffix in SIDECARS:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(str(db) + suffix)


def _rebuild_locked(artifacts: Path) -> RebuildResult:
    artifacts = Path(artifacts)
    for stale in artifacts.glob(TMP_PREFIX + "*"):  # left by a rebuild that was killed (and its journal)
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    records, problems = scan(artifacts)
    db = index_path(artifacts)
    tmp = artifacts / f"{TMP_PREFIX}{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        con = sqlite3.connect(str(tmp), isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            con.execute("BEGIN")
            for stmt in _DDL.split(";"):
                if stmt.strip():
                    con.execute(stmt)
            con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(INDEX_SCHEMA_VERSION),))
            con.execute("INSERT INTO meta VALUES ('generator', 'mini_kv')")
            for row, cases in records:
                _insert(con, row, cases)
            con.execute(f"PRAGMA user_version={INDEX_SCHEMA_VERSION}")
            con.execute("COMMIT")
        finally:
            con.close()
        _fsync_file(tmp)
        _retire(db)
        os.replace(tmp, db)
        fsync_dir(artifacts)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return RebuildResult(db, len(records), problems)


def rebuild_index(artifacts: Path) -> RebuildResult:
    """Rebuild artifacts/index.sqlite from the attempt directories alone; idempotent.

    Returns the number of indexed attempts and the problems (skipped directories and files).
    """
    artifacts = Path(artifacts)
    if not artifacts.is_dir():
        raise UserError(f"{artifacts}: no artifact store here (no such directory); run `mini-kv verify` first "
                        "or pass --artifacts")
    with index_lock(artifacts):
        try:
            return _rebuild_locked(artifacts)
        except sqlite3.Error as exc:
            raise IndexUnusable(f"{index_path(artifacts)}: rebuild failed ({exc})") from None


def update_index(artifacts: Path, attempt_dir: Path) -> list[Problem]:
    """Add one committed attempt to the index (call after AttemptWriter.commit).

    Creates the index with a full rebuild when there is none yet (the rebuild includes the attempt) and
    returns that rebuild's problems; otherwise returns []. Raises IndexUnusable on any failure: the
    attempt itself is safe either way, and `rebuild-index` brings the index back in line.
    """
    artifacts = Path(artifacts)
    try:
        row, cases = record_for_attempt(Path(attempt_dir))  # hashing needs no lock: attempts never change
    except AttemptInvalid as exc:
        raise IndexUnusable(f"not indexed: {exc}") from None
    db = index_path(artifacts)
    with index_lock(artifacts):
        try:
            if not db.exists():
                return _rebuild_locked(artifacts).problems
            con = _connect(db)
            try:
                con.execute("BEGIN IMMEDIATE")
                try:
                    _insert(con, row, cases)
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            finally:
                con.close()
        except (sqlite3.Error, OSError) as exc:
            raise IndexUnusable(f"{db}: update failed ({exc}); rebuild it with "
                                f"`mini-kv rebuild-index --artifacts {artifacts}`") from None
    return []


def read_index(artifacts: Path, where: str = "", params: tuple = ()) -> tuple[list[dict], dict[str, list[dict]]]:
    """Attempt rows (optionally filtered by an SQL `where` over `attempts`) and their bench cases, by attempt id."""
    db = index_path(artifacts)
    read_only = store_read_only(artifacts)
    # a read-only store gets no lock (it cannot be created there; nobody of ours can write there either)
    with contextlib.nullcontext() if read_only else index_lock(artifacts):
        con = _connect(db, read_only=read_only)
        try:
            con.row_factory = sqlite3.Row
            rows = [dict(r) for r in con.execute(
                f"SELECT * FROM attempts {('WHERE ' + where) if where else ''} "
                "ORDER BY task_id, candidate, created_at, attempt_id", params)]
            cases: dict[str, list[dict]] = {}
            for r in con.execute("SELECT * FROM bench_cases ORDER BY attempt_id, case_id"):
                cases.setdefault(r["attempt_id"], []).append(dict(r))
        except sqlite3.DatabaseError as exc:
            raise IndexUnusable(f"{db}: unreadable ({exc}); rebuild it with "
                                f"`mini-kv rebuild-index --artifacts {Path(artifacts)}`") from None
        finally:
            con.close()
    return rows, {r["attempt_id"]: cases.get(r["attempt_id"], []) for r in rows}


def snapshot(artifacts: Path) -> dict[str, tuple]:
    """The index content as comparable plain data: attempt id -> (row values, bench-case values)."""
    rows, cases = read_index(artifacts)
    return {r["attempt_id"]: (tuple(r[c] for c in ATTEMPT_COLUMNS),
                              tuple(tuple(c[k] for k in CASE_COLUMNS) for c in cases[r["attempt_id"]]))
            for r in rows}
