"""`mini-kv batch MANIFEST.yaml`: task cards x candidates and problem directories x solutions as one
list of batch items. Strict YAML, schemas/batch.schema.json, then every card, glob, problem and solution
checked before anything runs; an error names the manifest, the field and what was expected (exit 2)."""

from __future__ import annotations

from pathlib import Path

from mini_kv.cluster.batch import BENCH, VERIFY, Item
from mini_kv.errors import ConfigError, UserError

# A manifest's options are the command line's option names (`--memory-limit` is `memory_limit`); the
# few whose option record field is named otherwise are renamed here, in one place
FIELD_OF_OPTION = {"case": "case_filter", "memory_limit": "memory_limit_gb"}


def _options(cls, entry: dict, **fixed):
    """The entry's options record (pipeline.VerifyOptions, solexec.run.BenchOptions), with `fixed`."""
    return cls(**{FIELD_OF_OPTION.get(k, k): v for k, v in entry.get("options", {}).items()}, **fixed)


def load_manifest(path: str, store: str | None) -> list[Item]:
    """The manifest's items; `store` (--artifacts) or each card's or problem's project's artifacts/."""
    from mini_kv.load.schema import validate
    from mini_kv.load.strict_yaml import load_yaml

    file = str(path)
    if not Path(path).is_file():
        raise ConfigError(file, "", "manifest file not found")
    data = load_yaml(Path(path), file)
    validate(data, "batch", file)
    base = Path(path).resolve().parent
    items = [
        item
        for i, entry in enumerate(data.get("verify", []))
        for item in _verify_items(entry, base, file, f"verify[{i}]", store)
    ]
    for i, entry in enumerate(data.get("bench", [])):
        items += _bench_items(entry, base, file, f"bench[{i}]", store)
    return items


def _verify_items(entry: dict, base: Path, file: str, where: str, store: str | None) -> list[Item]:
    from mini_kv.cli_common import selected_candidates
    from mini_kv.load.task_card import load_task_card
    from mini_kv.pipeline import VerifyOptions

    task = base / entry["task"]
    if not task.is_file():
        raise ConfigError(file, f"{where}.task", f"{entry['task']!r}: no such task card (looked at {task})")
    try:
        card = load_task_card(task)
        cands = selected_candidates(card, entry.get("candidates", []))
    except UserError as exc:
        raise ConfigError(file, where, str(exc)) from None
    opts = _options(VerifyOptions, entry, artifacts=store)
    out = store or str(Path(card.project_root) / "artifacts")
    return [Item(VERIFY, f"{card.id}/{c.id}", str(task), c.id, opts, out) for c in cands]


def _bench_items(entry: dict, base: Path, file: str, where: str, store: str | None) -> list[Item]:
    from mini_kv.solexec.run import BenchOptions, bench_project_root

    problem = base / entry["problem"]
    if not (problem / "definition.json").is_file():
        raise ConfigError(file, f"{where}.problem", f"{entry['problem']!r}: no definition.json in {problem}")
    items = []
    for j, sol in enumerate(entry["solutions"]):
        if not (base / sol).is_file():
            raise ConfigError(file, f"{where}.solutions[{j}]", f"{sol!r}: no such solution file")
        opts = _options(BenchOptions, entry, solution=str(base / sol), artifacts=store)
        try:
            out = store or str(bench_project_root(opts) / "artifacts")
        except UserError as exc:
            raise ConfigError(file, f"{where}.solutions[{j}]", str(exc)) from None
        items.append(Item(BENCH, f"{problem.name}:{sol}", str(problem), None, opts, out))
    return items
