"""`mini-kv attempts list|compare|clean`: the stored attempts, what changed between two, and a retention
policy that never removes what a baseline or the leaderboard stands on."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.cli_common import artifacts_dir, console, err_console, task_id_of
from mini_kv.codec import to_json
from mini_kv.errors import ExitCode, UserError
from mini_kv.tables import Column, fitted_tables, num

if TYPE_CHECKING:
    from mini_kv.store.index import AttemptRow

LIST_COLUMNS = tuple("attempt_id candidate status device stable geomean_speedup source created_at".split())


def cmd_list(args) -> int:
    from mini_kv.store.index import read_index

    artifacts = artifacts_dir(args)
    task = task_id_of(args.target, "TARGET") if args.target else None
    rows, _ = read_index(artifacts, "task_id = ?", (task,)) if task else read_index(artifacts)
    if not rows:
        raise UserError(f"no attempts{f' of task {task}' if task else ''} in {artifacts}")
    if args.json:
        print(json.dumps(to_json(rows), indent=1))
        return ExitCode.OK
    for task_id in dict.fromkeys(r.task_id for r in rows):
        cells = [[_cell(getattr(r, c)) for c in LIST_COLUMNS] for r in rows if r.task_id == task_id]
        columns = [Column(c.replace("_", " ")) for c in LIST_COLUMNS]
        for t in fitted_tables(task_id, columns, cells, console.width, keys=1):
            console.print(t)
    return ExitCode.OK


def _cell(v) -> str:
    return num(v, ".3f" if isinstance(v, float) else "")


# ------------------------------------------------------------------------------------------- compare


def _attempt(spec: str, artifacts: Path) -> Path:
    """An attempt directory, given as a path or as an attempt id of the store."""
    p = Path(spec)
    if (p / "attempt.json").is_file():
        return p
    found = [d for d in artifacts.glob(f"*/{spec}") if (d / "attempt.json").is_file()]
    if len(found) != 1:
        raise UserError(f"{spec}: not an attempt directory, nor one attempt id in {artifacts}")
    return found[0]


def _sources(header: dict) -> dict[str, str]:
    """The candidate's files as the attempt holds them: relative path -> SHA-256 (from its manifest)."""
    keep = ("sources/", "solution.json")
    return {f["path"]: f["sha256"] for f in header["files"] if f["path"].startswith(keep)}


def _flat(d, prefix: str = "") -> dict[str, object]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


@dataclass(frozen=True)
class SourceDiff:
    added: list[str]
    removed: list[str]
    changed: list[str]


@dataclass(frozen=True)
class CaseDiff:
    case: str
    p50_a_us: float
    p50_b_us: float
    ratio: float  # B/A
    p_value: float  # two-sided Mann-Whitney U on the raw samples


@dataclass(frozen=True)
class AttemptDiff:
    """What differs between attempts `a` and `b` (`attempts compare --json` prints it)."""

    a: str
    b: str
    verdict: dict[str, list]  # field -> [a's, b's]
    sources: SourceDiff
    environment: dict[str, list]  # environment.json's differing (dotted) keys -> [a's, b's]
    cases: list[CaseDiff]


def compare(a: Path, b: Path) -> AttemptDiff:
    """What differs between two attempts: their verdicts, sources, environment and per-case latency
    (medians and a two-sided Mann-Whitney U test on the raw samples). Both pass the store's checks."""
    from mini_kv import stats
    from mini_kv.store.index import check_attempt

    # hashes and claims checked, as any reader of the store does
    (ra, ha, fa), (rb, hb, fb) = ((c.row, c.header, c.files) for c in map(check_attempt, (a, b)))
    sa, sb = _sources(ha), _sources(hb)
    ea, eb = _flat(fa.get("environment.json") or {}), _flat(fb.get("environment.json") or {})
    ca = {c["id"]: c for c in (fa.get("benchmark.json") or {}).get("cases", [])}
    cb = {c["id"]: c for c in (fb.get("benchmark.json") or {}).get("cases", [])}
    cases = []
    for cid in sorted(set(ca) & set(cb)):
        xa, xb = _samples(ca[cid]), _samples(cb[cid])
        if not xa or not xb:
            continue
        p50a, p50b = stats.summarize(xa).p50, stats.summarize(xb).p50
        cases.append(CaseDiff(cid, p50a, p50b, p50b / p50a, stats.mann_whitney_u(xa, xb)[1]))
    return AttemptDiff(
        str(a),
        str(b),
        {
            k: [getattr(ra, k), getattr(rb, k)]
            for k in ("task_id", "candidate", "status", "stable", "geomean_speedup")
        },
        SourceDiff(
            sorted(set(sb) - set(sa)),
            sorted(set(sa) - set(sb)),
            sorted(p for p in set(sa) & set(sb) if sa[p] != sb[p]),
        ),
        {k: [ea.get(k), eb.get(k)] for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)},
        cases,
    )


def _samples(case: dict) -> list[float]:
    rec = case.get("candidate") or {}
    return [x for rep in rec.get("samples") or [] for x in rep]


