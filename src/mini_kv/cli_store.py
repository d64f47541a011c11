"""Store commands: promote-baseline, rebuild-index, leaderboard. `register(sub)` adds them to the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from mini_kv.cli_common import artifacts_dir, console, err_console, task_id_of
from mini_kv.codec import to_json
from mini_kv.errors import ExitCode, UserError


def print_problems(problems, err_console) -> None:
    from rich.markup import escape

    for p in problems:
        label = (
            "[red]skipped (TAMPERED)[/]" if p.kind == "tampered" else f"[yellow]skipped[/] ({escape(p.kind)})"
        )
        err_console.print(f"{label} {escape(p.path)}: {escape(p.message)}", soft_wrap=True)


def cmd_promote_baseline(args) -> int:
    from mini_kv.judge.regression import default_baseline_output, promoted_baseline_use
    from mini_kv.load.task_card import find_project_root
    from mini_kv.store.baseline import promote_baseline

    attempt, root = Path(args.attempt), find_project_root(Path.cwd())
    # default: the card's declared baseline path, else baselines/<task>.json (a SOL problem: always), under the project
    output = Path(args.output) if args.output else default_baseline_output(attempt, root)
    base = promote_baseline(attempt, output, force=args.force)
    console.print(
        f"baseline {output}: {base.task_id} {base.task_version}, candidate "
        f"{base.source.candidate}, {len(base.cases)} bench case(s), from attempt {base.source.attempt_id}"
    )
    used, note = promoted_baseline_use(attempt, output, root)
    console.print(note if used else f"[yellow]note:[/] {note}", soft_wrap=True)
    return ExitCode.OK


def cmd_rebuild_index(args) -> int:
    from mini_kv.cli_checks import check_store_writable
    from mini_kv.store.index import rebuild_index

    check_store_writable(artifacts_dir(args))  # rebuilding writes the index and takes its lock
    result = rebuild_index(artifacts_dir(args))
    if args.json:
        print(
            json.dumps(
                {
                    "index": str(result.index),
                    "attempts": result.attempts,
                    "problems": to_json(result.problems),
                },
                indent=2,
            )
        )
    else:
        print_problems(result.problems, err_console)
        console.print(f"index {result.index}: {result.attempts} attempt(s), {len(result.problems)} skipped")
    return ExitCode.OK


def _known_tasks(artifacts: Path) -> list[str]:
    """Task ids that have any attempt in the index, valid or not."""
    from mini_kv.store.index import read_index

    rows, _ = read_index(artifacts)
    return sorted({r.task_id for r in rows})


def _check_leaderboard_args(args, artifacts: Path) -> None:
    """A read-only store can be read, not rebuilt; the export files must be writable. All before anything is read or written."""
    from mini_kv.cli_checks import store_write_problem
    from mini_kv.store.index import index_path, store_read_only

    if not artifacts.is_dir():
        raise UserError(f"artifact store {artifacts}: no such directory (pass --artifacts DIR)")
    if store_read_only(artifacts) and (args.rebuild or not index_path(artifacts).exists()):
        why = "--rebuild was asked for" if args.rebuild else "it has no index yet"
        raise UserError(
            f"leaderboard: the artifact store {artifacts} is read-only and {why}; the index "
            "cannot be (re)built there. Run `mini-kv rebuild-index` where the store is writable, "
            "or leave out --rebuild to read the existing index"
        )
    for option in ("json", "csv"):
        target = getattr(args, option)
        problem = target and store_write_problem(Path(target).parent)
        if problem:
            raise UserError(f"--{option} {target}: cannot write there: {problem}")


def cmd_leaderboard(args) -> int:
    from mini_kv import leaderboard as lb
    from mini_kv.store.index import store_read_only

    artifacts = artifacts_dir(args)
    if args.target and args.task:
        raise UserError(f"leaderboard: give the task once, as TARGET ({args.target}) or --task ({args.task})")
    if args.target or args.task:  # a task card or problem directory names its task, as verify/bench took it
        args.task = task_id_of(args.target or args.task, "TARGET" if args.target else "--task")
    _check_leaderboard_args(args, artifacts)
    if store_read_only(artifacts):
        err_console.print(
            f"note: the artifact store {artifacts} is read-only: reading its existing index "
            "without the lock (nothing is rebuilt)",
            markup=False,
            soft_wrap=True,
        )
    board = lb.build_leaderboard(
        artifacts, task=args.task, rebuild=args.rebuild, require_signed=args.require_signed
    )
    print_problems(board.problems, err_console)
    known = _known_tasks(artifacts) if args.task and not board.groups else []
    if args.task and not board.groups and args.task not in known:
        raise UserError(
            f"--task {args.task}: no attempt of this task in {artifacts}; tasks with attempts: "
            + (", ".join(known) or "none")
        )
    if args.json:
        lb.export_json(board, Path(args.json))
    if args.csv:
        lb.export_csv(board, Path(args.csv))
    tables = lb.rich_tables(board, console.width)
    for t in tables:
        console.print(t)
    if not tables:
        console.print(lb.why_nothing_ranked(artifacts, board), markup=False, soft_wrap=True)
    return ExitCode.OK


def register(sub) -> None:
    """Add the store subcommands to `sub` (the argparse subparsers of cli.build_parser)."""
    pb = sub.add_parser(
        "promote-baseline",
        help="make a complete, PASSED, stable attempt (task card or SOL problem) its regression baseline",
    )
    pb.add_argument("--attempt", required=True, help="attempt directory artifacts/<task>/<attempt_id>")
    pb.add_argument(
        "--output",
        help="baseline file (default: the card's `baseline`, else baselines/<task or definition>.json)",
    )
    pb.add_argument("--force", action="store_true", help="replace an existing baseline file")
    pb.set_defaults(func=cmd_promote_baseline)

    ri = sub.add_parser("rebuild-index", help="rebuild artifacts/index.sqlite from the attempt directories")
    ri.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    ri.add_argument("--json", action="store_true", help="print the result as JSON")
    ri.set_defaults(func=cmd_rebuild_index)

    lbp = sub.add_parser("leaderboard", help="rank the latest correct, stable attempt of each candidate")
    lbp.add_argument(
        "target", nargs="?", help="only this task: a task card, a SOL problem directory or a task id"
    )
    lbp.add_argument("--task", help="the same as TARGET")
    lbp.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    lbp.add_argument("--json", metavar="FILE", help="also write the leaderboard as JSON")
    lbp.add_argument("--csv", metavar="FILE", help="also write the leaderboard as CSV")
    lbp.add_argument("--rebuild", action="store_true", help="rebuild the index first")
    lbp.add_argument(
        "--require-signed",
        action="store_true",
        help="rank only attempts signed with the operator's key (MINI_KV_SIGNING_KEY or "
        "MINI_KV_SIGNING_KEY_FILE; docs/store.md, Signatures)",
    )
    lbp.set_defaults(func=cmd_leaderboard)
