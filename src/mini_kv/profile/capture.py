"""`mini-kv profile`: ncu around the target process on one fixed case, then re-import, parse, check.

Steps, each of which records a structured reason when it fails (reasons.PROFILE_REASONS):
find ncu -> CUDA visible -> the candidate's kernel names -> build (content-addressed cache) ->
`ncu ... python -m mini_kv.worker.child --job job.json --result-file target.events` (job kind
`profile_target`; its signed result becomes target.json) -> `ncu --import R --csv --page raw`
-> exactly one row of the candidate's kernel -> every required metric.
The profile directory is written whether or not it succeeded; only `status: ok` ones compare.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mini_kv import environment, jail
from mini_kv.codec import to_json
from mini_kv.errors import ConfigError, ExitCode
from mini_kv.model import Candidate, Case, Problem, sha256_file
from mini_kv.profile import metrics as metrics_mod
from mini_kv.profile import ncu as ncu_mod
from mini_kv.profile.reasons import FailureReason, ProfileFailure
from mini_kv.profile.store import (
    NcuRun,
    Profile,
    ProfiledCandidate,
    ProfiledCase,
    ProfiledTask,
    ProfileWriter,
)
from mini_kv.settings import DEFAULTS
from mini_kv.status import BuildStatus, ProfileStatus
from mini_kv.worker import channel
from mini_kv.worker.jobs import Event, Job, ProfileTargetJob

if TYPE_CHECKING:
    from mini_kv.compile.compiler import CompileRecord

# A fixed, public salt: profiles are evidence about a kernel, not a correctness check, and two
# candidates' profiles must see the same inputs to be comparable.
REPORT = "report.ncu-rep"


@dataclass
class ProfileOptions:
    case: str | None = None  # case id ("bench_4096x8192-float16") or base id; default: first bench case
    warmup: int = DEFAULTS.profile_warmup  # candidate calls before the profiled one (ncu --launch-skip)
    kernel: str | None = None  # profile only this one of the candidate's kernels
    seed_salt: str = DEFAULTS.profile_salt
    artifacts: str | None = None
    timeout: float = DEFAULTS.ncu_timeout_s  # seconds for the ncu run (and again for the import)
    compile_timeout: float | None = None
    prebuilt: str | None = None  # an ahead-of-time library instead of the JIT build
    ncu: str | None = None  # path of ncu (default: $MINI_KV_NCU, PATH, CUDA_HOME/bin)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pick_case(card: Problem, wanted: str | None) -> Case:
    """A case that runs on CUDA and returns a value: the named one, else the card's first bench case."""
    usable = [c for c in card.cases if c.runs_on("cuda") and c.kind != "illegal"]
    if wanted is None:
        bench = [c for c in usable if c.kind == "bench"]
        if not bench:
            raise ConfigError(card.path, "cases", "no bench case that runs on CUDA; pass --case")
        return bench[0]
    hits = [c for c in usable if c.id == wanted] or [c for c in usable if c.base_id == wanted]
    if len(hits) != 1:
        known = ", ".join(c.id for c in usable)
        what = "matches several dtypes" if hits else "is not a CUDA case of this card"
        raise ConfigError(card.path, "cases", f"--case {wanted!r} {what}; choose one of {known}")
    return hits[0]


@dataclass(frozen=True)
class ProfilePlan:
    """One profiled launch: the case (a card's Case, a SOL Workload), its seed, the kernels ncu matches
    after `warmup` skipped launches, and why no kernel was found (said only when none was)."""

    case: Any
    seed: int
    kernel_names: list[str]
    warmup: int
    no_kernels: str

    @property
    def kernel_filter(self) -> str | None:
        return metrics_mod.kernel_regex(self.kernel_names) if self.kernel_names else None


def plan(card: Problem, cand: Candidate, opts: ProfileOptions) -> ProfilePlan:
    """What will be profiled, and how; no side effects."""
    from mini_kv.worker.inputs import case_seed

    if opts.prebuilt and not Path(opts.prebuilt).is_file():
        raise ConfigError("--prebuilt", "", f"{opts.prebuilt} is not a file")
    case = pick_case(card, opts.case)
    found = ncu_mod.kernel_names(Path(card.project_root) / cand.path, list(cand.cuda_sources))
    seed, none = (
        case_seed(card.id, case.id, opts.seed_salt),
        f"no __global__ function in {list(cand.cuda_sources)}",
    )
    return kernel_plan(opts, case, seed, found, f"a __global__ kernel of {cand.id}", none)


