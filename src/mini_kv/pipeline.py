"""The one staged pipeline of `verify` and `bench`: prepare -> build -> worker job -> headline ->
regression gate -> attempt -> index (`run_stages`). A front door loads its format and supplies the
format's parts of each stage (`FrontDoor`: `CardDoor` here for task cards, `solexec.run.SolDoor` for
SOL-ExecBench problems); the stages hand each other frozen records (`Prepared`, `Built`, `Outcome`, `Run`)."""

from __future__ import annotations

import datetime as dt
import functools
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mini_kv import clocks, environment, jail
from mini_kv.codec import optional, to_json
from mini_kv.compile.compiler import CompileRecord, compile_candidate
from mini_kv.environment import Environment
from mini_kv.errors import ConfigError, ExitCode
from mini_kv.jail import JailInfo, JailSpec
from mini_kv.judge.regression import RegressionVerdict, Retimed
from mini_kv.judge.static_check import StaticCheck, check_sources
from mini_kv.model import Candidate, CandidateManifest, Problem, WorkerResults, canonical_json, sha256_text
from mini_kv.runner import STARTUP_S, ChildRun, run_worker
from mini_kv.settings import DEFAULTS, RunSettings, check_options, resolve
from mini_kv.status import BuildStatus, Status
from mini_kv.store.attempts import AttemptWriter
from mini_kv.store.headline import card_headline
from mini_kv.store.records import CARD_FORMAT, BenchmarkRecord, correctness_document
from mini_kv.worker import bandwidth
from mini_kv.worker import reference as refs
from mini_kv.worker.jobs import CardJob, Job


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
    memory_limit_gb: float | None = None  # a worker's memory cap (proc.cap_memory); None: half the machine
    max_cv: float | None = None  # stability gate overrides (fractions); None: the card's
    max_p95_cv: float | None = None
    env_tag: str | None = None  # see environment.collect
    sandbox: str = "auto"  # the jail's mode (jail.MODES): --sandbox, $MINI_KV_SANDBOX, the project's
    samples: int | None = None  # a fixed count per repeat; None: the card's (default: adaptive)
    budget: float | None = None  # seconds of timing per bench case; None: the card's, else the device's
    target_rel_ci: float | None = None  # the adaptive stopping rule's target; None: the card's or device's
    give_up_after: int = DEFAULTS.give_up_after  # consecutive TIMEOUTs before the rest is NOT_RUN
    require_own_kernels: bool = DEFAULTS.require_own_kernels  # LIBRARY_DELEGATION unless own kernels ran
    interleave_reference: bool = DEFAULTS.interleave_reference  # in a batch too (no reference reuse)


def benchmark_settings(
    card: Problem, opts: VerifyOptions, device: str, case_timeout: float | None = None
) -> RunSettings:
    """The card's benchmark section with the command line's overrides, then the environment's, resolved
    for `device` (settings.resolve)."""
    given = dict(card.benchmark)
    for key, opt in (
        ("method", "method"),
        ("l2", "l2"),
        ("max_cv", "max_cv"),
        ("max_p95_cv", "max_p95_cv"),
        ("samples", "samples"),
        ("budget_s", "budget"),
        ("target_rel_ci", "target_rel_ci"),
    ):
        if getattr(opts, opt) is not None:
            given[key] = getattr(opts, opt)
    given["require_own_kernels"] = opts.require_own_kernels
    return resolve(given, device, case_timeout)


def check_benchmark_options(card: Problem, opts: VerifyOptions, device: str) -> None:
    """Reject timing options that cannot run on `device` before anything is compiled (exit CONFIG)."""
    import math

    from mini_kv.errors import UserError

    if opts.skip_benchmark:
        return
    settings = benchmark_settings(card, opts, device)

    def where(key: str) -> str:
        return (
            f"--{key.replace('_', '-')}"
            if getattr(opts, key) is not None
            else f"{card.path}: benchmark.{key}"
        )

    for key, method, l2 in (("method", settings.method, "hot"), ("l2", "auto", settings.l2)):
        try:
            check_options(method, l2, device)
        except ValueError as exc:
            raise UserError(f"{where(key)}: {exc}") from None
    for key in ("max_cv", "max_p95_cv"):
        value = getattr(settings, key)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise UserError(f"{where(key)}: must be a positive fraction (0.03 = 3%), got {value!r}")


# ---------------------------------------------------------------- the records the stages hand on


@dataclass(frozen=True)
class Prepared:
    """The prepare stage's record: where and how the run happens, fixed before anything is built."""

    device: str
    env: Environment  # environment.json
    salt: str
    sandbox: JailInfo
    settings: RunSettings  # the timing settings
    case_timeout: float
    compile_timeout: float
    root: Path | None  # the project (baselines/, .build/); None: a SOL run outside one
    artifacts: Path  # the attempt store
    give_up_after: int = DEFAULTS.give_up_after  # consecutive TIMEOUTs before the rest is NOT_RUN
    jail_spec: JailSpec | None = None  # what the worker's jail shows it (None: runner.default_spec)


