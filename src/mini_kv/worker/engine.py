"""The evaluation engine: one case of either format, judged in the judge process.

A front door's job loads into a Format (worker/formats.py: a task card's op, a SOL problem's
workload): how a case's inputs are made, what the reference returns, how a candidate's result is read
and compared. On that one model this module runs every check both formats get:

- correctness rounds (`correctness`): fresh inputs per round at fresh addresses, the candidate called
  before the reference on even rounds and after it on odd ones, inputs unchanged, output integrity
  (a plain tensor aliasing nothing: integrity.check_output), structure and values, degenerate
  outputs, an earlier round's output unchanged after the next call; a wrong round examined once more
  to tell a cheat (work after return, deferred work, call-order dependence, a replayed result) from an
  honest wrong answer;
- timing (`time_case`): rotating input sets, a warm-up, one method for both sides, interleaved
  candidate/reference repeats within the case's budget, the harness checked around every measurement,
  then the post-timing check (STALE_OUTPUT_AFTER_TIMING).

Every finding that ends a case is one Failure (its `kind` and `code`); each format turns it into its
own status (formats.py), so one violation has one code whichever front door asked.
"""

from __future__ import annotations

import functools
import itertools
import time
import traceback
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field, replace

import torch

from mini_kv import stats
from mini_kv.codec import to_json
from mini_kv.settings import DEFAULTS, RunSettings
from mini_kv.worker import explain, integrity, shared
from mini_kv.worker import reference as refs
from mini_kv.worker.compare import Errors, Fp64Error, Matched, inputs_unchanged
from mini_kv.worker.explain import WrongReturn
from mini_kv.worker.inputs import case_seed, clone_args, tensor_nbytes, unwritten
from mini_kv.worker.integrity import Violation, check_output, degenerate, rewrite_in_place, same_bytes
from mini_kv.worker.link import MAX_FDS
from mini_kv.worker.remote import (
    Census,
    SpotCheck,
    StreamChecks,
    census_next,
    census_of,
    poison_before,
    refresh,
    stream_checks_of,
    stream_hold_next,
    workload_of,
)
from mini_kv.worker.timing import (
    TIMER_LABELS,
    Flush,
    L2Flusher,
    NoDeviceWorkError,
    TimingError,
    TimingGuardError,
    Warmup,
    is_cuda,
    l2_cache_bytes,
    measure,
    measure_until,
    method_chain,
    repeat_target,
    sample_floor,
    stopping_rule,
    warm_up,
)

SETTLE_S = 0.1  # how long a wrong output is left alone before it is read again (work after return)
PROBE_SAMPLES = 3
SLOW_SHARE = 0.8  # a round where the candidate's call took more than this share is the candidate's slowness
# a round on fewer input bytes is mostly the harness's fixed cost (messages, holds, checks) and says nothing
# of how a larger case scales: on an H200 a round on 68 bytes took 0.26 s, and scaled by size it skipped
# a 4-MiB case as a 4,800-s one
SCALE_FROM_BYTES = 1 << 20
MIN_ROUNDS = 2  # both call orders (candidate first, reference first), however tight the budget
# Setting a case up (its inputs and the reference's outputs) is repeated about twice more by the
# post-timing check (the same calls, then fresh inputs written into the same buffers).
SETUP_REPEATS = 3
POST_CHECK_PASSES = 2  # the post-timing check's passes over the input sets, each about a round


class Failure(Exception):
    """What ends a case. `kind`: VIOLATION (an integrity code in `code`), WRONG (`code`: values,
    structure, type, shape, dtype, device), RAISED (the candidate raised; `tb`), UNUSABLE (the case
    itself cannot run, the card's or problem's fault: `code` inputs or reference), SKIPPED (too large
    for the budget, or not applicable), TIMING (the timing itself failed). `stats`: the comparison's
    statistics, or the warm-up's."""

    VIOLATION, WRONG, RAISED, UNUSABLE, SKIPPED, TIMING = (
        "violation wrong raised unusable skipped timing".split()
    )

    def __init__(
        self, kind: str, message: str, code=None, stats: Errors | Matched | dict | None = None, tb: str = ""
    ):
        super().__init__(message)
        self.kind, self.message, self.code, self.stats, self.tb = kind, message, code, stats, tb


