"""`bench`: load -> languages -> build (compiler) -> worker child (job kind `sol`) -> traces -> attempt + index.

The parent never imports solution code. Everything that can go wrong with a solution becomes a
trace status; only bad input files and arguments (ConfigError) and mini_kv's own bugs raise.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from mini_kv import environment, jail
from mini_kv.codec import from_json, optional, to_json
from mini_kv.compile.compiler import CompileRecord, compile_candidate
from mini_kv.errors import ConfigError, ExitCode, UserError
from mini_kv.jail import JailInfo, JailSpec
from mini_kv.judge.regression import RegressionVerdict
from mini_kv.model import Candidate, Case, JailRecord, Problem, WorkerResults, canonical_json, sha256_text
from mini_kv.model import safe_name as _safe
from mini_kv.pipeline import (
    Built,
    Evaluated,
    FrontDoor,
    Identity,
    Outcome,
    Prepared,
    ReferenceCache,
    run_stages,
    worker_spec,
)
from mini_kv.runner import ChildRun
from mini_kv.settings import DEFAULTS, ExtraWorkloads, RunSettings, resolve
from mini_kv.settings import check_options as check_timing_options
from mini_kv.solexec import floor, languages, traces
from mini_kv.solexec.build import SolutionEntry, build_log, job_entry, solution_build, stage_sources
from mini_kv.solexec.definition import Definition, load_definition
from mini_kv.solexec.solution import load_solution
from mini_kv.solexec.workload import DATA_ROOT_VAR, Workload, extra_workloads, load_workloads
from mini_kv.status import BuildStatus, Status, violation_status
from mini_kv.store.records import SOL_FORMAT
from mini_kv.worker import bandwidth
from mini_kv.worker.jobs import SolJob

UNAVAILABLE = "unavailable here: "


@dataclass
class BenchOptions:
    solution: str
    definition: str | None = None
    workload: str | None = None
    device: str | None = None  # None: cuda when available, else cpu
    compile_timeout: float = DEFAULTS.compile_s
    timeout: float = DEFAULTS.sol_timeout_s  # per workload (correctness rounds and timing together)
    rounds: int = DEFAULTS.sol_rounds
    warmup: int = DEFAULTS.sol_warmup
    repeats: int = DEFAULTS.sol_repeats  # one profiler session per side (per batch) keeps start-up lean
    samples: int | None = None  # a fixed count; None: adaptive (worker.timing's stopping rule)
    budget: float | None = None  # seconds per workload (correctness rounds and timing); None: the device's
    target_rel_ci: float | None = None  # the adaptive stopping rule's target; None: the device's
    give_up_after: int = DEFAULTS.give_up_after  # consecutive TIMEOUTs before the rest is NOT_RUN
    method: str = "auto"
    l2: str | None = None  # None: cold on CUDA (upstream flushes L2 before every timed call)
    max_cv: float = DEFAULTS.max_cv
    max_p95_cv: float = DEFAULTS.max_p95_cv
    artifacts: str | None = None
    keep_staging: bool = False
    seed_salt: str | None = None
    memory_limit_gb: float | None = None
    extra_workloads: int = DEFAULTS.extra_workloads  # unseen workloads drawn from the var axes (workload.py)
    extra_workloads_seed: int = DEFAULTS.extra_workloads_seed
    require_own_kernels: bool = DEFAULTS.require_own_kernels  # LIBRARY_DELEGATION unless own kernels ran
    sandbox: str = "auto"  # the jail's mode (jail.MODES): --sandbox, $MINI_KV_SANDBOX, the project's
    interleave_reference: bool = DEFAULTS.interleave_reference  # in a batch too (no reference reuse)


def _found_under(base: Path, name: str, limit: int = 12) -> str:
    """`; found: a, b, ...` for the files called `name` below `base` (what a wrong path may have meant)."""
    if not base.is_dir():
        return ""
    hits = sorted(str(p.parent if name == "definition.json" else p) for p in base.rglob(name))
    if not hits:
        return ""
    return (
        "; found: " + ", ".join(hits[:limit]) + (f" (+{len(hits) - limit} more)" if len(hits) > limit else "")
    )


def problem_files(problem_dir: str | None, opts: BenchOptions) -> tuple[Path, Path]:
    """definition.json and workload.jsonl: the explicit options win over PROBLEM_DIR's files."""
    base = Path(problem_dir) if problem_dir else None
    if base is not None and not base.is_dir():
        raise UserError(
            f"{base}: not a problem directory (expected definition.json and workload.jsonl in it)"
        )
    if base is not None and not opts.definition and not (base / "definition.json").is_file():
        raise UserError(
            f"{base}: not a problem directory (no definition.json in it)"
            + _found_under(base, "definition.json")
        )
    found = []
    for option, name in ((opts.definition, "definition.json"), (opts.workload, "workload.jsonl")):
        path = Path(option) if option else (base / name if base else None)
        if path is None:
            raise UserError(f"give PROBLEM_DIR or --{name.split('.')[0]}")
        if not path.is_file():
            raise ConfigError(str(path), "", "file not found")
        found.append(path)
    return found[0], found[1]


