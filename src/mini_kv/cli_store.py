"""Store commands: promote-baseline, rebuild-index, leaderboard. `register(sub)` adds them to the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from mini_kv.errors import ExitCode


def _consoles():
    from mini_kv.cli import console, err_console  # imported late: cli imports this module

    return console, err_console


def _artifacts(args) -> Path:
    if args.artifacts:
        return Path(args.artifacts)
    from mini_kv.load.task_card import find_project_root

    return find_project_root(Path.cwd()) / "artifacts"


def print_problems(problems, err_console) -> None:
    for p in problems:
        d = p if isinstance(p, dict) else p.to_dict()
        err_console.print(f"[yellow]skipped[/] ({d['kind']}) {d['path']}: {d['message']}", soft_wrap=True)


def cmd_promote_baseline(args) -> int:
    from mini_kv.judge.regression import promote_baseline, promoted_baseline_use
    from mini_kv.load.task_card import find_project_root
    from mini_kv.store.attempts import AttemptInvalid, read_attempt

    console, _ = _consoles()
    attempt = Path(args.attempt)
    output = Path(args.output) if args.output else None
    if output is None:
        # the card's declared baseline path, else baselines/<task>.json, under the project root
        try:
            header = read_attempt(attempt)
            card = json.loads((attempt / "task_card.json").read_text()).get("card", {})
        except (AttemptInvalid, OSError, ValueError):
            header, card = {}, {}
        rel = card.get("baseline") or f"baselines/{header.get('task_id', 'unknown')}.json"
        output = find_project_root(Path.cwd()) / rel
    base = promote_baseline(attempt, output, force=args.force)
    console.print(f"baseline {output}: {base['task_id']} {base['task_version']}, candidate "
                  f"{base['source']['candidate']}, {len(base['cases'])} bench case(s), from attempt "
                  f"{base['source']['attempt_id']}")
    used, note = promoted_baseline_use(attempt, output, find_project_root(Path.cwd()))
    console.print(note if used else f"[yellow]note:[/] {note}", soft_wrap=True)
    return ExitCode.OK


def cmd_rebuild_index(args) -> int:
    from mini_kv.store.index import rebuild_index

    console, err_console = _consoles()
    result = rebuild_index(_artifacts(args))
    if args.json:
        print(json.dumps({"index": str(result.index), "attempts": result.attempts,
                          "problems": [p.to_dict() for p in result.problems]}, indent=2))
    else:
        print_problems(result.problems, err_console)
        console.print(f"index {result.index}: {result.attempts} attempt(s), {len(result.problems)} skipped")
    return ExitCode.OK


def cmd_leaderboard(args) -> int:
    from mini_kv.judge import leaderboard as lb

    console, err_console = _consoles()
    board = lb.build_leaderboard(_artifacts(args), task=args.task, rebuild=args.rebuild)
    print_problems(board["problems"], err_console)
    if args.json:
        lb.export_json(board, Path(args.json))
    if args.csv:
        lb.export_csv(board, Path(args.csv))
    tables = lb.rich_tables(board)
    for t in tables:
        console.print(t)
    if not tables:
        console.print("no complete, correct and stable attempts" + (f" for task {args.task}" if args.task else ""))
    return ExitCode.OK


def register(sub) -> None:
    """Add the store subcommands to `sub` (the argparse subparsers of cli.build_parser)."""
    pb = sub.add_parser("promote-baseline",
                        help="make a complete, PASSED, stable attempt the task's regression baseline")
    pb.add_argument("--attempt", required=True, help="attempt directory artifacts/<task>/<attempt_id>")
    pb.add_argument("--output", help="baseline file (default: the card's `baseline`, else baselines/<task>.json)")
    pb.add_argument("--force", action="store_true", help="replace an existing baseline file")
    pb.set_defaults(func=cmd_promote_baseline)

    ri = sub.add_parser("rebuild-index", help="rebuild artifacts/index.sqlite from the attempt directories")
    ri.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    ri.add_argument("--json", action="store_true", help="print the result as JSON")
    ri.set_defaults(func=cmd_rebuild_index)

    lbp = sub.add_parser("leaderboard", help="rank the latest correct, stable attempt of each candidate")
    lbp.add_argument("--task", help="only this task id")
    lbp.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    lbp.add_argument("--json", metavar="FILE", help="also write the leaderboard as JSON")
    lbp.add_argument("--csv", metavar="FILE", help="also write the leaderboard as CSV")
    lbp.add_argument("--rebuild", action="store_true", help="rebuild the index first")
    lbp.set_defaults(func=cmd_leaderboard)
