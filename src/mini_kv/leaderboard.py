"""Leaderboard: the latest valid attempt per (task, candidate), ranked by geometric-mean speedup.

Valid means complete (read_attempt verifies every file's SHA-256, and attempt.json still has the hash
the index recorded), PASSED (fully correct) and stable, with a geometric-mean speedup. Every row that
would be shown is re-derived from the attempt it cites (`checked_row`): an index row that differs from
that recomputation was edited, and is reported as TAMPERED, never ranked. Attempts are
grouped by (task, suite_hash, environment_key, device): only timings measured on the same suite, in the
same environment and on the same device are ranked against each other.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass, replace
from pathlib import Path

from mini_kv.codec import to_json
from mini_kv.errors import UserError
from mini_kv.status import Status
from mini_kv.store import signing
from mini_kv.store.atomic import write_bytes, write_json
from mini_kv.store.attempts import AttemptInvalid, AttemptTampered
from mini_kv.store.index import (
    ATTEMPT_COLUMNS,
    STAYS_OUT,
    AttemptRow,
    CaseRow,
    StoreProblem,
    check_attempt,
    index_path,
    read_index,
    read_tampered,
    rebuild_index,
)

LEADERBOARD_SCHEMA_VERSION = 1
# what an edited index row's message says: rebuilding is the repair for an edited index; it cannot bring
# back an attempt the index found rewritten (the index remembers it), nor forge a signature
REDERIVE = (
    "`mini-kv rebuild-index` re-derives the index from the attempt directories (an attempt rewritten "
    "along with the index cannot be told from a real one unless it is checked against its signature: "
    "`leaderboard --require-signed`)"
)
GROUP_KEYS = ("task_id", "suite_hash", "environment_key", "device")


@dataclass(frozen=True)
class Entry:
    """One ranked attempt: the newest valid one of its candidate."""

    rank: int
    candidate: str
    geomean_speedup: float
    attempt_id: str
    created_at: str
    path: str
    regression: str | None
    signature: str  # store.signing.Signature
    cases: dict[str, float]  # case id -> speedup
    source: str = "-"  # the candidate's git commit (store.index.source_label)


@dataclass(frozen=True)
class Group:
    """Attempts measured on one suite, in one environment, on one device (GROUP_KEYS): ranked together."""

    task_id: str
    suite_hash: str
    environment_key: str
    device: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class SigningState:
    key_id: str | None  # of the operator's key, None without one
    required: bool  # --require-signed


@dataclass(frozen=True)
class Board:
    """The leaderboard; its JSON export is `to_json(board)`."""

    schema_version: int
    generated_at: str
    artifacts: str
    task: str | None
    groups: tuple[Group, ...]
    problems: tuple[StoreProblem, ...]
    signing: SigningState


CSV_COLUMNS = tuple(
    (
        "schema_version task_id suite_hash environment_key device rank candidate geomean_speedup "
        "attempt_id created_at regression signature case_speedups"
    ).split()
)


def build_leaderboard(
    artifacts: Path, task: str | None = None, rebuild: bool = False, require_signed: bool = False
) -> Board:
    """The leaderboard: its groups of ranked attempts, and the problems found on the way.

    Reads the index (building it first when there is none, or when `rebuild`); every attempt that would
    be shown is re-verified, and one that fails is reported and replaced by that candidate's previous
    valid attempt. With `require_signed`, only attempts whose signature holds under the operator's key
    are ranked (UserError without a key).
    """
    artifacts = Path(artifacts)
    signing_key = signing.operator_key(artifacts)
    if require_signed and signing_key is None:
        raise UserError(
            f"--require-signed needs the operator's signing key to check signatures: set "
            f"{signing.KEY_ENV} or {signing.KEY_FILE_ENV} (docs/store.md, Signatures)"
        )
    problems: list[StoreProblem] = []
    if rebuild or not index_path(artifacts).exists():
        problems.extend(rebuild_index(artifacts).problems)
    where = f"status='{Status.PASSED}' AND stable=1 AND geomean_speedup IS NOT NULL"
    rows, cases = read_index(artifacts, where + (" AND task_id=?" if task else ""), (task,) if task else ())
    problems.extend(_remembered_tampered(artifacts, task, {p.path for p in problems}))
    latest = _latest_valid(artifacts, rows, cases, signing_key, require_signed, problems)
    return Board(
        schema_version=LEADERBOARD_SCHEMA_VERSION,
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        artifacts=str(artifacts),
        task=task,
        groups=_ranked_groups(latest),
        problems=tuple(problems),
        signing=SigningState(None if signing_key is None else signing_key.key_id, require_signed),
    )


def _latest_valid(
    artifacts: Path,
    rows: list[AttemptRow],
    cases: dict[str, tuple[CaseRow, ...]],
    signing_key,
    require_signed: bool,
    problems: list[StoreProblem],
) -> list[tuple[tuple, Entry]]:
    """Per (task, candidate), its newest attempt that passes every check (and, with `require_signed`,
    whose signature holds), unranked, with its group key; each one that fails is added to `problems`."""
    latest: dict[tuple[str, str], Entry] = {}
    groups: dict[tuple[str, str], tuple] = {}
    for row in sorted(rows, key=lambda r: (str(r.created_at), str(r.attempt_id)), reverse=True):
        key = (str(row.task_id), str(row.candidate))
        if key in latest:
            continue
        path = artifacts / str(row.path)
        try:
            real, real_cases = checked_row(artifacts, row, cases.get(row.attempt_id, ()))
        except AttemptInvalid as exc:
            problems.append(StoreProblem(str(path), exc.kind, str(exc).removeprefix(f"{path}: ")))
            continue
        state = signature_state(signing_key, real.signed_by)
        if require_signed and state != signing.Signature.VALID:
            problems.append(StoreProblem(str(path), "unsigned", _unsigned_why(state)))
            continue
        groups[key] = tuple(getattr(real, k) for k in GROUP_KEYS)
        latest[key] = Entry(
            0,
            real.candidate,
            real.geomean_speedup,
            real.attempt_id,
            real.created_at,
            real.path,
            real.regression,
            str(state),
            {c.case_id: c.speedup for c in real_cases},
            real.source,
        )
    return [(groups[k], e) for k, e in latest.items()]


def _ranked_groups(latest: list[tuple[tuple, Entry]]) -> tuple[Group, ...]:
    """The attempts grouped by what makes them comparable (GROUP_KEYS), each group ranked by speedup."""
    groups: dict[tuple, list[Entry]] = {}
    for gkey, entry in latest:
        groups.setdefault(gkey, []).append(entry)
    out = []
    for gkey in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for v in k)):
        members = sorted(groups[gkey], key=lambda e: (-e.geomean_speedup, e.candidate))
        entries = tuple(replace(e, rank=rank) for rank, e in enumerate(members, start=1))
        out.append(Group(*gkey, entries=entries))
    return tuple(out)


def signature_state(key: signing.SigningKey | None, signed_by: str | None) -> signing.Signature:
    """The signature state of a row that checked_row has just re-derived: check_attempt refused
    an attempt whose signature does not hold under `key`, so a row signed with `key` is VALID."""
    if signed_by is None:
        return signing.Signature.UNSIGNED
    if key is None:
        return signing.Signature.UNCHECKED
    return signing.Signature.VALID if signed_by == key.key_id else signing.Signature.OTHER_KEY


def _unsigned_why(state: signing.Signature) -> str:
    what = {
        signing.Signature.UNSIGNED: "not signed (written without a signing key, or its signature removed)",
        signing.Signature.OTHER_KEY: "signed with another key than the operator's",
    }[state]
    return f"{what}; --require-signed ranks only attempts signed with the operator's key"


def _remembered_tampered(artifacts: Path, task: str | None, reported: set[str]) -> list[StoreProblem]:
    """The attempts the index remembers as tampered (and this run has not just reported), of `task`."""
    return [
        StoreProblem(str(artifacts / t.path), "tampered", f"{t.message} (found {t.first_seen}); {STAYS_OUT}")
        for t in read_tampered(artifacts)
        if str(artifacts / t.path) not in reported and (task is None or t.path.split("/")[0] == task)
    ]


def checked_row(
    artifacts: Path, row: AttemptRow, cases: tuple[CaseRow, ...]
) -> tuple[AttemptRow, tuple[CaseRow, ...]]:
    """The index row of an attempt, re-derived from the attempt it cites: its directory must be
    `artifacts/<task_id>/<attempt_id>`, pass every check of the index (hashes, ids, headline recomputed
    from the per-case records) and give exactly this row, bench cases included. AttemptInvalid, or
    AttemptTampered naming index.sqlite when the row was edited, otherwise."""
    db = index_path(artifacts)
    task, attempt = row.task_id, row.attempt_id
    if not (
        isinstance(task, str)
        and isinstance(attempt, str)
        and row.path == f"{task}/{attempt}"
        and _plain_name(task)
        and _plain_name(attempt)
    ):
        raise AttemptTampered(
            f"{artifacts / str(row.path)}: TAMPERED {db.name}: the row of attempt "
            f"{attempt!r} (task {task!r}) cites {row.path!r}, not <task>/<attempt id>; " + REDERIVE
        )
    path = artifacts / task / attempt
    if not path.is_dir() or path.is_symlink():
        raise AttemptTampered(
            f"{path}: TAMPERED {db.name}: the row cites an attempt directory that does not exist; " + REDERIVE
        )
    try:
        checked = check_attempt(path)
    except OSError as exc:
        raise AttemptInvalid(f"{path}: could not be read ({exc})") from None
    real_row, real_cases = checked.row, checked.cases
    if real_row.attempt_sha256 != row.attempt_sha256:
        raise AttemptTampered(
            f"{path}: TAMPERED attempt.json: rewritten after it was indexed (its SHA-256 is not "
            f"the one {db.name} recorded); {STAYS_OUT}"
        )
    # values as sqlite gives them back: an int where a float was stored compares equal, text never does
    wrong = [c for c in ATTEMPT_COLUMNS if getattr(row, c) != getattr(real_row, c)]
    key = lambda c: str(c.case_id)  # noqa: E731
    if sorted(cases, key=key) != sorted(real_cases, key=key):
        wrong.append("bench_cases")
    if wrong:
        said = getattr(row, wrong[0], cases)
        real = getattr(real_row, wrong[0], real_cases)
        raise AttemptTampered(
            f"{path}: TAMPERED {db.name}: its row differs from the attempt it cites in "
            f"{', '.join(wrong)} (e.g. {wrong[0]}: index {said!r}, attempt {real!r}); never ranked. {REDERIVE}"
        )
    return real_row, real_cases


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def why_nothing_ranked(artifacts: Path, board: Board) -> str:
    """Why an empty leaderboard is empty: what the indexed attempts are, and what was skipped."""
    from collections import Counter

    task = board.task
    rows, _ = read_index(artifacts, "task_id=?" if task else "", (task,) if task else ())
    why: Counter[str] = Counter()
    for r in rows:
        if r.status != Status.PASSED:
            why[f"not PASSED ({r.status})"] += 1
        elif r.stable is None or r.geomean_speedup is None:
            why["not benchmarked (--skip-benchmark, or no bench case timed)"] += 1
        elif not r.stable:
            why[
                "timing unstable (robust CV above the limit: rerun on a quieter machine, or raise --max-cv)"
            ] += 1
        else:
            why["correct and stable"] += 1
    skipped = Counter(p.kind for p in board.problems)
    where = f" for task {task}" if task else ""
    if not rows and not skipped:
        return f"nothing to rank{where}: no attempt in the index (run `mini-kv verify` or `mini-kv bench`)"
    parts = [f"{n} {what}" for what, n in why.most_common()]
    line = f"nothing to rank{where}: of {len(rows)} indexed attempt(s), " + (", ".join(parts) or "none")
    if skipped:
        line += "; skipped: " + ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
    if board.signing.required and skipped.get("unsigned"):
        line += (
            f"; --require-signed ranks only attempts signed with the operator's key (key id "
            f"{board.signing.key_id}): attempts written without {signing.KEY_ENV} or "
            f"{signing.KEY_FILE_ENV} set are unsigned"
        )
    return line


def to_csv(board: Board) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g in board.groups:
        for e in g.entries:
            w.writerow(
                [
                    board.schema_version,
                    *(getattr(g, k) for k in GROUP_KEYS),
                    e.rank,
                    e.candidate,
                    repr(e.geomean_speedup),
                    e.attempt_id,
                    e.created_at,
                    e.regression or "",
                    e.signature,
                    ";".join(f"{k}={v!r}" for k, v in sorted(e.cases.items())),
                ]
            )
    return buf.getvalue()


def export_json(board: Board, path: Path) -> None:
    write_json(Path(path), to_json(board))


def export_csv(board: Board, path: Path) -> None:
    write_bytes(Path(path), to_csv(board).encode("utf-8"))


def rich_tables(board: Board, width: int = 180) -> list:
    """The board's groups as tables that fit `width` (tables.fitted_tables: ids and numbers are never
    cut; columns that do not fit go to a second table that repeats rank and candidate)."""
    from mini_kv.tables import Column, fitted_tables

    columns = [
        Column(h) for h in ("rank", "candidate", "geomean speedup", "per case", "regression", "signed")
    ] + [Column("commit"), Column("attempt"), Column("created")]
    out = []
    for g in board.groups:
        title = f"{g.task_id}  suite {str(g.suite_hash)[:12]}  env {g.environment_key}  device {g.device}"
        rows = [
            [
                str(e.rank),
                e.candidate,
                f"{e.geomean_speedup:.3f}x",
                "\n".join(f"{k} {v:.3f}x" for k, v in sorted(e.cases.items()) if v is not None),
                e.regression or "-",
                e.signature,
                e.source,
                e.attempt_id,
                e.created_at,
            ]
            for e in g.entries
        ]
        out += fitted_tables(title, columns, rows, width, keys=2)
    return out
