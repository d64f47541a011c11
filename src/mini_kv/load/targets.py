"""A card's `module:function` targets (its reference, its input factory), imported: what is wrong
with one, in the words a ConfigError gives. Light (no torch, no YAML): a card's judge checks them
with it as it starts (worker.child), the loader where it imports them (task_card.check_import_path)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def add_project_to_path(root: str | Path | None) -> None:
    """A card's `module:function` references may name modules of its project: importable from its
    root wherever the command runs (as when run from there), after the installed packages."""
    if root and str(root) not in sys.path:
        sys.path.append(str(root))


def import_error(spec: str, catch: type[BaseException] = Exception) -> str | None:
    """Why `spec` (`module:function`) cannot be used: its module does not import (raising `catch`),
    or names no callable; None where it can."""
    module, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(module)
    except catch as exc:
        return f"cannot import module {module!r} ({type(exc).__name__}: {exc})"
    if not callable(getattr(mod, attr, None)):
        return f"module {module!r} has no callable {attr!r}"
    return None
