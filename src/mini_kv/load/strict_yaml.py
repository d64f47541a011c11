"""YAML safe-load that rejects duplicate keys (PyYAML silently keeps the last one).

The document is composed to a node tree first and walked with its field path, so a duplicate
is reported as e.g. `operator.name`, with both line numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mini_kv.errors import ConfigError


def _join(path: str, part) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else str(part)


def _check_duplicates(node: yaml.Node, path: str, file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            where = _join(path, key)
            if key in seen:
                raise ConfigError(file, where, f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                                  f"(first defined at line {seen[key].start_mark.line + 1}); every key may appear once")
            seen[key] = key_node
            _check_duplicates(value_node, where, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, _join(path, i), file)


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
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_duplicates(root, "", name)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(name, "", f"not valid YAML: {exc}") from None
