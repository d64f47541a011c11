"""`verify`: loader -> compiler -> worker child (load, correctness, contract, benchmark) -> verdict -> attempt."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from mini_kv import environment
from mini_kv.build.compiler import compile_candidate
from mini_kv.errors import ExitCode
from mini_kv.model import Candidate, TaskCard
from mini_kv.runner import run_worker
from mini_kv.store.attempts import AttemptWriter
from mini_kv.worker import bandwidth


@dataclass
class VerifyOptions:
    device: str | None = None  # None: cuda if available else cpu
    skip_benchmark: bool = False
    method: str | None = None
    l2: str | None = None
    compile_timeout: float | None = None
    timeout: float | None = None  # per case
    prebuilt: str | None = None
    seed_salt: str | None = None
    artifacts: str | None = None
    case_filter: list[str] = field(default_factory=list)
    bench_all: bool = False
    gpu: int | None = None  # physical GPU this run is pinned to (CUDA_VISIBLE_DEVICES); see --gpus
    memory_limit_gb: float | None = None  # CPU worker address-space cap; None: half the machine
    max_cv: float | None = None  # stability gate overrides (fractions); None: the card's
    max_p95_cv: float | None = None
    env_tag: str | None = None  # see environment.collect


def pick_device(requested: str | None) -> str:
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            from mini_kv.errors import UserError
            raise UserError(f"--device {requested}: this torch ({torch.__version__}) sees no CUDA device")
        return "cuda:0" if requested == "cuda" else requested
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def benchmark_settings(card: TaskCard, opts: VerifyOptions) -> dict:
    """The card's benchmark section with the command line's overrides."""
    settings = dict(card.benchmark)
    for key in ("method", "l2", "max_cv", "max_p95_cv"):
        if getattr(opts, key) is not None:
            settings[key] = getattr(opts, key)
    return settings


def check_benchmark_options(card: TaskCard, opts: VerifyOptions, device: str) -> None:
    """Reject timing options that cannot run on `device` before anything is compiled (exit CONFIG)."""
    import math

    from mini_kv.errors import UserError
    from mini_kv.worker.timing import check_options

    if opts.skip_benchmark:
        return
    settings = benchmark_settings(card, opts)

    def where(key: str) -> str:
        return f"--{key.replace('_', '-')}" if getattr(opts, key) is not None else f"{card.path}: benchmark.{key}"

    for key, method, l2 in (("method", settings["method"], "hot"), ("l2", "auto", settings["l2"])):
        try:
            check_options(method, l2, device)
        except ValueError as exc:
            raise UserError(f"{where(key)}: {exc}") from None
    for key in ("max_cv", "max_p95_cv"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise UserError(f"{where(key)}: must be a positive fraction (0.03 = 3%), got {value!r}")


def _progress(job: dict, cand_id: str, say):
    """Turn the worker's `begin` events into 'stage i/n: case' messages plus overall done/total counts."""
    totals = {"correctness": len(job["cases"]), "contract": len(job.get("contract", [])),
              "benchmark": len(job.get("bench_cases", []))}
    seen = dict.fromkeys(totals, 0)

    def on_event(ev: dict) -> None:
        stage = ev.get("stage")
        if ev.get("event") == "begin" and stage in totals:
            seen[stage] = min(seen[stage] + 1, totals[stage])
            say(f"{cand_id}: {stage} {seen[stage]}/{totals[stage]}: {ev.get('case')}",
                completed=sum(seen.values()) - 1, total=sum(totals.values()))
    return on_event


