"""Worker job kind `sol`: evaluate a SOL-ExecBench solution, one `case` event per workload.

Runs inside `mini_kv.worker.child` (same signed channel, memory cap and restart-after-crash). The
`load` stage loads the reference, snapshots the functions the verdict depends on, then imports the
solution (a Python module, or the torch extension module the compiler built); a failed load says
which status every workload gets.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import PurePosixPath

from mini_kv.status import Status
from mini_kv.worker.channel import POISONED_MARKERS, Channel
from mini_kv.worker.jobs import Event


def _load_reference(path: str):
    spec = importlib.util.spec_from_file_location("mini_kv_sol_reference", path)
    module = importlib.util.module_from_spec(spec)
    # a real file: decorators such as @triton.jit read the source back with inspect
    spec.loader.exec_module(module)
    return module


def _import_solution(sol: dict):
    if sol["group"] == "cpp":
        spec = importlib.util.spec_from_file_location(sol["module"], sol["library"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    sys.path.insert(0, sol["dir"])  # so the entry file can import the solution's other files
    name = ".".join(PurePosixPath(sol["entry_file"]).with_suffix("").parts)
    return importlib.import_module(name)


def _import_beside(base: dict, sol: dict):
    """The baseline's solution beside the candidate's (the regression gate). Python modules are imported by
    name: the candidate's step out of sys.modules while the baseline's (same names) are imported."""
    if base["group"] == "cpp":  # a built module named after its build key
        return _import_solution(base)

    def under(d: str) -> list[str]:
        return [
            n
            for n, m in list(sys.modules.items())
            if (getattr(m, "__file__", None) or "").startswith(d + os.sep)
        ]

    theirs = {n: sys.modules.pop(n) for n in under(sol["dir"])}
    try:
        return _import_solution(base)
    finally:
        sys.path.remove(base["dir"])
        for n in under(base["dir"]):
            del sys.modules[n]
        sys.modules.update(theirs)


def _fail(chan: Channel, status: str, reason: str) -> None:
    # a traceback only where an exception is being handled (else format_exc says "NoneType: None")
    tb = traceback.format_exc()[-4000:] if sys.exc_info()[0] is not None else None
    chan.send(event=Event.LOAD, ok=False, status=status, reason=reason, traceback=tb)


def _load(job: dict, chan: Channel):
    """(reference module, solution function, integrity snapshot), or None after sending a failed load."""
    from mini_kv.worker import integrity

    # a `begin` before each import: should the process exit, crash or hang inside one, the parent
    # knows whose code it was (the reference's: INVALID_REFERENCE, not the solution's fault)
    chan.send(event=Event.BEGIN, stage="reference", case="(loading the reference)")
    try:
        reference = _load_reference(job.reference_file)
        ref_fn = reference.run
    except BaseException as exc:  # noqa: BLE001 - also sys.exit() at import; the problem's fault either way
        return _fail(
            chan, Status.INVALID_REFERENCE, f"the reference does not load: {type(exc).__name__}: {exc}"
        )
    snap = integrity.snapshot()
    sol = job.solution
    chan.send(event=Event.BEGIN, stage="solution", case="(importing the solution)")
    try:
        module = _import_solution(sol)
    except Exception as exc:  # noqa: BLE001 - a solution that cannot be imported cannot be built
        what = "built module" if sol["group"] == "cpp" else sol["entry_file"]
        return _fail(
            chan, Status.COMPILE_ERROR, f"importing the solution ({what}) failed: {type(exc).__name__}: {exc}"
        )
    fn = getattr(module, sol["entry_function"], None)
    if not callable(fn):
        return _fail(
            chan,
            Status.COMPILE_ERROR,
            f"the solution has no function {sol['entry_function']!r} "
            f"(entry point {sol['entry_file']}::{sol['entry_function']})",
        )
    try:
        integrity.Guard(snap).check("importing the solution")
    except integrity.Violation as v:
        return _fail(chan, Status.REWARD_HACK, integrity.reward_hack_log(v.code, v.message))
    return reference, ref_fn, fn, snap


def run_job(job: dict, chan: Channel) -> int:
    import torch

    from mini_kv.solexec.evaluate import Context, evaluate_workload
    from mini_kv.worker import integrity

    device = job.device
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device))
    # one intra-op thread on CPU: the reference gets no parallelism the solution lacks
    torch.set_num_threads(1)
    loaded = _load(job, chan)
    if loaded is None:
        return 0
    reference, ref_fn, fn, snap = loaded
    baseline = None
    if job.baseline:  # the regression gate's same-run comparison: it takes the reference's place in timing
        try:
            baseline = (
                getattr(_import_beside(job.baseline, job.solution), job.baseline["entry_function"]),
                job.baseline["dps"],
            )
            integrity.Guard(snap).check("loading the baseline's solution")
        except Exception as exc:  # noqa: BLE001 - a Violation too: either way no same-run comparison
            _fail(
                chan,
                Status.RUNTIME_ERROR,
                f"the baseline's solution did not load: {type(exc).__name__}: {exc}",
            )
            return 0
    chan.send(event=Event.LOAD, ok=True)
    ctx = Context(
        definition_name=job.definition_name,
        solution_fn=fn,
        reference_fn=ref_fn,
        reference_ns=vars(reference),
        dps=job.solution["dps"],
        device=device,
        salt=job.salt,
        settings=job.settings,
        snapshot=snap,
        baseline=baseline,
    )
    for case in job.cases:
        chan.send(event=Event.BEGIN, stage="correctness", case=case["id"])
        phase_s: dict[str, float] = {}
        rec = evaluate_workload(ctx, case, phase_s)
        chan.send(event=Event.CASE, record=rec, phase_s=phase_s)
        if rec["status"] == Status.RUNTIME_ERROR and any(m in rec["log"] for m in POISONED_MARKERS):
            return 4  # the CUDA context may be poisoned: the parent continues in a fresh child
    chan.send(event=Event.DONE)
    return 0