def _judging(fn):
    """A stage of the engine: an integrity violation raised anywhere inside it ends the case as a
    Failure of kind VIOLATION with the violation's own code."""

    @functools.wraps(fn)
    def stage(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Violation as v:
            raise Failure(Failure.VIOLATION, v.message, v.code) from None

    return stage


@dataclass(frozen=True)
class Checked:
    """One call's outputs against the reference's: `ok`; when not, `code` (values, or what else is
    wrong), `reason` and the first wrong output's name; the format's statistics, and `rank`: the larger,
    the worse the round (a record keeps the worst)."""

    ok: bool
    code: str | None = None
    reason: str | None = None
    output: str | None = None
    stats: Errors | Matched | None = None
    rank: tuple = ()


@dataclass(frozen=True)
class Passed:
    """Correctness rounds that all passed: the worst round's statistics, how many rounds ran, the
    quickest round's seconds (what a pass of the post-timing check costs), the reference against FP64."""

    stats: Errors | Matched | None
    rounds_run: int
    round_s: float
    reference_error: Fp64Error | None
    stream_checks: StreamChecks | None = None  # the rounds' calls held for the stream-order check


@dataclass(frozen=True)
class Timed:
    """A timed case: the record both formats store (timing_record), the post-timing check's finding
    (None: right after timing), and what a roofline needs (bytes of a set with its outputs, the first
    output's elements, the first input's element size)."""

    record: Timing
    post: Failure | None
    set_bytes: int
    numel: int
    itemsize: int


@dataclass
class JobContext:
    """What the cases of one job share: the format, the guard (the subject's: remote.RemoteGuard) and
    the correctness budget's state across cases (RoundBudget)."""

    fmt: object
    guard: object
    budget: RoundBudget = field(default_factory=lambda: RoundBudget(None, "cpu"))
    own_kernels: bool = False  # --require-own-kernels: library compute in a case's census is a violation
    kernels: Census | None = None  # the census of the current case's first call (remote.census_of)
    # in a batch: the parent's full reference measurements by case id (reference.CachedReference as JSON),
    # which a case re-checks instead of timing the reference again; None: not in a batch (interleaved)
    references: dict | None = None
    # told when a timing starts (True) and ends (False): the judge tells the parent (Event.TIMING), which
    # stops the workers it started ahead of their turn meanwhile (runner.AheadOfTurn)
    timing: Callable[[bool], None] = lambda on: None

    @classmethod
    def local(cls, fmt, budget_s: float | None = None) -> JobContext:
        """The engine on a candidate in this process, unguarded: measurement scripts and tests of the
        engine's own logic (a judged candidate always runs in its subject, under its Guard)."""
        return cls(fmt, _Unguarded(), RoundBudget(budget_s, fmt.device))


class _Unguarded:
    """integrity.Guard's interface without its checks."""

    def check(self, when: str) -> None:
        return None

    def call(self, fn, args, device: str, when: str = "the call", outputs=()):
        out = fn(*args)
        sync(device)
        return out


def sync(device: str) -> None:
    if is_cuda(device):
        torch.cuda.synchronize()


def _nbytes(args) -> list[int]:
    return [a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)]


def round_seed(fmt, case_id: str, r: int) -> int:
    """Round 0 uses the case's seed (the one its record shows and opcheck uses), round r one derived
    from it and the secret salt."""
    return case_seed(fmt.namespace, case_id, fmt.salt if r == 0 else f"{fmt.salt}\0round-{r}")


def set_seed(namespace: str, case_id: str, salt: str, k: int) -> int:
    """A timing input set's seed: set 0 uses the case's seed, set k > 0 one derived from it and the salt."""
    return case_seed(namespace, case_id, salt if k == 0 else f"{salt}\0input-set-{k}")


def call(job: JobContext, case, args: list, when: str) -> list:
    """The candidate once on `args` (DPS: into fresh poisoned buffers), under the subject's Guard; its
    outputs as a list. An exception of the candidate's is a RAISED Failure."""
    fmt = job.fmt
    try:
        if fmt.dps:
            outs = fmt.buffers(case)
            returned = job.guard.call(fmt.candidate, [*args, *outs], fmt.device, when, outputs=outs)
            _written_or_said(fmt, case, outs, returned)
            return outs
        return fmt.outputs(case, job.guard.call(fmt.candidate, list(args), fmt.device, when))
    except (Violation, Failure):
        raise
    except WrongReturn as exc:  # what came back is the candidate's part: no traceback of mini_kv's frames
        raise Failure(Failure.RAISED, str(exc), "plain") from None
    except Exception as exc:  # noqa: BLE001 - the candidate raising is a result
        if getattr(exc, "plain", False):  # a sys.exit in the candidate, said as such (explain.system_exit)
            raise Failure(Failure.RAISED, str(exc), "plain") from None
        tb = getattr(exc, "remote_traceback", "") or traceback.format_exc()[-4000:]
        code = "out_of_memory" if shared.out_of_memory(exc) else None
        raise Failure(
            Failure.RAISED, explain.exception_text(exc), code, tb=explain.candidate_frames(tb)
        ) from None


def _written_or_said(fmt, case, outs: list, returned) -> None:
    """A destination-passing candidate that returned its results instead of writing them: said so, not
    as the fill mini_kv left in the buffers (explain.never_written)."""
    if returned is None:
        return
    for name, out in zip(fmt.output_names(case), outs, strict=True):
        if unwritten(out):
            raise Failure(
                Failure.RAISED, explain.never_written(name, explain.describe_value(returned)), "plain"
            )


# ------------------------------------------------------------------ correctness rounds


@dataclass(frozen=True)
class _Round:
    pristine: list  # the round's inputs as made
    outs: list
    refs: list
    kept: list  # copies of `outs` when judged: an output that changes later was still being written
    checked: Checked
    calls: tuple[float, float, str] = (0.0, 0.0, "")  # seconds of the candidate's call, the reference's; case


@_judging
def correctness(job: JobContext, case, rounds: int, on_inputs=None) -> Passed:
    """`rounds` rounds (fewer where the budget says: RoundBudget), or a Failure. `on_inputs(args)` is
    called once the first round's inputs exist: what fails before that is the case's fault."""
    fmt, budget = job.fmt, job.budget
    nbytes = fmt.nbytes(case)
    budget.skip_if_too_large(nbytes)
    stream_checks_of(fmt.candidate)  # a count of this case's own (a case before may have failed mid-way)
    worst, prev, ref_error = None, None, None
    marks = [time.perf_counter()]  # each round's start, then the last one's end
    r = 0
    while r < rounds:
        if r == 1:
            rounds = budget.rounds_within(rounds, marks[1] - marks[0], nbytes, prev.calls)
        args = fmt.inputs(case, round_seed(fmt, case.id, r))
        if r == 0 and on_inputs is not None:
            on_inputs(args)
        prev = _one_round(job, case, r, args, prev)
        if r == 0:
            ref_error = fmt.reference_error(prev.pristine, prev.refs)
        worst = prev.checked if worst is None or prev.checked.rank > worst.rank else worst
        marks.append(time.perf_counter())
        if r < 2:
            budget.note_round(nbytes, marks[-1] - marks[-2], warm=r == 1, calls=prev.calls)
        r += 1
    round_s = min(b - a for a, b in itertools.pairwise(marks))
    return Passed(worst.stats if worst else None, r, round_s, ref_error, stream_checks_of(fmt.candidate))


