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
from mini_kv.sandbox import resolve as resolve_sandbox
from mini_kv.status import BuildStatus, Status
from mini_kv.store.attempts import AttemptWriter
from mini_kv.store.headline import card_headline
from mini_kv.worker import bandwidth
from mini_kv.worker.jobs import CardJob


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
    sandbox: bool = True  # run the worker in the OS sandbox where the machine allows it (--no-sandbox)


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


FINISHED_EVENTS = {"case": "correctness", "contract": "contract", "bench": "benchmark"}


def _finished_line(ev: dict, done: int, total: int, label: str) -> str:
    """One plain line for a finished case, contract check or benchmark (the log when output is piped)."""
    rec = ev.get("record") or {}
    name = rec.get("id") or ev.get("name") or "?"
    status = rec.get("status") or ("ok" if "candidate" in rec else "?")
    extra = ""
    if "candidate" in rec:  # a timed case: its P50 and speedup
        p50 = ((rec["candidate"].get("summary") or {}).get("overall") or {}).get("p50")
        extra = (f" P50 {p50:.2f} µs" if p50 is not None else "") + (
            f", speedup {rec['speedup']:.3f}x" if rec.get("speedup") else "")
    return f"{label} {FINISHED_EVENTS[ev['event']]} {done}/{total} {name}: {status}{extra}"


def _progress(job: dict, cand_id: str, say, line=None):
    """Turn the worker's `begin` events into 'stage i/n: case' messages plus overall done/total counts;
    `line`, when given, gets one plain line per finished result (a log when output is piped)."""
    totals = {"correctness": len(job["cases"]), "contract": len(job.get("contract", [])),
              "benchmark": len(job.get("bench_cases", []))}
    seen = dict.fromkeys(totals, 0)
    finished = dict.fromkeys(totals, 0)

    def on_event(ev: dict) -> None:
        stage = ev.get("stage")
        if ev.get("event") == "begin" and stage in totals:
            seen[stage] = min(seen[stage] + 1, totals[stage])
            say(f"{cand_id}: {stage} {seen[stage]}/{totals[stage]}: {ev.get('case')}",
                completed=sum(seen.values()) - 1, total=sum(totals.values()))
        elif ev.get("event") in FINISHED_EVENTS and line is not None:
            stage = FINISHED_EVENTS[ev["event"]]
            finished[stage] = min(finished[stage] + 1, totals[stage])
            line(_finished_line(ev, finished[stage], totals[stage], cand_id))
    return on_event


def _job(card: TaskCard, cand: Candidate, library: str, device: str, opts: VerifyOptions, salt: str,
         peak_bw: float | None = None) -> CardJob:
    wanted = set(opts.case_filter or ())
    chosen = [c.to_dict() for c in card.cases if c.runs_on(device) and (not wanted or {c.id, c.base_id} & wanted)]
    cases = [c for c in chosen if c["kind"] != "bench"]
    bench_kinds = {"bench", "core"} if (opts.bench_all or card.benchmark.get("cases") == "all") else {"bench"}
    bench = [] if opts.skip_benchmark else [c for c in chosen if c["kind"] in bench_kinds]
    settings = benchmark_settings(card, opts)
    return CardJob(
        task_id=card.id, op=cand.op, library=library, device=device, salt=salt,
        project_root=card.project_root,  # where the card's reference and input modules import from
        reference=card.operator["reference"], inputs=card.operator["inputs"],
        tolerances=card.tolerances, cases=cases, all_cases=[c.to_dict() for c in card.cases],
        bench_cases=bench, benchmark=settings,
        contract=["opcheck"] + (["gradcheck"] if cand.backward else []),
        backward=cand.backward,
        exprs={k: card.operator[k] for k in ("bytes", "flops") if k in card.operator},
        peak_bw=peak_bw,
        # files of the suite the parent watches while the worker runs (with the mini_kv package)
        watch_paths=_watch_paths(card),
        memory_limit_bytes=int(opts.memory_limit_gb * 2**30) if opts.memory_limit_gb else environment.cpu_memory_limit(),
    )


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


