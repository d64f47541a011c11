"""Task card v1: strict YAML -> JSON Schema -> semantic checks -> a frozen model.Problem (format `task-card`)."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import sys
from pathlib import Path

from mini_kv import arith, roofline
from mini_kv.errors import ConfigError
from mini_kv.load.files import links_leaving, odd_files
from mini_kv.load.flags import FlagRules, UnsafeFlag, check_flags
from mini_kv.load.schema import validate
from mini_kv.load.strict_yaml import load_yaml
from mini_kv.load.targets import add_project_to_path, import_error
from mini_kv.model import DEFAULT_BENCHMARK, DEFAULT_TIMEOUTS, Candidate, Case, Problem

CARD_SCHEMA_VERSION = 1
PROJECT_MARKERS = ("pyproject.toml", ".git", ".mini-kv-project")


def project_root_of(start: Path) -> Path | None:
    """The nearest ancestor of `start` (itself included) holding a project marker, or None."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if any((d / m).exists() for m in PROJECT_MARKERS)), None)


def find_project_root(start: Path) -> Path:
    """The nearest ancestor holding a project marker (else `start`); paths in a card may not leave it."""
    return project_root_of(start) or start.resolve()


def resolve_inside(
    root: Path,
    rel: str,
    file: str,
    fieldname: str,
    base: Path | None = None,
    must_exist: bool = True,
    kind: str = "file",
) -> Path:
    """Resolve `rel` (following symlinks) and insist the result stays inside `root`."""
    target = (base or root) / rel
    try:  # a NUL, a lone surrogate or an over-long name cannot name a file at all
        os.fsencode(rel)
        if "\0" in rel:
            raise ValueError("embedded NUL")
        resolved = target.resolve()
        root = root.resolve()
        exists = resolved.is_dir() if kind == "dir" else resolved.is_file()
    except (ValueError, OSError) as exc:
        raise ConfigError(file, fieldname, f"{rel!r} is not a usable path ({exc})") from None
    if resolved != root and root not in resolved.parents:
        raise ConfigError(file, fieldname, f"path {rel!r} resolves to {resolved}, outside the project {root}")
    if must_exist:
        if not exists:
            raise ConfigError(file, fieldname, f"{kind} {rel!r} does not exist (looked for {resolved})")
    return resolved


def check_import_path(spec: str, file: str, fieldname: str) -> None:
    why = import_error(spec)  # any import failure (an Exception) is a config error here
    if why is not None:
        raise ConfigError(file, fieldname, why)


def _check_modules(op: dict, file: str, check) -> None:
    """The operator's reference and input modules, by `check` (imported, or read without running)."""
    check(op["reference"], file, "operator.reference")
    check(op["inputs"], file, "operator.inputs")