def load_problem(problem_dir: str | None, opts: BenchOptions) -> Problem:
    """The problem (its workloads as cases, definition.json and the workloads' parse as the payload) with the
    solution as its one candidate."""
    def_path, wl_path = problem_files(problem_dir, opts)
    definition = load_definition(def_path)
    workloads = load_workloads(wl_path, definition)
    workloads += extra_workloads(definition, workloads, opts.extra_workloads, opts.extra_workloads_seed)
    if not Path(opts.solution).is_file():
        sol = Path(opts.solution)
        where = sol if sol.is_dir() else sol.parent
        raise ConfigError(
            opts.solution,
            "",
            ("a directory, not a solution file" if sol.is_dir() else "solution file not found")
            + _found_under(where, "solution.json"),
        )
    sol = load_solution(opts.solution, definition.name)
    version = "sol-" + sha256_text(canonical_json(definition.raw))[:12]
    return Problem(
        path=str(def_path),
        project_root=str(def_path.parent.resolve()),
        raw=definition.raw,
        id=definition.name,
        version=version,
        operator={"name": definition.raw.get("op_type") or definition.name, "version": version},
        reference=definition.reference,
        candidates=(sol,),
        default_candidate=sol.id,
        cases=tuple(_case(definition, wl, i) for i, wl in enumerate(workloads)),
        format=SOL_FORMAT,
        payload=(definition, workloads),
    )


def check_options(opts: BenchOptions, device: str) -> RunSettings:
    """The timing and round settings, checked before anything is built (exit CONFIG)."""
    l2 = opts.l2 or ("cold" if device.startswith("cuda") else "hot")
    try:
        check_timing_options(opts.method, l2, device)
    except ValueError as exc:
        raise UserError(f"--method/--l2: {exc}") from None
    if opts.extra_workloads < 0:
        raise UserError(f"--extra-workloads must be at least 0, got {opts.extra_workloads}")
    for name in ("rounds", "warmup", "repeats", "samples"):
        if getattr(opts, name) is not None and getattr(opts, name) < (0 if name == "warmup" else 1):
            raise UserError(
                f"--{name} must be at least {0 if name == 'warmup' else 1}, got {getattr(opts, name)}"
            )
    for name in ("timeout", "compile_timeout", "max_cv", "max_p95_cv", "budget", "target_rel_ci"):
        if getattr(opts, name) is not None and not getattr(opts, name) > 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(opts, name)}")
    given = {name: getattr(opts, name) for name in ("rounds", "warmup", "repeats", "samples", "method")}
    given |= {"l2": l2, "max_cv": opts.max_cv, "max_p95_cv": opts.max_p95_cv, "budget_s": opts.budget}
    given |= {"target_rel_ci": opts.target_rel_ci, "require_own_kernels": opts.require_own_kernels}
    if opts.extra_workloads:
        given["extra_workloads"] = ExtraWorkloads(opts.extra_workloads, opts.extra_workloads_seed)
    return resolve(given, device, opts.timeout, with_correctness=True)