def _job(card: TaskCard, cand: Candidate, library: str, device: str, opts: VerifyOptions, salt: str,
         peak_bw: float | None = None) -> dict:
    cases = [c.to_dict() for c in card.cases if c.kind != "bench" and c.runs_on(device)]
    if opts.case_filter:
        cases = [c for c in cases if c["id"] in opts.case_filter or c["base_id"] in opts.case_filter]
    bench_kinds = {"bench", "core"} if (opts.bench_all or card.benchmark.get("cases") == "all") else {"bench"}
    bench = [] if opts.skip_benchmark else [c.to_dict() for c in card.cases if c.kind in bench_kinds and c.runs_on(device)]
    if opts.case_filter:
        bench = [c for c in bench if c["id"] in opts.case_filter or c["base_id"] in opts.case_filter]
    settings = benchmark_settings(card, opts)
    return {
        "task_id": card.id, "op": cand.op, "library": library, "device": device, "salt": salt,
        "reference": card.operator["reference"], "inputs": card.operator["inputs"],
        "tolerances": card.tolerances, "cases": cases, "all_cases": [c.to_dict() for c in card.cases],
        "bench_cases": bench, "benchmark": settings,
        "contract": ["opcheck"] + (["gradcheck"] if cand.backward else []),
        "backward": cand.backward,
        "exprs": {k: card.operator[k] for k in ("bytes", "flops") if k in card.operator},
        "peak_bw": peak_bw,
        # files of the suite the parent watches while the worker runs (with the mini_kv package)
        "watch_paths": _watch_paths(card),
        "memory_limit_bytes": int(opts.memory_limit_gb * 2**30) if opts.memory_limit_gb else _cpu_memory_limit(),
    }


def _watch_paths(card: TaskCard) -> list[str]:
    """The card and the files of its reference and input factory."""
    import importlib.util

    paths = [str(Path(card.project_root) / card.path)]
    for spec in {card.operator["reference"], card.operator["inputs"]}:
        try:
            found = importlib.util.find_spec(spec.partition(":")[0])
        except (ImportError, ValueError):
            continue
        if found is not None and found.origin:
            paths.append(found.origin)
    return sorted(set(paths))


def _confirmation_batch(job: dict, opts: VerifyOptions, card: TaskCard, child_env: dict | None):
    """An independent re-measurement of one bench case, in a fresh worker with fresh inputs,
    for the regression gate: a slowdown counts only if this batch shows it too."""
    def confirm(case_id: str) -> list:
        case = next(c for c in job["bench_cases"] if c["id"] == case_id)
        rerun = {**job, "cases": [], "contract": [], "bench_cases": [case], "salt": secrets.token_hex(16)}
        res = run_worker(rerun, case_timeout=opts.timeout or card.timeouts["case_s"],
                         stage_timeout=card.timeouts["stage_s"], env=child_env)
        rec = next((r for r in res["bench"] if r.get("id") == case_id and "candidate" in r), None)
        if rec is None:
            raise RuntimeError(f"confirmation batch for {case_id} produced no timing")
        return rec["candidate"]["samples"]
    return confirm


