"""Inputs for the loader-hardening tests and the fuzz suite: a throw-away project holding a task card
(copied from tasks/vector_add.yaml) and a throw-away SOL problem (copied from tests/sol_solutions)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import struct
from pathlib import Path

import yaml
from build_helpers import share_build_cache

REPO = Path(__file__).resolve().parents[1]
SHIPPED_CARDS = sorted((REPO / "tasks").glob("*.yaml"))
SOL_PROBLEM = REPO / "tests" / "sol_solutions" / "problem"
GOOD_SOLUTION = REPO / "tests" / "sol_solutions" / "good_return" / "solution.json"


def card_project(tmp: Path) -> Path:
    """A project (marker file) with the vector_add candidates, so a card written into it can load."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / ".mini-kv-project").write_text("")
    for card in SHIPPED_CARDS:
        data = yaml.safe_load(card.read_text())
        for cand in data["candidates"]:
            dest = tmp / cand["path"]
            if not dest.exists():
                shutil.copytree(REPO / cand["path"], dest)
    return share_build_cache(tmp)  # the shipped candidates: their builds are shared


def shipped_card(name: str = "vector_add") -> dict:
    return yaml.safe_load((REPO / "tasks" / f"{name}.yaml").read_text())


def write_card(project: Path, card, name: str = "card.yaml") -> Path:
    """`card` as YAML text (a str is written as is)."""
    path = project / "tasks" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        card if isinstance(card, str) else yaml.safe_dump(card, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
        errors="surrogatepass",
    )
    return path


def sol_problem(tmp: Path) -> tuple[Path, dict, list[dict], dict]:
    """A copy of the test problem in `tmp`/problem: (dir, definition, workload lines, solution)."""
    d = tmp / "problem"
    shutil.copytree(SOL_PROBLEM, d, dirs_exist_ok=True)
    definition = json.loads((d / "definition.json").read_text())
    workloads = [json.loads(line) for line in (d / "workload.jsonl").read_text().splitlines() if line.strip()]
    return d, definition, workloads, json.loads(GOOD_SOLUTION.read_text())


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        obj if isinstance(obj, str) else json.dumps(obj), encoding="utf-8", errors="surrogatepass"
    )
    return path


def write_workloads(path: Path, lines) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def safetensors_bytes(header: dict | str, data: bytes = b"") -> bytes:
    raw = (header if isinstance(header, str) else json.dumps(header)).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def deepcopy(obj):
    return copy.deepcopy(obj)


def cli_main(*argv: str) -> tuple[int, str]:
    """`mini-kv ARGV` in this process: (exit code, stdout + stderr)."""
    from mini_kv import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue() + err.getvalue()
