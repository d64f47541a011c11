"""The one reader of mini_kv's versioned JSON files: read, a JSON object, a schema_version this mini_kv
reads (older ones migrated in memory, never rewritten), valid against its schema; errors name the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from mini_kv.errors import ConfigError, UserError


class RecordUnusable(UserError):
    """A versioned JSON file that cannot be used. `reason`: unreadable | version | schema."""

    def __init__(self, file: str, reason: str, message: str):
        super().__init__(f"{file}: {message}")
        self.file, self.reason = file, reason


def read_versioned(
    path: Path,
    version: int | None,
    schema: str | None = None,
    hint: str = "it was written by another mini_kv version: read it with that version",
    migrations: dict[int, Callable[[dict], dict]] | None = None,
) -> dict:
    """The JSON object in `path` at schema_version `version` (None: any): `migrations[v]` turns a version v
    object into version v + 1. RecordUnusable (naming the file, what was found and what to do) otherwise."""
    file = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        why = (
            "nested too deeply to be a real file"
            if isinstance(exc, RecursionError)
            else f"{type(exc).__name__}: {exc}"
        )
        raise RecordUnusable(file, "unreadable", f"unreadable ({why})") from None
    if not isinstance(data, dict):
        raise RecordUnusable(file, "unreadable", "not a JSON object")
    found = data.get("schema_version")
    migrations = migrations or {}
    while type(found) is int and found in migrations:  # may be any JSON value
        data = migrations[found](data)
        found = data["schema_version"]
    if version is not None and not (type(found) is int and found == version):
        known = " or ".join(map(str, [*sorted(migrations), version]))
        raise RecordUnusable(
            file,
            "version",
            f"schema_version {found!r} is not one this mini_kv reads: it reads version {known}; {hint}",
        )
    if schema is not None:
        from mini_kv.load.schema import validate

        try:
            validate(data, schema, file)
        except ConfigError as exc:
            raise RecordUnusable(file, "schema", str(exc)[len(file) + 2 :]) from None
        except RecursionError:
            raise RecordUnusable(file, "schema", "nested too deeply to check") from None
    return data