# the largest file a worker may write, its log included (RLIMIT_FSIZE: past it the write fails with
# SIGXFSZ, which ends the child: a RUNTIME_ERROR); what an attempt keeps of the log is smaller still
WORKER_FILE_CAP = 256 << 20


def worker_spec(
    readable: list[Path | str | None],
    project: Path | None,
    artifacts: Path | None,
    memory_bytes: int | None = None,
    candidate: Path | None = None,
) -> JailSpec:
    """The worker's view: `readable` read-only (`candidate`, the candidate's own staged files, for its
    subject alone), the project's .build/ staged (only the libraries a job names show), the artifact
    store hidden; the GPU where there is one; its whole tree's memory capped at `memory_bytes` where the
    machine allows a memory cgroup (GPU runs too, which no address-space cap fits)."""
    # both made now if missing: a child starts before the build and the attempt create them, and a dir
    # that did not exist when its jail was made is not masked (the whole build cache showed, as the
    # host's files: 0700 ones unreadable to the jail's uid, so a fresh project's first build did not load)
    hide = [d for d in (project / ".build" if project else None, artifacts) if d is not None]
    for d in hide:
        d.mkdir(parents=True, exist_ok=True)
    staged = (project / ".build").resolve() if project is not None else None
    return JailSpec(
        # a library under the staged .build/ (a --prebuilt one there) shows by staging, as every build does
        read_only=tuple(
            str(p)
            for p in readable
            if p is not None
            and os.path.exists(p)
            and not (staged and Path(p).resolve().is_relative_to(staged))
        ),
        staged=(str(project / ".build"),) if project is not None else (),
        hidden=(str(artifacts),) if artifacts is not None else (),
        gpu=bool(jail.gpu_nodes()),
        limits=jail.Limits(file_size_bytes=WORKER_FILE_CAP, memory_bytes=memory_bytes),
        candidate=(str(candidate),) if candidate is not None else (),
    )


def _jail_spec(prep: Prepared) -> JailSpec:
    return prep.jail_spec or worker_spec([prep.root], prep.root, prep.artifacts)


@dataclass(frozen=True)
class Identity:
    """What an attempt is compared by (attempt.json's ids): a baseline must match every one."""

    task_id: str
    task_version: str
    operator: dict  # name, version (SOL: the definition's operator record)
    suite_hash: str
    environment_key: str
    device: str


@dataclass(frozen=True)
class Evaluated:
    """What was evaluated (attempt.json's `candidate`, `op`, and a SOL attempt's `format`)."""

    candidate: str
    op: str
    format: str | None = optional()  # None: a task card's


@dataclass(frozen=True)
class Built:
    """The build stage's record: compile.json's (None: nothing compiled) and, when the build alone decides
    the run (no worker job), the door's outcomes and why the code cannot run here."""

    compile: CompileRecord | None
    decided: tuple | None = None  # the door's outcomes
    unavailable: str | None = None


@dataclass(frozen=True)
class Outcome:
    """The headline stage's record: status, exit code and summaries (store.headline), correctness.json's
    results, benchmark.json's cases (those the gate compares) and settings, and the door's own data."""

    status: Status
    code: ExitCode
    correctness: dict | None
    benchmark: dict | None
    results: WorkerResults
    bench_cases: list
    bench_settings: RunSettings | None = None
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BuildHeadline:
    """How the candidate's build ended (the attempt header's `compile`; compile.json has the rest)."""

    status: str | None
    cache_hit: bool | None
    duration_s: float
    key: str | None


@dataclass(frozen=True)
class DoorSummary:
    """A front door's own attempt header keys: its build's headline, the run's seconds, why a baseline
    was not used."""

    compile: BuildHeadline
    duration_s: float
    baseline_notes: tuple[str, ...] | None = optional()


@dataclass(frozen=True)
class Run:
    """What run_stages hands back to its front door."""

    prep: Prepared
    built: Built
    out: Outcome
    summary: dict  # the attempt header's status, exit code, summaries, the door's keys, regression
    code: ExitCode
    regression: RegressionVerdict | None
    attempt: Path
    index_warning: str | None
    phases: dict  # seconds since the start at the end of each stage, and where the worker's time went


@dataclass(frozen=True)
class VerifyResult:
    """What `verify` says of one candidate (report.print_verify prints it; a cluster item carries it)."""

    candidate: str
    summary: dict  # the attempt header's (Run.summary)
    results: WorkerResults
    compile: CompileRecord
    attempt: str
    exit_code: ExitCode = ExitCode.OK
    regression: RegressionVerdict | None = None
    index_warning: str | None = None
    settings: RunSettings | None = None  # the timing settings the run was held to
    phases: dict = field(default_factory=dict)

    @classmethod
    def of(cls, candidate: str, run: Run) -> VerifyResult:
        return cls(
            candidate,
            run.summary,
            run.out.results,
            run.built.compile,
            str(run.attempt),
            exit_code=run.code,
            regression=run.regression,
            index_warning=run.index_warning,
            settings=run.prep.settings,
            phases=run.phases,
        )