def device_memory(device: str, opts: BenchOptions) -> int:
    """Bytes a worker on `device` can hold: the GPU's memory, or a CPU worker's address-space cap."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return environment.cpu_memory_limit(opts.memory_limit_gb)


def check_memory(workloads: list[Workload], device: str, opts: BenchOptions) -> None:
    """A workload whose inputs and outputs alone exceed the device's memory is a configuration error,
    found before anything is built; it would otherwise end as a worker killed mid-run."""
    limit = device_memory(device, opts)
    for wl in workloads:
        if wl.nbytes > limit:
            raise ConfigError(
                wl.file,
                f"line {wl.line}: axes",
                f"workload {wl.uuid!r} needs {wl.nbytes / 2**30:.3g} "
                f"GiB for its inputs and outputs alone; {device} has {limit / 2**30:.3g} GiB",
            )


def _case(definition: Definition, wl: Workload, index: int) -> Case:
    """The workload as a case: id/kind/dtype/params are what the runner records for a workload whose worker
    crashed or hung; `signature` its concrete inputs and outputs (shapes resolved from its axes)."""
    spec = lambda t: {  # noqa: E731
        "name": t.name,
        "dtype": t.dtype,
        "shape": None if t.shape is None else list(definition.shape_of(t, wl.resolved_axes)),
    }
    signature = {
        "inputs": [spec(t) for t in definition.inputs],
        "outputs": [spec(t) for t in definition.outputs],
        "custom_inputs_entrypoint": definition.custom_inputs_entrypoint,
    }
    work = {k: getattr(wl, k) for k in ("uuid", "inputs", "resolved_axes", "safetensors", "tolerance")}
    return Case(
        wl.uuid,
        wl.uuid,
        "workload",
        dict(wl.axes),
        None,
        record={"index": index, "signature": signature, "workload": work},
    )


def _failure_log(entry: dict) -> str:
    parts = [entry.get("reason") or ""]
    for key in ("traceback", "log_tail"):
        if entry.get(key):
            parts.append(f"{key.replace('_', ' ')}:\n{entry[key].rstrip()}")
    return "\n".join(p for p in parts if p)


def _load_failure(load: dict) -> tuple[str, str]:
    """Every workload's status and log when the solution (or the reference) did not load."""
    status = load.get("status") or (Status.TIMEOUT if load.get("timed_out") else Status.RUNTIME_ERROR)
    log = _failure_log(load)
    if load.get("stage") == "reference":  # the worker died or hung in the reference's own code
        status = Status.INVALID_REFERENCE
        log = (
            "the reference did not finish loading (it hangs at import)"
            if load.get("timed_out")
            else "the reference ended the worker while loading"
        ) + f": {log}"
    return status, log


@dataclass(frozen=True)
class WorkloadOutcome:
    """One workload's outcome, as correctness.json keeps it (less `bench`, its benchmark.json record) and
    its trace says it: the worker's record (worker.formats.WorkloadRecord), or the status and log of a
    workload it has none for (a crash or hang while it ran, a build that decided every workload)."""

    id: str
    status: str
    log: str = ""
    correctness: dict | None = optional()
    performance: dict | None = optional()
    bench: dict | None = optional()
    kernels: dict | None = optional()
    finished_at: str | None = optional()
    stream_checks: dict | None = optional()  # worker.remote.StreamChecks: held calls, how many checked


def outcomes_from_results(results: WorkerResults, cases: tuple[Case, ...]) -> tuple[WorkloadOutcome, ...]:
    """Each case's outcome, in the cases' order, from the runner's results."""
    load = results.load or {"ok": False, "reason": "the worker produced no result"}
    if not load.get("ok"):
        return _all(cases, *_load_failure(load))
    by_id = {rec["id"]: rec for rec in results.cases}
    spent = [i["reason"] for i in results.incidents if i.get("status") == Status.TIMEOUT]
    out = []
    for c in cases:
        rec = by_id.get(c.id)
        if rec is None:
            out.append(
                WorkloadOutcome(
                    c.id, Status.TIMEOUT, "not evaluated: " + (spent[0] if spent else "no result")
                )
            )
        elif "signature" in rec or "finished_at" in rec:  # the worker's own record
            out.append(from_json(WorkloadOutcome, rec))
        else:  # the runner's record of a crash or hang while this workload ran
            out.append(WorkloadOutcome(c.id, rec["status"], _failure_log(rec)))
    ids = {c.id for c in cases}
    for incident in results.incidents:
        if incident.get("integrity"):  # bytes on the result channel that the worker did not sign
            hit = {incident["case"]} if incident.get("case") in ids else ids
            forged = (violation_status(incident["integrity"]), incident["reason"])
            out = [WorkloadOutcome(o.id, *forged) if o.id in hit else o for o in out]
    return tuple(out)


