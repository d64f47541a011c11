"""Same-process A/B timing of two profiled candidates: the latency beside the profile deltas.

ncu replays each kernel many times with counters on; its durations are not latencies. This
times both candidates the way the benchmark stage does (mini_kv.worker.timing.measure, the
same method chosen for both), in one child process, on the very inputs both profiles recorded
(same factory, same seed), alternating which goes first in each repeat.

Parent: `run_ab(a, b, ...)` -> worker child (job kind `ab`, sandboxed), which runs `time_pair`
under the integrity Guard as the benchmark stage does: a violation is the result (`integrity`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.codec import from_json, optional
from mini_kv.model import JailRecord, sha256_file
from mini_kv.settings import DEFAULTS
from mini_kv.worker.jobs import ABJob

if TYPE_CHECKING:
    from mini_kv.profile.store import Profile


@dataclass(frozen=True)
class ABTiming:
    """The A/B timing (compare-profiles' `timing`): both candidates' samples by label (A, B) and their
    summaries; or, `ran` False, why there is none (`error`: it failed, rather than was not asked for)."""

    ran: bool
    reason: str | None = optional()
    error: bool | None = optional()
    integrity: str | None = optional()  # the violation that ended it
    sandbox: JailRecord | None = optional()  # the jail the timing ran in
    method: str | None = optional()
    timer: str | None = optional()
    fallbacks: list | None = optional()
    unit: str | None = optional()
    order: list | None = optional()
    repeats: int | None = optional()
    samples_per_repeat: int | None = optional()
    candidates: dict | None = optional()  # label -> candidate id
    p50_us: dict | None = optional()
    p95_us: dict | None = optional()
    p50_robust_cv: dict | None = optional()
    b_over_a: float | None = optional()
    samples: dict | None = optional()


def _library(doc: Profile) -> tuple[str | None, str | None]:
    """The profiled library, if it is still on this machine unchanged: (path, why not)."""
    lib = doc.candidate.library
    if not lib or not Path(lib).is_file():
        return None, f"{doc.candidate.id}: the profiled library {lib} is not on this machine"
    if sha256_file(lib) != doc.candidate.library_sha256:
        return None, f"{doc.candidate.id}: {lib} changed since it was profiled"
    return lib, None


def job_for(a: Profile, b: Profile, repeats: int, samples: int, warmup: int, device: str = "cuda:0") -> ABJob:
    """The timing job; each candidate's `library` is filled in by the caller."""
    case = a.case  # compare() has checked that both profiles have the same case and inputs
    return ABJob(
        device=device,
        inputs=a.task.operator["inputs"],
        params=case.params,
        dtype=case.dtype,
        seed=case.seed,
        repeats=repeats,
        samples=samples,
        warmup=warmup,
        method="auto",
        candidates=[
            {"label": "A", "id": a.candidate.id, "op": a.candidate.op},
            {"label": "B", "id": b.candidate.id, "op": b.candidate.op},
        ],
    )


def run_ab(
    a: Profile,
    b: Profile,
    repeats: int = DEFAULTS.ab_repeats,
    samples: int = DEFAULTS.ab_samples,
    warmup: int = DEFAULTS.ab_warmup,
    timeout: float = DEFAULTS.ncu_timeout_s,
) -> ABTiming:
    """The timing of `a` against `b` in a jailed child, or why it could not run."""
    import torch

    from mini_kv.jail import JailSpec
    from mini_kv.load.task_card import find_project_root
    from mini_kv.runner import default_sandbox, run_one

    if not torch.cuda.is_available():
        return ABTiming(
            False,
            "no CUDA device visible to torch: the A/B latency needs the GPU the "
            "profiles were taken on (the profiler's replay durations are not latencies)",
        )
    job = job_for(a, b, repeats, samples, warmup)
    for entry, doc in zip(job.candidates, (a, b), strict=True):
        lib, why = _library(doc)
        if lib is None:
            return ABTiming(False, why + "; re-run `mini-kv profile` here")
        entry["library"] = lib
    # both candidates' code runs in this child, jailed as the worker is: it sees the two libraries and
    # the project whose input module it imports, read-only
    libs = tuple(entry["library"] for entry in job.candidates)
    spec = JailSpec(read_only=(*libs, str(find_project_root(Path.cwd()))), gpu=True)
    ev = run_one(job, timeout, sandbox=default_sandbox(), spec=spec)
    if not ev.ok:
        why = f"the timing process failed: {ev.reason}: {ev.traceback or ev.log_tail[-1500:]}"
        return ABTiming(False, why, error=True, sandbox=ev.sandbox)
    return replace(from_json(ABTiming, ev.result), sandbox=ev.sandbox)


def time_pair(job: ABJob) -> ABTiming:
    """Runs in the worker child: the harness is snapshot before either candidate loads and checked
    after loading and after timing; a violation is the result (`ran` False, `integrity`)."""
    from mini_kv.worker import integrity
    from mini_kv.worker.inputs import clone_args, import_path, make_case_inputs
    from mini_kv.worker.loader import load_op
    from mini_kv.worker.timing import CallRotation

    device = job.device
    args = make_case_inputs(import_path(job.inputs), job.params, job.dtype, device, int(job.seed))
    guard = integrity.Guard(integrity.snapshot())
    try:
        calls = {}
        for c in job.candidates:
            op = load_op(c["library"], c["op"])
            own = clone_args(args)  # the same values, independent buffers: neither sees the other's writes
            calls[c["label"]] = CallRotation([lambda op=op, own=own: op(*own)])
        guard.check("loading the candidates")
        result = _time(job, calls)
        guard.check("after timing")
    except integrity.Violation as v:
        return ABTiming(False, str(v), error=True, integrity=v.code)
    return result


def _time(job: ABJob, calls: dict) -> ABTiming:
    from mini_kv import stats
    from mini_kv.worker.engine import choose_method, timed
    from mini_kv.worker.timing import TIMER_LABELS, L2Flusher, measure, method_chain

    device = job.device
    flush = L2Flusher(device, False)
    for _ in range(job.warmup):
        for w in calls.values():
            w.next()()
    method, fallbacks = timed(
        lambda: choose_method(method_chain(job.method, device), list(calls.values()), device, flush, 20)
    )
    samples: dict[str, list] = {label: [] for label in calls}
    order_log = []
    for r in range(job.repeats):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        order_log.append(list(order))
        for label in order:
            samples[label].append(
                timed(lambda w=calls[label]: measure(w, method, job.samples, device, flush, 20)).samples
            )
    summary = {label: stats.summarize_repeats(s) for label, s in samples.items()}
    p50 = {label: summary[label].overall.p50 for label in calls}
    return ABTiming(
        True,
        method=method,
        timer=TIMER_LABELS[method],
        fallbacks=fallbacks,
        unit="us",
        order=order_log,
        repeats=job.repeats,
        samples_per_repeat=job.samples,
        candidates={c["label"]: c["id"] for c in job.candidates},
        p50_us=p50,
        p95_us={label: summary[label].overall.p95 for label in calls},
        p50_robust_cv={label: summary[label].p50_robust_cv for label in calls},
        b_over_a=p50["B"] / p50["A"],
        samples=samples,
    )