def cmd_compare(args) -> int:
    artifacts = artifacts_dir(args)
    diff = compare(_attempt(args.a, artifacts), _attempt(args.b, artifacts))
    if args.json:
        print(json.dumps(to_json(diff), indent=1))
        return ExitCode.OK
    for key, (x, y) in diff.verdict.items():
        console.print(f"{key}: {_cell(x)} -> {_cell(y)}" + ("" if x == y else "  [yellow](changed)[/]"))
    s = diff.sources
    changed = [f"+{p}" for p in s.added] + [f"-{p}" for p in s.removed] + [f"~{p}" for p in s.changed]
    console.print(
        "sources: " + (", ".join(changed) if changed else "identical"), markup=False, soft_wrap=True
    )
    env = diff.environment
    console.print(
        "environment: "
        + ("; ".join(f"{k}: {x} -> {y}" for k, (x, y) in env.items()) if env else "identical"),
        markup=False,
        soft_wrap=True,
    )
    rows = [
        [c.case, f"{c.p50_a_us:.2f}", f"{c.p50_b_us:.2f}", f"{c.ratio:.3f}x", f"{c.p_value:.2g}",
         "yes" if c.p_value < 0.01 else "no"]
        for c in diff.cases
    ]  # fmt: skip
    heads = ["case", "P50 A (us)", "P50 B (us)", "B/A", "p (Mann-Whitney)", "significant (p<0.01)"]
    for t in fitted_tables("latency", [Column(h) for h in heads], rows, console.width, keys=1):
        console.print(t)
    return ExitCode.OK


# --------------------------------------------------------------------------------------------- clean


def protected(artifacts: Path, baselines: Path) -> dict[str, str]:
    """attempt id -> why it is kept whatever the policy: a baseline was promoted from it, or the
    leaderboard ranks it."""
    from mini_kv.leaderboard import build_leaderboard

    keep: dict[str, str] = {}
    for f in sorted(baselines.glob("*.json")) if baselines.is_dir() else []:
        try:
            source = json.loads(f.read_text()).get("source") or {}
        except (OSError, ValueError):
            continue
        if isinstance(source.get("attempt_id"), str):
            keep[source["attempt_id"]] = f"baseline {f}"
    for g in build_leaderboard(artifacts).groups:
        for e in g.entries:
            keep.setdefault(e.attempt_id, f"leaderboard rank {e.rank} of {g.task_id}")
    return keep


def plan_clean(rows: list[AttemptRow], keep_last: int, keep: dict[str, str]) -> list[AttemptRow]:
    """The attempts to remove: all but the newest `keep_last` of each (task, candidate), never one in
    `keep`."""
    by_candidate: dict[tuple, list[AttemptRow]] = {}
    for r in rows:
        by_candidate.setdefault((r.task_id, r.candidate), []).append(r)
    out = []
    for group in by_candidate.values():
        group.sort(key=lambda r: (r.created_at, r.attempt_id), reverse=True)
        out += [r for r in group[keep_last:] if r.attempt_id not in keep]
    return out


def cmd_clean(args) -> int:
    from mini_kv.store.index import read_index, rebuild_index

    artifacts = artifacts_dir(args)
    if args.keep_last < 1:
        raise UserError(f"--keep-last {args.keep_last}: keep at least the newest attempt of each candidate")
    task = task_id_of(args.target, "TARGET") if args.target else None
    rows, _ = read_index(artifacts, "task_id = ?", (task,)) if task else read_index(artifacts)
    baselines = Path(args.baselines) if args.baselines else artifacts.parent / "baselines"
    keep = protected(artifacts, baselines)
    doomed = plan_clean(rows, args.keep_last, keep)
    for r in doomed:
        console.print(f"{'would remove' if args.dry_run else 'remove'} {r.path}", markup=False)
        if not args.dry_run:
            shutil.rmtree(artifacts / r.path)
    kept = [f"{a} ({why})" for a, why in keep.items() if any(r.attempt_id == a for r in rows)]
    if kept:
        err_console.print("kept whatever the policy: " + "; ".join(kept), markup=False, soft_wrap=True)
    if doomed and not args.dry_run:
        rebuild_index(artifacts)
    console.print(
        f"{len(doomed)} attempt(s) {'to remove' if args.dry_run else 'removed'}, {len(rows) - len(doomed)} kept"
    )
    return ExitCode.OK


def register(sub) -> None:
    a = sub.add_parser("attempts", help="list the stored attempts, compare two, or clean old ones")
    verbs = a.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="the attempts of the store (or of one task), newest last")
    ls.add_argument("target", nargs="?", help="a task card, a SOL problem directory or a task id")
    ls.add_argument("--json", action="store_true", help="print the index rows as JSON")
    ls.set_defaults(func=cmd_list)
    cp = verbs.add_parser("compare", help="what changed between two attempts: sources, environment, latency")
    cp.add_argument("a", help="attempt directory or attempt id")
    cp.add_argument("b", help="attempt directory or attempt id")
    cp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cp.set_defaults(func=cmd_compare)
    cl = verbs.add_parser("clean", help="remove old attempts; never a baseline's or a leaderboard row's")
    cl.add_argument("target", nargs="?", help="only this task: a task card, a problem directory or a task id")
    cl.add_argument("--keep-last", type=int, default=5, help="attempts kept per candidate (default 5)")
    cl.add_argument(
        "--baselines", help="directory of baseline files to protect (default: <store>/../baselines)"
    )
    cl.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    cl.set_defaults(func=cmd_clean)
    for p in (ls, cp, cl):
        p.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