def kernel_plan(
    opts: ProfileOptions, case, seed: int, found: list[str], of: str, no_kernels: str, strict: bool = True
) -> ProfilePlan:
    """The plan of one profiled launch: `found` kernels (`--kernel` must be one of them, if `strict` or any
    were found), the filter ncu gets, the warm-up launches it skips."""
    if opts.warmup < 1:
        raise ConfigError("--warmup", "", "at least one warm-up call is needed before the profiled launch")
    if opts.kernel is not None and opts.kernel not in found and (strict or found):
        raise ConfigError(
            "--kernel", "", f"{opts.kernel!r} is not {of} (found: {', '.join(found) or 'none'})"
        )
    return ProfilePlan(case, seed, [opts.kernel] if opts.kernel else found, opts.warmup, no_kernels)


def binding(task: ProfiledTask, cand: ProfiledCandidate, case: ProfiledCase, p: ProfilePlan, env) -> Profile:
    """profile.json's record before the steps fill it in, for a task card's candidate and a SOL solution
    alike."""
    return Profile(
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        task=task,
        candidate=cand,
        case=case,
        environment_key=env.key,
        ncu=NcuRun(p.kernel_names, p.kernel_filter, p.warmup, ncu_mod.SECTIONS),
    )


class Draft:
    """profile.json while the steps run: the record, replaced part by part as they find things (what a
    step found before it failed stays: the failed profile records it)."""

    def __init__(self, rec: Profile):
        self.rec = rec

    def found(self, part: str | None = None, **values) -> None:
        """`values` of the record's fields, or of the fields of its `part` (candidate, case, ncu)."""
        if part is not None:
            values = {part: replace(getattr(self.rec, part), **values)}
        self.rec = replace(self.rec, **values)


def _build(card: Problem, cand: Candidate, opts: ProfileOptions, w: ProfileWriter, rec: Draft) -> str:
    """The candidate's library: the prebuilt one, or the content-addressed JIT build (logs kept)."""
    from mini_kv.compile.compiler import compile_candidate

    if opts.prebuilt:
        lib = Path(opts.prebuilt).resolve()
        rec.found("candidate", library=str(lib), library_sha256=sha256_file(lib))
        return str(lib)
    comp = compile_candidate(
        Path(card.project_root),
        cand,
        timeout=opts.compile_timeout or card.timeouts["compile_s"],
        with_cuda=True,
    )
    return built(comp, w, rec)


def built(comp: CompileRecord, w: ProfileWriter, rec: Draft) -> str:
    """The library of a build record, its record and logs kept in the profile; COMPILE_FAILED otherwise."""
    w.json("compile.json", comp)
    for name, path in (comp.logs or {}).items():
        if Path(path).is_file():
            w.copy(f"logs/compile/{name}", Path(path))
    if comp.status != BuildStatus.OK:
        raise ProfileFailure("COMPILE_FAILED", f"build {comp.status}; see logs/compile/", build_key=comp.key)
    rec.found("candidate", library=comp.library, library_sha256=comp.library_sha256, build_key=comp.key)
    return comp.library


def _card_job(card: Problem, cand: Candidate, p: ProfilePlan, library: str) -> ProfileTargetJob:
    case: Case = p.case
    return ProfileTargetJob(
        library=library,
        op=cand.op,
        inputs=card.operator["inputs"],
        reference=card.reference,
        params=case.params,
        dtype=case.dtype,
        device="cuda:0",
        seed=p.seed,
        warmup=p.warmup,
        calls=1,
        tolerance=card.tolerances[case.dtype],
    )