def _cpu_memory_limit() -> int:
    """Address-space cap for a CPU worker: half the machine, so a runaway op fails alone."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


def summarize_correctness(results: dict, cand: Candidate, device: str) -> dict:
    counts: dict[str, dict[str, int]] = {}
    for rec in results["cases"]:
        group = {"core": "core", "extra": "extra", "edge": "edge/illegal", "illegal": "edge/illegal"}[rec["kind"]]
        c = counts.setdefault(group, {"passed": 0, "total": 0, "skipped": 0})
        if rec["status"] == "SKIPPED":
            c["skipped"] += 1
            continue
        c["total"] += 1
        c["passed"] += rec["status"] == "PASS"
    load = results["load"] or {"ok": False}
    kernels = load.get("kernels", {})
    needed = ["CPU", "Meta"] + (["CUDA"] if device.startswith("cuda") else [])
    missing = [k for k in needed if not kernels.get(k)]
    contract = results["contract"]
    contract_ok = all(r.get("status") == "PASS" for r in contract.values())
    # reason codes of the defences (mini_kv.worker.integrity), wherever they fired
    integrity = [r["integrity"] for r in [*results["incidents"], load, *results["cases"], *contract.values()]
                 if r.get("integrity")]
    cases_ok = all(r["status"] in ("PASS", "SKIPPED") for r in results["cases"])
    ok = bool(load.get("ok")) and cases_ok and contract_ok and not missing and not integrity
    invalid = [r["id"] for r in results["cases"] if r["status"] == "INVALID_CASE"]
    return {"ok": ok, "counts": counts, "kernels": kernels, "missing_kernels": missing, "invalid_cases": invalid,
            "integrity_failures": integrity,
            "contract": {k: v.get("status") for k, v in contract.items()}}


def summarize_benchmark(results: dict, skipped: bool) -> dict:
    from mini_kv.judge import stats

    if skipped:
        return {"ran": False, "ok": True, "stable": None, "reason": "--skip-benchmark"}
    recs = results["bench"]
    good = [r for r in recs if "candidate" in r]
    failed = [r for r in recs if "candidate" not in r]
    post_bad = [r["id"] for r in good if not r["post_check"]["ok"]]
    stable = all(r["stability"]["stable"] for r in good) if good else None
    speedups = [r["speedup"] for r in good if r.get("speedup")]
    integrity = [r["integrity"] for r in recs if r.get("integrity")] + \
        [r["post_check"]["integrity"] for r in good if r["post_check"].get("integrity")]
    return {"ran": True, "ok": not failed and not post_bad, "stable": stable,
            "failed": [r["id"] for r in failed], "post_check_failed": post_bad, "integrity_failures": integrity,
            "geomean_speedup": stats.geomean(speedups) if speedups else None}


def verify(card: TaskCard, cand: Candidate, opts: VerifyOptions, progress=None) -> dict:
    root = Path(card.project_root)
    artifacts = Path(opts.artifacts) if opts.artifacts else root / "artifacts"
    device = "cuda:0" if opts.gpu is not None else pick_device(opts.device)
    env = environment.collect(opts.gpu, opts.env_tag)
    # the worker sees only its GPU, as cuda:0, so work on other GPUs cannot disturb it
    child_env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(opts.gpu)} if opts.gpu is not None else None
    t0 = time.perf_counter()
    salt = opts.seed_salt if opts.seed_salt is not None else secrets.token_hex(16)
    say = progress or (lambda msg, **_: None)
    check_benchmark_options(card, opts, device)

    say(f"compile {cand.id}")
    if opts.prebuilt:
        compile_rec = {"schema_version": 1, "status": "ok", "prebuilt": True, "library": str(Path(opts.prebuilt).resolve()),
                       "cache_hit": None, "duration_s": 0.0}
    else:
        compile_rec = compile_candidate(root, cand, timeout=opts.compile_timeout or card.timeouts["compile_s"],
                                        with_cuda=None if device.startswith("cuda") else False)
    # the roofline's memory ceiling: measured once per environment, cached, kept in environment.json
    bw = None if opts.skip_benchmark else bandwidth.ensure(root, env["key"], device, env=child_env)
    env["copy_bandwidth_Bps"], env["copy_bandwidth"] = (bw or {}).get("copy_bandwidth_Bps"), bw
    results = {"load": None, "cases": [], "contract": {}, "bench": [], "incidents": []}
    if compile_rec["status"] == "ok":
        say(f"verify {cand.id} on {device}")
        job = _job(card, cand, compile_rec["library"], device, opts, salt, peak_bw=env["copy_bandwidth_Bps"])
        results = run_worker(job, case_timeout=opts.timeout or card.timeouts["case_s"],
                             stage_timeout=card.timeouts["stage_s"], on_event=_progress(job, cand.id, say),
                             env=child_env)
    correctness = summarize_correctness(results, cand, device) if compile_rec["status"] == "ok" else None
    bench = summarize_benchmark(results, opts.skip_benchmark) if correctness else None

    if compile_rec["status"] != "ok":
        status, code = "COMPILE_ERROR" if compile_rec["status"] == "error" else "COMPILE_TIMEOUT", ExitCode.COMPILE
    elif correctness["invalid_cases"]:  # the card's params, not the candidate
        status, code = "INVALID_CASE", ExitCode.CONFIG
    elif not correctness["ok"]:
        status, code = "INCORRECT", ExitCode.CORRECTNESS
    elif bench["ran"] and not bench["ok"]:
        status, code = "BENCHMARK_ERROR", ExitCode.BENCHMARK
    else:
        status, code = "PASSED", ExitCode.OK
    summary = {
        "status": status, "exit_code": int(code), "device": device, "correctness": correctness,
        "benchmark": bench, "gpu": opts.gpu, "compile": {k: compile_rec.get(k) for k in ("status", "cache_hit", "duration_s", "key")},
        "duration_s": round(time.perf_counter() - t0, 3),
    }
    regression = None
    if status == "PASSED" and bench["ran"]:
        from mini_kv.judge.regression import check_card_baseline, exit_code_for

        confirm = _confirmation_batch(job, opts, card, child_env)
        regression = check_card_baseline(card, env, results["bench"], device, confirm=confirm)
        if regression is not None:
            summary["regression"] = {"verdict": regression["verdict"], "reasons": regression["reasons"]}
            code = exit_code_for(regression)
            summary["exit_code"] = int(code)
    attempt_dir = _write_attempt(artifacts, card, cand, env, compile_rec, results, summary, salt, device,
                                 regression)
    from mini_kv.store.index import IndexUnusable, update_index

    index_warning = None
    try:  # the attempt is committed either way; `mini-kv rebuild-index` repairs a stale index
        update_index(artifacts, attempt_dir)
    except IndexUnusable as exc:
        index_warning = str(exc)
    return {"summary": summary, "results": results, "compile": compile_rec, "attempt": str(attempt_dir),
            "exit_code": code, "regression": regression, "index_warning": index_warning}


def _write_attempt(artifacts: Path, card: TaskCard, cand: Candidate, env: dict, compile_rec: dict,
                   results: dict, summary: dict, salt: str, device: str, regression: dict | None = None) -> Path:
    root = Path(card.project_root)
    w = AttemptWriter(artifacts, card.id, cand.id)
    w.json("task_card.json", {"path": card.path, "card": card.raw, "suite_hash": card.suite_hash()})
    cdir = root / cand.path
    files = sorted(p for p in cdir.rglob("*") if p.is_file())
    manifest = {"schema_version": 1, **cand.to_dict(),
                "files": [{"path": str(p.relative_to(cdir))} for p in files]}
    w.json("candidate_manifest.json", manifest)
    for p in files:
        w.copy(f"sources/{p.relative_to(cdir)}", p)
    w.json("environment.json", env)
    w.json("compile.json", compile_rec)
    for name, path in (compile_rec.get("logs") or {}).items():
        if os.path.isfile(path):
            w.copy(f"logs/compile/{name}", Path(path))
    if results.get("log") and os.path.isfile(results["log"]):
        w.copy("logs/worker.log", Path(results["log"]))
    w.json("correctness.json", {"schema_version": 1, "device": device, "seed_salt": salt,
                                "load": results["load"], "cases": results["cases"],
                                "contract": results["contract"], "incidents": results["incidents"],
                                "summary": summary["correctness"]})
    w.json("benchmark.json", {"schema_version": 1, "device": device, "cases": results["bench"],
                              "summary": summary["benchmark"]})
    if regression is not None:
        w.json("regression.json", regression)
    header = {
        "task_id": card.id, "task_version": card.version,
        "operator": {"name": card.operator["name"], "version": card.operator["version"]},
        "candidate": cand.id, "op": cand.op,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "suite_hash": card.suite_hash(), "environment_key": env["key"],
        "build_key": compile_rec.get("key"), **summary,
    }
    return w.commit(header)
