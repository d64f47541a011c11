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
import datetime as dt
import functools
import json
import os
import re
import secrets
import sqlite3
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from filelock import FileLock
from filelock import Timeout as LockTimeout

from mini_kv.codec import from_json
from mini_kv.errors import UserError
from mini_kv.judge.regression import timed
from mini_kv.model import WorkerResults, case_seed, safe_name, sha256_file, sol_suite_hash
from mini_kv.status import BuildStatus, Status
from mini_kv.store import headline, signing
from mini_kv.store.atomic import fsync_dir, fsync_file
from mini_kv.store.attempts import FILE_SCHEMAS, PARTIAL, AttemptInvalid, AttemptTampered, read_attempt
from mini_kv.store.jsonfile import RecordUnusable, read_versioned
from mini_kv.store.records import CARD_FORMAT, SOL_FORMAT, AttemptRecords, read_record, read_records

# 2: attempts.signed_by and the `tampered` table (the index remembers what it found tampered)
# 3: attempts.source_commit and source_dirty (the candidate's git commit)
INDEX_SCHEMA_VERSION = 3
INDEX_NAME = "index.sqlite"
LOCK_NAME = ".index.lock"
TMP_PREFIX = ".index.sqlite."
TMP_SUFFIX = ".tmp"
SIDECARS = ("-wal", "-shm", "-journal")
LOCK_TIMEOUT_S = 300.0
BUSY_TIMEOUT_S = 30.0
# schema_version of the JSON files inside an attempt that the index reads (and store.records' two)
KNOWN_FILE_VERSIONS = {"regression.json": 1, "environment.json": 1, "static_check.json": 1}
# the JSON files of an attempt that derive() reads (all must be JSON objects)
KNOWN_JSON_FILES = tuple(
    (
        "benchmark.json correctness.json environment.json regression.json compile.json task_card.json "
        "definition.json solution.json"
    ).split()
)

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
    attempt_sha256 TEXT NOT NULL,
    signed_by TEXT,
    source_commit TEXT,
    source_dirty INTEGER
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
CREATE TABLE tampered (
    path TEXT PRIMARY KEY,
    attempt_sha256 TEXT,
    first_seen TEXT NOT NULL,
    message TEXT NOT NULL
);
"""


class IndexUnusable(UserError):
    """The index cannot be read or written; the message says what to do (usually `rebuild-index`)."""


@dataclass(frozen=True)
class StoreProblem:
    """A directory or file under artifacts/ that is not a usable attempt; reported and skipped."""

    path: str
    kind: str  # partial | stray | invalid | version | misplaced | tampered | unsigned
    message: str


@dataclass(frozen=True)
class AttemptRow:
    """One attempt as the index holds it (table `attempts`, in column order): every value recomputed
    from the attempt's hashed records by check_attempt, never taken from its claims."""

    attempt_id: str
    task_id: str
    task_version: str | None
    operator_name: str | None
    operator_version: str | None
    candidate: str
    status: str
    device: str | None
    suite_hash: str | None
    environment_key: str | None
    created_at: str | None
    stable: int | None  # 1/0; None when nothing was timed
    geomean_speedup: float | None
    regression: str | None  # the regression verdict, when the attempt was judged against a baseline
    path: str  # <task>/<attempt_id>, relative to the store
    attempt_sha256: str
    signed_by: str | None  # the key id its signature claims
    source_commit: str | None  # the git commit of the candidate's project (attempt.json `source`)
    source_dirty: int | None  # 1 where its tree differed from that commit; None outside git

    @property
    def source(self) -> str:
        return source_label(self.source_commit, self.source_dirty)


def source_label(commit: str | None, dirty) -> str:
    """An attempt's source commit as tables show it: 12 hex digits, `+dirty` where its tree differed."""
    if not commit:
        return "-"
    return commit[:12] + ("+dirty" if dirty else "")


@dataclass(frozen=True)
class CaseRow:
    """One timed bench case of an attempt (table `bench_cases`), recomputed from its raw samples."""

    attempt_id: str
    case_id: str
    p50_us: float
    p95_us: float
    speedup: float
    stable: int


