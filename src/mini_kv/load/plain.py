"""Bounds every loaded document must keep before any schema or loader sees it.

Task cards, definitions, workloads and solutions are JSON-shaped data: mappings with string keys,
lists, strings, finite numbers, booleans and null. A document that is deeper than any real file,
or holds NaN/infinity, a non-string key, or a YAML-only type (a timestamp, binary, a set) is
refused here with the path of the offending value, so later code (jsonschema, the loaders,
arithmetic on the values) never meets it.
"""

from __future__ import annotations

import math

from mini_kv.errors import ConfigError

MAX_DEPTH = 64  # the shipped files nest at most 6 deep
MAX_NODES = 100_000  # values in one document, counted after YAML aliases are expanded

_LEAVES = (str, int, float, bool, type(None))


def join(path: str, part) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else str(part)


def _describe_type(value) -> str:
    return type(value).__name__


def check_plain(data, file: str, prefix: str = "") -> None:
    """ConfigError naming the first value that is not plain JSON-shaped data (walked without recursion).
    `prefix` goes before every field path (e.g. `line 3: ` for a line of a JSONL file)."""

    def where(path: str) -> str:
        return prefix + (path or "(top level)")

    stack = [(data, "", 1)]
    nodes = 0
    while stack:
        value, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(file, where(""), f"more than {MAX_NODES} values; not a plausible file")
        if depth > MAX_DEPTH:
            raise ConfigError(file, where(path), f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ConfigError(
                        file,
                        where(join(path, repr(key))),
                        f"a key must be a string, got {_describe_type(key)} {key!r} (quote it)",
                    )
                stack.append((item, join(path, key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, join(path, i), depth + 1) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(
                file, where(path), f"a finite number, got {value!r} (NaN and infinity are not allowed)"
            )
        elif not isinstance(value, _LEAVES):
            raise ConfigError(
                file,
                where(path),
                f"a string, number, boolean, null, list or mapping; "
                f"got a {_describe_type(value)} (quote the value to make it a string)",
            )
