"""Fuzz tests: the shared hypothesis profile (fuzz_settings, loaded on import) and fixtures."""

from __future__ import annotations

import fuzz_settings  # noqa: F401 - registers and loads the "mini_kv_fuzz" profile
import pytest


@pytest.fixture(scope="session")
def fuzz_project(tmp_path_factory):
    """A project holding the shipped cards' candidates; fuzzed cards are written into it."""
    from fuzz_helpers import card_project

    return card_project(tmp_path_factory.mktemp("fuzz-project"))