TRACE_WORDS = {Status.NOT_RUN: Status.TIMEOUT, Status.IMPOSSIBLE_TIME: Status.REWARD_HACK}


def build_traces(
    problem: Problem, outcomes: tuple[WorkloadOutcome, ...], env: environment.Environment
) -> list[traces.Trace]:
    trace_env = traces.trace_environment(env)
    out = []
    for wl, o in zip(problem.payload[1], outcomes, strict=True):  # the cases are the workloads, in order
        if o.status == Status.SKIPPED:  # upstream's layout has no word for it: correctness.json says why
            continue
        out.append(
            traces.make_trace(
                problem.id,
                wl.traced(),
                problem.candidates[0].id,
                # upstream has no NOT_RUN (a workload given up on after the solution hung is a TIMEOUT there)
                # nor IMPOSSIBLE_TIME (its nearest word: REWARD_HACK, the log starting with the code)
                TRACE_WORDS.get(o.status, o.status),
                trace_env,
                log=o.log or "",
                correctness=o.correctness,
                performance=o.performance,
                timestamp=o.finished_at,
            )
        )
    return out


def _all(cases: tuple[Case, ...], status: str, log: str) -> tuple[WorkloadOutcome, ...]:
    return tuple(WorkloadOutcome(c.id, status, log) for c in cases)


def compile_problem(
    problem: Problem, staging: Path, opts: BenchOptions, say, known: CompileRecord | None = None
) -> tuple[CompileRecord | None, tuple[WorkloadOutcome, ...] | None]:
    """(compile record, outcomes when the build decides every workload) for the sources staged under
    `staging`/solution. Also scripts/prebuild_solutions.py's build, so its cache keys are bench's.
    `known`: the same build made ahead in a batch (compiler.compile_candidate)."""
    sol = problem.candidates[0]
    flags, reason = languages.cpp_flags(sol.languages, sol.dependencies)
    if reason:
        return None, _all(problem.cases, Status.RUNTIME_ERROR, UNAVAILABLE + reason)
    say(f"compile {sol.id}: {sol.build_summary(True)}")
    built = solution_build(sol, staging / "solution", flags)
    rec = compile_candidate(
        bench_project_root(opts), built, opts.compile_timeout, sandbox=jail.resolve(opts.sandbox), known=known
    )
    if rec.status == BuildStatus.TIMEOUT:
        return rec, _all(
            problem.cases,
            Status.TIMEOUT,
            f"the build did not finish within --compile-timeout {opts.compile_timeout:g} s\n{build_log(rec)}",
        )
    if rec.status != BuildStatus.OK:
        return rec, _all(
            problem.cases, Status.COMPILE_ERROR, build_log(rec) or "the build failed (no output)"
        )
    return rec, None


def _cpp_unavailable(rec: CompileRecord, device: str) -> str | None:
    reason = languages.cpp_run_unavailable(device)
    if reason and rec.check_only:
        check = rec.cuda_check or {}
        reason += (
            f" (compile check: {check.get('status')}"
            + (f"; {check['note']}" if check.get("note") else "")
            + ")"
        )
    return reason