def _find_spec_without_import(module: str) -> importlib.machinery.ModuleSpec | None:
    """The module's spec found through the import system's finders, without executing any module:
    importlib.util.find_spec would import (run) every parent package of a dotted name."""
    spec, path = None, None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if name in sys.modules and getattr(sys.modules[name], "__spec__", None) is not None:
            spec = sys.modules[name].__spec__  # already imported (mini_kv's own references): nothing new runs
        else:
            spec = next(
                (
                    s
                    for f in sys.meta_path
                    if hasattr(f, "find_spec")
                    for s in [f.find_spec(name, path)]
                    if s is not None
                ),
                None,
            )
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if i < len(parts) - 1 and path is None:
            return None  # a plain module has no submodules
    return spec


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names a module defines at its top level, and whether it may define more (star import, __getattr__)."""
    names: set[str] = set()
    open_ended = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    open_ended = True
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            open_ended = True  # conditional definitions: a static reading cannot tell
    return names, open_ended or "__getattr__" in names


def check_definition_path(spec: str, file: str, fieldname: str) -> None:
    """`module:function` exists, checked without executing the module (validate-task runs no user code):
    the module is found by its finders and its source parsed; importing it is left to `verify`."""
    module, _, attr = spec.partition(":")
    try:
        found = _find_spec_without_import(module)
    except (ImportError, ValueError, AttributeError) as exc:
        raise ConfigError(
            file, fieldname, f"cannot locate module {module!r} ({type(exc).__name__}: {exc})"
        ) from None
    if found is None:
        raise ConfigError(file, fieldname, f"module {module!r} not found on the Python path")
    origin = found.origin if found.has_location else None
    if not origin or not origin.endswith(".py"):
        return  # a compiled or built-in module: only an import can tell, and verify does it
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (OSError, SyntaxError, ValueError) as exc:
        raise ConfigError(file, fieldname, f"module {module!r} ({origin}) cannot be parsed: {exc}") from None
    names, open_ended = _top_level_names(tree)
    if attr not in names and not open_ended:
        raise ConfigError(
            file, fieldname, f"module {module!r} ({origin}) defines no {attr!r} at its top level"
        )


def _check_expressions(op: dict, cases: tuple[Case, ...], file: str) -> None:
    """bytes/flops are evaluated per bench case in the worker (roofline.case_names: the case's numeric
    params, itemsize, numel): check the grammar, the bounds and every name against each bench case now,
    so a bad expression (a misspelt name) is the card's error here, not a failed benchmark later."""
    for key in ("bytes", "flops"):
        if key not in op:
            continue
        for case in [c for c in cases if c.kind == "bench"] or [None]:
            names = (
                dict.fromkeys(arith.names_in(op[key]), 1)
                if case is None
                else roofline.case_names(case.params, itemsize=1, numel=1)
            )
            try:
                arith.evaluate(op[key], names)
            except arith.ExpressionError as exc:
                where = f" (bench case {case.base_id!r})" if case is not None else ""
                raise ConfigError(
                    file, f"operator.{key}", f"{exc}{where}; the grammar: {arith.GRAMMAR}"
                ) from None
            except ZeroDivisionError:
                pass  # well formed; only the probe values are unlucky


def _expand_cases(raw_cases: list, file: str) -> tuple[Case, ...]:
    seen_base: dict[str, int] = {}
    seen: dict[str, int] = {}
    out = []
    for i, entry in enumerate(raw_cases):
        base = entry["id"]
        if base in seen_base:
            raise ConfigError(
                file, f"cases[{i}].id", f"duplicate case id {base!r} (first used at cases[{seen_base[base]}])"
            )
        seen_base[base] = i
        for dtype in entry["dtypes"]:
            cid = f"{base}-{dtype}"
            if cid in seen:
                raise ConfigError(
                    file, f"cases[{i}].id", f"expanded case id {cid!r} collides with cases[{seen[cid]}]"
                )
            seen[cid] = i
            out.append(
                Case(
                    id=cid,
                    base_id=base,
                    kind=entry["kind"],
                    params=dict(entry["params"]),
                    dtype=dtype,
                    devices=tuple(entry.get("devices", ("cpu", "cuda"))),
                )
            )
    return tuple(out)


