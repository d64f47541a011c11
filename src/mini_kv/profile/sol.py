"""`mini-kv profile --solution`: a SOL-ExecBench solution under ncu on one workload (capture.run_profile's
steps and profile directory). The target calls the entry point on the workload's inputs, made as `bench`
makes them, then checks its output against the reference. Kernels: a C++ solution's __global__ functions,
a Python one's @triton.jit functions, else `--kernel NAME` (e.g. a library kernel PyTorch launches).
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from mini_kv import jail
from mini_kv.environment import Environment
from mini_kv.errors import ConfigError
from mini_kv.model import sha256_text
from mini_kv.profile import capture
from mini_kv.profile.ncu import _GLOBAL
from mini_kv.profile.store import ProfiledCandidate, ProfiledCase, ProfiledTask
from mini_kv.profile.target import TargetResult
from mini_kv.status import BuildStatus
from mini_kv.worker.jobs import SolProfileTargetJob

_TRITON = re.compile(r"@triton\.jit\b[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+([A-Za-z_]\w*)")


def kernel_names(sol) -> list[str]:
    pattern, suffixes = (_TRITON, (".py",)) if sol.group == "python" else (_GLOBAL, (".cu", ".cuh"))
    names: list[str] = []
    for src in sol.sources:
        if PurePosixPath(src.path).suffix in suffixes:
            text = (
                re.sub(r"//[^\n]*|/\*.*?\*/", "", src.content, flags=re.S)
                if sol.group == "cpp"
                else src.content
            )
            names += [n for n in pattern.findall(text) if n not in names]
    return names


def plan(prob, opts: capture.ProfileOptions) -> capture.ProfilePlan:
    """The workload (--case: its uuid; default the first), seed, kernels; no side effects."""
    from mini_kv.worker.inputs import case_seed

    wls, sol = prob.payload[1], prob.candidates[0]
    hits = wls[:1] if opts.case is None else [w for w in wls if w.uuid == opts.case]
    if not hits:
        raise ConfigError(
            "--case",
            "",
            f"{opts.case!r} is not a workload of {prob.id}; choose one of " + ", ".join(w.uuid for w in wls),
        )
    seed = case_seed(prob.id, hits[0].uuid, opts.seed_salt)
    none = f"no __global__ or @triton.jit function in {sol.id}'s sources: name the kernel to profile with --kernel"
    return capture.kernel_plan(
        opts, hits[0], seed, kernel_names(sol), f"a kernel of {sol.id}", none, strict=False
    )


def target(prob, opts: capture.ProfileOptions, staging: Path, env: Environment) -> capture.Target:
    """capture.Target of a solution: task = its definition, case = the workload, target = run_target."""
    from mini_kv.solexec.build import job_entry, stage_sources
    from mini_kv.solexec.run import _case, _safe, sol_identity

    p, (d, _), sol = plan(prob, opts), prob.payload, prob.candidates[0]
    wl, ident = p.case, sol_identity(prob, {}, env, "cuda:0")
    rec = capture.binding(
        ProfiledTask(
            ident.task_id,
            ident.task_version,
            str(Path(d.path).parent),
            ident.suite_hash,
            {**ident.operator, "reference": "definition.json", "inputs": "workload.jsonl"},
        ),
        ProfiledCandidate(
            _safe(sol.id),
            sol.op,
            sol.path,
            tuple({"path": s.path, "sha256": sha256_text(s.content)} for s in sol.sources),
            False,
        ),
        ProfiledCase(
            wl.uuid,
            wl.uuid,
            "workload",
            "",
            dict(wl.axes),
            p.seed,
            opts.seed_salt,
            {"atol": wl.tolerance["max_atol"], "rtol": wl.tolerance["max_rtol"]},
        ),
        p,
        env,
    )

    def build(w, r) -> SolProfileTargetJob:
        stage_sources(sol, staging / "solution")
        comp = None
        if sol.group == "cpp":
            from mini_kv.compile.compiler import CompileRecord
            from mini_kv.solexec.run import BenchOptions, compile_problem

            comp, _ = compile_problem(
                prob,
                staging,
                BenchOptions(solution=sol.path, compile_timeout=opts.compile_timeout or 600.0),
                lambda msg: None,
            )
            capture.built(comp or CompileRecord(status=BuildStatus.UNAVAILABLE), w, r)
        return SolProfileTargetJob(
            device="cuda:0",
            reference=d.reference,
            seed=p.seed,
            warmup=p.warmup,
            calls=1,
            solution=job_entry(sol, staging / "solution", comp),
            case=_case(d, wl, 0).to_dict(),
        )

    records = {"definition.json": d.raw, "solution.json": sol.resolved(), "environment.json": env}
    return capture.Target(ident.task_id, _safe(sol.id), p, rec, records, build, str(Path.cwd()))


def profile_solution(prob, opts: capture.ProfileOptions, progress=None) -> capture.ProfileResult:

    from mini_kv import environment
    from mini_kv.solexec.run import BenchOptions, bench_project_root

    artifacts = (
        Path(opts.artifacts)
        if opts.artifacts
        else bench_project_root(BenchOptions(prob.candidates[0].path)) / "artifacts"
    )
    with jail.scratch("sol-profile") as staging:
        return capture.run_profile(
            target(prob, opts, Path(staging), environment.collect()), artifacts, opts, progress
        )


def run_target(job) -> TargetResult:
    """The profiled process: the solution `warmup` + `calls` times, then its last output against the reference."""
    import torch

    from mini_kv.profile.target import input_digest
    from mini_kv.worker.compare import compare_matched
    from mini_kv.worker.inputs import allocate_outputs, clone_args, make_inputs, normalize_outputs
    from mini_kv.worker.loader import import_solution, load_source

    device, sol, case = job.device, job.solution, job.case
    torch.cuda.set_device(torch.device(device))
    reference = load_source(job.reference)
    fn = getattr(import_solution(sol), sol["entry_function"])
    sig, wl = case["signature"], case["workload"]
    args = make_inputs(sig, wl, vars(reference), device, int(job.seed), {})
    pristine = clone_args(args)
    outs = allocate_outputs(sig, device) if sol["dps"] else []
    for _ in range(int(job.warmup) + int(job.calls)):
        res = fn(*args, *outs)
    torch.cuda.synchronize()
    outs = outs if sol["dps"] else normalize_outputs(res, sig, device)
    checks = [
        compare_matched(o, r, wl["tolerance"])
        for o, r in zip(outs, normalize_outputs(reference.run(*pristine), sig, device), strict=True)
    ]
    bad = next((c for c in checks if not c.ok), None)
    return TargetResult(
        input_digest(pristine),
        int(job.warmup) + int(job.calls),
        {"ok": bad is None, "reason": bad and bad.reason},
        torch.cuda.get_device_name(torch.device(device)),
    )