class FrontDoor(Protocol):
    """A format's part of each stage (run_stages): CardDoor, solexec.run.SolDoor (both subclass it for its defaults)."""

    FORMAT: str  # correctness.json's and benchmark.json's `format`
    evaluating: str  # 'verify <candidate>', 'evaluate <solution>'
    label: str | None = None  # progress messages' prefix (None: SOL workloads)
    skipped_benchmark: bool = False

    warm: ChildRun | None = None  # the worker, started before its job (start_worker)
    # its build as a batch made it ahead (cluster.batch.evaluate_here): a failure on the sources is not
    # compiled again (compiler.failed_alike)
    build_ahead: CompileRecord | None = None

    def prepare(self) -> Prepared: ...  # options checked, device, environment, salt, sandbox
    def new_worker(self, ahead: bool) -> ChildRun: ...  # the door's worker, jailed as its job needs

    def start_worker(self, ahead: bool = False) -> None:
        """The worker (judge and subject) started before its job is known; `ahead`: a batch's next item,
        while the item before it runs (runner.AheadOfTurn: no CUPTI warm-up). Called again without
        `ahead` (its prepare), a worker started ahead is taken in its turn."""
        if self.warm is None:
            self.warm = self.new_worker(ahead)
        elif not ahead:
            self.warm.in_turn()

    def build(self, prep: Prepared, say) -> Built: ...
    def job(self, prep: Prepared, built: Built) -> Job | None: ...  # None: the build decided
    def first_child(self) -> ChildRun | None:
        """The worker started early (start_worker) to run the job, handed over to the run: None if none."""
        child, self.warm = self.warm, None
        return child

    def stage_timeout(self, job: Job) -> float: ...
    def outcome(self, prep: Prepared, built: Built, results: WorkerResults) -> Outcome: ...
    def find_baseline(self, prep: Prepared) -> tuple[Path | None, str | None, list[str]]: ...
    def identity(self, prep: Prepared) -> Identity: ...
    def build_baseline(
        self, baseline: dict, prep: Prepared, job: Job
    ) -> tuple[dict, dict]: ...  # (entry, record)
    def confirm_job(self, job: Job, case_id: str) -> Job: ...  # one case, interleaved settings
    def timed(
        self, res: WorkerResults, case_id: str
    ) -> tuple[dict | None, str | None, str | None]: ...  # (timing, why none, the violation that ended it)
    def summary(self, built: Built, duration_s: float, notes: list[str]) -> DoorSummary | None:
        return None  # its header keys

    def evaluated(self) -> Evaluated: ...
    def reference_digest(self) -> str: ...  # the reference's code (ReferenceCache's key)
    def source_dir(self) -> Path | None: ...  # the candidate's directory, whose git commit is recorded
    def write_files(self, w: AttemptWriter, built: Built, out: Outcome) -> None: ...
    def close(self) -> None:
        return None


# ------------------------------------------------------------------ the reference's timing in a batch


class ReferenceCache:
    """The full timings of the reference side of a batch's cases (worker/reference.py), kept here in the
    parent, by everything that makes a reference's timing comparable (`key`). Filled only from the
    records the judge signed, of attempts that PASSED (a candidate caught tampering with the harness or
    the timing leaves nothing behind); the subject, the only process that runs candidate code, never sees
    it. One per batch here, one per worker process on a cluster (one GPU each); thread-safe."""

    def __init__(self) -> None:
        self._entries: dict[str, refs.CachedReference] = {}
        self._lock = threading.Lock()

    @staticmethod
    def keys(door: FrontDoor, prep: Prepared, job: Job) -> dict[str, str]:
        """Each timed case's key: the problem (its identity, suite hash and the reference's code), the case,
        the device (its index, and the environment key: GPU model, driver, torch, ...), the timing
        settings."""
        ident = to_json(door.identity(prep))
        common = {"identity": ident, "reference": door.reference_digest(), "settings": to_json(prep.settings)}
        timed = job.bench_cases if job.KIND == "card" else job.cases  # a SOL workload times after its rounds
        return {c["id"]: sha256_text(canonical_json({**common, "case": c})) for c in timed}

    def offer(self, keys: dict[str, str]) -> dict:
        """The job's `reference_timings`: the cached measurement of each case that has one."""
        with self._lock:
            return {cid: to_json(self._entries[k]) for cid, k in keys.items() if k in self._entries}

    def learn(self, keys: dict[str, str], out: Outcome, attempt: str, solution: str) -> None:
        """Keep the reference sides this run timed in full (measured, or retimed after a drift) of a
        PASSED attempt, replacing what was there."""
        if out.status != Status.PASSED:
            return
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        for rec in out.bench_cases:
            source = (rec.get("reference_timing") or {}).get("source")
            if (
                source not in (refs.MEASURED, refs.RETIMED)
                or rec.get("id") not in keys
                or "reference" not in rec
            ):
                continue
            how = refs.ReferenceHow(
                rec["method"], rec["calls_per_sample"], rec["input_sets"], rec["l2"], rec.get("l2_flush")
            )
            with self._lock:
                self._entries[keys[rec["id"]]] = refs.CachedReference(
                    rec["reference"], how, attempt, solution, now
                )


