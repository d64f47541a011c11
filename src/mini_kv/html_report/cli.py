"""The `report` command. `register(sub)` adds it to the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mini_kv.cli_common import artifacts_dir, console, err_console
from mini_kv.errors import ConfigError, ExitCode


def _task_id(spec: str, flag: str) -> str:
    """A task id, or the id inside a task card (`tasks/x.yaml`) or SOL problem directory (its definition name)."""
    p = Path(spec)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            card = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(str(p), flag, f"unreadable task card ({exc})") from None
        if not isinstance(card, dict) or not isinstance(card.get("id"), str):
            raise ConfigError(str(p), f"{flag}: id", "a task card with a string `id`")
        return card["id"]
    if p.is_dir() and (p / "definition.json").is_file():
        try:
            name = json.loads((p / "definition.json").read_text()).get("name")
        except (OSError, ValueError, AttributeError) as exc:
            raise ConfigError(str(p / "definition.json"), flag, f"unreadable definition ({exc})") from None
        if not isinstance(name, str):
            raise ConfigError(str(p / "definition.json"), "name", "a string: the problem's name")
        # the task id `bench` stores a problem under: its name made directory-safe
        return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "unnamed"
    return spec


def _artifacts(args) -> Path:
    if args.attempt and not args.artifacts:  # an attempt lives in <artifacts>/<task>/<attempt_id>
        return Path(args.attempt[0]).resolve().parent.parent
    return artifacts_dir(args)


def cmd_report(args) -> int:
    from mini_kv.html_report.build import ReportOptions, build_report

    tasks = tuple(
        dict.fromkeys(
            [_task_id(t, "--task") for t in args.task or []]
            + [_task_id(p, "--problem") for p in args.problem or []]
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
    r.add_argument("--task", action="append", help="task id or task card (repeatable; default: every task)")
    r.add_argument("--problem", action="append", help="SOL problem name or directory (repeatable)")
    r.add_argument(
        "--attempt", action="append", metavar="DIR", help="only this attempt directory (repeatable)"
    )
    r.add_argument("-o", "--output", default="report.html", help="HTML file to write (default: report.html)")
    r.add_argument("--png", metavar="DIR", help="also write every chart as a PNG into DIR")
    r.add_argument("--artifacts", help="artifact store (default: <project>/artifacts)")
    r.set_defaults(func=cmd_report)