def _candidates(raw: list, root: Path, file: str) -> tuple[Candidate, ...]:
    seen_ids: dict[str, int] = {}
    seen_ops: dict[str, int] = {}
    out = []
    for i, c in enumerate(raw):
        where = f"candidates[{i}]"
        if c["id"] in seen_ids:
            raise ConfigError(
                file,
                f"{where}.id",
                f"duplicate candidate id {c['id']!r} (first at candidates[{seen_ids[c['id']]}])",
            )
        seen_ids[c["id"]] = i
        if c["op"] in seen_ops:
            raise ConfigError(
                file,
                f"{where}.op",
                f"op {c['op']!r} is already used by candidates[{seen_ops[c['op']]}]; "
                "each candidate needs a dispatcher namespace of its own",
            )
        seen_ops[c["op"]] = i
        cdir = resolve_inside(root, c["path"], file, f"{where}.path", kind="dir")
        try:  # flags reach a shell inside the build (build.ninja): only allow-listed options
            check_flags({f"{where}.{k}": c.get(k, []) for k in ("cflags", "cuda_cflags")}, FlagRules(cdir))
        except UnsafeFlag as exc:
            raise ConfigError(file, exc.field, f"flag {exc.flag!r} refused: {exc.why}") from None
        for group in ("cpu", "cuda"):
            for j, src in enumerate(c["sources"].get(group, [])):
                resolve_inside(root, src, file, f"{where}.sources.{group}[{j}]", base=cdir)
        for link, target in links_leaving(cdir, root):  # listed as a source or not: the build reads them all
            raise ConfigError(
                file,
                f"{where}.path",
                f"symlink {link} points to {target}, outside the project "
                f"{root} (or nowhere); copy the file into the candidate dir instead",
            )
        for odd, why in odd_files(cdir):  # before anything runs: the build and the archive read them all
            raise ConfigError(file, f"{where}.path", f"{odd} {why}")
        out.append(
            Candidate(
                id=c["id"],
                path=os.path.relpath(cdir, root),
                op=c["op"],
                cpu_sources=tuple(c["sources"]["cpu"]),
                cuda_sources=tuple(c["sources"].get("cuda", [])),
                cflags=tuple(c.get("cflags", [])),
                cuda_cflags=tuple(c.get("cuda_cflags", [])),
                backward=bool(c.get("backward", False)),
            )
        )
    return tuple(out)


def load_task_card(
    path: str | Path, project_root: Path | None = None, import_modules: bool = True
) -> Problem:
    """`import_modules=False` checks the reference and input modules without running them: validate-task
    runs none of a card's code, and verify has its worker's judge import them as it starts (jailed, and
    without torch in the front door: pipeline.CardDoor.prepare)."""
    path = Path(path)
    file = str(path)
    data = load_yaml(path, file)
    if not isinstance(data, dict):
        raise ConfigError(file, "(top level)", "a mapping of task card fields")
    version = data.get("schema_version")
    if version != CARD_SCHEMA_VERSION:  # checked first: a newer card's new fields would hide the real cause
        raise ConfigError(
            file,
            "schema_version",
            f"unsupported schema_version {version!r}; this mini_kv reads task "
            f"cards of version {CARD_SCHEMA_VERSION} (upgrade mini_kv, or rewrite the card for v1)",
        )
    validate(data, "task_card", file)
    root = (project_root or find_project_root(path.parent)).resolve()
    resolve_inside(root, str(path.resolve()), file, "(file)")  # the card itself must live in the project

    op = data["operator"]
    add_project_to_path(root)
    _check_modules(op, file, check_import_path if import_modules else check_definition_path)
    candidates = _candidates(data["candidates"], root, file)
    cases = _expand_cases(data["cases"], file)
    _check_expressions(op, cases, file)

    dtypes_used = {c.dtype for c in cases if c.kind != "illegal"}
    missing = sorted(dtypes_used - set(data["tolerances"]))
    if missing:
        raise ConfigError(
            file, "tolerances", f"no tolerance for dtype(s) {', '.join(missing)} used by the cases"
        )

    default = data.get("default_candidate", candidates[0].id)
    if default not in {c.id for c in candidates}:
        raise ConfigError(file, "default_candidate", f"{default!r} is not one of the candidate ids")

    baseline = data.get("baseline")
    if baseline is not None:
        resolve_inside(root, baseline, file, "baseline", must_exist=False)

    return Problem(
        path=os.path.relpath(path.resolve(), root),
        project_root=str(root),
        raw=data,
        id=data["id"],
        version=data["version"],
        operator=dict(op),
        reference=op["reference"],
        candidates=candidates,
        default_candidate=default,
        tolerances=data["tolerances"],
        cases=cases,
        benchmark={**DEFAULT_BENCHMARK, **data.get("benchmark", {})},
        timeouts={**DEFAULT_TIMEOUTS, **data.get("timeouts", {})},
        baseline=baseline,
    )