# ---------------------------------------------------------------------------------- the stages


def run_stages(
    door: FrontDoor,
    progress=None,
    line=None,
    outbox: Path | None = None,
    references: ReferenceCache | None = None,
) -> Run:
    """prepare -> build -> the worker job (progress events) -> headline and exit code -> regression gate ->
    attempt -> index, with `door`'s parts; `progress(msg, completed=, total=)` and `line(text)` as verify's.
    `outbox`: write the attempt there and leave the index alone (a cluster worker: the client stores it).
    `references`: in a batch, the reference timings the job re-checks instead of timing again, and keeps."""
    from mini_kv.judge.regression import exit_code_for
    from mini_kv.store.index import IndexUnusable, update_index

    t0, phases = time.perf_counter(), {}

    def lap(name: str) -> None:
        phases[name] = round(time.perf_counter() - t0, 3)

    say = progress or (lambda msg, **_: None)
    scratch = str(jail.scratch_dir("run"))  # this run's worker log, removed at the end
    try:
        prep = door.prepare()
        lap("prepared_s")
        built = door.build(prep, say)
        lap("built_s")
        job = door.job(prep, built)
        keys = ReferenceCache.keys(door, prep, job) if references is not None and job is not None else {}
        if keys:
            job = job.replace(reference_timings=references.offer(keys))
        results = WorkerResults(None, prep.sandbox.record())
        if job is not None:
            say(f"{door.evaluating} on {prep.device}")
            first = door.first_child()
            watch = clocks.ClockWatch(prep.device)  # the SM clock while each case is timed
            try:
                results = run_worker(
                    job,
                    log_path=None if first is not None else os.path.join(scratch, "worker.log"),
                    case_timeout=prep.case_timeout,
                    stage_timeout=door.stage_timeout(job),
                    on_event=_progress(job, door.label, say, line, phases, t0),
                    first_child=first,
                    sandbox=prep.sandbox,
                    give_up_after=prep.give_up_after,
                    spec=_jail_spec(prep),
                )
            finally:
                watch.stop()
            clocks.attach([*results.bench, *results.cases], watch)
            if watch.unavailable and prep.device.startswith("cuda") and line is not None:
                line(f"SM clock not recorded: {watch.unavailable}")
        # the headline comes from the same function the index and the leaderboard recompute it with
        out = door.outcome(prep, built, results)
        lap("evaluated_s")
        duration = round(time.perf_counter() - t0, 3)
        regression, notes = _judge_regression(door, prep, out, lambda: _confirmation(door, job, prep))
        code = out.code if regression is None else exit_code_for(regression)
        summary = {
            "status": out.status,
            "exit_code": int(code),
            "device": prep.device,
            "correctness": to_json(out.correctness),
            "benchmark": out.benchmark,
            **(to_json(door.summary(built, duration, notes)) or {}),
            # the verdict and its reasons, when the attempt was judged against a baseline
            **(
                {"regression": {"verdict": regression.verdict, "reasons": list(regression.reasons)}}
                if regression
                else {}
            ),
        }
        attempt = _write_attempt(door, prep, built, out, summary, regression, outbox or prep.artifacts)
        if keys:
            references.learn(keys, out, attempt.name, door.evaluated().candidate)
        index_warning = None
        try:  # the attempt is committed either way; `mini-kv rebuild-index` repairs a stale index
            if outbox is None:
                update_index(prep.artifacts, attempt)
        except IndexUnusable as exc:
            index_warning = str(exc)
        lap("recorded_s")
    finally:
        door.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return Run(prep, built, out, summary, code, regression, attempt, index_warning, phases)


FINISHED_EVENTS = {"case": "correctness", "contract": "contract", "bench": "benchmark"}


def _first_line(text, width: int = 160) -> str:
    """A failure's reason as one line of a progress log: its first non-blank line, cut to `width`."""
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 3] + "..."


