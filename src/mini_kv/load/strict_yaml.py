"""YAML safe-load that rejects duplicate keys (PyYAML silently keeps the last one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mini_kv.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            line = key_node.start_mark.line + 1
            first = seen[key].start_mark.line + 1
            raise _DuplicateKey(f"duplicate key {key!r} at line {line} (first defined at line {first})")
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


class _DuplicateKey(Exception):
    pass


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: Path, display: str | None = None) -> Any:
    """Parse one YAML file; any problem becomes a ConfigError naming the file."""
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(name, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(name, "", f"cannot read as UTF-8 text ({exc})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(name, "", f"{exc}; every key may appear once") from None
    except yaml.YAMLError as exc:
        raise ConfigError(name, "", f"not valid YAML: {exc}") from None
