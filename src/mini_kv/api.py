"""The Python API: evaluate solutions from a generation loop, with the CLI's verdicts.

    from mini_kv import api
    for result in api.evaluate("problems/sol-execbench/rmsnorm", [path, api.Solution(...)], device="cpu"):
        print(result.solution, result.status, result.speedup)

A problem is a SOL problem directory (definition.json + workload.jsonl) or a task card (.yaml); a
solution is a solution.json path, an in-memory `Solution` (source strings, no files needed), or, for a
task card, a candidate id of the card. Each one goes through the same pipeline as `mini-kv bench` /
`mini-kv verify` (`pipeline.run_stages`: the same build cache, sandbox, worker, integrity checks and
store), and its result is read back from the attempt the pipeline wrote, through the store's own
checks (`store.index.check_attempt`), so a result here is exactly what `leaderboard` would rank.
With `store=False` the attempt is written to a temporary store and removed once read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.errors import ExitCode, UserError

if TYPE_CHECKING:
    from mini_kv.cluster.batch import ItemResult
    from mini_kv.judge.static_check import StaticCheck
    from mini_kv.store.index import CheckedAttempt


@dataclass(frozen=True)
class Solution:
    """A SOL solution held in memory: its sources are strings, written inline into solution.json."""

    name: str
    entry_point: str  # "<file>::<function>", the file one of `sources`
    sources: Mapping[str, str]  # relative path -> file content
    language: str = "pytorch"  # pytorch, triton, cuda_cpp, ... (solution.json's spec.languages)
    destination_passing_style: bool = False
    description: str = ""
    dependencies: tuple[str, ...] = ("torch",)

    def to_json(self, definition: str) -> dict:
        return {
            "name": self.name,
            "definition": definition,
            "author": "mini-kv api",
            "description": self.description,
            "spec": {
                "languages": [self.language],
                "target_hardware": ["LOCAL"],
                "entry_point": self.entry_point,
                "dependencies": list(self.dependencies),
                "destination_passing_style": self.destination_passing_style,
            },
            "sources": [{"path": p, "content": c} for p, c in self.sources.items()],
        }


@dataclass(frozen=True)
class CaseResult:
    """One workload (SOL) or correctness case (task card)."""

    id: str
    status: str
    reason: str | None = None
    latency_us: float | None = None  # the candidate's median, where the case was timed
    speedup: float | None = None  # reference time over candidate time


@dataclass(frozen=True)
class Result:
    """The verdict on one solution, as the store holds it."""

    solution: str
    status: str
    exit_code: int
    cases: tuple[CaseResult, ...] = ()
    speedup: float | None = None  # geometric mean over the timed cases
    stable: bool | None = None  # whether the timing met the stability bar
    attempt: Path | None = None  # None with store=False, or when nothing was stored
    reason: str | None = None  # why it did not pass, in one line
    duration_s: float = 0.0
    # the static pre-check of its sources (judge.static_check: kernelguard's findings, a lead, never the
    # verdict); None where the attempt holds none
    static_check: StaticCheck | None = None
    # the front door's own result: bench's BenchResult, verify's VerifyResult
    raw: object = field(default=None, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == ExitCode.OK


def evaluate(
    problem: str | Path,
    solutions: Iterable[str | Path | Solution],
    *,
    device: str | None = None,
    store: bool = True,
    artifacts: str | Path | None = None,
    **options,
) -> Iterator[Result]:
    """Evaluate each solution of `problem` in turn, yielding its `Result` as it finishes.

    `options` are the command line's option names (`timeout`, `rounds`, `samples`, `memory_limit_gb`,
    ...): `BenchOptions` for a SOL problem, `VerifyOptions` for a task card; an unknown name is a
    UserError. A candidate that fails, crashes or cheats is a Result; bad input is a UserError."""
    from mini_kv import jail
    from mini_kv.cluster.batch import evaluate_here

    problem = Path(problem)
    solutions = list(solutions)
    if not solutions:
        raise UserError("api.evaluate: no solutions given (an empty selection is an error, never a pass)")
    scratch = None if store else jail.scratch_dir("api")
    store_dir = str(scratch or artifacts) if (scratch or artifacts) else None
    try:
        with jail.scratch("solutions") as tmp:
            # every input checked (and every in-memory solution written) before anything runs
            items = [
                _sol_item(problem, sol, tmp / str(i), device, store_dir, options)
                if problem.is_dir()
                else _card_item(problem, sol, device, store_dir, options)
                for i, sol in enumerate(solutions)
            ]
            for _, out in evaluate_here(items):
                yield _result(out, keep=store)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def kept_judges():
    """Within it, judges are kept between `evaluate` calls too, as they are between the solutions of one
    call: a loop that evaluates one solution per call pays a judge's start (Python, torch, the problem's
    reference: about 0.8 s of CPU a call on the 2-core machine) once per problem instead of once per call. Every
    solution still runs in a fresh subject; the judge runs no candidate code. The judges kept end with
    it (at most two wait at once)."""
    from mini_kv.runner import keep_judges

    with keep_judges():
        yield


def _sol_item(problem: Path, sol, tmp: Path, device, store_dir, options: dict):
    from mini_kv.cluster.batch import BENCH, Item
    from mini_kv.solexec.run import BenchOptions

    path = _solution_file(problem, sol, tmp)
    opts = _options(BenchOptions, options, solution=str(path), device=device, artifacts=store_dir)
    return Item(BENCH, f"{problem.name}:{path}", str(problem), None, opts, store_dir or "")


def _card_item(card_path: Path, cand_id, device, store_dir, options: dict):
    from mini_kv.cluster.batch import VERIFY, Item
    from mini_kv.load.task_card import load_task_card
    from mini_kv.pipeline import VerifyOptions

    if not isinstance(cand_id, str):
        raise UserError(f"{card_path}: a task card's solutions are its candidates' ids, got {cand_id!r}")
    card = load_task_card(card_path)
    ids = [c.id for c in card.candidates]
    if cand_id not in ids:
        raise UserError(f"{card_path}: no candidate {cand_id!r} (the card has {', '.join(ids)})")
    opts = _options(VerifyOptions, options, device=device, artifacts=store_dir)
    return Item(VERIFY, f"{card.id}/{cand_id}", str(card_path), cand_id, opts, store_dir or "")


def _solution_file(problem: Path, sol, tmp: Path) -> Path:
    if not isinstance(sol, Solution):
        return Path(sol)
    definition = json.loads((problem / "definition.json").read_text())["name"]
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "solution.json"
    try:
        path.write_text(json.dumps(sol.to_json(definition), indent=1), encoding="utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(
            f"api.Solution {sol.name!r}: sources: text that cannot be encoded as UTF-8 ({exc})"
        ) from None
    return path


def _options(cls, options: dict, **fixed):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(
            f"api.evaluate: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**{k: v for k, v in fixed.items() if k in known}, **options)


def _result(out: ItemResult, keep: bool) -> Result:
    """The Result of one front door's run, read back from the attempt the pipeline stored."""
    from mini_kv.judge.static_check import read_static_check
    from mini_kv.solexec.run import BenchResult
    from mini_kv.store.index import AttemptInvalid, check_attempt
    from mini_kv.store.records import finite

    sol = out.detail if isinstance(out.detail, BenchResult) else None
    attempt = Path(out.attempt) if out.attempt else None
    checked, invalid, cases = None, None, ()
    if attempt is not None and (attempt / "attempt.json").exists():
        try:
            found = check_attempt(attempt)
            checked, cases = found, _cases(found)
        except AttemptInvalid as exc:  # the store refuses it (or its records): so does the API
            invalid = str(exc)
    row = checked.row if checked else None
    return Result(
        solution=sol.solution if sol else out.candidate,
        status="INVALID" if invalid else row.status if row else str(out.status),
        exit_code=int(out.exit_code),
        cases=cases,
        speedup=finite(row.geomean_speedup) if row else None,
        stable=row.stable if row else None,
        attempt=attempt if keep else None,
        reason=_reason(out, cases, invalid),
        duration_s=sol.duration_s if sol else 0.0,
        static_check=read_static_check(attempt) if checked is not None else None,  # its hash checked above
        raw=out.detail,
    )


def _cases(checked: CheckedAttempt) -> tuple[CaseResult, ...]:
    """The cases of correctness.json as the store's checks read it, with their timings."""
    timed = {r.case_id: r for r in checked.cases}
    return tuple(
        CaseResult(
            id=c.id,
            status=c.status,
            reason=c.reason or None,
            latency_us=timed[c.id].p50_us if c.id in timed else None,
            speedup=timed[c.id].speedup if c.id in timed else None,
        )
        for c in checked.records.correctness
    )


def _reason(out: ItemResult, cases: tuple[CaseResult, ...], invalid: str | None) -> str | None:
    if out.exit_code == ExitCode.OK:
        return None
    if invalid:
        return invalid
    failed = [c for c in cases if c.status not in ("PASSED", "SKIPPED")]
    if failed:
        first = failed[0]
        return f"{len(failed)} case(s) failed; first {first.id}: {first.status} {first.reason or ''}".strip()
    from mini_kv.cluster.batch import VERIFY

    summary = out.detail.summary if out.kind == VERIFY and out.detail is not None else {}
    return summary.get("reason") or str(out.status)
