"""compare-profiles' A/B timing of two profiled task-card candidates: the latency beside the profile deltas.

ncu replays each kernel many times with counters on; its durations are not latencies. The A/B is the
regression gate's same-run comparison (pipeline.time_beside) on the profiled case: B's profiled build in
the candidate's place and A's in the reference's, both loaded by one jailed subject and timed by its judge
with the benchmark stage's method, settings and integrity checks, the order alternating every repeat; the
first input set is the one both profiles recorded (same card, case and seed salt).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv.codec import optional
from mini_kv.model import JailRecord, sha256_file
from mini_kv.settings import DEFAULTS

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


def run_ab(
    a: Profile,
    b: Profile,
    repeats: int = DEFAULTS.ab_repeats,
    samples: int = DEFAULTS.ab_samples,
    warmup: int = DEFAULTS.ab_warmup,
    device: str = "cuda",
) -> ABTiming:
    """The timing of `a` against `b` (compare() has checked they profiled the same task and case), or why
    it could not run. `device`: cuda unless a test times CPU builds."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return ABTiming(
                False,
                "no CUDA device visible to torch: the A/B latency needs the GPU the "
                "profiles were taken on (the profiler's replay durations are not latencies)",
            )
    libs = {}
    for label, doc in (("A", a), ("B", b)):
        libs[label], why = _library(doc)
        if why:
            return ABTiming(False, why + "; re-run `mini-kv profile` here")
    return _time(a, b, libs, repeats, samples, warmup, device)


def _time(
    a: Profile, b: Profile, libs: dict, repeats: int, samples: int, warmup: int, device: str
) -> ABTiming:
    from mini_kv.environment import cpu_memory_limit
    from mini_kv.load.task_card import load_task_card
    from mini_kv.pipeline import CardDoor, NoTiming, VerifyOptions, time_beside, worker_spec

    card = load_task_card(a.task.card_path)
    if card.suite_hash() != a.task.suite_hash:
        return ABTiming(False, f"{a.task.card_path} changed since it was profiled; re-run `mini-kv profile`")
    case = next(c.to_dict() for c in card.cases if c.id == a.case.id)
    opts = VerifyOptions(device=device, prebuilt=libs["B"], seed_salt=a.case.seed_salt, give_up_after=1)
    door = CardDoor(card, card.candidate(b.candidate.id), opts)
    try:
        prep = door.prepare()
        # A's library, wherever its profile was built, shows in the jail as B's (--prebuilt) does; the door's
        # worker (it checked the card's modules) times them where its view already shows both (A under the
        # staged .build/), else it ends and a fresh one with that view does, none idle beside the timing
        spec = worker_spec(
            [prep.root, libs["B"], libs["A"]], prep.root, prep.artifacts, cpu_memory_limit(None)
        )
        first = door.first_child() if spec == prep.jail_spec else None
        door.close()
        prep = dataclasses.replace(prep, jail_spec=spec)
        job = door.job(prep, door.build(prep, lambda *_: None))
        settings = dataclasses.replace(job.benchmark, repeats=repeats, samples=samples, warmup=warmup)
        job = job.replace(cases=[], contract=[], bench_cases=[case], benchmark=settings)
        baseline = {"library": libs["A"], "op": a.candidate.op}
        rec, res = time_beside(door, prep, job, case["id"], baseline, first_child=first)
    except NoTiming as exc:  # a violation, a crash or a timeout of either side: the worker's record says
        return ABTiming(False, str(exc), error=True, integrity=exc.integrity)
    finally:
        door.close()
    # the engine's own record of each side: its samples and their summary (stats.summarize_repeats)
    by_label = {"A": rec["reference"], "B": rec["candidate"]}
    summary = {label: side["summary"] for label, side in by_label.items()}
    p50 = {label: s["overall"]["p50"] for label, s in summary.items()}
    return ABTiming(
        True,
        sandbox=res.sandbox,
        method=rec["method"],
        timer=rec["timer"],
        fallbacks=rec["fallbacks"],
        unit=rec["unit"],
        order=[["A" if who == "reference" else "B" for who in order] for order in rec["order"]],
        repeats=len(rec["order"]),
        samples_per_repeat=samples,
        candidates={"A": a.candidate.id, "B": b.candidate.id},
        p50_us=p50,
        p95_us={label: s["overall"]["p95"] for label, s in summary.items()},
        p50_robust_cv={label: s["p50_robust_cv"] for label, s in summary.items()},
        b_over_a=p50["B"] / p50["A"],
        samples={label: side["samples"] for label, side in by_label.items()},
    )