class SolDoor(FrontDoor):
    """bench's part of the stages (pipeline.run_stages): a SOL-ExecBench solution on its problem's workloads.
    The regression gate compares with baselines/<definition>.json; a suspected slowdown is decided in the
    same run by the baseline's own solution (solexec.build.stage_sol_baseline) in the reference's place."""

    FORMAT = SOL_FORMAT

    def __init__(self, problem: Problem, cand: Candidate, opts: BenchOptions):
        self.problem, self.cand, self.opts, self.staging = problem, cand, opts, None
        self.workloads = problem.payload[1]  # the SOL loader's parse
        self.evaluating = f"evaluate {cand.id}"

    @functools.cached_property
    def worker_jail(self) -> tuple[JailInfo, JailSpec, Path]:
        """The worker's sandbox, what its jail shows (its staging dir, made here), and the store it must
        not see."""
        opts = self.opts
        self.staging = jail.scratch_dir("sol")
        root = bench_project_root(opts, required=False)
        artifacts = Path(opts.artifacts) if opts.artifacts else root / "artifacts"
        readable = [self.problem.project_root, root, os.environ.get(DATA_ROOT_VAR)]
        memory = environment.cpu_memory_limit(opts.memory_limit_gb)
        spec = worker_spec(readable, root, artifacts, memory, candidate=self.staging)
        return jail.resolve(opts.sandbox), spec, artifacts

    def new_worker(self, ahead: bool) -> ChildRun:
        opts = self.opts
        if self.cand.group == "cpp" or not opts.artifacts:
            bench_project_root(opts)  # before anything runs: where the build and the attempt will go
        sandbox, spec, _ = self.worker_jail
        # no CUDA: a no-op; ahead: CUPTI's warm-up makes a CUDA context, so it waits for the job
        warm = not ahead and opts.method in ("auto", "cupti") and not (opts.device or "").startswith("cpu")
        return ChildRun(
            None,
            str(self.staging / "worker.log"),
            None,
            warm_profiler=warm,
            sandbox=sandbox,
            spec=spec,
            ahead=ahead,
        )

    def prepare(self) -> Prepared:
        opts = self.opts
        # the worker loads torch and starts CUPTI while this process checks the device, the environment
        # and the build (seconds each on a GPU machine); in a batch it may have started ahead
        self.start_worker()
        sandbox, spec, artifacts = self.worker_jail
        root = bench_project_root(opts, required=False)
        device = environment.pick_device(opts.device)
        settings = check_options(opts, device)
        check_memory(self.workloads, device, opts)
        env = environment.collect()
        salt = opts.seed_salt if opts.seed_salt is not None else secrets.token_hex(16)
        stage_sources(self.cand, self.staging / "solution")
        # the roofline's memory ceiling (cached per environment), for the impossible-time floor (solexec.floor)
        env = env.measured(bandwidth.ensure(root, env.key, device) if root is not None else None)
        return Prepared(
            device,
            env,
            salt,
            sandbox,
            settings,
            opts.timeout,
            opts.compile_timeout,
            root,
            artifacts,
            give_up_after=opts.give_up_after,
            jail_spec=spec,
        )

    def build(self, prep: Prepared, say) -> Built:
        compile_rec, outcomes = None, None
        if self.cand.group == "cpp":
            compile_rec, outcomes = compile_problem(
                self.problem, self.staging, self.opts, say, self.build_ahead
            )
            unavailable = None if outcomes else _cpp_unavailable(compile_rec, prep.device)
        else:
            unavailable = languages.python_unavailable(self.cand.languages, prep.device, prep.env)
        if outcomes is None and unavailable:
            outcomes = _all(self.problem.cases, Status.RUNTIME_ERROR, UNAVAILABLE + unavailable)
        return Built(compile_rec, outcomes, unavailable)

    def job(self, prep: Prepared, built: Built) -> SolJob | None:
        if built.decided is not None:
            return None
        return SolJob(
            device=prep.device,
            salt=prep.salt,
            settings=prep.settings,
            definition_name=self.problem.id,
            reference=self.problem.reference,
            solution=job_entry(self.cand, self.staging / "solution", built.compile),
            cases=[c.to_dict() for c in self.problem.cases],
            memory_limit_bytes=environment.cpu_memory_limit(self.opts.memory_limit_gb),
        )

    def stage_timeout(self, job: SolJob) -> float:
        return self.opts.timeout * (len(job.cases) + 1)

    def outcome(self, prep: Prepared, built: Built, results: WorkerResults) -> Outcome:
        outcomes = (
            built.decided if built.decided is not None else outcomes_from_results(results, self.problem.cases)
        )
        outcomes = floor.judge_times(*self.problem.payload, outcomes, prep.env.copy_bandwidth_Bps)
        trace_list, unavailable = build_traces(self.problem, outcomes, prep.env), built.unavailable
        if outcomes and all(o.log.startswith(UNAVAILABLE) for o in outcomes):
            unavailable = unavailable or outcomes[0].log[len(UNAVAILABLE) :]
        code = exit_code(trace_list, unavailable)
        cases = [to_json(replace(o, bench=None)) for o in outcomes]
        bench_records = [{"id": o.id, **o.bench} for o in outcomes if o.bench]
        status, correctness, bench = _summaries(cases, bench_records, code)
        return Outcome(
            status,
            code,
            correctness,
            bench,
            replace(results, cases=cases),
            bench_records,
            prep.settings,
            {"traces": trace_list, "unavailable": unavailable},
        )

    def find_baseline(self, prep: Prepared) -> tuple[Path | None, str | None, list[str]]:
        from mini_kv.judge.regression import find_baseline

        path = find_baseline(prep.root, _safe(self.problem.id))[0] if prep.root is not None else None
        return path, "definition", []

    def identity(self, prep: Prepared) -> Identity:
        return sol_identity(self.problem, prep.settings, prep.env, prep.device)

    def build_baseline(self, baseline: dict, prep: Prepared, job: SolJob) -> tuple[SolutionEntry, dict]:
        from mini_kv.solexec.build import stage_sol_baseline

        entry = stage_sol_baseline(
            baseline,
            prep.root,
            prep.artifacts,
            self.staging / "baseline",
            job.definition_name,
            prep.compile_timeout,
        )
        return entry, entry

    def confirm_job(self, job: SolJob, case_id: str) -> SolJob:
        return job.replace(
            cases=[c for c in job.cases if c["id"] == case_id],
            settings=replace(job.settings.interleaved(), rounds=1),
        )

    def timed(self, res: WorkerResults, case_id: str) -> tuple[dict | None, str | None, str | None]:
        rec = next((r for r in res.cases if r.get("id") == case_id), {})
        why = rec.get("log") or rec.get("reason") or (res.load or {}).get("reason")
        return ({**rec["bench"], "order": None} if rec.get("bench") else None), why, rec.get("integrity")

    def evaluated(self) -> Evaluated:
        return Evaluated(_safe(self.cand.id), self.cand.op, SOL_FORMAT)

    def reference_digest(self) -> str:
        return sha256_text(self.problem.reference)

    def source_dir(self) -> Path | None:
        """The solution file's directory; None for sources given in memory (mini_kv.api)."""
        path = Path(str(self.opts.solution)) if self.opts.solution else None
        return path.resolve().parent if path is not None and path.is_file() else None

    def write_files(self, w, built: Built, out: Outcome) -> None:
        sol = self.cand
        w.json("definition.json", self.problem.raw)
        w.text("workload.jsonl", "".join(json.dumps(to_json(wl.traced())) + "\n" for wl in self.workloads))
        w.json("solution.json", sol.resolved())
        for src in sol.sources:
            w.text(f"sources/{src.path}", src.content)
        w.text("traces.jsonl", "".join(traces.dumps(t) + "\n" for t in out.detail["traces"]))

    def close(self) -> None:
        if self.warm is not None:  # never sent a job (nothing to evaluate, or an error on the way)
            self.warm.close(kill=True)
        if self.staging is not None and not self.opts.keep_staging:
            shutil.rmtree(self.staging, ignore_errors=True)


