"""Builds shared across tests through the content-addressed build cache."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def share_build_cache(project: Path) -> Path:
    """Give a test's project the checkout's build cache (`.build/`; in CI it is kept between runs).
    Builds are keyed by their sources, flags and toolchain, not by where the project lies, so a test
    that needs a candidate built (not a cold build) reuses the one another test or an earlier run
    made. Failed builds are never stored: a compile error is compiled every time."""
    (ROOT / ".build").mkdir(exist_ok=True)
    link = project / ".build"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to((ROOT / ".build").resolve(), target_is_directory=True)
    return project
