"""Hypothesis strategies that mutate a shipped document (a task card, definition.json, a workload
line, solution.json): nasty values at random places, and mutations that are invalid by construction."""

from __future__ import annotations

import copy
import math
import re

from hypothesis import strategies as st

NASTY_STRINGS = [
    "",
    " ",
    "[/x]",
    "[red]x[/red]",
    "[/]",
    "[bold",
    "a\n",
    "\n",
    "\0",
    "a\0b",
    "\ud800",
    "\udfff",
    "é",
    "²",
    "٣",
    "𝟘",
    "a" * 300,
    "x" * 5000,
    "../../etc/passwd",
    "/etc/passwd",
    ".",
    "..",
    "./",
    "a/",
    "a//b",
    "~",
    "${HOME}",
    "%s%n",
    "::",
    "a::b\n",
    "1.0.0\n",
    "NaN",
    "Infinity",
    "-inf",
    "*r",
    "&a",
    "!!python/object:os.system",
    "{}",
    "[]",
    "\u202e",
    "\ufeff",
    "a b",
    "a:b",
    "-1",
    "1e400",
    "0x10",
    "9**9**9**9",
    "min()",
    "True",
    "h * 1e308 * 10",
    "__import__('os')",
    "nul\x00",
    "tab\t",
    "\r\n",
    "'",
    '"',
    "\\",
    "C:\\x",
]
NASTY_NUMBERS = [
    0,
    -1,
    -5,
    1,
    2,
    2**31,
    2**62,
    2**63,
    2**64,
    10**30,
    10**400,
    1e11,
    1e308,
    -1e308,
    0.5,
    1e-320,
    float("nan"),
    float("inf"),
    -float("inf"),
    True,
    False,
]
NASTY_KEYS = [
    1,
    0,
    -1,
    1.5,
    True,
    False,
    None,
    "",
    "[/x]",
    "a\n",
    "\0",
    "\ud800",
    "é",
    "x" * 300,
    "__proto__",
]


def deep(depth: int, kind: str = "list"):
    value: object = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def values() -> st.SearchStrategy:
    leaf = st.one_of(
        st.sampled_from(NASTY_STRINGS),
        st.sampled_from(NASTY_NUMBERS),
        st.text(max_size=12),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.none(),
        st.booleans(),
    )
    nested = st.builds(deep, st.integers(1, 400), st.sampled_from(["list", "dict"]))
    containers = st.one_of(st.lists(leaf, max_size=3), st.dictionaries(st.text(max_size=6), leaf, max_size=3))
    return st.one_of(leaf, leaf, leaf, containers, nested)


def locations(doc) -> list[tuple]:
    """Every (path of keys) in `doc`, containers and leaves alike, the root excluded."""
    out = []
    stack = [((), doc)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            out.append((*path, k))
            stack.append(((*path, k), v))
    return sorted(out, key=repr)


def get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _apply(doc, op: str, path: tuple, value, key):
    parent = get(doc, path[:-1])
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif op == "add" and isinstance(parent, dict):
        parent[key] = value
    elif op == "add":
        parent.insert(last, value)
    elif op == "rename" and isinstance(parent, dict):
        parent[key] = parent.pop(last)
    elif op == "wrap":
        parent[last] = [parent[last]]


@st.composite
def mutated(draw, original: dict, max_mutations: int = 3):
    """`original` with 1..max_mutations random mutations (may stay valid)."""
    doc = copy.deepcopy(original)
    for _ in range(draw(st.integers(1, max_mutations))):
        locs = locations(doc)
        if not locs:
            break
        path = draw(st.sampled_from(locs))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "rename", "wrap"]))
        key = draw(st.one_of(st.sampled_from(NASTY_KEYS), st.text(max_size=8)))
        _apply(doc, op, path, draw(values()), key)
    return doc


FIELD_SUFFIXES = ["\n", "[/x]", " ", "\0", "é", "\ud800", "x" * 300, "/", ":"]  # each breaks an identifier
TEXT_SUFFIXES = [
    "\n",
    "\0",
    "\x1f",
    "\ud800",
    "x" * 300,
]  # each breaks a free-text name (no control chars, bounded)