@dataclass(frozen=True)
class SkippedWorkload:
    """A workload left out (too large for the device within the budget) and why."""

    id: str
    reason: str | None


@dataclass(frozen=True)
class BenchResult:
    """`bench`'s result, what its report (solexec.table.print_report) and `--json` print."""

    traces: tuple[traces.Trace, ...]  # one per workload not SKIPPED, in the workloads' order
    status: str
    exit_code: ExitCode
    attempt: str
    index_warning: str | None
    compile: CompileRecord | None
    device: str
    settings: RunSettings
    unavailable: str | None
    skipped: tuple[SkippedWorkload, ...]
    counts: dict[str, int]  # workloads by status (SKIPPED and NOT_RUN included): the summary line
    benchmark: dict | None  # the timing's headline (its stability): the summary line
    staging: str | None  # the staging dir, when kept
    definition: str
    solution: str
    duration_s: float
    phases: dict
    regression: RegressionVerdict | None
    sandbox: JailRecord | None  # the jail's record (its summary line names gaps)
    kernels: dict  # per workload, the ops and kernels its first call ran (integrity.kernel_census): bench -v


def sol_door(problem_dir: str | None, opts: BenchOptions) -> SolDoor:
    """bench's front door for `opts.solution` on the problem in `problem_dir`."""
    problem = load_problem(problem_dir, opts)
    return SolDoor(problem, problem.candidates[0], opts)


