"""Does the pipelined batch change timings? The shipped solutions' P50s alone against inside a busy batch.

    python benchmarks/pipeline_p50.py [--device cuda] [--load DIR] [--load-count N] [--only TEXT] [--json OUT]

Three runs of every shipped solution (solutions/<problem>/<language>/) through the batch evaluator
(`mini_kv.cli_batch.run_items`, the engine of `batch`, `bench` with several solutions and the API):
  alone A and alone B: each solution in a batch of its own, one after the other (nothing else running);
  pipelined: all of them in one batch among `--load-count` solutions of a labelled corpus (`--load`,
  benchmarks/make_corpus.py; their C++ builds are cold, so builds and correctness checks run beside
  the shipped solutions' timing, as in a generation loop's batch).
Per workload, the candidate's P50 (benchmark.json) of the pipelined run and of alone B, each against
alone A: B/A is the run-to-run noise, pipelined/A what the pipeline adds. The bar (issue: "the shipped
solutions' P50s within 1% of a run with nothing else on the GPU"): the median over workloads of
|pipelined/A - 1| within 1%, and no workload further from A than 1% or its own noise (|B/A - 1|), the
larger. Exit 0 when it holds. SM clocks (benchmark.json's `clocks`) are summarised per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
TOL = 0.01


def shipped() -> list[tuple[str, Path, Path]]:
    """(name, problem dir, solution.json) of every shipped solution."""
    out = []
    for sol in sorted((ROOT / "solutions").glob("*/*/solution.json")):
        problem = ROOT / "problems" / "sol-execbench" / sol.parent.parent.name
        out.append((f"{sol.parent.parent.name}/{sol.parent.name}", problem, sol))
    if not out:
        raise SystemExit("no shipped solutions under solutions/ (an empty selection is an error)")
    return out


def run(entries, device: str, store: Path, options) -> dict[str, str]:
    """{label: attempt dir} of one batch of (name, problem dir, solution.json); `options(name)`: its options."""
    from throughput import bench_item, run_items_here

    items = [bench_item(name, problem, sol, device, options(name), store) for name, problem, sol in entries]
    return {r.label: r.attempt for r in run_items_here(items)}


def p50s(attempt: str | None) -> tuple[dict[str, float], list[dict]]:
    """({workload: candidate P50 in us}, the timed cases' clocks) of one stored attempt."""
    if not attempt:
        return {}, []
    data = json.loads((Path(attempt) / "benchmark.json").read_text())
    out, clk = {}, []
    for case in data.get("cases", []):
        cand = case.get("candidate") or {}
        p50 = ((cand.get("summary") or {}).get("overall") or {}).get("p50")
        if p50:
            out[case["id"]] = p50
        if case.get("clocks"):
            clk.append(case["clocks"])
    return out, clk


def clock_summary(clks: list[dict]) -> dict:
    if not clks:
        return {"cases": 0}
    return {
        "cases": len(clks),
        "sm_mhz_min": min(c["sm_mhz_min"] for c in clks),
        "sm_mhz_max": max(c["sm_mhz_max"] for c in clks),
        "throttled_cases": sum(bool(c["throttled"]) for c in clks),
        "reasons": sorted({r for c in clks for r in c["reasons"]}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--load", type=Path, help="a corpus dir (benchmarks/make_corpus.py) for the busy batch")
    ap.add_argument("--load-count", type=int, default=16)
    ap.add_argument("--only", help="only the shipped solutions whose name holds this text")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    entries = [e for e in shipped() if args.only is None or args.only in e[0]]
    if not entries:
        raise SystemExit(f"no shipped solution matches --only {args.only!r}")
    options = {"timeout": 300.0}
    load, load_options = [], {}
    if args.load is not None:
        from throughput import load_corpus, stratified

        data, corpus = load_corpus(args.load)
        corpus = [e for e in corpus if e.kind != "hang"]  # a hang only waits: it adds no load
        load = [(f"load:{e.name}", e.problem, e.solution) for e in stratified(corpus, args.load_count)]
        load_options = (
            data.get("options") or {}
        )  # the corpus's short timeouts: its hangs and slow ones stay cheap
    store = Path(tempfile.mkdtemp(prefix="mini-kv-p50-"))
    runs: dict[str, dict[str, str]] = {}
    took = {}
    for label in ("alone_a", "alone_b"):
        t0 = time.perf_counter()
        runs[label] = {}
        for e in entries:
            runs[label].update(run([e], args.device, store / label, lambda name: options))
        took[label] = round(time.perf_counter() - t0, 1)
    # the shipped solutions spread among the load, so that their timings overlap its builds and checks
    mixed, step = [], max(1, len(load) // max(1, len(entries)))
    for i, e in enumerate(entries):
        mixed += [*load[i * step : (i + 1) * step], e]
    mixed += load[len(entries) * step :]
    t0 = time.perf_counter()
    runs["pipelined"] = run(
        mixed,
        args.device,
        store / "pipelined",
        lambda name: load_options if name.startswith("load:") else options,
    )
    took["pipelined"] = round(time.perf_counter() - t0, 1)

    rows, clocks = [], {}
    for label in runs:
        clocks[label] = clock_summary([c for name, *_ in entries for c in p50s(runs[label].get(name))[1]])
    for name, *_ in entries:
        a, b, p = (p50s(runs[k].get(name))[0] for k in ("alone_a", "alone_b", "pipelined"))
        for w in sorted(set(a) & set(b) & set(p)):
            noise, added = b[w] / a[w] - 1, p[w] / a[w] - 1
            rows.append(
                {"solution": name, "workload": w, "alone_us": a[w], "noise": noise, "pipelined": added}
            )
    if not rows:
        print("no workload was timed in all three runs", file=sys.stderr)
        return 1
    median_added = statistics.median(abs(r["pipelined"]) for r in rows)
    outliers = [r for r in rows if abs(r["pipelined"]) > max(TOL, abs(r["noise"]))]
    ok = median_added <= TOL and not outliers
    for r in rows:
        print(
            f"{r['solution']:28} {r['workload'][:12]:12} alone {r['alone_us']:10.2f} us  "
            f"B/A {r['noise']:+7.2%}  pipelined/A {r['pipelined']:+7.2%}"
        )
    print(
        f"{len(rows)} workloads of {len(entries)} solutions; load {len(load)} solutions; median |pipelined/A-1| "
        f"{median_added:.2%} (bar {TOL:.0%}), median |B/A-1| {statistics.median(abs(r['noise']) for r in rows):.2%}; "
        f"{len(outliers)} workload(s) outside max(1%, own noise); runs took {took} s; clocks {clocks}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "median_added": median_added,
                    "outliers": outliers,
                    "took_s": took,
                    "clocks": clocks,
                    "ok": ok,
                    "device": args.device,
                    "load": len(load),
                },
                indent=1,
            )  # fmt: skip
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
