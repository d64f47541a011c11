"""Attempt directories: `artifacts/<task>/<attempt_id>/`, written as `<id>.partial` and renamed when whole.

attempt.json is written last and lists the SHA-256 and size of every other file; a reader
re-hashes them, so a tampered or truncated attempt is reported and never used.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from pathlib import Path, PurePosixPath

from mini_kv.codec import to_json
from mini_kv.model import sha256_file
from mini_kv.store import signing
from mini_kv.store.atomic import StagedDir
from mini_kv.store.jsonfile import RecordUnusable, read_versioned

ATTEMPT_SCHEMA_VERSION = 1
PARTIAL = StagedDir.PARTIAL
# the schemas/ the files of an attempt are checked against when written and when read (correctness.json
# and benchmark.json: store.records' records check themselves)
FILE_SCHEMAS = {"regression.json": "regression", "static_check.json": "static_check"}


def new_attempt_id(candidate: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{stamp}-{candidate}-{secrets.token_hex(3)}"


class AttemptWriter(StagedDir):
    """Collects files into a `.partial` dir; `commit()` seals and publishes it atomically."""

    def __init__(self, artifacts: Path, task_id: str, candidate: str):
        self.attempt_id = new_attempt_id(candidate)
        self.task_dir = Path(artifacts) / task_id
        try:
            super().__init__(self.task_dir / self.attempt_id)
        except FileExistsError:
            raise FileExistsError(
                f"attempt directory {self.task_dir / self.attempt_id} already exists"
            ) from None

    def json(self, rel: str, obj) -> None:
        """`obj` (a record: the codec writes it) as `rel`, checked first against its schema if it has one."""
        if rel in FILE_SCHEMAS:
            from mini_kv.load.schema import validate

            validate(to_json(obj), FILE_SCHEMAS[rel], rel)
        super().json(rel, obj)

    def commit(self, header: dict) -> Path:
        """Seal: attempt.json lists every file's SHA-256, and is signed with the operator's key when one
        is set (store.signing; `signature: null` says it is not)."""
        full = {
            **header,
            "schema_version": ATTEMPT_SCHEMA_VERSION,
            "attempt_id": self.attempt_id,
            "files": self.manifest(),
        }
        full.pop(signing.SIGNATURE_FIELD, None)
        sig = signing.signature_for(signing.operator_key(self.task_dir.parent), full)
        full[signing.SIGNATURE_FIELD] = to_json(sig)
        return self.publish("attempt.json", full)


class AttemptInvalid(Exception):
    """An attempt directory that must not be used; the message says why, `kind` what sort of problem it is
    (invalid, version, misplaced, tampered: index.Problem)."""

    kind = "invalid"

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        self.kind = kind or self.kind


class AttemptTampered(AttemptInvalid):
    """An attempt whose files disagree with its own records: changed, added, linked or forged."""

    kind = "tampered"


def read_attempt(path: Path, verify: bool = True) -> dict:
    """attempt.json of a sealed attempt (valid against schemas/attempt.schema.json), after checking every
    listed file's size and SHA-256."""
    path = Path(path)
    if path.name.endswith(PARTIAL):
        raise AttemptInvalid(f"{path}: incomplete attempt (still .partial)")
    if not (path / "attempt.json").exists():
        raise AttemptInvalid(f"{path}: no attempt.json")
    try:
        header = read_versioned(path / "attempt.json", ATTEMPT_SCHEMA_VERSION, "attempt")
    except RecordUnusable as exc:
        raise AttemptInvalid(str(exc), "version" if exc.reason == "version" else None) from None
    if verify:
        verify_files(path, header.get("files"))
    header["path"] = str(path)
    return header


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _manifest(path: Path, files) -> list[tuple[str, str, int]]:
    """attempt.json's `files` as (path, sha256, size), after checking its shape and every name."""
    meta = path / "attempt.json"
    if not isinstance(files, list):
        raise AttemptInvalid(
            f"{meta}: `files` is {type(files).__name__}, expected a list of {{path, sha256, size}} objects"
        )
    out, seen = [], {}
    for i, e in enumerate(files):
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("path"), str)
            and isinstance(e.get("sha256"), str)
            and _SHA256.fullmatch(e["sha256"]) is not None
            and type(e.get("size")) is int
            and e["size"] >= 0
        )
        if not ok:
            raise AttemptInvalid(
                f"{meta}: files[{i}] is not a {{path, sha256 (64 lowercase hex), size (int >= 0)}} object"
            )
        rel = e["path"]
        parts = PurePosixPath(rel).parts
        if (
            not rel
            or rel.startswith("/")
            or "\\" in rel
            or "\0" in rel
            or any(p in ("..", ".") for p in parts)
            or rel != str(PurePosixPath(rel))
            or rel == "attempt.json"
        ):
            raise AttemptTampered(
                f"{meta}: files[{i}] path {rel!r} is not a plain relative path inside the attempt"
            )
        # names that differ only in case would be one file on a case-insensitive file system
        if rel.casefold() in seen:
            raise AttemptTampered(
                f"{meta}: files[{i}] path {rel!r} is listed twice (as {seen[rel.casefold()]!r})"
            )
        seen[rel.casefold()] = rel
        out.append((rel, e["sha256"], e["size"]))
    return out


def verify_files(path: Path, files) -> None:
    """Every listed file is a regular file inside `path` (no link on the way) with its recorded size and
    SHA-256, and no file is there that is not listed. AttemptTampered/AttemptInvalid otherwise."""
    if path.is_symlink():
        raise AttemptTampered(f"{path}: the attempt directory is a symbolic link (to {os.readlink(path)})")
    listed = _manifest(path, files)
    for rel, digest, size in listed:
        f = path / rel
        for anc in [*reversed(f.relative_to(path).parents), Path(rel)]:
            if str(anc) != "." and (path / anc).is_symlink():
                raise AttemptTampered(f"{path}: listed file {rel}: {anc} is a symbolic link")
        if not f.exists():
            raise AttemptInvalid(f"{path}: listed file {rel} is missing")
        if not f.is_file():
            raise AttemptTampered(f"{path}: listed file {rel} is not a regular file")
        if f.stat().st_size != size or sha256_file(f) != digest:
            raise AttemptTampered(
                f"{path}: {rel} does not match its recorded SHA-256 and size in attempt.json "
                "(tampered or truncated)"
            )
    names = {rel for rel, _, _ in listed} | {"attempt.json"}
    for p in sorted(path.rglob("*")):
        if (p.is_symlink() or not p.is_dir()) and str(p.relative_to(path)) not in names:
            raise AttemptTampered(
                f"{path}: {p.relative_to(path)} is not listed in attempt.json (added after "
                "the attempt was sealed)"
            )


def iter_attempt_dirs(artifacts: Path):
    """Every directory that could be an attempt, including partial and garbage ones (the caller reports)."""
    artifacts = Path(artifacts)
    if not artifacts.is_dir():
        return
    for task_dir in sorted(artifacts.iterdir()):
        if not task_dir.is_dir() or task_dir.name.startswith("."):
            continue
        yield from sorted(task_dir.iterdir())