def bench(
    problem_dir: str | None,
    opts: BenchOptions,
    progress=None,
    line=None,
    outbox: Path | None = None,
    references: ReferenceCache | None = None,
    door: SolDoor | None = None,
) -> BenchResult:
    """`references`: in a batch, the reference timings its solutions share (pipeline.ReferenceCache);
    `door`: the solution's door made by the batch (cluster.batch.run_item), else made here."""
    t0 = time.perf_counter()
    door = door if door is not None else sol_door(problem_dir, opts)
    say = progress and (lambda msg, **_: progress(msg))
    run = run_stages(door, say, line, outbox, references)
    cases = run.out.results.cases
    return BenchResult(
        traces=tuple(run.out.detail["traces"]),
        status=run.out.status,
        exit_code=run.code,
        attempt=str(run.attempt),
        index_warning=run.index_warning,
        compile=run.built.compile,
        device=run.prep.device,
        settings=run.prep.settings,
        unavailable=run.out.detail["unavailable"],
        skipped=tuple(
            SkippedWorkload(c["id"], c.get("log")) for c in cases if c.get("status") == Status.SKIPPED
        ),
        counts=run.summary["correctness"]["counts"],
        benchmark=run.summary.get("benchmark"),
        staging=str(door.staging) if opts.keep_staging else None,
        definition=door.problem.id,
        solution=door.cand.id,
        duration_s=round(time.perf_counter() - t0, 3),
        phases=run.phases,
        regression=run.regression,
        sandbox=run.out.results.sandbox,
        kernels={c["id"]: c["kernels"] for c in cases if c.get("kernels")},
    )


def exit_code(trace_list: list[traces.Trace], unavailable: str | None) -> ExitCode:
    """0 only when every workload passed; otherwise the worst kind of failure (highest code)."""
    statuses = {t.evaluation.status for t in trace_list}
    if statuses == {Status.PASSED}:
        return ExitCode.OK
    if not statuses:  # every workload skipped (too large for the device within the budget): nothing timed
        return ExitCode.CONFIG if unavailable else ExitCode.BENCHMARK
    if unavailable:
        return ExitCode.CONFIG
    worst = {Status.COMPILE_ERROR: ExitCode.COMPILE, Status.INVALID_REFERENCE: ExitCode.CONFIG}
    return max(worst.get(s, ExitCode.CORRECTNESS) for s in statuses - {Status.PASSED})


# ------------------------------------------------------------------------------------ attempt


def _summaries(cases: list[dict], bench_records: list[dict], code: ExitCode) -> tuple[str, dict, dict]:
    """Status, correctness and benchmark summaries, by the function the index recomputes them with."""
    from mini_kv.store.headline import sol_headline

    failed = Status.COMPILE_ERROR if code == ExitCode.COMPILE else Status.FAILED
    head = sol_headline(cases, bench_records, failed)
    return head.status, head.correctness, head.benchmark


def sol_identity(
    problem: Problem, settings: RunSettings, env: environment.Environment, device: str
) -> Identity:
    """What a SOL attempt is compared by."""
    return Identity(
        _safe(problem.id), problem.version, problem.operator, problem.suite_hash(settings), env.key, device
    )


def bench_project_root(opts: BenchOptions, required: bool = True) -> Path | None:
    """The project whose `.build/` cache (C++ solutions) and `artifacts/` store (without --artifacts)
    bench uses: the one the command runs in, else the one holding the solution file, as verify uses
    its card's. Outside both, a clear error rather than a store made in whatever directory this is."""
    from mini_kv.load.task_card import PROJECT_MARKERS, project_root_of

    for start in (Path.cwd(), Path(opts.solution).resolve().parent):
        root = project_root_of(start)
        if root is not None:
            return root
    if not required:
        return None
    raise ConfigError(
        str(opts.solution),
        "(file)",
        f"neither the working directory ({Path.cwd()}) nor the solution is inside a project (a "
        f"directory holding one of {', '.join(PROJECT_MARKERS)}), where bench keeps its build cache "
        "(.build/) and its attempts (artifacts/): run bench inside a project, or create an empty "
        ".mini-kv-project file in the directory to use as one",
    )