def _one_round(job: JobContext, case, r: int, args: list, prev: _Round | None) -> _Round:
    """Round r: even rounds call the candidate before the reference (nothing of the reference's exists
    yet to be read), odd ones after it; the previous round's inputs and outputs are kept alive, so
    neither their addresses nor their Python ids can come back, and freed blocks of the sizes the
    candidate may pick up are poisoned first."""
    fmt, where = job.fmt, job.fmt.where(r)
    pristine = clone_args(args)
    t0 = time.perf_counter()
    if r % 2 == 0:
        poison_before(fmt.candidate, _nbytes(args), fmt.device)
        if r == 0:
            census_next(fmt.candidate)  # whose ops and kernels the case's first call runs
        stream_hold_next(fmt.candidate)  # fresh inputs: stream order checked whatever the size
        outs = call(job, case, args, "the call before the reference")
        t1 = time.perf_counter()
        if r == 0:
            _own_kernels(job)
        refs = fmt.expected(case, pristine)
        calls = (t1 - t0, time.perf_counter() - t1, case.id)
    else:
        refs = fmt.expected(case, args)
        t1 = time.perf_counter()
        poison_before(fmt.candidate, _nbytes(prev.outs) if prev else [], fmt.device)
        stream_hold_next(fmt.candidate)
        outs = call(job, case, args, "the call after the reference")
        calls = (time.perf_counter() - t1, t1 - t0, case.id)
    if r == 0:
        job.guard.check("after the first call")
    if not inputs_unchanged(pristine, args):
        raise Violation("INPUT_MUTATED", f"{where}the candidate modified its inputs")
    for name, out in [] if fmt.dps else zip(fmt.output_names(case), outs, strict=True):  # DPS: our buffers
        try:
            check_output(out, args, [*refs, *(prev.refs if prev else ())], prev.outs if prev else ())
        except Violation as v:
            raise Violation(v.code, f"{where}{fmt.output_label(name)}{v.message}") from None
    checked = fmt.check(case, outs, refs)
    if not checked.ok:
        if checked.code == "values":  # values, not structure: was it a cheat that got caught out?
            _explain(job, case, r, pristine, outs, refs, prev)
        why = f"{where}{fmt.output_label(checked.output)}{checked.reason}"
        raise Failure(Failure.WRONG, why, checked.code, checked.stats)
    for name, out, ref in zip(fmt.output_names(case), outs, refs, strict=True):
        why = degenerate(out, ref, fmt.atol(case))
        if why:
            raise Violation("DEGENERATE_OUTPUT", f"{where}{fmt.output_label(name)}{why}")
    if prev is not None and not all(same_bytes(o, k) for o, k in zip(prev.outs, prev.kept, strict=True)):
        raise Violation(
            "DEFERRED_WORK",
            "an earlier call's output changed after it returned (written by a later call or by work left running)",
        )
    return _Round(pristine, outs, refs, [o.detach().clone() for o in outs], checked, calls)


def _own_kernels(job: JobContext) -> None:
    """The case's census (job.kernels, for its record); under --require-own-kernels, library compute in
    it is LIBRARY_DELEGATION (integrity.check_own_kernels)."""
    job.kernels = census_of(job.fmt.candidate)
    if job.own_kernels and job.kernels is not None:
        integrity.check_own_kernels(job.kernels.library)


def _explain(
    job: JobContext, case, r: int, pristine: list, outs: list, refs: list, prev: _Round | None
) -> None:
    """A wrong round: a cheat shows itself here (raised as a Violation); an honest wrong answer returns."""
    fmt, where = job.fmt, job.fmt.where(r)
    if (
        prev is not None
        and all(same_bytes(o, p) for o, p in zip(outs, prev.outs, strict=True))
        and not all(same_bytes(a, b) for a, b in zip(refs, prev.refs, strict=True))
    ):
        raise Violation(
            "REPLAYED_RESULT", f"{where}on new inputs the candidate returned the previous outputs again"
        )
    time.sleep(SETTLE_S)
    sync(fmt.device)
    refresh(fmt.candidate)
    if fmt.check(case, outs, refs, stats=False).ok:
        raise Violation(
            "THREAD_ESCAPE",
            f"{where}the output was wrong when the call returned and right a moment later: work continued "
            "after the call",
        )
    again = call(job, case, clone_args(pristine), "a second call on the same inputs")
    if fmt.check(case, outs, refs, stats=False).ok:
        raise Violation(
            "DEFERRED_WORK",
            f"{where}the output was wrong when the call returned and was completed by the next call",
        )
    if fmt.check(case, again, refs, stats=False).ok:
        raise Violation(
            "CALL_ORDER_DEPENDENT",
            f"{where}wrong when called before the reference, right on the same inputs called after it (reads "
            "the reference's result or depends on call order)"
            if r % 2 == 0
            else f"{where}wrong, then right on the same inputs called again: the result depends on how many "
            "calls came before",
        )


