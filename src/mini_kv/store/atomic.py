"""Crash-safe file writes: temp file in the same dir, fsync, os.replace, fsync the dir."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

# bytes of one log of candidate output (worker, compiler) kept in an attempt (AttemptWriter.copy_log)
LOG_CAP = 8 << 20


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, obj) -> None:
    write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True, default=_default, allow_nan=True) + "\n").encode()
    )


def _default(o):
    if dataclasses.is_dataclass(o) and not isinstance(o, type):  # a typed record: the one codec writes it
        from mini_kv.codec import to_json

        return to_json(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class StagedDir:
    """A directory built as `<final>.partial` and renamed into place when whole (attempts, profiles).

    `manifest()` fsyncs every file and lists each with its SHA-256 and size; `publish(name, doc)` writes
    the manifest file last and renames: readers never see a partial directory."""

    PARTIAL = ".partial"

    def __init__(self, final: Path):
        self.final = Path(final)
        self.partial = self.final.with_name(self.final.name + self.PARTIAL)
        if self.final.exists() or self.partial.exists():  # append-only: never reuse a directory
            raise FileExistsError(f"directory {self.final} already exists")
        self.partial.mkdir(parents=True)

    def path(self, rel: str) -> Path:
        p = self.partial / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def json(self, rel: str, obj) -> None:
        write_json(self.partial / rel, obj)

    def text(self, rel: str, text: str) -> None:
        write_bytes(self.partial / rel, text.encode("utf-8", "replace"))

    def copy(self, rel: str, src: Path) -> None:
        shutil.copyfile(src, self.path(rel))

    def copy_log(self, rel: str, src: Path, cap: int = LOG_CAP) -> None:
        """A log of candidate output, bounded: beyond `cap` bytes only its first and last halves are
        kept, with a marker between that says how many bytes were dropped."""
        size = src.stat().st_size
        if size <= cap:
            return self.copy(rel, src)
        half = cap // 2
        with open(src, "rb") as f:
            head = f.read(half)
            f.seek(size - half)
            tail = f.read(half)
        marker = (
            f"\n[mini_kv: {size - 2 * half} bytes of this log dropped here; an attempt keeps "
            f"{cap} bytes of each log, its first and last halves]\n"
        ).encode()
        write_bytes(self.path(rel), head + marker + tail)

    def manifest(self) -> list[dict]:
        """Every file (fsynced: some were written by other processes) with its SHA-256 and size."""
        from mini_kv.model import sha256_file

        files = []
        for p in sorted(self.partial.rglob("*")):
            if p.is_file():
                fsync_file(p)
                files.append(
                    {
                        "path": str(p.relative_to(self.partial)),
                        "sha256": sha256_file(p),
                        "size": p.stat().st_size,
                    }
                )
        for d in {p.parent for p in self.partial.rglob("*")} | {self.partial}:
            fsync_dir(d)
        return files

    def publish(self, manifest_name: str, doc: dict) -> Path:
        write_json(self.partial / manifest_name, doc)
        os.rename(self.partial, self.final)  # the moment the directory becomes visible
        fsync_dir(self.final.parent)
        return self.final