def _confirmation_batch(job: dict, opts: VerifyOptions, card: TaskCard, child_env: dict | None,
                        artifacts: Path):
    """The regression gate's evidence for one suspected case: the baseline's own sources, built under
    a namespace of their own, timed in one fresh worker with the candidate, interleaved (the worker
    alternates who goes first each repeat), with fresh inputs. Stored timings alone never FAIL."""
    from mini_kv.build.baseline import build_baseline

    built: dict = {}

    def confirm(baseline: dict, case_id: str) -> dict:
        if "build" not in built:  # once per verify, however many cases need it
            built["build"] = build_baseline(baseline, Path(card.project_root), artifacts,
                                            with_cuda=None if job["device"].startswith("cuda") else False,
                                            timeout=opts.compile_timeout or card.timeouts["compile_s"])
        b = built["build"]
        case = next(c for c in job["bench_cases"] if c["id"] == case_id)
        rerun = {**job, "cases": [], "contract": [], "bench_cases": [case], "salt": secrets.token_hex(16),
                 "baseline": {"library": b.library, "op": b.op},
                 "benchmark": _interleaved_settings(job["benchmark"])}
        res = run_worker(rerun, case_timeout=opts.timeout or card.timeouts["case_s"],
                         stage_timeout=card.timeouts["stage_s"], env=child_env,
                         sandbox=resolve_sandbox(opts.sandbox))
        rec = next((r for r in res["bench"] if r.get("id") == case_id and "candidate" in r), None)
        if rec is None:
            why = (res.get("load") or {}).get("reason") or next(
                (r.get("reason") for r in res["bench"] if r.get("id") == case_id), None)
            raise RuntimeError(f"the same-run comparison of {case_id} produced no timing" + (f": {why}" if why else ""))
        return {"candidate": rec["candidate"]["samples"], "baseline": rec["reference"]["samples"],
                "order": rec.get("order"), "build": b.to_dict()}
    return confirm