@st.composite
def invalid(
    draw, original: dict, identifiers: list[tuple], required: list[str], suffixes: list[str] = FIELD_SUFFIXES
):
    """`original` with one mutation that no valid document has: an unknown top-level field, a required
    field deleted, NaN or infinity somewhere, a suffix that breaks an identifier, nesting past 64
    levels, or a non-string key. Returns (document, what was done)."""
    doc = copy.deepcopy(original)
    kind = draw(st.sampled_from(["unknown", "required", "nonfinite", "identifier", "deep", "key"]))
    if kind == "unknown":
        doc["zz_" + draw(st.text(alphabet="abcdefghij[]/\n", max_size=8))] = draw(values())
    elif kind == "required":
        del doc[draw(st.sampled_from(required))]
    elif kind == "nonfinite":
        locs = [p for p in locations(doc) if not isinstance(get(doc, p), (dict, list))] or [
            (next(iter(doc)),)
        ]
        path = draw(st.sampled_from(locs))
        get(doc, path[:-1])[path[-1]] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    elif kind == "identifier":
        path = draw(st.sampled_from(identifiers))
        parent = get(doc, path[:-1])
        parent[path[-1]] = str(parent[path[-1]]) + draw(st.sampled_from(suffixes))
    elif kind == "deep":
        locs = locations(doc)
        path = draw(st.sampled_from(locs))
        get(doc, path[:-1])[path[-1]] = deep(
            draw(st.integers(66, 2000)), draw(st.sampled_from(["list", "dict"]))
        )
    else:
        maps = [()] + [p for p in locations(doc) if isinstance(get(doc, p), dict)]
        target = get(doc, draw(st.sampled_from(maps)))
        target[draw(st.sampled_from([1, 0, 2.5, True, None]))] = draw(values())
    return doc, kind


YAML_SNIPPETS = [
    "rec: &r [*r]",
    "a0: &a0 [x,x,x,x,x,x,x,x,x,x]\na1: &a1 [*a0,*a0,*a0,*a0,*a0,*a0,*a0,*a0,*a0,*a0]\n"
    "a2: &a2 [*a1,*a1,*a1,*a1,*a1,*a1,*a1,*a1,*a1,*a1]\na3: &a3 [*a2,*a2,*a2,*a2,*a2,*a2,*a2,*a2,*a2,*a2]\n"
    "a4: &a4 [*a3,*a3,*a3,*a3,*a3,*a3,*a3,*a3,*a3,*a3]\na5: &a5 [*a4,*a4,*a4,*a4,*a4,*a4,*a4,*a4,*a4,*a4]",
    "deep: " + "[" * 500 + "]" * 500,
    "deep: " + "{a: " * 100 + "1" + "}" * 100,
    "x: !!python/object/apply:os.system ['true']",
    "x: !!binary aGVsbG8=",
    "x: !!set {a, b}",
    "x: 2020-01-01",
    "x: .nan",
    "x: .inf",
    "x: *undefined",
    "? [a, b]\n: 1",
    "? {a: 1}\n: 1",
    "1: one",
    "null: x",
    "id: dup\nid: dup",
    'x: "\\ud800"',
    'x: "\\0"',
    "x: 1e400",
    "x: 0x7fffffffffffffffffffffff",
    "%YAML 1.1\n---",
    "--- \n...",
    "x: |\n  [/x]",
    "\t",
    "x: &a 1\ny: *a\nz: *a",
]


@st.composite
def yaml_text(draw, original: str):
    """`original` (YAML text) with a snippet placed at a random line, or a line cut, or bytes flipped."""
    lines = original.splitlines()
    op = draw(st.sampled_from(["insert", "replace", "cut", "flip"]))
    i = draw(st.integers(0, len(lines)))
    if op in ("insert", "replace"):
        snippet = draw(
            st.one_of(st.sampled_from(YAML_SNIPPETS), st.sampled_from(NASTY_STRINGS).map(lambda s: f"x: {s}"))
        )
        lines[i : i + (op == "replace")] = snippet.splitlines()
    elif op == "cut":
        lines = lines[:i]
    else:
        text = "\n".join(lines)
        j = draw(st.integers(0, max(0, len(text) - 1)))
        text = (
            text[:j]
            + draw(
                st.sampled_from(
                    [
                        "[",
                        "]",
                        "{",
                        "}",
                        ":",
                        "&",
                        "*",
                        "!",
                        "|",
                        ">",
                        "%",
                        "@",
                        "`",
                        "\t",
                        "\0",
                        "\ud800",
                        "\x85",
                        "\u2028",
                    ]
                )
            )
            + text[j + 1 :]
        )
        return text
    return "\n".join(lines) + "\n"


JSON_SNIPPETS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "1" + "0" * 5000,
    "[" * 3000 + "]" * 3000,
    '"\\ud800"',
    '"\\u0000"',
    "null",
    "true",
    "{}",
    "[]",
    '"[/x]"',
    "-0",
    "1e-400",
    '{"a": 1, "a": 2}',
]


@st.composite
def json_text(draw, original: str):
    """`original` (JSON text) with a value replaced by a snippet, cut short, or a character changed."""
    op = draw(st.sampled_from(["value", "cut", "flip"]))
    if op == "value":
        spots = [m.end() for m in re.finditer(r'": ', original)] or [0]
        j = draw(st.sampled_from(spots))
        end = j
        while end < len(original) and original[end] not in ",}]":
            end += 1
        return original[:j] + draw(st.sampled_from(JSON_SNIPPETS)) + original[end:]
    j = draw(st.integers(0, max(0, len(original) - 1)))
    if op == "cut":
        return original[:j]
    return original[:j] + draw(st.sampled_from(list('[]{}:,"\\0-e') + ["\0", "\ud800"])) + original[j + 1 :]