def capture(
    ncu: str, job: Job, p: ProfilePlan, w: ProfileWriter, rec: Draft, timeout: float, cwd: str
) -> None:
    """Run ncu around the target (the worker child running `job`), re-import, parse; fills `rec`,
    raises ProfileFailure with the reason."""
    w.json("job.json", job.to_dict())
    # the worker child, with its signed events in a file: ncu stands between it and this process. Both
    # run jailed; they write only into `box`, from which this process copies the report and the events
    key = secrets.token_bytes(32)
    with jail.scratch("ncu") as box:
        shutil.copyfile(w.path("job.json"), box / "job.json")
        files = ["--job", str(box / "job.json"), "--result-file", str(box / "target.events")]
        target = [sys.executable, "-m", "mini_kv.worker.child", *files]
        report_base = box / REPORT[: -len(".ncu-rep")]
        cmd = ncu_mod.profile_command(ncu, report_base, p.kernel_filter, p.warmup, target)
        # the profiled python imports this mini_kv even if it is not installed
        path = os.pathsep.join(
            filter(None, (str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")))
        )
        run, out, err = ncu_mod.run_logged(
            "profile",
            cmd,
            w.path("logs/ncu-profile.log"),
            timeout,
            env={**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", channel.KEY_ENV: key.hex()},
            cwd=cwd,
            spec=_ncu_spec(ncu, job, cwd, box),
        )
        for name in (REPORT, "target.events"):
            jail.take_out(box, name, w.path(name))
    rec.found("ncu", commands=(*rec.rec.ncu.commands, run))
    _target_result(w, key)
    _judge_profile_run(run, out + err, w, rec)
    imp, out, err = _reimport(ncu, w, timeout)
    rec.found("ncu", commands=(*rec.rec.ncu.commands, imp))
    if imp.timed_out or imp.returncode != 0 or not out.strip():
        raise ProfileFailure(
            "REIMPORT_FAILED",
            f"`ncu --import` exited {imp.returncode}" + (" (timed out)" if imp.timed_out else ""),
            log_tail=ncu_mod.tail(out + err),
        )
    w.text("raw.csv", out)
    result = metrics_mod.analyze(out, p.kernel_filter)
    w.json(
        "metrics.json",
        {
            "schema_version": 1,
            "kernel": result.kernel,
            "metrics": to_json(result.metrics),
            "rows": result.rows,
        },
    )
    rec.found(kernel=result.kernel, summary=result.summary)


def _reimport(ncu: str, w: ProfileWriter, timeout: float) -> tuple[ncu_mod.Command, str, str]:
    """`ncu --import` of the kept report, jailed, from a copy in a fresh scratch dir: a jail of its own
    uid cannot reach the attempt's private directory, and the profiled target's box is its to tamper
    with (a link left there would turn a copy into it into a write elsewhere)."""
    with jail.scratch("ncu-import") as inbox:
        shutil.copyfile(w.path(REPORT), inbox / REPORT)
        return ncu_mod.run_logged(
            "import",
            ncu_mod.import_command(ncu, inbox / REPORT),
            w.path("logs/ncu-import.log"),
            timeout,
            spec=jail.JailSpec(read_only=(_ncu_home(ncu), str(inbox / REPORT))),
        )


def _ncu_home(ncu: str) -> str:
    """Nsight Compute's installation (ncu is often a link from the CUDA toolkit's bin/ into it)."""
    return str(Path(os.path.realpath(ncu)).parent)


def _ncu_spec(ncu: str, job: Job, cwd: str, box: Path) -> jail.JailSpec:
    """ncu and its target in one jail: ncu's installation, the project and what the job names
    read-only (the project's .build/ and artifacts/ hidden but for the named library), `box` writable,
    the GPU, perf_event_open and TCP on the jail's own loopback (ncu talks to its target over it)."""
    from mini_kv.load.task_card import find_project_root
    from mini_kv.runner import job_paths

    root = find_project_root(Path(cwd))
    named = [p for p in job_paths(job.to_dict()) if os.path.exists(p)]
    return jail.JailSpec(
        read_only=(_ncu_home(ncu), str(root), *named),
        writable=(str(box),),
        hidden=tuple(str(root / d) for d in (".build", "artifacts") if (root / d).exists()),
        gpu=True,
        profiler=True,
    )


def _target_result(w: ProfileWriter, key: bytes) -> None:
    """target.json: the target's signed `result`, or why it has none (a `fatal` event, unsigned data)."""
    path = w.partial / "target.events"
    if path.is_file():  # else the target never started: judged below
        ev = (channel.read_file(path, key) or [{"reason": "the target sent no result"}])[0]
        w.json(
            "target.json",
            ev["result"]
            if ev.get("event") == Event.RESULT
            else {
                "ok": False,
                "error": ev.get("reason") or f"unsigned data: {ev.get('line')}",
                "traceback": ev.get("traceback"),
            },
        )


def _judge_profile_run(run: ncu_mod.Command, out: str, w: ProfileWriter, rec: Draft) -> None:
    """Name what went wrong in the ncu run (`out`: its output), most specific reason first."""
    log_tail = ncu_mod.tail(out)
    if ncu_mod.PERMISSION_MARK in out:
        raise ProfileFailure(
            "PERMISSION_DENIED", "ncu may not read the performance counters here", log_tail=log_tail
        )
    result_file = w.partial / "target.json"
    target = None
    if result_file.is_file():
        try:
            target = json.loads(result_file.read_text())
        except ValueError:
            target = {"ok": False, "error": "target.json is not JSON"}
    rec.found(target=target)
    if run.timed_out:
        raise ProfileFailure(
            "NCU_FAILED", f"ncu did not finish within {run.duration_s:.0f} s", log_tail=log_tail
        )
    if target is not None and not target.get("ok"):
        raise ProfileFailure("TARGET_FAILED", target.get("error", "the target failed"), log_tail=log_tail)
    if run.returncode != 0:
        raise ProfileFailure(
            "NCU_FAILED", f"ncu exited {run.returncode}", returncode=run.returncode, log_tail=log_tail
        )
    if target is None:
        raise ProfileFailure(
            "TARGET_FAILED", "the target wrote no result (did ncu run it?)", log_tail=log_tail
        )
    rec.found("case", input_sha256=target.get("input_sha256"))
    rec.found(device=target.get("device_name"))
    check = target.get("output_check") or {}
    if not check.get("ok"):
        raise ProfileFailure("WRONG_OUTPUT", check.get("reason") or "output check failed", check=check)
    if ncu_mod.NO_KERNELS_MARK in out or not (w.partial / REPORT).is_file():
        raise ProfileFailure(
            "NO_MATCHING_KERNEL",
            "ncu profiled no kernel: nothing matched "
            f"{rec.rec.ncu.kernel_filter} after {rec.rec.ncu.launch_skip} skipped launches",
            log_tail=log_tail,
        )


@dataclass(frozen=True)
class ProfileResult:
    """What `profile` says of one profile (`--json` prints it); profile.json holds the whole record."""

    status: str
    exit_code: int
    reason: FailureReason | None
    path: str
    profile_id: str
    summary: dict | None
    kernel: str | None
    case: str
    candidate: str


@dataclass
class Target:
    """What `profile` profiles: a task-card candidate, or a SOL-ExecBench solution (profile.sol)."""

    task_id: str
    candidate: str
    plan: ProfilePlan
    rec: Profile  # profile.json's record before the steps (binding)
    records: dict  # the JSON files written beside it
    build: Callable[
        [ProfileWriter, Draft], Job
    ]  # builds (ProfileFailure if it cannot), returns the target's job
    cwd: str


def profile_candidate(card: Problem, cand: Candidate, opts: ProfileOptions, progress=None) -> ProfileResult:
    """Profile `cand` on one case; always writes a profile directory."""
    from mini_kv.compile.compiler import candidate_files

    p, env, cdir = plan(card, cand, opts), environment.collect(), Path(card.project_root) / cand.path
    case: Case = p.case
    sources = tuple(
        {"path": str(f.relative_to(cdir)), "sha256": sha256_file(f)} for f in candidate_files(cdir)
    )
    rec = binding(  # what the profile is about: task, candidate sources, case, seed, environment
        ProfiledTask(
            card.id,
            card.version,
            card.path,
            card.suite_hash(),
            {k: card.operator[k] for k in ("name", "version", "reference", "inputs")},
        ),
        ProfiledCandidate(cand.id, cand.op, cand.path, sources, bool(opts.prebuilt)),
        ProfiledCase(
            case.id,
            case.base_id,
            case.kind,
            case.dtype,
            case.params,
            p.seed,
            opts.seed_salt,
            card.tolerances[case.dtype],
        ),
        p,
        env,
    )
    records = {
        "task_card.json": {"path": card.path, "card": card.raw, "suite_hash": card.suite_hash()},
        "candidate_manifest.json": cand.manifest(files=sources),
        "environment.json": env,
    }
    target = Target(
        card.id,
        cand.id,
        p,
        rec,
        records,
        lambda w, r: _card_job(card, cand, p, _build(card, cand, opts, w, r)),
        card.project_root,
    )
    return run_profile(
        target,
        Path(opts.artifacts) if opts.artifacts else Path(card.project_root) / "artifacts",
        opts,
        progress,
    )


def run_profile(t: Target, artifacts: Path, opts: ProfileOptions, progress=None) -> ProfileResult:
    """The steps every profile takes (module docstring); always writes the profile directory."""
    say = progress or (lambda msg: None)
    rec, p = Draft(t.rec), t.plan
    w = ProfileWriter(artifacts, t.task_id, t.candidate)
    for name, doc in t.records.items():
        w.json(name, doc)
    try:
        ncu = ncu_mod.find_ncu(opts.ncu)
        if ncu is None:
            raise ProfileFailure("NCU_NOT_FOUND", "install Nsight Compute or pass --ncu / set MINI_KV_NCU")
        rec.found("ncu", path=ncu, version=ncu_mod.ncu_version(ncu))
        if not cuda_available():
            raise ProfileFailure("NO_CUDA", "torch sees no CUDA device; profile on a GPU machine")
        if not p.kernel_names:
            raise ProfileFailure("NO_KERNEL_NAMES", p.no_kernels)
        say(f"build {t.candidate}")
        job = t.build(w, rec)
        say(f"ncu: {t.candidate} on {rec.rec.case.id}")
        capture(ncu, job, p, w, rec, opts.timeout, t.cwd)
        reason = None
        rec.found(status=ProfileStatus.OK, reason=None, exit_code=int(ExitCode.OK))
    except ProfileFailure as exc:
        reason = exc.reason
        rec.found(status=ProfileStatus.FAILED, reason=reason, exit_code=int(exc.exit_code))
    path, r = w.commit(rec.rec), rec.rec
    return ProfileResult(
        r.status,
        r.exit_code,
        reason,
        str(path),
        w.profile_id,
        to_json(r.summary),
        r.kernel,
        r.case.id,
        t.candidate,
    )