class RoundBudget:
    """The correctness rounds a case's budget allows, from what earlier rounds cost (state across the
    cases of one job). Without a budget (a task card's correctness) every round runs."""

    def __init__(self, budget_s: float | None, device: str):
        self.budget_s, self.device = budget_s, device
        # (seconds, bytes, warm) of a correctness round so far: what a larger case will cost
        self.round_cost: tuple[float, int, bool] | None = None
        # (seconds, bytes) of the first round of a case found too large after it: a measured size that
        # the per-byte scaling of a small warm round underestimates (cache effects), so it bounds the others
        self.too_large: tuple[float, int] | None = None
        self.round_calls: tuple[float, float, str] | None = None  # (candidate's call, reference's, case)
        # (bytes, the candidate's call, the reference's, case) where the candidate was too slow for the
        # budget: no larger case is run (it would be no quicker), and the reason names it, not the size
        self.slow_call: tuple[int, float, float, str] | None = None

    def note_round(
        self, nbytes: int | None, seconds: float, warm: bool, calls: tuple = (0.0, 0.0, "")
    ) -> None:
        """A second round's time where there is one, the largest case's, over a first round's, which
        holds one-off costs that say nothing about size (a library's first call, a plan built on first
        use: on an H200 a cuDNN solution's first round took 0.42 s on 2.7 MiB, scaled to a false 36-s
        estimate)."""
        cur = self.round_cost
        if (
            nbytes is not None
            and nbytes >= SCALE_FROM_BYTES
            and (cur is None or (warm, nbytes) >= (cur[2], cur[1]))
        ):
            self.round_cost = (seconds, nbytes, warm)
            self.round_calls = calls

    def skip_if_too_large(self, nbytes: int | None) -> None:
        """SKIPPED before any call when a round scaled by bytes says MIN_ROUNDS of this case outrun the
        whole budget (a correctness round on CPU at 14,509 x 4096 took 15-38 s, so running one to find
        out would spend the budget many times over); the larger estimate of the known rounds decides."""
        if self.budget_s and self.slow_call and nbytes is not None and nbytes >= self.slow_call[0]:
            raise Failure(
                Failure.SKIPPED,
                explain.slow_solution_earlier(self.device, *self.slow_call[1:], self.budget_s),
            )
        bases = [self.too_large] if self.too_large else []
        if self.round_cost is not None and nbytes is not None and nbytes > self.round_cost[1]:
            bases.append(self.round_cost[:2])
        if not self.budget_s or not bases or nbytes is None:
            return
        estimate, seconds, seen = max((s * nbytes / max(1, b), s, b) for s, b in bases)
        if estimate * MIN_ROUNDS > self.budget_s:
            calls = self.round_calls
            if seconds == self.round_cost[0] and calls and calls[0] > SLOW_SHARE * seconds:
                # the round scaled was the candidate's own time (the reference's was small): said so, not size
                raise Failure(
                    Failure.SKIPPED, explain.slow_solution_earlier(self.device, *calls, self.budget_s)
                )
            raise self._skip(
                f"a correctness round would take about {estimate:.3g} s (one on {seen / 2**20:.3g} MiB took "
                f"{seconds:.3g} s; this case has {nbytes / 2**20:.3g} MiB)"
            )

    def rounds_within(
        self, rounds: int, first_s: float, nbytes: int | None, calls: tuple = (0.0, 0.0, "")
    ) -> int:
        """The rounds that fit in half the budget (at least MIN_ROUNDS), given the first round's time; where
        they do not, the candidate's slowness when its call (`calls`: its seconds, the reference's, the
        case) took most of the round, else the case's size, is the reason."""
        if not self.budget_s or rounds <= 1:
            return rounds
        if first_s * MIN_ROUNDS > self.budget_s:
            call_s, ref_s, case_id = calls
            if call_s > SLOW_SHARE * first_s:  # not the size: the reference on the same inputs was quick
                self.slow_call = (nbytes or 0, call_s, ref_s, case_id)
                raise Failure(
                    Failure.SKIPPED,
                    explain.slow_solution(self.device, call_s, ref_s, MIN_ROUNDS, self.budget_s),
                )
            if nbytes is not None and (self.too_large is None or nbytes < self.too_large[1]):
                self.too_large = (first_s, nbytes)
            raise self._skip(f"one correctness round took {first_s:.3g} s")
        return max(MIN_ROUNDS, min(rounds, int(self.budget_s / 2 / max(first_s, 1e-9))))

    def _skip(self, why: str) -> Failure:
        return Failure(
            Failure.SKIPPED,
            f"too large for {self.device} within the budget: {why}, and {MIN_ROUNDS} rounds and the timing "
            f"would not fit in the case's budget of {self.budget_s:.3g} s (--budget)",
        )


# ------------------------------------------------------------------ timing


