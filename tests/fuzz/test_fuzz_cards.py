"""Fuzzing task cards: mutations of the shipped cards (types, unicode, markup, deep nesting, aliases,
huge numbers, NaN/inf, paths) through the loader in-process and through `validate-task`.

Properties: the loader returns a card or raises ConfigError naming the card, nothing else, within
the hang guard; a card it accepts passes independent sanity checks; a card that is invalid by
construction is rejected; the CLI exits 0 or 2, never 10, never prints a traceback."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys

import pytest
import yaml
from fuzz_helpers import REPO, SHIPPED_CARDS, cli_main, write_card
from fuzz_mutations import invalid, mutated, yaml_text
from fuzz_settings import examples, within
from hypothesis import given
from hypothesis import strategies as st

from mini_kv.errors import ConfigError, ExitCode, UserError
from mini_kv.load.task_card import load_task_card

CARDS = {p.stem: yaml.safe_load(p.read_text()) for p in SHIPPED_CARDS}
TEXTS = {p.stem: p.read_text() for p in SHIPPED_CARDS}
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SEMVER = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})")
QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
_names = itertools.count()


def _write(project, card) -> object:
    return write_card(project, card, f"fuzz_{next(_names)}.yaml")


def _load(path):
    """The card, or None after a ConfigError that names this file; anything else fails the example."""
    try:
        with within(what=f"loading {path.name}"):
            return load_task_card(path)
    except ConfigError as exc:
        assert exc.file == str(path) and exc.expected, str(exc)
        return None


def _numbers(node):
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            assert all(isinstance(k, str) for k in x)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, float):
            yield x


def assert_sane(card) -> None:
    """What every accepted card must satisfy, checked independently of the schema."""
    assert IDENT.fullmatch(card.id) and SEMVER.fullmatch(card.version)
    assert IDENT.fullmatch(card.operator["name"]) and SEMVER.fullmatch(card.operator["version"])
    for cand in card.candidates:
        assert IDENT.fullmatch(cand.id) and QUALNAME.fullmatch(cand.op)
        assert "\n" not in cand.path and "\0" not in cand.path and not cand.path.startswith("..")
    for case in card.cases:
        assert IDENT.fullmatch(case.base_id)
    assert all(math.isfinite(x) for x in _numbers(card.raw))
    assert all(0 < t <= 604800 for t in card.timeouts.values())


@examples(1.0)
@given(name=st.sampled_from(sorted(CARDS)), data=st.data())
def test_mutated_cards_load_or_are_config_errors(fuzz_project, name, data):
    card = data.draw(mutated(CARDS[name]))
    try:
        path = _write(fuzz_project, card)
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        return  # not representable as YAML text; the text mutations below cover broken text
    loaded = _load(path)
    if loaded is not None:
        assert_sane(loaded)


@examples(1.0)
@given(name=st.sampled_from(sorted(CARDS)), data=st.data())
def test_cards_invalid_by_construction_are_rejected(fuzz_project, name, data):
    original = CARDS[name]
    identifiers = (
        [("id",), ("version",), ("operator", "name"), ("operator", "version")]
        + [("candidates", i, "id") for i in range(len(original["candidates"]))]
        + [("candidates", i, "op") for i in range(len(original["candidates"]))]
        + [("cases", i, "id") for i in range(len(original["cases"]))]
    )
    card, kind = data.draw(
        invalid(original, identifiers, ["id", "version", "operator", "candidates", "cases", "tolerances"])
    )
    try:
        path = _write(fuzz_project, card)
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        return
    assert _load(path) is None, f"accepted a card with a mutation of kind {kind!r}"


@examples(1.0)
@given(name=st.sampled_from(sorted(CARDS)), data=st.data())
def test_mutated_card_text_loads_or_is_a_config_error(fuzz_project, name, data):
    text = data.draw(yaml_text(TEXTS[name]))
    path = fuzz_project / "tasks" / f"fuzz_{next(_names)}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    loaded = _load(path)
    if loaded is not None:
        assert_sane(loaded)


@examples(0.5)
@given(name=st.sampled_from(sorted(CARDS)), data=st.data())
def test_validate_task_in_process_exits_0_or_2(fuzz_project, name, data):
    card = data.draw(mutated(CARDS[name]))
    try:
        path = _write(fuzz_project, card)
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        return
    with within(what="validate-task"):
        code, out = cli_main("validate-task", str(path))
    assert code in (ExitCode.OK, ExitCode.CONFIG), out
    assert "Traceback" not in out and "internal error" not in out, out
    assert (code == ExitCode.OK) == (_load(path) is not None)


@examples(0.05, cap=12)
@given(name=st.sampled_from(sorted(CARDS)), data=st.data())
def test_validate_task_cli_exits_2_on_invalid_cards(fuzz_project, name, data):
    card, kind = data.draw(invalid(CARDS[name], [("id",), ("version",), ("cases", 0, "id")], ["id", "cases"]))
    try:
        path = _write(fuzz_project, card)
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        return
    proc = subprocess.run(
        [sys.executable, "-m", "mini_kv", "validate-task", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == ExitCode.CONFIG, (kind, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and path.name in proc.stderr


@pytest.mark.parametrize("name", sorted(CARDS))
def test_shipped_cards_load_in_the_fuzz_project(fuzz_project, name):
    """The starting point of every mutation is a valid card (else the suite would test nothing)."""
    card = _load(_write(fuzz_project, CARDS[name]))
    assert card is not None
    assert_sane(card)


def test_user_errors_are_the_only_expected_failures():
    assert issubclass(ConfigError, UserError)
