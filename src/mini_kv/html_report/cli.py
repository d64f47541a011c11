"""The `report` command. `register(sub)` adds it to the CLI."""

from __future__ import annotations

from pathlib import Path

from mini_kv.cli_common import artifacts_dir, console, err_console, task_id_of
from mini_kv.errors import ExitCode


def _artifacts(args) -> Path:
    if args.attempt and not args.artifacts:  # an attempt lives in <artifacts>/<task>/<attempt_id>
        return Path(args.attempt[0]).resolve().parent.parent
    return artifacts_dir(args)


def cmd_report(args) -> int:
    from mini_kv.html_report.build import ReportOptions, build_report

    tasks = tuple(
        dict.fromkeys(
            [task_id_of(t, "TARGET") for t in args.target or []]
            + [task_id_of(t, "--task") for t in args.task or []]
            + [task_id_of(p, "--problem") for p in args.problem or []]
        )
    )
    opts = ReportOptions(
        artifacts=_artifacts(args),
        output=Path(args.output),
        tasks=tasks,
        attempts=tuple(Path(a) for a in args.attempt or []),
        png_dir=Path(args.png) if args.png else None,
    )
    res = build_report(opts)
    for s in res.skipped:
        err_console.print(f"[yellow]skipped[/] {s.path}: {s.reason}", soft_wrap=True, markup=True)
    console.print(
        f"report {res.output}: {res.attempts} attempt(s), {res.charts} chart(s), "
        f"{res.size / 1024:,.0f} KiB, {len(res.skipped)} skipped, {res.seconds:.1f} s"
        + (f"; {len(res.pngs)} PNG(s) in {opts.png_dir}" if opts.png_dir else "")
    )
    return ExitCode.OK


def register(sub) -> None:
    r = sub.add_parser("report", help="one self-contained HTML page with plots of the stored attempts")
    r.add_argument(
        "target",
        nargs="*",
        help="what `verify`/`bench` was given: a task card, a SOL problem directory, or a task id",
    )
    r.add_argument("--task", action="append", help="task id or task card (repeatable; default: every task)")
    r.add_argument("--problem", action="append", help="SOL problem name or directory (repeatable)")
    r.add_argument(
        "--attempt", action="append", metavar="DIR", help="only this attempt directory (repeatable)"
    )
    r.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    r.add_argument("--png", metavar="DIR", help="also write every chart as a PNG into DIR")
    r.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    r.set_defaults(func=cmd_report)