def input_set_count(
    set_bytes: int,
    cold: bool,
    max_sets: int = DEFAULTS.max_input_sets,
    free_bytes: int | None = None,
    l2_bytes: int | None = None,
) -> int:
    """How many input sets to rotate through: 1 when hot; in cold mode >= 2, and no more than span
    `input_set_l2_span` L2 sizes (more add nothing to coldness: each set is evicted by the sets after it
    and the flush), fit the memory budget and `max_sets`. Without the L2 bound a large workload held 17
    sets per side, and four benches of rmsnorm on one H200 ran it out of memory."""
    if not cold:
        return 1
    budget = DEFAULTS.input_set_bytes
    if free_bytes is not None:
        budget = min(budget, int(free_bytes * DEFAULTS.input_set_free_share))
    fits = budget // max(1, 2 * set_bytes)  # candidate and reference each hold their own copy
    if l2_bytes:
        fits = min(fits, -(-DEFAULTS.input_set_l2_span * l2_bytes // max(1, set_bytes)))
    return int(max(2, min(max_sets, fits)))


def choose_method(
    chain: list[str], workloads: list, device: str, flush: L2Flusher, launches: int
) -> tuple[str, list[dict]]:
    """The first method in `chain` that times every workload; the ones skipped and why. The host wall
    clock alone cannot fail to time anything: no probe calls (they cost seconds for a large CPU case)."""
    if chain == ["wallclock"]:
        return chain[0], []
    fallbacks = []
    for i, method in enumerate(chain):
        try:
            for calls in workloads:
                measure(calls, method, PROBE_SAMPLES, device, flush, launches)
        except TimingError as exc:
            if i == len(chain) - 1:
                raise
            fallbacks.append({"method": method, "reason": str(exc)})
            continue
        return method, fallbacks
    raise AssertionError("empty method chain")


def timed(fn):
    """Timing with the guards that turn an escape from the timer into a reason code (a Violation)."""
    try:
        return fn()
    except TimingGuardError as exc:
        raise Violation("THREAD_ESCAPE", f"while timing: {exc}") from None
    except NoDeviceWorkError as exc:
        code = "NO_DEVICE_WORK" if "no CUDA kernel:" in str(exc) else "REPLAYED_RESULT"
        raise Violation(code, f"while timing: {exc}") from None


@dataclass(frozen=True)
class Budget:
    """What a case's measurements may spend: `left_s`, `cost` (each side's seconds per call) and
    `floor_samples` (the samples a measurement takes whatever is left)."""

    left_s: float
    cost: dict
    floor_samples: int = 1


def timing_budget(
    budget_s: float | None, started: float, warm: Warmup, n_sets: int, round_s, settings: RunSettings
) -> Budget:
    """The budget left since `started` (before the warm-up) less what the post-timing check will cost
    (POST_CHECK_PASSES per input set, each about the quickest correctness round: without it a large
    case's sampling spent the whole budget and the check pushed it past), the warm-up's seconds per call
    of each side (what one sample costs), and the samples a measurement takes whatever is left
    (timing.sample_floor: not the candidate's to steer)."""
    left = (budget_s or float("inf")) - (time.perf_counter() - started)
    cost = dict(zip(("candidate", "reference"), warm.seconds_per_call, strict=True))
    floor = sample_floor(settings, budget_s, cost["reference"])
    return Budget(left - POST_CHECK_PASSES * n_sets * (round_s or 0.0), cost, int(floor or 1))


class SampledRepeats:
    """The repeats of a candidate/reference measurement within a timing budget (timing_budget): each
    measurement's share of it, no new repeat once it is spent (the first always runs, for both sides),
    each side's samples, kernel times and how its sampling stopped, and who went first in each."""

    def __init__(self, settings: RunSettings, budget: Budget):
        self.count = settings.repeats
        self.share = max(0.0, budget.left_s) / (2 * self.count)
        self.deadline = time.perf_counter() + budget.left_s
        self.cost = budget.cost
        self.floor = budget.floor_samples
        self.samples: dict[str, list] = {"candidate": [], "reference": []}
        self.sampling = {w: {"taken": [], "stopped": [], "rel_ci": []} for w in self.samples}
        self.kernel_us: dict[str, list] = {"candidate": [], "reference": []}
        self.taken = {"candidate": 0, "reference": 0}  # samples timed here (a reused side's are not)
        self.order: list[list[str]] = []

    def __iter__(self):
        for r in range(self.count):
            if r > 0 and time.perf_counter() >= self.deadline:
                return
            yield r

    def add(self, who: str, m) -> None:
        """One measurement (timing.Measurement) of `who`."""
        self.samples[who].append(m.samples)
        self.taken[who] += len(m.samples)
        for key in ("taken", "stopped", "rel_ci"):
            self.sampling[who][key].append(m.notes["sampling"][key])
        if m.kernel_us is not None:
            self.kernel_us[who].append(m.kernel_us)

    def substitute(self, who: str, side: dict) -> None:
        """`who`'s side is `side` (a Side's JSON: a full measurement of an earlier run), not what was
        timed here; the samples timed here still count as timed calls."""
        self.samples[who] = [list(rep) for rep in side["samples"]]
        self.sampling[who] = {k: list(side["sampling"][k]) for k in ("taken", "stopped", "rel_ci")}
        kernel = side.get("kernel_us_p50")
        self.kernel_us[who] = [[kernel]] if kernel is not None else []

    def adopt(self, who: str, other: SampledRepeats) -> None:
        """`who`'s side is the one `other` timed (after this plan's), its order appended."""
        self.samples[who], self.sampling[who] = other.samples[who], other.sampling[who]
        self.kernel_us[who] = other.kernel_us[who]
        self.taken[who] += other.taken[who]
        self.order += other.order

    def side(self, who: str, summary: stats.RepeatSummary) -> Side:
        kernel = [x for rep in self.kernel_us[who] for x in rep]
        p50 = stats.summarize(kernel).p50 if kernel else None
        return Side(self.samples[who], summary, self.sampling[who], p50)


OMIT = {"omit_none": True}  # a field left out of the JSON where the record does not have it


@dataclass(frozen=True)
class Side:
    """benchmark.json's record of one side: its samples per repeat, their summary, how each repeat's
    sampling went (taken, stopped, rel_ci), and under CUPTI the median busy time of its kernels."""

    samples: list
    summary: stats.RepeatSummary
    sampling: dict
    kernel_us_p50: float | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True)
class Sampled:
    """benchmark.json's `sampling` of a case: the rule, the warm-up, how many samples and timed calls
    each side took and why its measurements stopped (mini_kv.status.StopReason, one per repeat); a SOL
    workload's also how many correctness rounds ran."""

    mode: str
    samples: int | str
    target_rel_ci: float | None
    min_samples: int | None
    max_samples: int | None
    repeat_rel_ci: float | None
    budget_s: float | None
    warmup_calls: int
    warmup_s: float
    repeats_run: int
    timed_calls: dict
    stopped: list
    rounds_run: int | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True)