ATTEMPT_COLUMNS = tuple(f.name for f in fields(AttemptRow))
CASE_COLUMNS = tuple(f.name for f in fields(CaseRow))


@dataclass
class RebuildResult:
    index: Path
    attempts: int
    problems: list[StoreProblem]


def rebuild_hint(artifacts: Path) -> str:
    return f"rebuild it with `mini-kv rebuild-index --artifacts {Path(artifacts)}`"


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
        raise IndexUnusable(
            f"{artifacts / LOCK_NAME}: another mini_kv process has held the index lock for "
            f"{timeout:.0f} s; wait for it to finish (or end it) and retry"
        ) from None
    except OSError as exc:  # e.g. the lock path is a directory, or the store is read-only
        raise IndexUnusable(
            f"{artifacts / LOCK_NAME}: cannot take the index lock ({exc}); it must be a "
            "writable file (remove whatever else is there)"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _attempt_json_file(path: Path, rel: str) -> dict:
    """One JSON object of the attempt: versioned files at a version this mini_kv reads (correctness.json
    and benchmark.json migrated to version 2 and checked against their schemas)."""
    try:
        if rel in ("correctness.json", "benchmark.json"):
            return read_record(path / rel)
        return read_versioned(path / rel, KNOWN_FILE_VERSIONS.get(rel), FILE_SCHEMAS.get(rel))
    except RecordUnusable as exc:
        if exc.reason == "schema":  # its hash matched: rewritten, and the file list fixed up
            raise _tampered(path, rel, str(exc)[len(exc.file) + 2 :]) from None
        raise AttemptInvalid(str(exc), "version" if exc.reason == "version" else None) from None


@dataclass(frozen=True)
class CheckedAttempt:
    """An attempt that passed every check of the store (check_attempt): what every reader of an attempt
    uses, so none re-reads its files or takes a figure from what the attempt says about itself."""

    header: dict  # attempt.json, with `path`
    files: dict[str, dict]  # its JSON files (KNOWN_JSON_FILES it lists), by name, as read and checked
    row: AttemptRow  # the headline, recomputed from the per-case records
    cases: tuple[CaseRow, ...]

    @functools.cached_property
    def records(self) -> AttemptRecords:
        """Its per-case records typed (store.records.read_records); MalformedRecord if they cannot be."""
        return read_records(Path(self.header["path"]), self.header, self.files)


def check_attempt(attempt_dir: Path) -> CheckedAttempt:
    """One attempt, checked as the index checks it; raises AttemptInvalid if it is not usable.

    Reads the attempt through read_attempt, so every listed file's SHA-256 is checked first; then
    cross-checks the header's ids against the files they name and recomputes the headline (status,
    stability, speedups, geometric mean) from the per-case records (`derive`). The row holds the
    recomputed values; any stored claim that differs from them is AttemptTampered.
    """
    attempt_dir = Path(attempt_dir)
    header = read_attempt(attempt_dir)  # valid against its schema, then every listed size and SHA-256
    if header["attempt_id"] != attempt_dir.name:
        raise AttemptInvalid(
            f"{attempt_dir}: directory name differs from its attempt_id {header['attempt_id']!r} "
            "(renamed or copied by hand); move it back to artifacts/<task>/<attempt_id>",
            "misplaced",
        )
    if header["task_id"] != attempt_dir.parent.name:
        raise AttemptInvalid(
            f"{attempt_dir}: lies under {attempt_dir.parent.name!r} but belongs to task "
            f"{header['task_id']!r}; move it to artifacts/{header['task_id']}/",
            "misplaced",
        )
    head, files = derive(attempt_dir, header)
    _check_signature(attempt_dir, header)
    stable = None if head.benchmark is None else head.benchmark["stable"]
    row = AttemptRow(
        attempt_id=header["attempt_id"],
        task_id=header["task_id"],
        task_version=header["task_version"],
        operator_name=header["operator"]["name"],
        operator_version=header["operator"]["version"],
        candidate=header["candidate"],
        status=str(head.status),
        device=header.get("device"),
        suite_hash=header["suite_hash"],
        environment_key=header["environment_key"],
        created_at=header["created_at"],
        stable=None if stable is None else int(bool(stable)),
        geomean_speedup=None if head.benchmark is None else head.benchmark.get("geomean_speedup"),
        regression=(files.get("regression.json") or {}).get("verdict"),
        path=f"{attempt_dir.parent.name}/{attempt_dir.name}",
        attempt_sha256=sha256_file(attempt_dir / "attempt.json"),
        signed_by=signing.claimed_key_id(header),
        source_commit=(header.get("source") or {}).get("commit"),
        source_dirty=None if not header.get("source") else int(bool(header["source"]["dirty"])),
    )
    cases = tuple(
        CaseRow(row.attempt_id, c.id, c.p50_us, c.p95_us, c.speedup, int(c.stable)) for c in head.cases
    )
    return CheckedAttempt(header, files, row, cases)


def _check_signature(attempt_dir: Path, header: dict) -> None:
    """A signature made with the operator's key must hold; one that does not is a rewritten attempt.
    (Unsigned, or signed with another key: not this check's business; leaderboard --require-signed.)"""
    key = signing.operator_key(attempt_dir.parent.parent)
    if signing.check(key, header) == signing.Signature.BROKEN:
        raise _tampered(
            attempt_dir,
            "attempt.json",
            f"its signature does not hold under the operator's key (key id {key.key_id}): the attempt "
            "was changed after mini_kv signed it",
        )


_ATTEMPT_ID = re.compile(r"\d{8}T\d{12}Z-(?P<candidate>.+)-[0-9a-f]{6}")
_RECORDS = ("environment.json", "correctness.json", "benchmark.json")
REQUIRED_FILES = {
    CARD_FORMAT: ("task_card.json", *_RECORDS),
    SOL_FORMAT: ("definition.json", "workload.jsonl", "solution.json", *_RECORDS),
}


def _tampered(attempt_dir: Path, file: str, message: str) -> AttemptTampered:
    return AttemptTampered(f"{attempt_dir}: TAMPERED {file}: {message}")


def _agree(attempt_dir: Path, file: str, what: str, said, header_field: str, want) -> None:
    """A record's `what` is what attempt.json says (its `header_field`): else it is another attempt's."""
    if said != want:
        raise _tampered(
            attempt_dir, file, f"{what} {said!r} differs from attempt.json's {header_field} {want!r}"
        )


def derive(attempt_dir: Path, header: dict) -> tuple[headline.Headline, dict[str, dict]]:
    """The headline recomputed from a verified attempt's records, after checking that the header's ids
    agree with the files they describe. Returns it with the JSON files read (by name)."""
    fmt = header.get("format") or CARD_FORMAT
    if not isinstance(fmt, str) or fmt not in REQUIRED_FILES:
        raise AttemptInvalid(
            f"{attempt_dir / 'attempt.json'}: format {fmt!r} is not one of "
            f"{', '.join(sorted(REQUIRED_FILES))}"
        )
    listed = {f["path"] for f in header["files"]}
    files = {rel: _attempt_json_file(attempt_dir, rel) for rel in sorted(listed) if rel in KNOWN_JSON_FILES}
    for rel in REQUIRED_FILES[fmt]:
        if rel not in listed:
            raise _tampered(
                attempt_dir, rel, f"missing: a {fmt} attempt always has it (attempt.json does not list it)"
            )
    m = _ATTEMPT_ID.fullmatch(header["attempt_id"])
    if m is None or m["candidate"] != header["candidate"]:
        raise _tampered(
            attempt_dir,
            "attempt.json",
            f"attempt_id {header['attempt_id']!r} is not "
            f"<UTC time>-{header['candidate']}-<6 hex>, for its candidate {header['candidate']!r}",
        )
    _check_environment(attempt_dir, header, files["environment.json"])
    for rel in ("correctness.json", "benchmark.json"):
        for key, want in (("device", header.get("device")), ("format", fmt)):
            _agree(attempt_dir, rel, key, files[rel].get(key), key, want)
    corr, bench = files["correctness.json"], files["benchmark.json"]
    try:
        head = (_sol_headline if fmt == SOL_FORMAT else _card_headline)(attempt_dir, header, files)
    except headline.RecordError as exc:
        raise _tampered(attempt_dir, exc.file, str(exc)[len(exc.file) + 2 :]) from None
    except ValueError as exc:  # stats refusing the samples (empty, non-positive, NaN)
        raise _tampered(attempt_dir, "benchmark.json", f"timing samples unusable ({exc})") from None
    wrong = headline.claims_mismatch(head, header, corr, bench)
    if wrong:
        file = wrong[0].split(" ", 1)[0]
        raise _tampered(
            attempt_dir,
            file,
            "a headline differs from the recomputation from the hashed per-case records: " + "; ".join(wrong),
        )
    return head, files


def _sol_headline(attempt_dir: Path, header: dict, files: dict[str, dict]) -> headline.Headline:
    _check_sol_ids(attempt_dir, header, files)
    failed = header["status"] if header["status"] in headline.SOL_FAILED_STATUSES else Status.FAILED
    return headline.sol_headline(files["correctness.json"]["cases"], files["benchmark.json"]["cases"], failed)


def _card_headline(attempt_dir: Path, header: dict, files: dict[str, dict]) -> headline.Headline:
    corr, bench = files["correctness.json"], files["benchmark.json"]
    _check_card_ids(attempt_dir, header, files["task_card.json"])
    _check_card_seeds(attempt_dir, header, corr, bench)
    compile_status = files["compile.json"].get("status") if "compile.json" in files else BuildStatus.OK
    summary = bench.get("summary")
    skipped = (
        isinstance(summary, dict) and summary.get("ran") is False and not any(map(timed, bench["cases"]))
    )
    missing = [k for k in ("load", "contract", "incidents") if k not in corr]
    if missing:  # every writer writes them: a record without them was edited
        raise headline.RecordError("correctness.json", f"records malformed (no {', '.join(missing)})")
    return headline.card_headline(
        compile_status,
        from_json(WorkerResults, corr),
        bench["cases"],
        skipped,
        str(header.get("device") or ""),
    )


def _check_environment(attempt_dir: Path, header: dict, env: dict) -> None:
    from mini_kv.environment import environment_key

    _agree(
        attempt_dir, "environment.json", "key", env.get("key"), "environment_key", header["environment_key"]
    )
    try:
        key = environment_key(env)
    except (AttributeError, TypeError, ValueError) as exc:
        raise _tampered(attempt_dir, "environment.json", f"fields malformed ({exc})") from None
    if key != env["key"]:
        raise _tampered(
            attempt_dir,
            "environment.json",
            f"key {env['key']!r} is not the key of the environment "
            f"it describes ({key!r}): relabelled to be ranked with another environment",
        )


def _check_card_ids(attempt_dir: Path, header: dict, card_rec: dict) -> None:
    card = card_rec.get("card")
    if isinstance(card, dict):
        _agree(attempt_dir, "task_card.json", "card id", card.get("id"), "task_id", header["task_id"])
    suite = card_rec.get("suite_hash")
    _agree(attempt_dir, "task_card.json", "suite_hash", suite, "suite_hash", header["suite_hash"])


def _check_card_seeds(attempt_dir: Path, header: dict, corr: dict, bench: dict) -> None:
    """Every timed case's seed derives from this run's secret salt (correctness.json): benchmark.json
    records of another attempt (another run, another salt) do not fit here."""
    timed_cases = [c for c in bench["cases"] if timed(c)]
    if not timed_cases:
        return
    salt = corr.get("seed_salt")
    for c in timed_cases:
        if not isinstance(salt, str) or c.get("seed") != case_seed(header["task_id"], str(c.get("id")), salt):
            raise _tampered(
                attempt_dir,
                "benchmark.json",
                f"case {c.get('id')!r}: seed {c.get('seed')!r} was not "
                "derived from this attempt's seed_salt (correctness.json): its records come from "
                "another run",
            )


def _check_sol_ids(attempt_dir: Path, header: dict, files: dict) -> None:
    for rel, field in (("definition.json", "task_id"), ("solution.json", "candidate")):
        name = files[rel].get("name")
        if not isinstance(name, str) or safe_name(name) != header[field]:
            raise _tampered(
                attempt_dir, rel, f"name {name!r} does not match attempt.json's {field} {header[field]!r}"
            )
    try:
        lines = (attempt_dir / "workload.jsonl").read_text().splitlines()
        workloads = [json.loads(line) for line in lines if line.strip()]
        suite = sol_suite_hash(files["definition.json"], workloads, files["benchmark.json"].get("settings"))
    except (OSError, ValueError, RecursionError, TypeError) as exc:
        raise _tampered(attempt_dir, "workload.jsonl", f"unreadable ({type(exc).__name__}: {exc})") from None
    if suite != header["suite_hash"]:
        raise _tampered(
            attempt_dir,
            "attempt.json",
            f"suite_hash {header['suite_hash']!r} is not the hash of the "
            "definition, workloads and settings it records",
        )


IndexRecord = tuple[AttemptRow, tuple[CaseRow, ...]]


def scan(artifacts: Path) -> tuple[list[IndexRecord], list[StoreProblem]]:
    """Every valid attempt's rows, plus a Problem for everything else found under artifacts/."""
    artifacts = Path(artifacts)
    records: list[IndexRecord] = []
    problems: list[StoreProblem] = []
    if not artifacts.is_dir():
        return records, problems
    own = {INDEX_NAME} | {INDEX_NAME + s for s in SIDECARS}
    for entry in sorted(artifacts.iterdir()):
        if entry.name.startswith(".") or entry.name in own:
            continue  # the lock, temporary index files, hidden tool state
        if entry.is_symlink() or not entry.is_dir():
            problems.append(StoreProblem(str(entry), "stray", "not a task directory (stray file); remove it"))
            continue
        try:
            children = sorted(entry.iterdir())
        except OSError as exc:
            problems.append(StoreProblem(str(entry), "invalid", f"task directory unreadable ({exc})"))
            continue
        for d in children:
            if d.is_symlink() or not d.is_dir():
                problems.append(
                    StoreProblem(str(d), "stray", "not an attempt directory (stray file or link); remove it")
                )
            elif d.name.endswith(PARTIAL):
                problems.append(
                    StoreProblem(
                        str(d),
                        "partial",
                        "incomplete attempt (.partial): still being written, "
                        "or its writer died; never used. Remove it once no verify is running",
                    )
                )
            else:
                try:
                    checked = check_attempt(d)
                    records.append((checked.row, checked.cases))
                except AttemptInvalid as exc:
                    problems.append(StoreProblem(str(d), exc.kind, str(exc).removeprefix(f"{d}: ")))
                except (OSError, RecursionError, MemoryError) as exc:
                    # unreadable in a way no check foresaw: this attempt is skipped, the others still count
                    problems.append(
                        StoreProblem(str(d), "invalid", f"could not be read ({type(exc).__name__}: {exc})")
                    )
    return _drop_duplicates(records, problems)


def _drop_duplicates(
    records: list[IndexRecord], problems: list[StoreProblem]
) -> tuple[list[IndexRecord], list[StoreProblem]]:
    """Attempt ids are unique: two directories claiming one id (a copy relabelled under another task)
    are both reported and neither is indexed, since nothing tells which one is the original."""
    where: dict[str, list[str]] = {}
    for row, _ in records:
        where.setdefault(row.attempt_id, []).append(row.path)
    kept = []
    for row, cases in records:
        paths = where[row.attempt_id]
        if len(paths) == 1:
            kept.append((row, cases))
            continue
        others = ", ".join(p for p in paths if p != row.path)
        problems.append(
            StoreProblem(
                row.path,
                "tampered",
                f"TAMPERED attempt.json: attempt_id {row.attempt_id!r} "
                f"is also claimed by {others}; attempt ids are unique, so one is a copy",
            )
        )
    return kept, problems


@dataclass(frozen=True)
class TamperedRecord:
    """An attempt the index found tampered: it stays out of every ranking, whatever is rebuilt."""

    path: str  # <task>/<attempt dir>, relative to the store
    attempt_sha256: str | None  # of its attempt.json when it was found, None when unreadable
    first_seen: str
    message: str


TAMPERED_COLUMNS = ("path", "attempt_sha256", "first_seen", "message")


@dataclass(frozen=True)
class Memory:
    """What an index knew before a rebuild: the SHA-256 of each indexed attempt's attempt.json, and
    the attempts it found tampered. Attempts are sealed and never rewritten, so an attempt.json whose
    hash changed since it was indexed was rewritten (consistently, or the index would have said so)."""

    indexed: dict[str, str]  # path -> attempt_sha256
    tampered: dict[str, TamperedRecord]


def remembered(db: Path) -> Memory:
    """The memory of the index at `db`, of any schema version this module ever wrote; empty when there
    is none or it is unreadable (a rebuild then knows only what the attempts say)."""
    indexed: dict[str, str] = {}
    tampered: dict[str, TamperedRecord] = {}
    if not db.is_file() or db.is_symlink():
        return Memory(indexed, tampered)
    try:
        con = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error:
        return Memory(indexed, tampered)
    try:
        with contextlib.suppress(sqlite3.Error):
            for path, digest in con.execute("SELECT path, attempt_sha256 FROM attempts"):
                if isinstance(path, str) and isinstance(digest, str):
                    indexed[path] = digest
        with contextlib.suppress(sqlite3.Error):
            for row in con.execute(f"SELECT {', '.join(TAMPERED_COLUMNS)} FROM tampered"):
                if all(isinstance(v, str) for v in (row[0], row[2], row[3])):
                    tampered[row[0]] = TamperedRecord(*row)
    finally:
        con.close()
    return Memory(indexed, tampered)


def _store_path(artifacts: Path, path: str) -> str:
    """<task>/<attempt dir> of a path under the store (the key of the index's memory)."""
    p = Path(path)
    return f"{p.parent.name}/{p.name}" if p.parent.parent == Path(artifacts) else str(p)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


STAYS_OUT = (
    "never ranked: rebuilding the index does not change that (the index remembers it). Keep it as "
    "evidence, or delete the directory"
)


def apply_memory(
    artifacts: Path, records: list[IndexRecord], problems: list[StoreProblem], memory: Memory
) -> tuple[list[IndexRecord], list[StoreProblem], dict[str, TamperedRecord]]:
    """Hold a rebuild to what the old index knew: an attempt it found tampered stays out, an attempt
    whose attempt.json changed since it was indexed is tampered, and every tampered finding of this
    scan is remembered. Returns the records to index, the problems and the memory to keep."""
    tampered = dict(memory.tampered)
    kept = []
    for row, cases in records:
        old = memory.indexed.get(row.path)
        if row.path in tampered:
            t = tampered[row.path]
            problems.append(
                StoreProblem(
                    str(artifacts / row.path),
                    "tampered",
                    f"{t.message} (found {t.first_seen}); {STAYS_OUT}",
                )
            )
        elif old is not None and old != row.attempt_sha256:
            msg = (
                f"TAMPERED attempt.json: rewritten after it was indexed (SHA-256 {row.attempt_sha256}, "
                f"the index recorded {old}); attempts are sealed and never rewritten"
            )
            tampered[row.path] = TamperedRecord(row.path, row.attempt_sha256, _now(), msg)
            problems.append(StoreProblem(str(artifacts / row.path), "tampered", f"{msg}; {STAYS_OUT}"))
        else:
            kept.append((row, cases))
    for p in problems:
        key = _store_path(artifacts, p.path)
        if p.kind == "tampered" and key not in tampered:
            meta = Path(artifacts) / key / "attempt.json"
            digest = sha256_file(meta) if meta.is_file() and not meta.is_symlink() else None
            tampered[key] = TamperedRecord(key, digest, _now(), p.message)
    return kept, problems, tampered


def _check_index_file(db: Path) -> None:
    """Something other than a regular file where the index belongs is never replaced or removed by us."""
    if db.is_symlink() or (db.exists() and not db.is_file()):
        what = (
            "a symbolic link" if db.is_symlink() else "a directory" if db.is_dir() else "not a regular file"
        )
        raise IndexUnusable(
            f"{db}: is {what}, not an index file; move it out of the way (it is never "
            f"deleted for you), then run `mini-kv rebuild-index --artifacts {db.parent}`"
        )


def store_read_only(artifacts: Path) -> bool:
    """An existing store this process cannot write (read-only mount, permissions): neither the lock file
    nor sqlite's WAL files can be created there, and no writer of this user can be at work in it."""
    artifacts = Path(artifacts)
    return artifacts.is_dir() and not os.access(artifacts, os.W_OK | os.X_OK)


def _connect(db: Path, read_only: bool = False) -> sqlite3.Connection:
    """An open connection to an existing, current-version index; IndexUnusable otherwise."""
    _check_index_file(db)
    if not db.is_file():
        raise IndexUnusable(
            f"{db}: no index yet; create it with `mini-kv rebuild-index --artifacts {db.parent}`"
        )
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
            raise IndexUnusable(
                f"{db}: not a mini_kv index (no schema_version); rebuild it from the attempt "
                f"directories with `mini-kv rebuild-index --artifacts {db.parent}`"
            )
        if row[0] != str(INDEX_SCHEMA_VERSION):
            raise IndexUnusable(
                f"{db}: index schema_version {row[0]} is not {INDEX_SCHEMA_VERSION}, the one this "
                "mini_kv reads; it was written by another mini_kv version. The index is derived "
                "data: rebuild it for this version with "
                f"`mini-kv rebuild-index --artifacts {db.parent}`, or use the mini_kv that wrote it"
            )
    except sqlite3.DatabaseError as exc:
        con.close()
        raise IndexUnusable(f"{db}: unreadable ({exc}); {rebuild_hint(db.parent)}") from None
    except BaseException:
        con.close()
        raise
    return con


def _insert(con: sqlite3.Connection, row: AttemptRow, cases: tuple[CaseRow, ...]) -> None:
    con.execute("DELETE FROM bench_cases WHERE attempt_id=?", (row.attempt_id,))
    con.execute(
        f"INSERT OR REPLACE INTO attempts ({', '.join(ATTEMPT_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(ATTEMPT_COLUMNS))})",
        astuple(row),
    )
    con.executemany(
        f"INSERT OR REPLACE INTO bench_cases ({', '.join(CASE_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(CASE_COLUMNS))})",
        [astuple(c) for c in cases],
    )


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
    db = index_path(artifacts)
    _check_index_file(db)
    records, problems = scan(artifacts)
    records, problems, tampered = apply_memory(artifacts, records, problems, remembered(db))
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
            con.executemany(
                f"INSERT INTO tampered ({', '.join(TAMPERED_COLUMNS)}) VALUES (?, ?, ?, ?)",
                [tuple(getattr(t, c) for c in TAMPERED_COLUMNS) for t in tampered.values()],
            )
            con.execute(f"PRAGMA user_version={INDEX_SCHEMA_VERSION}")
            con.execute("COMMIT")
        finally:
            con.close()
        fsync_file(tmp)
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
        raise UserError(
            f"{artifacts}: no artifact store here (no such directory); run `mini-kv verify` first "
            "or pass --artifacts"
        )
    with index_lock(artifacts):
        try:
            return _rebuild_locked(artifacts)
        except sqlite3.Error as exc:
            raise IndexUnusable(f"{index_path(artifacts)}: rebuild failed ({exc})") from None


def update_index(artifacts: Path, attempt_dir: Path) -> list[StoreProblem]:
    """Add one committed attempt to the index (call after AttemptWriter.commit).

    Creates the index with a full rebuild when there is none yet (the rebuild includes the attempt) and
    returns that rebuild's problems; otherwise returns []. Raises IndexUnusable on any failure: the
    attempt itself is safe either way, and `rebuild-index` brings the index back in line.
    """
    artifacts = Path(artifacts)
    try:
        checked = check_attempt(Path(attempt_dir))  # hashing needs no lock: attempts never change
    except AttemptInvalid as exc:
        raise IndexUnusable(f"not indexed: {exc}") from None
    except (OSError, RecursionError) as exc:
        raise IndexUnusable(f"not indexed: {attempt_dir}: unreadable ({type(exc).__name__}: {exc})") from None
    db = index_path(artifacts)
    with index_lock(artifacts):
        try:
            if not db.exists():
                return _rebuild_locked(artifacts).problems
            con = _connect(db)
            try:
                con.execute("BEGIN IMMEDIATE")
                try:
                    _refuse_remembered(con, artifacts, checked.row)
                    _insert(con, checked.row, checked.cases)
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            finally:
                con.close()
        except AttemptInvalid as exc:
            raise IndexUnusable(f"not indexed: {exc}") from None
        except (sqlite3.Error, OSError) as exc:
            raise IndexUnusable(f"{db}: update failed ({exc}); {rebuild_hint(artifacts)}") from None
    return []


def _refuse_remembered(con: sqlite3.Connection, artifacts: Path, row: AttemptRow) -> None:
    """An update never brings back an attempt the index found tampered, nor replaces the record of an
    indexed attempt with a rewritten one."""
    hit = con.execute("SELECT message FROM tampered WHERE path=?", (row.path,)).fetchone()
    old = con.execute("SELECT attempt_sha256 FROM attempts WHERE path=?", (row.path,)).fetchone()
    if hit is None and (old is None or old[0] == row.attempt_sha256):
        return
    why = hit[0] if hit else "attempt.json rewritten after it was indexed"
    raise AttemptTampered(f"{artifacts / row.path}: {why}; {STAYS_OUT}")


@contextlib.contextmanager
def _reading(artifacts: Path):
    """A connection to the index for reading, under the lock (a read-only store gets none: it cannot be
    created there, and nobody of ours can write there either); IndexUnusable when it cannot be read."""
    db = index_path(artifacts)
    read_only = store_read_only(artifacts)
    with contextlib.nullcontext() if read_only else index_lock(artifacts):
        con = _connect(db, read_only=read_only)
        try:
            yield con
        except sqlite3.DatabaseError as exc:
            raise IndexUnusable(f"{db}: unreadable ({exc}); {rebuild_hint(artifacts)}") from None
        finally:
            con.close()


def read_index(
    artifacts: Path, where: str = "", params: tuple = ()
) -> tuple[list[AttemptRow], dict[str, tuple[CaseRow, ...]]]:
    """Attempt rows (optionally filtered by an SQL `where` over `attempts`) and their bench cases, by
    attempt id. Values are as the file holds them: an index edited by hand may hold anything, and the
    leaderboard re-derives every row it shows (leaderboard.checked_row)."""
    with _reading(artifacts) as con:
        con.row_factory = sqlite3.Row
        have = {r[1] for r in con.execute("PRAGMA table_info(attempts)")}
        have_cases = {r[1] for r in con.execute("PRAGMA table_info(bench_cases)")}
        if not set(ATTEMPT_COLUMNS) <= have or not set(CASE_COLUMNS) <= have_cases:
            raise IndexUnusable(
                f"{index_path(artifacts)}: its tables lack columns of a mini_kv index (edited by hand?); "
                + rebuild_hint(artifacts)
            )
        rows = [
            AttemptRow(*(r[c] for c in ATTEMPT_COLUMNS))
            for r in con.execute(
                f"SELECT * FROM attempts {('WHERE ' + where) if where else ''} "
                "ORDER BY task_id, candidate, created_at, attempt_id",
                params,
            )
        ]
        cases: dict[str, list[CaseRow]] = {}
        for r in con.execute("SELECT * FROM bench_cases ORDER BY attempt_id, case_id"):
            cases.setdefault(r["attempt_id"], []).append(CaseRow(*(r[c] for c in CASE_COLUMNS)))
    return rows, {
        r.attempt_id: tuple(cases.get(r.attempt_id, ())) for r in rows if isinstance(r.attempt_id, str)
    }


def read_tampered(artifacts: Path) -> list[TamperedRecord]:
    """The attempts the index remembers as tampered (they stay out of every ranking)."""
    with _reading(artifacts) as con:
        rows = con.execute(f"SELECT {', '.join(TAMPERED_COLUMNS)} FROM tampered ORDER BY path").fetchall()
    return [TamperedRecord(*r) for r in rows]