def _interleaved_settings(settings: dict) -> dict:
    """The card's sample budget in twice as many, shorter repeats: the worker alternates candidate and
    baseline every repeat, so a burst of load on the machine hits both alike."""
    repeats = int(settings["repeats"])
    samples = int(settings["samples"])
    finer = max(2 * repeats, 10)
    return {**settings, "repeats": finer, "samples": max(10, -(-repeats * samples // finer))}


STATUS_CODES = {"COMPILE_ERROR": ExitCode.COMPILE, "COMPILE_TIMEOUT": ExitCode.COMPILE,
                "INCORRECT": ExitCode.CORRECTNESS, "INVALID_CASE": ExitCode.CONFIG, "BENCHMARK_ERROR": ExitCode.BENCHMARK, "PASSED": ExitCode.OK}


def verify(card: TaskCard, cand: Candidate, opts: VerifyOptions, progress=None, line=None) -> dict:
    root = Path(card.project_root)
    artifacts = Path(opts.artifacts) if opts.artifacts else root / "artifacts"
    device = "cuda:0" if opts.gpu is not None else environment.pick_device(opts.device)
    env = environment.collect(opts.gpu, opts.env_tag)
    # the worker sees only its GPU, as cuda:0, so work on other GPUs cannot disturb it
    child_env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(opts.gpu)} if opts.gpu is not None else None
    t0 = time.perf_counter()
    salt = opts.seed_salt if opts.seed_salt is not None else secrets.token_hex(16)
    say = progress or (lambda msg, **_: None)
    check_benchmark_options(card, opts, device)

    say(f"compile {cand.id}")
    compile_rec = _compile(card, cand, opts, device)
    # the roofline's memory ceiling: measured once per environment, cached, kept in environment.json
    bw = None if opts.skip_benchmark else bandwidth.ensure(root, env["key"], device, env=child_env)
    env["copy_bandwidth_Bps"], env["copy_bandwidth"] = (bw or {}).get("copy_bandwidth_Bps"), bw
    sandbox = resolve_sandbox(opts.sandbox)
    results = {"load": None, "cases": [], "contract": {}, "bench": [], "incidents": [], "sandbox": sandbox.to_dict()}
    if compile_rec["status"] == BuildStatus.OK:
        say(f"verify {cand.id} on {device}")
        job = _job(card, cand, compile_rec["library"], device, opts, salt, peak_bw=env["copy_bandwidth_Bps"])
        results = run_worker(job, case_timeout=opts.timeout or card.timeouts["case_s"],
                             stage_timeout=card.timeouts["stage_s"], on_event=_progress(job, cand.id, say, line),
                             env=child_env, sandbox=sandbox)
    # the headline comes from the same function the index and the leaderboard recompute it with
    head = card_headline(compile_rec["status"], results, results["bench"], opts.skip_benchmark, device)
    correctness, bench, status = head.correctness, head.benchmark, head.status
    summary = {
        "status": status, "exit_code": int(STATUS_CODES[status]), "device": device, "correctness": correctness,
        "benchmark": bench, "gpu": opts.gpu, "compile": {k: compile_rec.get(k) for k in ("status", "cache_hit", "duration_s", "key")},
        "duration_s": round(time.perf_counter() - t0, 3),
    }
    regression = _judge_regression(card, opts, env, results, summary, artifacts,
                                   confirm_with=lambda: _confirmation_batch(job, opts, card, child_env, artifacts))
    code = ExitCode(summary["exit_code"])
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


def _compile(card: TaskCard, cand: Candidate, opts: VerifyOptions, device: str) -> dict:
    """compile.json's record: the content-addressed build, or the --prebuilt library as it is."""
    if opts.prebuilt:
        return {"schema_version": 1, "status": BuildStatus.OK, "prebuilt": True,
                "library": str(Path(opts.prebuilt).resolve()), "cache_hit": None, "duration_s": 0.0}
    return compile_candidate(Path(card.project_root), cand, timeout=opts.compile_timeout or card.timeouts["compile_s"],
                             with_cuda=None if device.startswith("cuda") else False)


def _judge_regression(card: TaskCard, opts: VerifyOptions, env: dict, results: dict, summary: dict,
                      artifacts: Path, confirm_with) -> dict | None:
    """The verdict against the card's promoted baseline for a PASSED attempt with a benchmark; None
    otherwise or without a baseline. Sets the summary's baseline notes, regression and exit code.
    `confirm_with()` gives the same-run comparison of a suspected case."""
    from mini_kv.judge.regression import check_card_baseline, exit_code_for, find_card_baseline

    status = summary["status"]
    judged = status == Status.PASSED and summary["benchmark"]["ran"]
    baseline_path, _, notes = find_card_baseline(card)
    if baseline_path is not None and not judged:
        why = "--skip-benchmark" if opts.skip_benchmark else f"the attempt is {status}"
        notes.append(f"baseline {baseline_path.relative_to(card.project_root)} not used: {why} (the regression "
                     "check needs a PASSED attempt with a benchmark)")
    if notes:
        summary["baseline_notes"] = notes
    if not judged:
        return None
    regression = check_card_baseline(card, env, results["bench"], summary["device"], confirm_with=confirm_with(),
                                     artifacts=artifacts)
    if regression is not None:
        summary["regression"] = {"verdict": regression["verdict"], "reasons": regression["reasons"]}
        summary["exit_code"] = int(exit_code_for(regression))
    return regression


def _copy_sources(w: AttemptWriter, cdir: Path, cand: Candidate, compile_rec: dict) -> dict:
    """Copy into `sources/` exactly the files the build key hashed, and the manifest saying so. A copy
    whose bytes differ from the key's (the file changed after the build read it) is named in
    `changed_since_build`: the attempt then holds what is there now, not what was built."""
    from mini_kv.build.compiler import candidate_files
    from mini_kv.model import sha256_file

    built = compile_rec.get("files")
    if built is None:  # --prebuilt: no build key; the source files as they are
        built = [{"path": str(p.relative_to(cdir)), "sha256": None} for p in candidate_files(cdir)]
    files, changed = [], []
    for entry in built:
        dest = f"sources/{entry['path']}"
        w.copy(dest, cdir / entry["path"])
        digest = sha256_file(w.path(dest))
        if entry["sha256"] is not None and digest != entry["sha256"]:
            changed.append(entry["path"])
        files.append({"path": entry["path"], "sha256": digest})
    return {"schema_version": 1, **cand.to_dict(), "build_key": compile_rec.get("key"), "files": files,
            "changed_since_build": changed}


def _write_attempt(artifacts: Path, card: TaskCard, cand: Candidate, env: dict, compile_rec: dict,
                   results: dict, summary: dict, salt: str, device: str, regression: dict | None = None) -> Path:
    from mini_kv.store.records import CARD_FORMAT, benchmark_document, correctness_document

    root = Path(card.project_root)
    w = AttemptWriter(artifacts, card.id, cand.id)
    w.json("task_card.json", {"path": card.path, "card": card.raw, "suite_hash": card.suite_hash()})
    w.json("candidate_manifest.json", _copy_sources(w, root / cand.path, cand, compile_rec))
    w.json("environment.json", env)
    w.json("compile.json", compile_rec)
    for name, path in (compile_rec.get("logs") or {}).items():
        if os.path.isfile(path):
            w.copy(f"logs/compile/{name}", Path(path))
    if results.get("log") and os.path.isfile(results["log"]):
        w.copy("logs/worker.log", Path(results["log"]))
    w.json("correctness.json", correctness_document(CARD_FORMAT, device, salt, results, summary["correctness"]))
    w.json("benchmark.json", benchmark_document(CARD_FORMAT, device, results["bench"], summary["benchmark"]))
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