class Span:
    """When a case's timing had the device: the host's real-time clock (seconds since the epoch, as
    `time.time()`) from the start of its warm-up to the end of its post-timing check. Two spans of one
    host's device that overlap are two timings that shared it (a batch gives none:
    tests/test_reference_reuse.py checks it)."""

    start: float
    end: float


@dataclass(frozen=True)
class Timing:
    """benchmark.json's record of a timed case (both formats): how it was timed (the method, the methods
    that failed first, calls per sample, the L2 mode), the samples of both sides, their summaries, the
    speedup and the stability gate's verdict, how the case was sampled."""

    method: str
    method_requested: str
    fallbacks: list
    l2: str
    timer: str
    calls_per_sample: int
    input_sets: int
    unit: str
    order: list
    candidate: Side
    reference: Side
    sampling: Sampled
    speedup: float
    stability: dict
    l2_flush: Flush | None = field(default=None, metadata=OMIT)
    reference_timing: refs.ReferenceTiming | None = field(default=None, metadata=OMIT)  # in a batch
    span: Span | None = field(default=None, metadata=OMIT)


def _repeats(
    calls: dict,
    method: str,
    settings: RunSettings,
    job: JobContext,
    flush,
    launches: int,
    budget: Budget,
    first: int,
    short: dict | None = None,
) -> SampledRepeats:
    """Every repeat, alternating who goes first (the candidate on even repeats when `first` is even, so
    single-repeat runs alternate across cases); each measurement samples by the stopping rule within its
    share of the case's budget, and the harness is checked after each. The sides named in `short` are
    timed once, in the first repeat, for that fixed count (a cached reference's drift re-check); a side
    not in `calls` is not timed."""
    threads = integrity.os_threads()  # after the probes: lazily started runtime threads exist by now
    plan, short = SampledRepeats(settings, budget), short or {}
    for r in plan:
        order = ("candidate", "reference") if (r + first) % 2 == 0 else ("reference", "candidate")
        order = [w for w in order if w in calls and (r == 0 or w not in short)]
        plan.order.append(order)
        for who in order:
            rule = stopping_rule(settings, plan.share, plan.count)
            if who in short:
                rule = replace(rule, fixed=short[who])
            # `measure`: this module's name, the seam tests script timings through
            args = (calls[who], method, rule, job.fmt.device, flush, launches, plan.cost.get(who))
            m = timed(lambda args=args: measure_until(*args, measure_fn=measure, floor=plan.floor))
            # under CUPTI the profiler's own threads come and go; measure() still counts Python threads
            left = integrity.foreign_threads(integrity.os_threads() - threads) if method != "cupti" else set()
            if left:
                raise Violation("THREAD_ESCAPE", f"{len(left)} new thread(s) running after timing the {who}")
            job.guard.check(f"after timing the {who}")
            plan.add(who, m)
    return plan


