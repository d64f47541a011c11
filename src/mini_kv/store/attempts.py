"""Attempt directories: `artifacts/<task>/<attempt_id>/`, written as `<id>.partial` and renamed when whole.

attempt.json is written last and lists the SHA-256 and size of every other file; a reader
re-hashes them, so a tampered or truncated attempt is reported and never used.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path

from mini_kv.errors import ConfigError
from mini_kv.model import sha256_file
from mini_kv.store.atomic import StagedDir

ATTEMPT_SCHEMA_VERSION = 1
PARTIAL = ".partial"


def new_attempt_id(candidate: str) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{candidate}-{secrets.token_hex(3)}"


class AttemptWriter(StagedDir):
    """Collects files into a `.partial` dir; `commit()` seals and publishes it atomically."""

    def __init__(self, artifacts: Path, task_id: str, candidate: str):
        self.attempt_id = new_attempt_id(candidate)
        self.task_dir = Path(artifacts) / task_id
        try:
            super().__init__(self.task_dir / self.attempt_id)
        except FileExistsError:
            raise FileExistsError(f"attempt directory {self.task_dir / self.attempt_id} already exists") from None

    def commit(self, header: dict) -> Path:
        files = self.manifest()
        return self.publish("attempt.json", {**header, "schema_version": ATTEMPT_SCHEMA_VERSION,
                                             "attempt_id": self.attempt_id, "files": files})


class AttemptInvalid(Exception):
    """An attempt directory that must not be used; the message says why."""


def read_attempt(path: Path, verify: bool = True) -> dict:
    """attempt.json of a sealed attempt, after checking every listed file's size and SHA-256."""
    path = Path(path)
    if path.name.endswith(PARTIAL):
        raise AttemptInvalid(f"{path}: incomplete attempt (still .partial)")
    meta = path / "attempt.json"
    try:
        header = json.loads(meta.read_text())
    except FileNotFoundError:
        raise AttemptInvalid(f"{path}: no attempt.json") from None
    except (OSError, ValueError) as exc:
        raise AttemptInvalid(f"{meta}: unreadable ({exc})") from None
    if not isinstance(header, dict):
        raise AttemptInvalid(f"{meta}: not a JSON object")
    version = header.get("schema_version")
    if version != ATTEMPT_SCHEMA_VERSION:
        raise AttemptInvalid(f"{meta}: schema_version {version!r} is not {ATTEMPT_SCHEMA_VERSION}; "
                             "it was written by another mini_kv version: read it with that version")
    if verify:
        for entry in header.get("files", []):
            if not isinstance(entry, dict) or not _inside(path, entry.get("path")):
                raise AttemptInvalid(f"{path}: listed file {(entry or {}).get('path') if isinstance(entry, dict) else entry!r} "
                                     "is not a relative path inside the attempt directory")
            f = path / entry["path"]
            if not f.is_file():
                raise AttemptInvalid(f"{path}: listed file {entry['path']} is missing")
            if f.stat().st_size != entry["size"] or sha256_file(f) != entry["sha256"]:
                raise AttemptInvalid(f"{path}: {entry['path']} does not match its recorded SHA-256 (tampered or truncated)")
    header["path"] = str(path)
    return header


def _inside(attempt_dir: Path, rel) -> bool:
    """A listed file must lie inside its attempt directory, also after following links: a manifest
    naming ../../etc/hostname must not make the store read (and vouch for) a file outside it."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in Path(rel).parts:
        return False
    return (attempt_dir / rel).resolve().is_relative_to(attempt_dir.resolve())


class AttemptMisplaced(AttemptInvalid):
    """A sealed attempt that is not where its own header says it belongs (renamed or moved by hand)."""

    kind = "misplaced"


def read_sealed_attempt(path: Path) -> dict:
    """attempt.json of an attempt another record may rely on (a baseline is promoted from it):
    schema-valid, every listed file inside the directory and matching its SHA-256, and the
    directory at artifacts/<task_id>/<attempt_id>, as the index requires."""
    from mini_kv.load.schema import validate

    path = Path(path)
    header = read_attempt(path, verify=False)
    try:
        validate({k: v for k, v in header.items() if k != "path"}, "attempt", str(path / "attempt.json"))
    except ConfigError as exc:
        raise AttemptInvalid(str(exc)) from None
    header = read_attempt(path)
    if header["attempt_id"] != path.name:
        raise AttemptMisplaced(f"{path}: directory name differs from its attempt_id {header['attempt_id']!r} "
                               "(renamed or copied by hand); move it back to artifacts/<task>/<attempt_id>")
    if header["task_id"] != path.resolve().parent.name:
        raise AttemptMisplaced(f"{path}: lies under {path.resolve().parent.name!r} but belongs to task "
                               f"{header['task_id']!r}; move it to artifacts/{header['task_id']}/")
    return header


def load_attempt_file(attempt: dict, rel: str):
    """One JSON file of an already verified attempt."""
    try:
        return json.loads((Path(attempt["path"]) / rel).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(str(Path(attempt["path"]) / rel), "", f"unreadable attempt file ({exc})") from None


def iter_attempt_dirs(artifacts: Path):
    """Every directory that could be an attempt, including partial and garbage ones (the caller reports)."""
    artifacts = Path(artifacts)
    if not artifacts.is_dir():
        return
    for task_dir in sorted(artifacts.iterdir()):
        if not task_dir.is_dir() or task_dir.name.startswith("."):
            continue
        yield from sorted(task_dir.iterdir())
