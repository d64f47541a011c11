"""Human-readable output of a verify run: per-case table, benchmark table, summary line."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def case_table(cases: list[dict]) -> Table:
    t = Table(title="correctness", show_lines=False)
    for col in ("case", "kind", "status", "max abs err", "max rel err", "ref err (vs fp64)", "detail"):
        t.add_column(col)
    for r in cases:
        ref = r.get("reference_error") or {}
        detail = r.get("reason") or r.get("raised") or ""
        if r.get("first_mismatch"):
            fm = r["first_mismatch"]
            detail += f" first at {fm['index']}: got {fm['got']:.6g}, expected {fm['expected']:.6g}"
        if r["status"] != "PASS" and r.get("inputs"):
            detail = f"inputs {[(i.get('shape'), i.get('dtype')) for i in r['inputs']]}; " + detail
        style = {"PASS": "green", "SKIPPED": "yellow"}.get(r["status"], "red")
        t.add_row(escape(r["id"]), r["kind"], f"[{style}]{r['status']}[/]", _fmt(r.get("max_abs_err")),
                  _fmt(r.get("max_rel_err")), _fmt(ref.get("max_abs_err")), escape(detail[:160]))
    return t


def bench_table(cases: list[dict]) -> Table:
    t = Table(title="benchmark (times in µs)")
    for col in ("case", "method", "L2", "cand P50", "cand P95", "CV", "ref P50", "speedup", "GB/s",
                "TFLOP/s", "% peak", "stable"):
        t.add_column(col)
    for r in cases:
        if "candidate" not in r:
            t.add_row(r["id"], "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", f"[red]{r.get('status')}[/]")
            continue
        cs, rs = r["candidate"]["summary"], r["reference"]["summary"]
        c, ref = {**cs["overall"], "p50_robust_cv": cs["p50_robust_cv"]}, rs["overall"]
        roof = r.get("roofline") or {}
        share = roof.get("peak_share")
        t.add_row(r["id"], r["method"] + ("*" if r.get("fallbacks") else ""), r["l2"], _fmt(c["p50"], ".2f"),
                  _fmt(c["p95"], ".2f"), f"{c['p50_robust_cv'] * 100:.1f}%", _fmt(ref["p50"], ".2f"),
                  _fmt(r["speedup"], ".3f"), _fmt(roof.get("gbps"), ".1f"), _fmt(roof.get("tflops"), ".2f"),
                  "-" if share is None else f"{share * 100:.0f}%",
                  "yes" if r["stability"]["stable"] else "[red]no[/]")
    return t


def summary_line(summary: dict) -> str:
    corr = summary.get("correctness") or {}
    parts = []
    for group in ("core", "extra", "edge/illegal"):
        c = corr.get("counts", {}).get(group)
        if c:
            parts.append(f"{group} {c['passed']}/{c['total']}" + (f" ({c['skipped']} skipped)" if c["skipped"] else ""))
    if corr.get("invalid_cases"):
        parts.append(f"invalid case params (the card's fault): {', '.join(corr['invalid_cases'])}")
    contract = corr.get("contract", {})
    for name in ("opcheck", "gradcheck"):
        if name in contract:
            parts.append(f"{name} {'1/1' if contract[name] == 'PASS' else '0/1'}")
    bench = summary.get("benchmark") or {}
    if bench.get("ran"):
        gm = bench.get("geomean_speedup")
        parts.append(f"speedup {gm:.3f}x" if gm else "speedup -")
        if bench.get("stable") is not None:
            parts.append("stable" if bench["stable"] else "UNSTABLE")
    if summary.get("regression"):
        parts.append(f"regression {summary['regression']['verdict']}")
    return ", ".join(parts)


def compile_error_excerpt(comp: dict, lines: int = 25) -> str:
    """The compiler's own error lines, not the wrapper's traceback."""
    text = ""
    check = comp.get("cuda_check") or {}
    for c in check.get("checks", []):
        if c.get("returncode"):
            text += c.get("output", "")
    for name in ("stdout.log", "stderr.log"):
        path = (comp.get("logs") or {}).get(name)
        if path:
            try:
                with open(path, errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
    picked = [ln for ln in text.splitlines() if "error" in ln.lower() or "FAILED" in ln]
    return "\n".join((picked or text.splitlines())[-lines:])


def print_verify(result: dict, console: Console | None = None, verbose: bool = False) -> None:
    console = console or Console()
    s = result["summary"]
    comp = result["compile"]
    hit = comp.get("cache_hit")
    console.print(f"compile: {comp['status']} ({'cache hit' if hit else 'built' if hit is False else 'prebuilt'}, "
                  f"{comp.get('duration_s', 0):.2f} s)" + (f"  note: {comp['cuda_note']}" if comp.get("cuda_note") else ""))
    if comp["status"] != "ok":
        console.print(f"[red]compile {comp['status']}[/]:")
        console.print(compile_error_excerpt(comp), markup=False)
    res = result["results"]
    load = res.get("load")
    if load is not None and not load.get("ok"):
        console.print(f"[red]load failed:[/] {escape(str(load.get('reason')))}")
    if res["cases"]:
        failing = [r for r in res["cases"] if r["status"] not in ("PASS", "SKIPPED")]
        console.print(case_table(res["cases"] if verbose or failing else res["cases"]))
    for name, rec in res.get("contract", {}).items():
        console.print(f"{name}: {rec.get('status')}" + (f" ({rec.get('reason')})" if rec.get("reason") else ""),
                      markup=False)
    if s.get("correctness") and s["correctness"].get("missing_kernels"):
        console.print(f"[red]missing kernels:[/] {', '.join(s['correctness']['missing_kernels'])}")
    if res.get("bench"):
        console.print(bench_table(res["bench"]))
        for r in res["bench"]:
            if "candidate" in r and not r["stability"]["stable"]:
                console.print(f"  {r['id']} unstable: {'; '.join(r['stability']['reasons'])}", markup=False)
            for fb in r.get("fallbacks") or []:
                console.print(f"  {r['id']} method {r['method']}*: {fb['method']} not used: {fb['reason']}", markup=False)
            if r.get("status") and r.get("reason"):
                console.print(f"  {r['id']} {r['status']}: {r['reason']}", markup=False)
    for inc in res.get("incidents", []):
        console.print(f"[yellow]incident:[/] {escape(str(inc))}")
    if result.get("regression"):
        print_regression(result["regression"], console)
    console.print(f"[bold]{s['status']}[/] {escape(str(result.get('candidate', '')))}: {escape(summary_line(s))}")
    console.print(f"attempt: {result['attempt']}", markup=False)
    if result.get("index_warning"):
        console.print(f"[yellow]index not updated:[/] {escape(str(result['index_warning']))} (run `mini-kv rebuild-index`)")


def _batch(b: dict | None) -> str:
    if not b:
        return "-"
    return f"p={b['p_value']:.2g}, {'significant' if b['significant'] else 'not significant'}"


def print_regression(reg: dict, console: Console) -> None:
    """The verdict against the baseline, one row per case, with both batches when a slowdown was seen."""
    style = {"PASS": "green", "WARN": "yellow", "INCOMPARABLE": "yellow"}.get(reg["verdict"], "red")
    base = (reg.get("baseline_file") or {}).get("path", "baseline")
    console.print(f"regression vs {base}: [{style}]{reg['verdict']}[/]")
    cases = [c for c in reg.get("cases", []) if "p50_ratio" in c]
    if cases:
        t = Table(title="regression (times in µs)")
        for col in ("case", "verdict", "base P50", "cand P50", "P50 Δ", "P95 Δ", "first batch", "confirmation"):
            t.add_column(col)
        for c in cases:
            conf = c.get("confirmation") or {}
            conf_p50 = ((conf.get("summary") or {}).get("overall") or {}).get("p50")
            t.add_row(c["id"], c["verdict"], _fmt(c["baseline"]["p50"], ".2f"), _fmt(c["candidate"]["p50"], ".2f"),
                      f"{(c['p50_ratio'] - 1) * 100:+.1f}%", f"{(c['p95_ratio'] - 1) * 100:+.1f}%",
                      _batch(c.get("first_batch")),
                      _batch(conf.get("test")) + (f", P50 {conf_p50:.2f}" if conf_p50 else ""))
        console.print(t)
    for reason in reg.get("reasons", []):
        console.print(f"  {reason}", markup=False)
