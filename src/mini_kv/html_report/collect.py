"""What the report shows, read from the attempt store alone: typed, read-only views of attempts.

Attempts are listed and read with the store's own reader (store.index.check_attempt: every listed
file's SHA-256, the ids, and the headline recomputed from the per-case records, exactly as the index
and the leaderboard check them) and its typed records (store.records.read_records), so the charts and
the page never touch raw dicts. An attempt that fails a check (tampered, misplaced) or whose files do
not have the expected shape becomes a `SkippedAttempt` entry with the reason; the page still builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mini_kv.errors import UserError
from mini_kv.judge.regression import RegressionVerdict
from mini_kv.profile.compare import Ident, MetricRow
from mini_kv.profile.store import PROFILES_DIR  # Nsight Compute profiles, not attempts
from mini_kv.store.attempts import AttemptInvalid, iter_attempt_dirs
from mini_kv.store.index import check_attempt
from mini_kv.store.records import SOL_FORMAT, BenchCase, CorrCase, finite


@dataclass(frozen=True)
class SkippedAttempt:
    path: str
    reason: str


@dataclass(frozen=True)
class Attempt:
    task_id: str
    candidate: str
    attempt_id: str
    created_at: str
    status: str
    device: str
    environment_key: str
    suite_hash: str
    fmt: str  # "task" or "sol-execbench"
    path: Path
    files: tuple[str, ...]
    environment: dict
    geomean: float | None
    stable: bool | None
    bench: tuple[BenchCase, ...]
    correctness: tuple[CorrCase, ...]
    contract: tuple[tuple[str, str], ...]  # (check, status): opcheck, gradcheck, integrity, kernels
    regression: RegressionVerdict | None  # regression.json, when the attempt was judged against a baseline
    source: str = "-"  # the candidate's git commit (store.index.source_label)

    @property
    def group(self) -> tuple[str, str, str, str]:
        """What the leaderboard groups by: only timings of one suite, environment and device compare."""
        return (self.task_id, self.suite_hash, self.environment_key, self.device)


@dataclass(frozen=True)
class ProfilePair:
    """Two profiles of one (task, case): their metric rows, or why they do not compare."""

    A: Ident
    B: Ident
    refused: str  # "" when they compare
    rows: tuple[MetricRow, ...]


@dataclass
class Store:
    artifacts: Path
    attempts: list[Attempt] = field(default_factory=list)
    skipped: list[SkippedAttempt] = field(default_factory=list)

    def tasks(self) -> list[str]:
        return sorted({a.task_id for a in self.attempts})


# ------------------------------------------------------------------------------------------ reading


def read_one(path: Path) -> Attempt:
    """One attempt as the report sees it; AttemptInvalid or MalformedRecord when it cannot be used."""
    checked = check_attempt(path)
    row, rec = checked.row, checked.records
    return Attempt(
        task_id=row.task_id,
        candidate=row.candidate,
        attempt_id=row.attempt_id,
        created_at=str(row.created_at or ""),
        status=row.status,
        device=str(row.device),
        environment_key=str(row.environment_key),
        suite_hash=str(row.suite_hash),
        fmt="sol-execbench" if checked.header.get("format") == SOL_FORMAT else "task",
        path=Path(path),
        files=tuple(sorted(f["path"] for f in checked.header["files"])),
        environment=checked.files["environment.json"],
        geomean=finite(row.geomean_speedup),
        stable=None if row.stable is None else bool(row.stable),
        bench=rec.bench,
        correctness=rec.correctness,
        contract=rec.contract,
        regression=rec.regression,
        source=row.source,
    )


def load_store(artifacts: Path, explicit: list[Path] | None = None) -> Store:
    """Every attempt under `artifacts` (or only the `explicit` directories), each verified and typed."""
    store = Store(Path(artifacts))
    dirs = (
        list(explicit)
        if explicit
        else [d for d in iter_attempt_dirs(artifacts) if d.parent.name != PROFILES_DIR]
    )
    for d in dirs:
        if not d.is_dir():
            store.skipped.append(SkippedAttempt(str(d), "not a directory"))
            continue
        try:
            store.attempts.append(read_one(d))
        # AttemptInvalid includes MalformedRecord; UserError: unreadable JSON
        except (AttemptInvalid, OSError, UserError) as exc:
            store.skipped.append(SkippedAttempt(str(d), str(exc).removeprefix(f"{d}: ")))
    store.attempts.sort(key=lambda a: (a.task_id, a.candidate, a.created_at, a.attempt_id))
    return store
