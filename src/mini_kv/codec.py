"""The one codec between mini_kv's typed records (frozen dataclasses) and their JSON form.

`to_json` turns a record into plain JSON data (field order kept, tuples as lists, enums as their
values); `from_json` builds a record from JSON data. Field types drive the build: nested records,
`X | None`, `tuple[X, ...]` and `dict[str, X]`; anything else is taken as it is. Checking data against
its schema in schemas/ first is load.schema.read_record's (this module sits below load)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, TypeVar

R = TypeVar("R")


def to_json(value: Any) -> Any:
    """A record (or any value holding records) as JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            # an optional field the record does not have is left out (metadata {"omit_none": True})
            if not (f.metadata.get("omit_none") and getattr(value, f.name) is None)
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[R], data: Any) -> R:
    """The record `cls` held in `data`."""
    return _build(cls, data)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(tp: Any, data: Any) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(data, dict):
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        return tp(**{k: _build(hints[k], v) for k, v in data.items() if k in names})
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if data is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _build(inner[0], data) if len(inner) == 1 else data
    if origin is tuple and isinstance(data, list):
        return tuple(_build(args[0], v) for v in data)
    if origin is dict and isinstance(data, dict):
        return {k: _build(args[1], v) for k, v in data.items()}
    return data
