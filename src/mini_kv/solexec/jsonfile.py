"""Strict JSON reading: duplicate keys and non-standard numbers (NaN, Infinity) are errors, not silently kept."""

from __future__ import annotations

import json
from pathlib import Path

from mini_kv.errors import ConfigError
from mini_kv.load.plain import check_plain


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(f"duplicate key {key!r}; every key may appear once")
        seen[key] = value
    return seen


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, file: str, where: str = ""):
    """One JSON document; a ConfigError naming `file` (and `where`, e.g. `line 3`) otherwise.
    Numbers too large for a float (1e400 reads as infinity) and nesting deeper than any real
    file are refused like NaN (mini_kv.load.plain)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Duplicate as exc:
        raise ConfigError(file, where, str(exc)) from None
    except ValueError as exc:
        raise ConfigError(file, where, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(file, where, "nested too deep to be a real file") from None
    check_plain(data, file, f"{where}: " if where else "")
    return data


def read_text(path: Path, file: str | None = None) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(file or str(path), "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(file or str(path), "", f"unreadable ({exc})") from None


def read_json(path: Path):
    return parse_json(read_text(path), str(path))
