"""YAML safe-load that rejects duplicate keys (PyYAML silently keeps the last one).

The document is composed to a node tree first and walked with its field path, so a duplicate
is reported as e.g. `operator.name`, with both line numbers. Before that, one pass over the
parser's event stream (no recursion, no expansion) bounds the nesting depth and the size of the
document with its aliases expanded, and refuses an alias to a node that contains it: a 1 KB alias
"bomb" or a self-referencing alias would otherwise hang or overflow the stack of every later step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mini_kv.errors import ConfigError
from mini_kv.load.plain import MAX_DEPTH, MAX_NODES, check_plain, join

# libyaml when present: the pure-Python parser takes a fifth of a second for a card
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_shape(text: str, file: str) -> None:
    """Depth, expanded size and self-reference, from the event stream alone."""
    sizes: dict[str, int] = {}  # anchor -> node count of its (expanded) value
    open_: list[list] = []  # per open collection: [anchor, node count so far]
    total = 0
    for ev in yaml.parse(text, Loader=LOADER):
        line = f"line {ev.start_mark.line + 1}" if ev.start_mark else ""
        if isinstance(ev, yaml.AliasEvent):
            if ev.anchor not in sizes:
                what = (
                    "refers to a node that contains it"
                    if any(f[0] == ev.anchor for f in open_)
                    else "names no anchor defined before it"
                )
                raise ConfigError(file, line, f"alias *{ev.anchor} {what}")
            weight = sizes[ev.anchor]
        elif isinstance(ev, yaml.ScalarEvent):
            weight = 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(open_) >= MAX_DEPTH:
                raise ConfigError(file, line, f"nested more than {MAX_DEPTH} levels deep")
            open_.append([ev.anchor, 1])
            continue
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, weight = open_.pop()
            if anchor:
                sizes[anchor] = weight
        else:
            continue
        if open_:
            open_[-1][1] += weight
        total += weight
        if total > MAX_NODES or (open_ and open_[-1][1] > MAX_NODES):
            raise ConfigError(
                file, line, f"more than {MAX_NODES} values once its aliases are expanded (an alias bomb?)"
            )


def _check_duplicates(node: yaml.Node, path: str, file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            where = join(path, key)
            if key in seen:
                raise ConfigError(
                    file,
                    where,
                    f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                    f"(first defined at line {seen[key].start_mark.line + 1}); every key may appear once",
                )
            seen[key] = key_node
            _check_duplicates(value_node, where, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, join(path, i), file)


def _compose_and_construct(text: str, name: str) -> Any:
    """One parse: the node tree is checked for duplicate keys, then turned into Python values."""
    loader = LOADER(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_duplicates(root, "", name)
        return loader.construct_document(root)
    finally:
        loader.dispose()


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
        _check_shape(text, name)
        data = _compose_and_construct(text, name)
    except yaml.YAMLError as exc:
        raise ConfigError(name, "", f"not valid YAML: {exc}") from None
    check_plain(data, name)
    return data