def _input_sets(job: JobContext, case, cold: bool, launches: int) -> tuple[list, int, int]:
    """(input sets, the first output's numel, bytes of one set with its outputs): set 0 from the case's
    seed, sized by the reference's outputs on it."""
    fmt = job.fmt
    args = fmt.inputs(case, set_seed(fmt.namespace, case.id, fmt.salt, 0))
    refs = fmt.expected(case, args)
    set_bytes = tensor_nbytes(args) + tensor_nbytes(refs)
    free = l2 = None
    if is_cuda(fmt.device):
        free, l2 = torch.cuda.mem_get_info(torch.device(fmt.device))[0], l2_cache_bytes(fmt.device)
    n = input_set_count(set_bytes, cold, max(2, launches), free, l2)
    # every tensor of the candidate's sets crosses to the subject as a file descriptor, all in one
    # message: more than it can carry ended the subject (rmsnorm's 20 cold sets on an H200)
    per_set = sum(isinstance(a, torch.Tensor) for a in args) + (len(refs) if fmt.dps else 0)
    n = max(1, min(n, MAX_FDS // max(1, per_set)))
    sets = [args] + [fmt.inputs(case, set_seed(fmt.namespace, case.id, fmt.salt, k)) for k in range(1, n)]
    return sets, refs[0].numel() if refs else 0, set_bytes


def _workloads(job: JobContext, case, sets: list) -> tuple:
    """Rotating candidate and reference (or the regression gate's baseline) calls, DPS ones into per-set
    output buffers. The judge spot-checks timed calls of the candidate (remote.RemoteWorkload): the
    reference on a copy of the set's values, compared as a round compares; spare values of their own seed."""
    fmt, n_inputs = job.fmt, len(sets[0])

    def wrong(args: list, outs) -> str | None:
        outs = outs if fmt.dps else fmt.outputs(case, outs)
        found = fmt.check(case, outs, fmt.expected(case, args[:n_inputs]), stats=False)
        return None if found.ok else f"{fmt.output_label(found.output)}{found.reason}"

    def stale_caught(old: list, new: list) -> bool:
        return not fmt.check(
            case, fmt.expected(case, old[:n_inputs]), fmt.expected(case, new[:n_inputs]), stats=False
        ).ok

    spare = fmt.inputs(case, case_seed(fmt.namespace, case.id, f"{fmt.salt}\0spot-check"))
    positions = tuple(range(n_inputs, n_inputs + len(fmt.output_names(case)))) if fmt.dps else ()
    ref_sets = [clone_args(s) for s in sets]
    ref, ref_dps = fmt.baseline or (fmt.reference, False)
    cand_sets = [[*s, *(fmt.buffers(case) if fmt.dps else [])] for s in sets]
    cand = workload_of(fmt.candidate, cand_sets, SpotCheck(wrong, spare, positions, stale_caught))
    refc = workload_of(ref, [[*s, *(fmt.buffers(case) if ref_dps else [])] for s in ref_sets])
    return cand, refc, ref_sets


def _warm(sides: list, settings: RunSettings, device: str, setup_s: float, budget_s: float | None) -> Warmup:
    """The warm-up, or a SKIPPED Failure: a case whose set-up, repeated by the post-timing check,
    alone outruns the budget is skipped before any warm-up (on CPU a GPU-sized case of 33M elements took
    50 s, almost all of it outside the timed calls), and so is one whose single call of each side does."""
    limit = f"the case's budget of {budget_s:.3g} s (--budget, or benchmark.budget_s)" if budget_s else ""
    if budget_s and SETUP_REPEATS * setup_s > budget_s:
        raise Failure(
            Failure.SKIPPED,
            f"too large for {device} within the budget: setting the case up (its inputs and the reference's "
            f"outputs) took {setup_s:.3g} s, and the post-timing check repeats that about twice, over {limit}",
        )
    warm = warm_up(sides, settings.warmup, DEFAULTS.warmup_share * (budget_s or float("inf")), device)
    cost = warm.seconds_per_call
    if budget_s and None not in cost and sum(cost) > budget_s:
        why = f"one call of each side took {sum(cost):.3g} s, over {limit}"
        if 2 * cost[1] <= budget_s:
            # the reference fits: the candidate is what is slow, which a candidate that sleeps through its
            # warm-up calls can claim at will. A skip is neutral (the attempt passes on the rest), so it is
            # decided by the reference's call alone, measured here; the candidate's slowness is a failure.
            raise Failure(
                Failure.TIMING,
                f"the candidate is too slow to time within the budget: {why} (the reference's: {cost[1]:.3g} s)",
                stats={"warmup": warm},
            )
        raise Failure(
            Failure.SKIPPED, f"too large for {device} within the timing budget: {why}", stats={"warmup": warm}
        )
    return warm


@_judging
def time_case(
    job: JobContext, case, settings: RunSettings, budget_s, first: int = 0, round_s=None, lap=None
) -> Timed:
    """_time_case, with `job.timing` told when it starts and ends (whatever ends it)."""
    job.timing(True)
    try:
        return _time_case(job, case, settings, budget_s, first, round_s, lap)
    finally:
        job.timing(False)


def _time_case(
    job: JobContext, case, settings: RunSettings, budget_s, first: int = 0, round_s=None, lap=None
) -> Timed:
    """Candidate and reference timed alike (same method, L2 mode and input-set layout, interleaved), then
    the post-timing check. In cold-L2 mode each timed call gets an input set at fresh addresses with
    fresh values (rotating sets), and L2 is flushed before every sample. `lap(name)`, if given, is told
    when each part ends (inputs, warmup, checks, sampling)."""
    fmt, lap = job.fmt, lap or (lambda name: None)
    cold = settings.l2 == "cold"
    if cold and not is_cuda(fmt.device):
        raise ValueError(f"l2 'cold' needs a CUDA device, not {fmt.device}")
    launches = settings.graph_launches or DEFAULTS.graph_launches
    t_setup = time.perf_counter()
    sets, numel, set_bytes = _input_sets(job, case, cold, launches)
    cand, ref, ref_sets = _workloads(job, case, sets)
    # the rotations let go of their sets when timing ends, in the subject too (RemoteWorkload.close)
    with closing(cand), closing(ref):
        setup_s = time.perf_counter() - t_setup
        lap("inputs")
        # cold: one captured launch per input set, so consecutive replayed launches use different buffers
        launches = len(sets) if cold else launches
        flush = L2Flusher(fmt.device, cold)
        t0, start = time.perf_counter(), time.time()
        warm = _warm([cand, ref], settings, fmt.device, setup_s, budget_s)
        sync(fmt.device)
        lap("warmup")
        chain = method_chain(settings.method, fmt.device)
        method, fallbacks = timed(lambda: choose_method(chain, [cand, ref], fmt.device, flush, launches))
        job.guard.check("before timing")
        budget = timing_budget(budget_s, t0, warm, len(sets), round_s, settings)
        calls_per = launches if method == "graph" else 1
        l2 = settings.l2 if is_cuda(fmt.device) else "n/a"
        flushed = to_json(flush.describe()) if flush.enabled else None
        cached, note = _cached_reference(
            job, case, refs.ReferenceHow(method, calls_per, len(sets), l2, flushed)
        )
        lap("checks")
        sides = {"candidate": cand, "reference": ref}
        short = {"reference": refs.recheck_count(cached, settings)} if cached else None
        plan = _repeats(sides, method, settings, job, flush, launches, budget, first, short)
        source = _reference_side(
            plan, cached, note, job, settings, (ref, method, flush, launches, budget, first)
        )
        lap("sampling")
        post = post_check(job, case, sets, ref_sets)
        job.guard.check("after the post-timing check")
        record = timing_record(
            plan, settings, (method, fallbacks, calls_per, l2), warm, budget_s, len(sets), flush
        )
        span = Span(round(start, 6), round(time.time(), 6))
        record = replace(record, reference_timing=source, span=span)
        lap("checks")  # the record's statistics too: the laps account for all of the timing's seconds
        itemsize = next((a.element_size() for a in sets[0] if isinstance(a, torch.Tensor)), 0)
        return Timed(record, post, set_bytes, numel, itemsize)


def _cached_reference(
    job: JobContext, case, how: refs.ReferenceHow
) -> tuple[refs.CachedReference | None, str | None]:
    """The parent's full measurement of this case's reference that this run may re-check instead of
    timing it again, or None and why not (None, None: not in a batch, or no measurement yet). A
    regression confirmation (a baseline in the reference's place) never reuses one."""
    found = (job.references or {}).get(case.id) if job.fmt.baseline is None else None
    if found is None:
        return None, None
    cached = refs.CachedReference.from_json(found)
    why = refs.mismatch(cached, how)
    return (None, why) if why else (cached, None)


def _reference_side(
    plan: SampledRepeats, cached, note: str | None, job: JobContext, settings: RunSettings, again: tuple
) -> refs.ReferenceTiming | None:
    """Which way the reference side was measured (None: not in a batch). With a cached measurement the
    plan timed only the re-check: within its band the cached side stands in; outside it, the reference
    is timed in full again (`again`: what _repeats needs) and that measurement stands."""
    if cached is None:
        return None if job.references is None else refs.ReferenceTiming(refs.MEASURED, note=note)
    check = refs.recheck(cached, plan.samples["reference"][0], settings)
    origin = (cached.attempt, cached.solution, cached.measured_at)
    if check.verdict == refs.WITHIN:
        plan.substitute("reference", cached.side)
        return refs.ReferenceTiming(refs.REUSED, *origin, check)
    ref, method, flush, launches, budget, first = again
    plan.adopt(
        "reference", _repeats({"reference": ref}, method, settings, job, flush, launches, budget, first)
    )
    return refs.ReferenceTiming(refs.RETIMED, *origin, check)


def timing_record(
    plan, settings: RunSettings, how: tuple, warm: Warmup, budget_s, n_sets: int, flush
) -> Timing:
    """A timed case's record; `how`: the method, the methods that failed first, calls per sample, L2 mode."""
    method, fallbacks, calls_per, l2 = how
    cand_s, ref_s = (stats.summarize_repeats(plan.samples[who]) for who in ("candidate", "reference"))
    max_cv, max_p95_cv = settings.cv_limits
    stability = to_json(stats.stability(cand_s, ref_s, max_cv, max_p95_cv))
    timed = (method, settings.method, fallbacks, l2, TIMER_LABELS[method], calls_per, n_sets, "us")
    sides = (plan.side("candidate", cand_s), plan.side("reference", ref_s))
    sampled = sampling_record(settings, budget_s, warm, plan.sampling, calls_per, plan.taken)
    speedup = stats.speedup(ref_s.overall.p50, cand_s.overall.p50)
    stability = {**stability, "max_cv": max_cv, "max_p95_cv": max_p95_cv}
    return Timing(
        *timed, plan.order, *sides, sampled, speedup, stability, flush.describe() if flush.enabled else None
    )


def sampling_record(
    settings: RunSettings, budget_s, warm: Warmup, sides: dict, calls_per: int, taken: dict
) -> Sampled:
    """`taken`: the samples each side timed here (SampledRepeats.taken: a reused side's are not its own)."""
    fixed = settings.fixed_count is not None
    target = None if fixed else repeat_target(settings, settings.repeats)
    rule = ("fixed" if fixed else "adaptive", settings.samples)
    rule += (settings.target_rel_ci, settings.min_samples, settings.max_samples, target, budget_s)
    repeats = len(next(iter(sides.values()))["taken"])
    timed = {who: n * calls_per for who, n in taken.items()}
    stopped = sorted({why for side in sides.values() for why in side["stopped"]})
    return Sampled(*rule, warm.calls, warm.seconds, repeats, timed, stopped)


def post_check(job: JobContext, case, sets: list, ref_sets: list) -> Failure | None:
    """After all timed calls: every input set must still give the right output, and so must new values
    written into the same buffers (same addresses, shapes, ids and version counters), which a result cache
    keyed on any of those gets wrong. The STALE_OUTPUT_AFTER_TIMING finding, or None."""
    fmt = job.fmt
    for k, (s, rs) in enumerate(zip(sets, ref_sets, strict=True)):
        wrong = _after_timing(job, case, s, rs)
        if wrong:
            return _stale(
                f"input set {k}: {wrong} (right before timing, wrong after: replayed or stale results)"
            )
    for k, s in enumerate(sets):
        fresh = fmt.inputs(case, case_seed(fmt.namespace, f"{case.id}\0post-timing", f"{fmt.salt}\0{k}"))
        rewrite_in_place(s, fresh)
        # a Python scalar cannot be rewritten in place: the candidate gets the fresh one, as the reference does
        s = [x if isinstance(x, torch.Tensor) else new for x, new in zip(s, fresh, strict=True)]
        wrong = _after_timing(job, case, s, fresh)
        if wrong:
            return _stale(
                f"input set {k}, new values in the same buffers: {wrong} (a result cache keyed on the "
                "address, shape, id or version counter of the inputs)"
            )
    return None


def _stale(message: str) -> Failure:
    return Failure(Failure.VIOLATION, message, "STALE_OUTPUT_AFTER_TIMING")


def _after_timing(job: JobContext, case, args: list, ref_args: list) -> str | None:
    """Why the candidate's outputs on `args` are wrong after timing (or why it raised), or None. A
    violation of the output rules is raised with its own code."""
    fmt = job.fmt
    try:
        outs = call(job, case, args, "a call after timing")
    except Failure as f:
        if f.code == "out_of_memory":  # beside other processes on the device: a failure, not a cheat
            raise Failure(
                Failure.RAISED, f"{f.message} (out of device memory in the check after timing)", tb=f.tb
            ) from None
        return f"the candidate raised after timing ({f.message}): it behaves differently once timed"
    for out in () if fmt.dps else outs:
        check_output(out, args)
    found = fmt.check(case, outs, fmt.expected(case, clone_args(ref_args)), stats=False)
    return None if found.ok else f"{fmt.output_label(found.output)}{found.reason}"