def _finished_line(ev: dict, done: int, total: int, label: str | None) -> str:
    """One plain line for a finished case, contract check, benchmark or (`label` None) SOL workload."""
    rec = ev.get("record") or {}
    name = rec.get("id") or ev.get("name") or "?"
    status = rec.get("status") or ("ok" if "candidate" in rec else "?")
    perf = rec.get("performance") or {}
    why = _first_line(rec.get("reason") or rec.get("log"))
    why = f" ({why})" if why and status not in (Status.PASSED, "ok") else ""
    if label is None:
        extra = (
            f" {perf['latency_ms']:.3f} ms, speedup {perf['speedup_factor']:.2f}x"
            if perf.get("latency_ms")
            else ""
        )
        return f"workload {done}/{total} {name}: {status}{extra}{why}"
    extra = ""
    if "candidate" in rec:  # a timed case: its P50 and speedup
        p50 = ((rec["candidate"].get("summary") or {}).get("overall") or {}).get("p50")
        extra = (f" P50 {p50:.2f} µs" if p50 is not None else "") + (
            f", speedup {rec['speedup']:.3f}x" if rec.get("speedup") else ""
        )
    return f"{label} {FINISHED_EVENTS[ev['event']]} {done}/{total} {name}: {status}{extra}{why}"


def _progress(job, label: str | None, say, line=None, phases: dict | None = None, started: float = 0.0):
    """Turn the worker's `begin` events into '<label>: stage i/n: case' messages (SOL: 'workload i/n: case')
    with overall done/total counts; `line`, when given, gets one plain line per finished result (a log when
    output is piped); `phases` where the worker's time went: start-up until the code loaded, then the
    per-case phases the worker measured."""
    totals = {
        "correctness": len(job.cases),
        "contract": len(getattr(job, "contract", [])),
        "benchmark": len(getattr(job, "bench_cases", [])),
    }
    seen = dict.fromkeys(totals, 0)
    finished = dict.fromkeys(totals, 0)
    phases = {} if phases is None else phases

    def on_event(ev: dict) -> None:
        stage, kind = ev.get("stage"), ev.get("event")
        if kind == "load":
            phases["worker_ready_s"] = round(time.perf_counter() - started, 3)
        elif kind == "begin" and totals.get(stage):
            seen[stage] = min(seen[stage] + 1, totals[stage])
            where = "workload" if label is None else f"{label}: {stage}"
            say(
                f"{where} {seen[stage]}/{totals[stage]}: {ev.get('case')}",
                completed=sum(seen.values()) - 1,
                total=sum(totals.values()),
            )
        elif kind in FINISHED_EVENTS and line is not None:
            stage = FINISHED_EVENTS[kind]
            finished[stage] = min(finished[stage] + 1, totals[stage])
            line(_finished_line(ev, finished[stage], totals[stage], label))
        for name, secs in (
            ev.get("phase_s") if kind == "case" and isinstance(ev.get("phase_s"), dict) else {}
        ).items():
            if isinstance(secs, (int, float)):
                phases[f"workload_{name}_s"] = round(phases.get(f"workload_{name}_s", 0.0) + secs, 3)

    return on_event


def _judge_regression(
    door: FrontDoor, prep: Prepared, out: Outcome, confirm_with
) -> tuple[RegressionVerdict | None, list[str]]:
    """The verdict against the promoted baseline for a PASSED attempt with a benchmark (None otherwise or
    without a baseline), and notes on a baseline not used. `confirm_with()` gives the same-run comparison."""
    from mini_kv.store.baseline import check_baseline

    path, found_by, notes = door.find_baseline(prep)
    judged = out.status == Status.PASSED and (out.benchmark or {}).get("ran")
    if path is not None and not judged:
        why = "--skip-benchmark" if door.skipped_benchmark else f"the attempt is {out.status}"
        notes.append(
            f"baseline {path.relative_to(prep.root)} not used: {why} (the regression "
            "check needs a PASSED attempt with a benchmark)"
        )
    if path is None or not judged:
        return None, notes
    return check_baseline(
        path,
        found_by,
        prep.root,
        to_json(door.identity(prep)),
        out.bench_cases,
        confirm_with(),
        artifacts=prep.artifacts,
    ), notes


def _confirmation(door: FrontDoor, job: Job, prep: Prepared):
    """confirm(baseline, case_id), the regression gate's evidence for one suspected case: the baseline's own
    code (built once per run) timed beside the candidate (`time_beside`), with fresh inputs. Stored timings
    alone never FAIL."""
    built: dict = {}

    def confirm(baseline: dict, case_id: str) -> Retimed:
        if not built:  # once per run, however many cases need it
            built["entry"], built["record"] = door.build_baseline(baseline, prep, job)
        rerun = door.confirm_job(job, case_id).replace(salt=secrets.token_hex(16))
        rec, _ = time_beside(door, prep, rerun, case_id, built["entry"])
        return Retimed(
            rec["candidate"]["samples"], rec["reference"]["samples"], rec.get("order"), built["record"]
        )

    return confirm


