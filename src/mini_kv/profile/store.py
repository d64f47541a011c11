"""Profile directories: `artifacts/profiles/<profile_id>/`, built as `<id>.partial` and renamed when whole.

profile.json is written last and lists the SHA-256 and size of every other file (the pattern of
attempt directories). A reader re-hashes them, validates profile.json against
schemas/profile.schema.json and re-derives the summary from the stored raw CSV, so an edited
number in profile.json is caught too.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from mini_kv.codec import from_json, optional, to_json
from mini_kv.model import sha256_file
from mini_kv.profile.metrics import ProfileSummary
from mini_kv.profile.ncu import Command
from mini_kv.profile.reasons import FailureReason
from mini_kv.status import ProfileStatus
from mini_kv.store.atomic import StagedDir

PROFILE_SCHEMA_VERSION = 1
PARTIAL = ".partial"
PROFILES_DIR = "profiles"


@dataclass(frozen=True)
class ProfiledTask:
    """What a profile is about: a task card (or a SOL definition) and its operator."""

    id: str
    version: str
    card_path: str
    suite_hash: str
    operator: dict  # name, version, reference, inputs


@dataclass(frozen=True)
class ProfiledCandidate:
    """The profiled candidate: its sources, and the library the build made (or --prebuilt gave)."""

    id: str
    op: str
    path: str
    sources: tuple[dict, ...]  # {path, sha256}
    prebuilt: bool
    library: str | None = None
    library_sha256: str | None = None
    build_key: str | None = None


@dataclass(frozen=True)
class ProfiledCase:
    """The one case profiled, its seed and the digest of the inputs the target made (target.json)."""

    id: str
    base_id: str
    kind: str
    dtype: str
    params: dict
    seed: int
    seed_salt: str
    tolerance: dict
    input_sha256: str | None = None


@dataclass(frozen=True)
class NcuRun:
    """How ncu ran: where it is, which kernels it matched after how many skipped launches, its commands."""

    kernel_names: tuple[str, ...]
    kernel_filter: str | None
    launch_skip: int
    sections: tuple[str, ...]
    path: str | None = None
    version: str | None = None
    launch_count: int = 1
    clock_control: str = "none"
    commands: tuple[Command, ...] = ()


@dataclass(frozen=True)
class Profile:
    """profile.json (schemas/profile.schema.json): what was profiled, how, and the outcome; the steps of
    a profile fill in what they find (`device`, `target`, ...), ProfileWriter.commit adds the files."""

    created_at: str
    task: ProfiledTask
    candidate: ProfiledCandidate
    case: ProfiledCase
    environment_key: str
    ncu: NcuRun
    device: str | None = None  # the GPU the target ran on, as torch names it
    target: dict | None = None  # what the profiled process reported (target.json)
    kernel: dict[str, str] | None = None  # the identity columns of the target kernel's CSV row
    summary: ProfileSummary | None = None
    status: str | None = None
    reason: FailureReason | None = None
    exit_code: int | None = None
    schema_version: int | None = optional()
    kind: str | None = optional()
    profile_id: str | None = optional()
    files: tuple[dict, ...] | None = optional()  # {path, sha256, size}
    path: str | None = optional()  # where read_profile found it (not in the file)


class ProfileUnusable(Exception):
    """A profile directory that must not be compared; `code` is a compare refusal code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def new_profile_id(task_id: str, candidate: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{task_id}-{candidate}-{secrets.token_hex(3)}"


class ProfileWriter(StagedDir):
    """Collects a profile's files in a `.partial` dir; `commit()` seals and publishes it."""

    def __init__(self, artifacts: Path, task_id: str, candidate: str):
        self.profile_id = new_profile_id(task_id, candidate)
        self.root = Path(artifacts) / PROFILES_DIR
        super().__init__(self.root / self.profile_id)

    def commit(self, header: Profile) -> Path:
        """Hash every file, write profile.json (validated) last, rename the directory into place."""
        from mini_kv.load.schema import validate

        doc = {
            **to_json(header),
            "schema_version": PROFILE_SCHEMA_VERSION,
            "kind": "mini_kv.profile",
            "profile_id": self.profile_id,
            "files": self.manifest(),
        }
        validate(json.loads(json.dumps(doc, default=str)), "profile", str(self.partial / "profile.json"))
        return self.publish("profile.json", doc)


def resolve(spec: str, artifacts: Path) -> Path:
    """A profile given as a directory, or as an id under artifacts/profiles/."""
    p = Path(spec)
    if p.is_dir():
        return p
    under = Path(artifacts) / PROFILES_DIR / spec
    return under if under.is_dir() else p


def read_profile(path: Path) -> Profile:
    """profile.json of a sealed profile after every check; ProfileUnusable says which failed."""
    from mini_kv.store.jsonfile import RecordUnusable, read_versioned

    path = Path(path)
    if path.name.endswith(PARTIAL):
        raise ProfileUnusable("PROFILE_INVALID", f"{path}: incomplete profile (still .partial)")
    try:
        doc = read_versioned(path / "profile.json", PROFILE_SCHEMA_VERSION, "profile")
    except RecordUnusable as exc:
        raise ProfileUnusable("PROFILE_INVALID", str(exc)) from None
    listed = set()
    for entry in doc["files"]:
        f = path / entry["path"]
        listed.add(entry["path"])
        if not f.is_file():
            raise ProfileUnusable("PROFILE_TAMPERED", f"{path}: listed file {entry['path']} is missing")
        if f.stat().st_size != entry["size"] or sha256_file(f) != entry["sha256"]:
            raise ProfileUnusable(
                "PROFILE_TAMPERED", f"{path}: {entry['path']} does not match its recorded SHA-256"
            )
    if doc["status"] == ProfileStatus.OK:
        _check_summary(path, doc, listed)
    return replace(from_json(Profile, doc), path=str(path))


def same_values(a, b) -> bool:
    """Equal structure and values; numbers equal to 1e-9 relative, so a sum re-derived in another
    order (or by a version that rounds it) is not mistaken for an edit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _check_summary(path: Path, doc: dict, listed: set[str]) -> None:
    """The summary in profile.json must be what the hashed raw CSV says (profile.json lists no hash of itself)."""
    from mini_kv.profile.metrics import analyze
    from mini_kv.profile.reasons import ProfileFailure

    if "raw.csv" not in listed:
        raise ProfileUnusable("PROFILE_TAMPERED", f"{path}: a successful profile must list raw.csv")
    try:
        again = analyze((path / "raw.csv").read_text(), doc["ncu"]["kernel_filter"]).summary
    except ProfileFailure as exc:
        raise ProfileUnusable(
            "PROFILE_TAMPERED", f"{path}: raw.csv no longer yields a profile ({exc})"
        ) from None
    if not same_values(to_json(again), doc["summary"]):
        raise ProfileUnusable("PROFILE_TAMPERED", f"{path}: profile.json's summary differs from its raw.csv")
