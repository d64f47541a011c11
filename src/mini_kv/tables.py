"""Tables that stay readable in a narrow console: ids and numbers are never cut.

rich squeezes a table that is too wide by shrinking every column, so `n31-float16` becomes `n31-floa…`
and `12.34` becomes `12.…`. Here every column is exactly as wide as its widest cell (headers may wrap
at spaces), and when the columns do not fit the width they are split over several tables, each
repeating the key columns (the case id) so every row can still be read across.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from mini_kv.settings import RunSettings

# per column: one space of padding each side and one vertical rule; plus the table's left edge
COLUMN_OVERHEAD = 3
EDGE = 1


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    style: str | None = None


def num(x: float | None, spec: str = ".3g", none: str = "-") -> str:
    """A number as a table cell shows it; `none` where there is none."""
    return none if x is None else format(x, spec)


def _cell_width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.splitlines()), default=0)


def _widths(columns: list[Column], rows: list[list[str]], whole_headers: bool) -> list[int]:
    """Each column as wide as its widest cell and its header (`whole_headers`) or the header's
    longest word (the header then wraps at spaces)."""
    out = []
    for i, col in enumerate(columns):
        header = len(col.header) if whole_headers else max((len(w) for w in col.header.split()), default=1)
        out.append(max([header, *(_cell_width(r[i]) for r in rows)]))
    return out


def _table_width(widths: list[int]) -> int:
    return EDGE + sum(w + COLUMN_OVERHEAD for w in widths)


def _groups(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """Column indices per table: the key columns first in each, then as many others as fit."""
    base = _table_width(widths[:keys])
    groups: list[list[int]] = []
    current: list[int] = []
    used = base
    for i in range(keys, len(widths)):
        need = widths[i] + COLUMN_OVERHEAD
        if current and used + need > width:
            groups.append(current)
            current, used = [], base
        current.append(i)
        used += need
    if current or not groups:
        groups.append(current)
    return [list(range(keys)) + g for g in groups]


def fitted_tables(
    title: str, columns: list[Column], rows: list[list[str]], width: int, keys: int = 1, **table_options
) -> list[Table]:
    """One table when it fits `width`, else several with the first `keys` columns repeated."""
    widths = _widths(columns, rows, whole_headers=True)
    if _table_width(widths) > width:  # narrow: headers wrap before anything is split
        widths = _widths(columns, rows, whole_headers=False)
    groups = _groups(widths, keys, width)
    tables = []
    for n, group in enumerate(groups, start=1):
        t = Table(title=title if len(groups) == 1 else f"{title} ({n}/{len(groups)})", **table_options)
        for i in group:
            col = columns[i]
            t.add_column(col.header, justify=col.justify, style=col.style, width=widths[i], overflow="fold")
        for r in rows:
            t.add_row(*(r[i] for i in group))
        tables.append(t)
    return tables


def verbose_details(settings: RunSettings | None, comp, phases: dict, duration_s) -> list[str]:
    """What `-v` adds on every command (verify, bench, batch): the timing settings, the build (`comp`, a
    compile.compiler.CompileRecord, None: nothing built), and where
    the time went. Rich markup; the time line is one line whatever the width (scripts grep it)."""
    keys = ("rounds", "warmup", "repeats", "samples", "target_rel_ci", "budget_s", "method", "l2", "max_cv")
    shown = ", ".join(f"{k} {getattr(settings, k)}" for k in keys if getattr(settings, k, None) is not None)
    out = [f"[dim]settings: {shown}[/]"]
    if comp:
        note = " (compile check only)" if comp.check_only else ""
        out.append(
            f"[dim]build {comp.status}{note}: cache hit {comp.cache_hit}, "
            f"{comp.duration_s} s, {comp.build_dir or comp.key}[/]"
        )
    if phases:
        total = (
            duration_s
            if duration_s is not None
            else max(v for k, v in phases.items() if not k.startswith("workload_"))
        )
        # cumulative marks since the start; the worker's own split of the evaluation in parentheses
        marks = ", ".join(
            f"{k[:-2].replace('_', ' ')} {v:.2f}" for k, v in phases.items() if not k.startswith("workload_")
        )
        inner = ", ".join(
            f"{k[9:-2].replace('_', ' ')} {v:.2f}" for k, v in phases.items() if k.startswith("workload_")
        )
        out.append(
            f"[dim]time (s since start): {marks}; total {total}"
            + (f" (in the worker, summed over workloads: {inner})" if inner else "")
            + "[/]"
        )
    return out