def time_beside(
    door: FrontDoor,
    prep: Prepared,
    job: Job,
    case_id: str,
    baseline: dict,
    first_child: ChildRun | None = None,
) -> tuple[dict, WorkerResults]:
    """Case `case_id` of `job` timed in one fresh worker with another build (`baseline`: its library and op,
    loaded by the subject beside the candidate) in the reference's place, interleaved (the worker alternates
    who goes first each repeat): the door's timing record of the case (`reference` is the baseline's side),
    and the worker's results. The regression gate's same-run comparison, and compare-profiles' A/B.
    A cached reference timing that came with the job is never used in its place (worker.engine).
    `first_child`: a worker of the door's started already, with the same jail view (`door.first_child`)."""
    with jail.scratch("confirm") as scratch:
        res = run_worker(
            job.replace(baseline=baseline),
            log_path=None if first_child is not None else os.path.join(scratch, "worker.log"),
            first_child=first_child,
            case_timeout=prep.case_timeout,
            stage_timeout=door.stage_timeout(job),
            sandbox=prep.sandbox,
            spec=_jail_spec(prep),
        )
    rec, why, violation = door.timed(res, case_id)
    if rec is None:
        raise NoTiming(
            f"the same-run comparison of {case_id} produced no timing" + (f": {why}" if why else ""),
            violation,
        )
    return rec, res


class NoTiming(RuntimeError):
    """time_beside's case produced no timing: why, and the integrity code of a violation that ended it."""

    def __init__(self, message: str, integrity: str | None = None):
        super().__init__(message)
        self.integrity = integrity


def _write_attempt(
    door: FrontDoor,
    prep: Prepared,
    built: Built,
    out: Outcome,
    summary: dict,
    regression: RegressionVerdict | None,
    store: Path,
) -> Path:
    """The attempt in `store`: the door's own files, the static pre-check of their sources, environment.json,
    compile.json and its logs, the worker's log, correctness.json, benchmark.json, regression.json and the
    header, committed."""
    ident, what = door.identity(prep), door.evaluated()
    w = AttemptWriter(store, ident.task_id, what.candidate)
    door.write_files(w, built, out)
    w.json("static_check.json", _static_check(w))
    w.json("environment.json", prep.env)
    if built.compile is not None:
        w.json("compile.json", built.compile)
        for name, path in (built.compile.logs or {}).items():
            if os.path.isfile(path):
                w.copy_log(f"logs/compile/{name}", Path(path))
    if out.results.log and os.path.isfile(out.results.log):
        w.copy_log("logs/worker.log", Path(out.results.log))
    w.json(
        "correctness.json",
        correctness_document(door.FORMAT, prep.device, prep.salt, out.results, out.correctness),
    )
    w.json(
        "benchmark.json",
        BenchmarkRecord(door.FORMAT, prep.device, out.bench_settings, out.bench_cases, out.benchmark),
    )
    if regression is not None:
        w.json("regression.json", regression)
    return w.commit(
        {
            **to_json(ident),
            **to_json(what),
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "build_key": built.compile.key if built.compile else None,
            "source": to_json(environment.source_revision(door.source_dir())),
            **summary,
        }
    )


# --------------------------------------------------------------------------- verify's front door

STATUS_CODES = {
    Status.COMPILE_ERROR: ExitCode.COMPILE,
    Status.COMPILE_TIMEOUT: ExitCode.COMPILE,
    Status.INCORRECT: ExitCode.CORRECTNESS,
    Status.INVALID_CASE: ExitCode.CONFIG,
    Status.BENCHMARK_ERROR: ExitCode.BENCHMARK,
    Status.IMPOSSIBLE_TIME: ExitCode.BENCHMARK,  # a time faster than physics: the benchmark stage's verdict
    Status.REWARD_HACK: ExitCode.CORRECTNESS,  # a defence fired (status.VIOLATIONS): as bench's traces exit
    Status.PASSED: ExitCode.OK,
}


class CardDoor(FrontDoor):
    """verify's part of the stages (run_stages): a task card's candidate."""

    FORMAT = CARD_FORMAT

    def __init__(self, card: Problem, cand: Candidate, opts: VerifyOptions):
        self.card, self.cand, self.opts = card, cand, opts
        self.scratch: str | None = None  # its log's directory, removed by close
        self.label, self.evaluating = cand.id, f"verify {cand.id}"
        self.skipped_benchmark = opts.skip_benchmark

    @functools.cached_property
    def worker_jail(self) -> tuple[JailInfo, JailSpec, Path]:
        """The worker's sandbox, what its jail shows, and the store it must not see."""
        card, opts = self.card, self.opts
        root = Path(card.project_root)
        artifacts = Path(opts.artifacts) if opts.artifacts else root / "artifacts"
        spec = worker_spec(
            [root, opts.prebuilt], root, artifacts, environment.cpu_memory_limit(opts.memory_limit_gb)
        )
        return jail.resolve(opts.sandbox), spec, artifacts

    def new_worker(self, ahead: bool) -> ChildRun:
        card, opts = self.card, self.opts
        sandbox, spec, _ = self.worker_jail
        device = environment.pick_device(opts.device) if opts.device else None
        self.scratch = str(jail.scratch_dir("verify"))
        # no CUDA: a no-op; ahead: CUPTI's warm-up makes a CUDA context, so it waits for the job
        warm = not ahead and (device or "cuda").startswith("cuda") and not opts.skip_benchmark
        return ChildRun(
            None,
            os.path.join(self.scratch, "worker.log"),
            None,
            warm_profiler=warm,
            sandbox=sandbox,
            spec=spec,
            warm_contract=True,  # every card job runs opcheck
            # the card was loaded without running its modules (the door's caller): the judge imports
            # them as it starts, jailed, and one that does not import is the card's error before any build
            card_modules={
                "project_root": str(Path(card.project_root)),
                "modules": [
                    ["operator.reference", card.operator["reference"]],
                    ["operator.inputs", card.operator["inputs"]],
                ],
            },
            ahead=ahead,
        )

    def prepare(self) -> Prepared:
        card, opts = self.card, self.opts
        root = Path(card.project_root)
        # on a cluster worker (mini_kv.cluster) this whole process sees only its GPU, as cuda:0. A device
        # given is checked before the store and the worker exist (for the CPU without importing torch);
        # none given, torch picks it, after the worker's start
        device = environment.pick_device(opts.device) if opts.device else None
        if device is not None:
            check_benchmark_options(card, opts, device)
        sandbox, spec, artifacts = self.worker_jail
        # the worker (a fresh jailed process) imports torch and the card's modules while this process
        # collects the environment and builds: started before its job is known (in a batch, maybe ahead)
        self.start_worker()
        failed = self.warm.card_modules_error(STARTUP_S)
        if failed is not None:
            raise ConfigError(str(root / card.path), *failed)
        if device is None:
            device = environment.pick_device(None)
            check_benchmark_options(card, opts, device)
        env = environment.collect(tag=opts.env_tag)
        # the roofline's memory ceiling: measured once per environment, cached, kept in environment.json
        # (a probe is a child of its own: its torch import, not its copies, overlaps the worker's start)
        env = env.measured(None if opts.skip_benchmark else bandwidth.ensure(root, env.key, device))
        return Prepared(
            device,
            env,
            opts.seed_salt if opts.seed_salt is not None else secrets.token_hex(16),
            sandbox,
            benchmark_settings(card, opts, device, opts.timeout or card.timeouts["case_s"]),
            opts.timeout or card.timeouts["case_s"],
            opts.compile_timeout or card.timeouts["compile_s"],
            root,
            artifacts,
            opts.give_up_after,
            spec,
        )

    def close(self) -> None:
        if self.warm is not None:  # never sent a job (the build failed, or an error on the way)
            self.warm.close(kill=True)
            self.warm = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def build(self, prep: Prepared, say) -> Built:
        """compile.json's record: the content-addressed build, or the --prebuilt library as it is."""
        say(f"compile {self.cand.id}: {self.cand.build_summary(prep.device.startswith('cuda'))}")
        if self.opts.prebuilt:
            return Built(
                CompileRecord(
                    status=BuildStatus.OK, library=str(Path(self.opts.prebuilt).resolve()), prebuilt=True
                )
            )
        return Built(
            compile_candidate(
                prep.root,
                self.cand,
                timeout=prep.compile_timeout,
                with_cuda=None if prep.device.startswith("cuda") else False,
                sandbox=prep.sandbox,  # the run's jail mode (--sandbox) for its build too
                known=self.build_ahead,
            )
        )

    def job(self, prep: Prepared, built: Built) -> CardJob | None:
        if built.compile.status != BuildStatus.OK:
            return None
        card, cand, opts, device = self.card, self.cand, self.opts, prep.device
        wanted = set(opts.case_filter or ())
        chosen = [
            c.to_dict()
            for c in card.cases
            if c.runs_on(device) and (not wanted or {c.id, c.base_id} & wanted)
        ]
        cases = [c for c in chosen if c["kind"] != "bench"]
        bench_kinds = (
            {"bench", "core"} if (opts.bench_all or card.benchmark.get("cases") == "all") else {"bench"}
        )
        bench = [] if opts.skip_benchmark else [c for c in chosen if c["kind"] in bench_kinds]
        return CardJob(
            task_id=card.id,
            op=cand.op,
            library=built.compile.library,
            device=device,
            salt=prep.salt,
            project_root=card.project_root,  # where the card's reference and input modules import from
            reference=card.reference,
            inputs=card.operator["inputs"],
            tolerances=card.tolerances,
            cases=cases,
            all_cases=[c.to_dict() for c in card.cases],
            bench_cases=bench,
            benchmark=benchmark_settings(card, opts, device, opts.timeout or card.timeouts["case_s"]),
            contract=["opcheck"] + (["gradcheck"] if cand.backward else []),
            backward=cand.backward,
            exprs={k: card.operator[k] for k in ("bytes", "flops") if k in card.operator},
            peak_bw=prep.env.copy_bandwidth_Bps,
            # files of the suite the parent watches while the worker runs (with the mini_kv package)
            watch_paths=_watch_paths(card),
            memory_limit_bytes=environment.cpu_memory_limit(opts.memory_limit_gb),
        )

    def stage_timeout(self, job: Job) -> float:
        return self.card.timeouts["stage_s"]

    def outcome(self, prep: Prepared, built: Built, results: WorkerResults) -> Outcome:
        head = card_headline(
            built.compile.status, results, results.bench, self.opts.skip_benchmark, prep.device
        )
        held_to = None if self.opts.skip_benchmark else prep.settings  # what the run was held to (settings)
        return Outcome(
            head.status,
            STATUS_CODES[head.status],
            head.correctness,
            head.benchmark,
            results,
            results.bench,
            held_to,
        )

    def find_baseline(self, prep: Prepared) -> tuple[Path | None, str | None, list[str]]:
        from mini_kv.judge.regression import find_card_baseline

        return find_card_baseline(self.card)

    def identity(self, prep: Prepared) -> Identity:
        card, operator = self.card, {k: self.card.operator[k] for k in ("name", "version")}
        return Identity(card.id, card.version, operator, card.suite_hash(), prep.env.key, prep.device)

    def build_baseline(self, baseline: dict, prep: Prepared, job: Job) -> tuple[dict, dict]:
        """The baseline's own sources, built under a namespace of their own."""
        from mini_kv.baseline import build_baseline

        b = build_baseline(
            baseline,
            prep.root,
            prep.artifacts,
            timeout=prep.compile_timeout,
            with_cuda=None if job.device.startswith("cuda") else False,
        )
        return {"library": b.library, "op": b.op}, to_json(b)

    def confirm_job(self, job: Job, case_id: str) -> Job:
        case = next(c for c in job.bench_cases if c["id"] == case_id)
        return job.replace(cases=[], contract=[], bench_cases=[case], benchmark=job.benchmark.interleaved())

    def timed(self, res: WorkerResults, case_id: str) -> tuple[dict | None, str | None, str | None]:
        recs = [r for r in res.bench if r.get("id") == case_id]
        why = (res.load or {}).get("reason") or next((r.get("reason") for r in recs), None)
        violation = next((r["integrity"] for r in recs if r.get("integrity")), None)
        return next((r for r in recs if "candidate" in r), None), why, violation

    def summary(self, built: Built, duration_s: float, notes: list[str]) -> DoorSummary:
        c = built.compile
        return DoorSummary(
            BuildHeadline(c.status, c.cache_hit, c.duration_s, c.key), duration_s, tuple(notes) or None
        )

    def evaluated(self) -> Evaluated:
        return Evaluated(self.cand.id, self.cand.op)

    def reference_digest(self) -> str:
        """The card and its reference's and input factory's files, as they are now."""
        return sha256_text(
            "".join(sha256_text(Path(p).read_text(encoding="utf-8")) for p in _watch_paths(self.card))
        )

    def source_dir(self) -> Path | None:
        return Path(self.card.project_root) / self.cand.path

    def write_files(self, w: AttemptWriter, built: Built, out: Outcome) -> None:
        card = self.card
        w.json("task_card.json", {"path": card.path, "card": card.raw, "suite_hash": card.suite_hash()})
        w.json(
            "candidate_manifest.json",
            _copy_sources(w, Path(card.project_root) / self.cand.path, self.cand, built.compile),
        )


def _static_check(w: AttemptWriter) -> StaticCheck:
    """judge.static_check over the attempt's `sources/` as the door copied them (the files the build
    hashed, or a solution's own): never a path of the candidate's choosing."""
    root = w.path("sources")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    return check_sources({str(p.relative_to(root)): p.read_bytes() for p in files})


def _watch_paths(card: Problem) -> list[str]:
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


def _copy_sources(
    w: AttemptWriter, cdir: Path, cand: Candidate, compile_rec: CompileRecord
) -> CandidateManifest:
    """Copy into `sources/` exactly the files the build key hashed, and the manifest saying so. A copy
    whose bytes differ from the key's (the file changed after the build read it) is named in
    `changed_since_build`: the attempt then holds what is there now, not what was built."""
    from mini_kv.compile.compiler import candidate_files
    from mini_kv.model import sha256_file

    built = compile_rec.files
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
    return cand.manifest(build_key=compile_rec.key, files=tuple(files), changed_since_build=tuple(changed))
