"""What each front door's job loads into for the engine (worker/engine.py), and how it records a case.

A task card (job kind `card`) and a SOL problem (kind `sol`) both become a Format: the seed namespace,
the candidate (a RemoteOp in the subject), the reference (here, in the judge), the input maker, the
output reader and the comparison rule. Each kind registers its steps (EVALUATORS: the stages
worker.child.run_job runs, over which of the job's lists, sending which event): a card's correctness
cases, contract checks and bench cases; a SOL problem's workloads (correctness rounds, then timing).
The kinds differ only in what they load and in the records they send: a Failure of the engine's becomes
the door's own record here; a violation has its code's one status in both (status.VIOLATIONS: a card's
record with an integrity code, SOL's trace with the code first in its log).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import sys
import time
import traceback
from dataclasses import dataclass, field, replace

import torch

from mini_kv import roofline
from mini_kv.codec import optional, to_json
from mini_kv.load.targets import add_project_to_path
from mini_kv.model import Performance
from mini_kv.settings import DEFAULTS, RunSettings
from mini_kv.status import Status, violation_status
from mini_kv.worker import engine
from mini_kv.worker.compare import Errors, Fp64Error, Matched, compare, compare_matched, tensor_errors
from mini_kv.worker.contract import Contract
from mini_kv.worker.engine import Checked, Failure
from mini_kv.worker.inputs import (
    ReferenceInputError,
    allocate_outputs,
    clone_args,
    describe_args,
    import_path,
    make_case_inputs,
    make_inputs,
    normalize_outputs,
    upcast_args,
)
from mini_kv.worker.integrity import Violation, reward_hack_log
from mini_kv.worker.jobs import Event
from mini_kv.worker.loader import load_source
from mini_kv.worker.remote import Census, RemoteGuard, RemoteOp, StreamChecks


@dataclass(frozen=True)
class Step:
    """One stage of a kind's job: `method` of the evaluator run on each item of the job's list `over`,
    giving (the item's record, other fields of its event), sent as one `event`."""

    method: str
    over: str
    event: str


def timing_event(chan):
    """engine.JobContext.timing for a judge: the parent told when each timing starts and ends."""
    return lambda on: chan.send(event=Event.TIMING, on=on)


def _tb() -> str:
    return traceback.format_exc()[-4000:]


# ------------------------------------------------------------------ task cards


@dataclass(frozen=True)
class CardCase:
    id: str
    kind: str
    dtype: str
    params: dict

    @classmethod
    def of(cls, case: dict) -> CardCase:
        return cls(case["id"], case.get("kind", "bench"), case["dtype"], case["params"])


@dataclass(frozen=True)
class CardCaseRecord:
    """A card's correctness case as correctness.json keeps it: the case, its seed and the inputs made, its
    status and why (the defence that fired, the traceback, what an illegal input raised); what the engine
    found: the comparison's statistics (compare.Errors, flat), the reference's own FP64 error, the calls
    made, whose kernels the first call ran."""

    id: str
    kind: str
    dtype: str
    params: dict
    seed: int
    status: str = Status.PASSED
    reason: str | None = optional()
    integrity: str | None = optional()
    traceback: str | None = optional()
    raised: str | None = optional()
    inputs: list | None = optional()
    kernels: Census | None = optional()
    calls: int | None = optional()
    stream_checks: StreamChecks | None = optional()
    reference_error: Fp64Error | None = optional()
    max_abs_err: float | None = optional()
    max_rel_err: float | None = optional()
    mismatches: int | None = optional()
    first_mismatch: dict | None = optional()
    numel: int | None = optional()
    has_nan: bool | None = optional()
    has_inf: bool | None = optional()

    def found(self, errors: Errors | None, **fields) -> CardCaseRecord:
        """This record with `fields` and the comparison's statistics (none: the values were not compared)."""
        return replace(self, **fields, **(dataclasses.asdict(errors) if errors else {}))


@dataclass(frozen=True)
class CardFormat:
    """A task card's op: the card's input factory and reference, one output, atol/rtol per dtype."""

    namespace: str
    device: str
    salt: str
    candidate: object
    reference: object
    factory: object
    tolerances: dict
    baseline: tuple | None = None
    dps: bool = False

    def inputs(self, case: CardCase, seed: int) -> list:
        try:
            args = make_case_inputs(self.factory, case.params, case.dtype, self.device, seed)
        except Exception as exc:  # noqa: BLE001 - bad params (n: -5, n: "abc", too large): the card's fault
            raise Failure(
                Failure.UNUSABLE,
                f"the card's input factory failed for params {case.params}: {type(exc).__name__}: {str(exc)[:300]}",
                "inputs",
            ) from None
        if args is None:
            raise Failure(Failure.SKIPPED, f"not applicable on device {self.device!r}")
        return list(args)

    def expected(self, case: CardCase, args: list) -> list:
        try:
            return [self.reference(*clone_args(args))]
        except Exception as exc:  # noqa: BLE001 - the card's reference failing is the card's fault
            raise Failure(
                Failure.UNUSABLE, f"the card's reference raised {type(exc).__name__}: {exc}", "reference"
            ) from None

    def outputs(self, case: CardCase, result) -> list:
        return [result]

    def output_names(self, case: CardCase) -> list[str]:
        return ["output"]

    def output_label(self, name: str | None) -> str:
        return ""  # one output: the reason says it all

    def where(self, r: int) -> str:
        return "" if r == 0 else "on a second input set: " if r == 1 else f"on input set {r + 1}: "

    def atol(self, case: CardCase) -> float:
        return float(self.tolerances[case.dtype]["atol"])

    def nbytes(self, case: CardCase) -> None:
        return None  # a card's correctness has no budget

    def check(self, case: CardCase, outs: list, refs: list, stats: bool = True) -> Checked:
        tol = self.tolerances[case.dtype]
        res = compare(outs[0], refs[0], tol["atol"], tol["rtol"], errors=stats)
        e = res.errors
        rank = (e.has_nan, e.has_inf, e.max_abs_err) if e else (False, False, 0.0)
        if res.ok:
            return Checked(True, stats=e, rank=rank)
        return Checked(False, "values" if e else "structure", res.reason, None, e, rank)

    def reference_error(self, args: list, refs: list) -> Fp64Error | None:
        """The reference itself against float64, so the card's tolerance is known to be achievable."""
        ref = refs[0]
        if not isinstance(ref, torch.Tensor) or ref.dtype == torch.float64 or not ref.is_floating_point():
            return None
        errs = tensor_errors(ref, self.reference(*upcast_args(args)), 0.0, 0.0)  # in FP64
        return Fp64Error(errs.max_abs_err, errs.max_rel_err)


class CardEvaluator:
    """Kind `card`: the candidate's dispatcher op against the card's reference: correctness cases (two
    rounds), the contract checks (opcheck, gradcheck: in the subject) and the bench cases (timing)."""

    STEPS = (
        Step("correctness", "cases", Event.CASE),
        Step("contract", "contract", Event.CONTRACT),
        Step("bench", "bench_cases", Event.BENCH),
    )

    def __init__(self, job, chan, fmt: CardFormat, guard):
        self.job, self.chan, self.fmt = job, chan, fmt
        own = bool(job.benchmark.require_own_kernels)
        self.engine = engine.JobContext(
            fmt, guard, own_kernels=own, references=job.reference_timings, timing=timing_event(chan)
        )

    @classmethod
    def load(cls, job, chan, subject) -> CardEvaluator | None:
        """The evaluator with the candidate loaded in the subject under its Guard, or None after a
        failed `load` event. The reference and the card's input factory are loaded here, in the judge."""
        add_project_to_path(job.project_root)  # the card's own modules, as the loader imports them
        reference, factory = import_path(job.reference), import_path(job.inputs)
        names = ("device", "library", "op", "project_root", "inputs", "memory_limit_bytes")
        reply = subject.request("load", kind="card", **{k: getattr(job, k) for k in names})
        if not reply.get("ok"):
            return chan.send(event=Event.LOAD, ok=False, **to_json(LoadFailed.of(reply)))
        baseline = None
        if job.baseline:
            # the regression gate's same-run comparison: the baseline's own build, under its own
            # dispatcher namespace, takes the reference's place in the interleaved timing
            reply_b = subject.request("load_baseline", library=job.baseline["library"], op=job.baseline["op"])
            if not reply_b.get("ok"):  # a violation too: either way no same-run comparison
                why = LoadFailed.of(reply_b).reason
                return chan.send(
                    event=Event.LOAD, ok=False, reason=f"the baseline's build did not load: {why}"
                )
            baseline = (RemoteOp(subject, "baseline"), False)
        chan.send(event=Event.LOAD, ok=True, kernels=reply.get("kernels"), hint=reply.get("hint"))
        candidate = RemoteOp(subject, "candidate")
        fmt = CardFormat(
            job.task_id, job.device, job.salt, candidate, reference, factory, job.tolerances, baseline
        )
        return cls(job, chan, fmt, RemoteGuard(subject))

    def correctness(self, case: dict) -> tuple[CardCaseRecord, dict]:
        c = CardCase.of(case)
        # `inputs` until the card's factory has made them: a crash or hang there is the card's fault
        self.chan.send(event=Event.BEGIN, stage="inputs", case=c.id)

        def on_inputs() -> None:
            self.chan.send(event=Event.BEGIN, stage="correctness", case=c.id)

        return correctness_record(self.engine, c, on_inputs), {}

    def contract(self, name: str) -> tuple[Contract | dict, dict]:
        """opcheck or gradcheck, run in the subject (they call the op in ways only torch knows): its
        record is the subject's claim, and a violation there fails the check."""
        job = self.job
        self.chan.send(event=Event.BEGIN, stage="contract", case=name)
        try:
            reply = self.fmt.candidate.subject.ask(
                "contract", name=name, task_id=job.task_id, cases=job.all_cases, salt=job.salt
            )
        except Violation as v:
            return Contract(v.status, v.code, reason=str(v)), {"name": name}
        except Exception as exc:  # noqa: BLE001 - the check itself broke in the subject
            return Contract(Status.FAILED, reason=f"{type(exc).__name__}: {exc}"), {"name": name}
        # the subject's claim, passed on as it came (a record that is not one: FAILED)
        return reply["record"] if isinstance(reply.get("record"), dict) else Contract(Status.FAILED), {
            "name": name
        }

    def bench(self, case: dict) -> tuple[dict, dict]:
        c, job = CardCase.of(case), self.job
        self.chan.send(event=Event.BEGIN, stage="benchmark", case=c.id)
        try:
            return bench_record(self.engine, c, job.benchmark, job.peak_bw, job.exprs), {}
        except Exception as exc:  # noqa: BLE001 - a failed benchmark is a result
            why = f"{type(exc).__name__}: {exc}"
            return {"id": c.id, "status": Status.BENCHMARK_ERROR, "reason": why, "traceback": _tb()}, {}


def bench_record(
    ej: engine.JobContext, c: CardCase, settings: RunSettings, peak_bw: float | None, exprs: dict
) -> dict:
    """A card's bench case timed (engine.time_case): benchmark.json's record with the roofline (the card's
    `bytes` and `flops` expressions, else the bytes of an input set with its output) and the post-timing
    check's verdict; a Failure as the record of a benchmark that did not time."""
    try:
        t = engine.time_case(ej, c, settings, settings.budget_s or None)
    except Failure as f:
        if f.kind in (Failure.SKIPPED, Failure.VIOLATION):  # a skip's stats: its warm-up
            ended = _card_failure(f, CardCaseRecord(c.id, c.kind, c.dtype, c.params, 0))
            said = {"status": ended.status, "reason": ended.reason, "integrity": ended.integrity}
            return {"id": c.id, **{k: v for k, v in said.items() if v is not None}, **(f.stats or {})}
        return {"id": c.id, "status": Status.BENCHMARK_ERROR, "integrity": None, "reason": f.message}
    names = roofline.case_names(c.params, t.itemsize, t.numel)
    bytes_moved = roofline.evaluate(exprs["bytes"], names) if exprs.get("bytes") else float(t.set_bytes)
    flops = roofline.evaluate(exprs["flops"], names) if exprs.get("flops") else None
    p50 = t.record.candidate.summary.overall.p50
    post = {"ok": True, "reason": None}
    if t.post is not None:
        post = {"ok": False, "integrity": t.post.code, "reason": t.post.message}
    return {
        "id": c.id,
        "dtype": c.dtype,
        "params": c.params,
        "seed": engine.set_seed(ej.fmt.namespace, c.id, ej.fmt.salt, 0),
        **to_json(t.record),
        "post_check": post,
        "bytes": bytes_moved,
        "flops": flops,
        "roofline": to_json(roofline.achieved(bytes_moved, flops, p50 * 1e-6, peak_bw)),
        "peak_bw_Bps": peak_bw,
    }


def correctness_record(ej: engine.JobContext, c: CardCase, on_inputs=None) -> CardCaseRecord:
    """A card's correctness case (engine.correctness: settings.card_rounds rounds; an illegal case must raise),
    as correctness.json's record. `on_inputs`, if given, is called once the card's input factory has made
    the inputs: what fails before that is the card's fault (INVALID_CASE), never the candidate's."""
    seed = engine.round_seed(ej.fmt, c.id, 0)
    made_inputs: list = []

    def made(args: list) -> None:
        made_inputs.append(describe_args(args))
        if on_inputs is not None:
            on_inputs()

    def record() -> CardCaseRecord:  # whose compute its first call ran, once known
        inputs = made_inputs[0] if made_inputs else None
        return CardCaseRecord(c.id, c.kind, c.dtype, c.params, seed, inputs=inputs, kernels=ej.kernels)

    ej.kernels = None
    try:
        if c.kind == "illegal":
            args = ej.fmt.inputs(c, seed)
            made(args)
            return _run_illegal(ej, args, record())
        passed = engine.correctness(ej, c, DEFAULTS.card_rounds, made)
    except Failure as f:
        return _card_failure(f, record())
    return record().found(
        passed.stats,
        reference_error=passed.reference_error,
        calls=passed.rounds_run,
        stream_checks=passed.stream_checks,
    )


def _card_failure(f: Failure, rec: CardCaseRecord) -> CardCaseRecord:
    """A card's case record for a Failure of the engine's."""
    if f.kind == Failure.VIOLATION:
        return replace(
            rec, status=violation_status(f.code), integrity=f.code, reason=f"{f.code}: {f.message}"
        )
    if f.kind == Failure.WRONG:
        return rec.found(f.stats, status=Status.INCORRECT, reason=f.message)
    if f.kind == Failure.RAISED:
        return replace(rec, status=Status.RUNTIME_ERROR, reason=f.message, traceback=f.tb)
    if f.kind == Failure.SKIPPED:
        return replace(rec, status=Status.SKIPPED, reason=f.message)
    return replace(rec, status=Status.INVALID_CASE, reason=f.message)


def _run_illegal(ej: engine.JobContext, args: list, rec: CardCaseRecord) -> CardCaseRecord:
    """An illegal input must raise a clean Python exception from the op; returning anything is a contract
    failure. The harness is checked after the call either way."""
    try:
        try:
            ej.guard.call(ej.fmt.candidate, args, ej.fmt.device, "an illegal-input call")
        except Violation:
            raise
        except Exception as exc:  # noqa: BLE001
            ej.guard.check("after an illegal-input call")
            return replace(rec, raised=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    except Violation as v:
        return replace(rec, status=v.status, integrity=v.code, reason=str(v))
    return replace(
        rec, status=Status.INCORRECT, reason="the op accepted illegal input instead of raising an error"
    )


@dataclass(frozen=True)
class LoadFailed:
    """The `load` event's fields for a subject that could not load the candidate (its error, and a hint),
    or reported a violation while it did."""

    reason: str
    integrity: str | None = optional()
    hint: str | None = optional()

    @classmethod
    def of(cls, reply: dict) -> LoadFailed:
        if isinstance(reply.get("violation"), dict):
            v = reply["violation"]
            return cls(f"{v.get('code')}: {v.get('message')}", integrity=v.get("code"))
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        return cls(f"{err.get('type')}: {err.get('message')}", hint=reply.get("hint"))


# ------------------------------------------------------------------ SOL-ExecBench problems


@dataclass(frozen=True)
class SolCase:
    id: str
    signature: dict
    workload: dict
    index: int

    @classmethod
    def of(cls, case: dict) -> SolCase:
        return cls(case["id"], case["signature"], case["workload"], int(case.get("index", 0)))


@dataclass
class SolFormat:
    """A SOL problem's workload: the definition's signature (inputs and outputs by name), the reference's
    `run`, inputs random, scalar, from safetensors or the definition's own generator, upstream's rule."""

    namespace: str
    device: str
    salt: str
    candidate: object
    reference: object
    reference_ns: dict
    dps: bool
    baseline: tuple | None = None
    safetensors_cache: dict = field(default_factory=dict)  # a workload's safetensors inputs, read once

    def inputs(self, case: SolCase, seed: int) -> list:
        cache = self.safetensors_cache
        try:
            return make_inputs(case.signature, case.workload, self.reference_ns, self.device, seed, cache)
        except ReferenceInputError as exc:
            raise Failure(Failure.UNUSABLE, f"custom input generation failed: {exc}", "reference") from None
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory, unreadable safetensors data
            raise Failure(
                Failure.UNUSABLE, f"input generation failed: {type(exc).__name__}: {exc}\n{_tb()}", "inputs"
            ) from None

    def expected(self, case: SolCase, args: list) -> list:
        sig = case.signature
        try:
            refs = normalize_outputs(self.reference(*clone_args(args)), sig, self.device, "the reference")
            engine.sync(self.device)
        except Exception as exc:  # noqa: BLE001
            raise Failure(
                Failure.UNUSABLE, f"reference run() failed: {type(exc).__name__}: {exc}\n{_tb()}", "reference"
            ) from None
        for spec, ref in zip(sig["outputs"], refs, strict=True):
            want = tuple(spec["shape"] or ())
            if tuple(ref.shape) != want or ref.dtype != getattr(torch, spec["dtype"]):
                raise Failure(
                    Failure.UNUSABLE,
                    f"reference output {spec['name']!r} is {list(ref.shape)} "
                    f"{str(ref.dtype).replace('torch.', '')}, the definition says {list(want)} {spec['dtype']}",
                    "reference",
                )
        return refs

    def outputs(self, case: SolCase, result) -> list:
        return normalize_outputs(result, case.signature, self.device)

    def buffers(self, case: SolCase) -> list:
        return allocate_outputs(case.signature, self.device)

    def output_names(self, case: SolCase) -> list[str]:
        return [o["name"] for o in case.signature["outputs"]]

    def output_label(self, name: str | None) -> str:
        return f"output {name!r}: " if name else ""

    def where(self, r: int) -> str:
        return f"round {r}, "

    def atol(self, case: SolCase) -> float:
        return float(case.workload["tolerance"]["max_atol"])

    def nbytes(self, case: SolCase) -> int:
        """Bytes of a workload's tensors (inputs and outputs) from its signature's shapes and dtypes."""
        specs = [*case.signature["inputs"], *case.signature["outputs"]]
        return sum(math.prod(s["shape"]) * _itemsize(s["dtype"]) for s in specs if s.get("shape") is not None)

    def check(self, case: SolCase, outs: list, refs: list, stats: bool = True) -> Checked:
        """Exact tensor type (a subclass could compute lazily on read), shape, dtype, device, then values
        by upstream's rule; the worst output's statistics."""
        worst = None
        for spec, out, ref in zip(case.signature["outputs"], outs, refs, strict=True):
            name = spec["name"]
            found = _structure(out, ref)
            if found:
                return Checked(False, found[0], found[1], name)
            res = compare_matched(out, ref, case.workload["tolerance"])
            rank = (res.has_nan, res.has_inf, res.max_absolute_error)
            if not res.ok:
                return Checked(False, "values", res.reason, name, res, rank)
            if worst is None or rank > worst.rank:
                worst = Checked(True, stats=res, rank=rank)
        return worst or Checked(True)

    def reference_error(self, args: list, refs: list) -> None:
        return None


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()  # float4_e2m1fn_x2: 1, two values


def _structure(out, ref) -> tuple[str, str] | None:
    if type(out) is not torch.Tensor:
        return "type", (
            f"is a {type(out).__name__}, not exactly a torch.Tensor (a subclass can compute or change its values when read)"
        )
    if tuple(out.shape) != tuple(ref.shape):
        return "shape", f"has shape {list(out.shape)}, expected {list(ref.shape)}"
    if out.dtype != ref.dtype:
        return "dtype", (
            f"has dtype {str(out.dtype).replace('torch.', '')}, expected {str(ref.dtype).replace('torch.', '')}"
        )
    if out.device != ref.device:
        return "device", f"is on {out.device}, expected {ref.device}"
    return None


# a SOL record's status for a wrong output, by what is wrong (the values: INCORRECT_NUMERICAL)
_SOL_WRONG = {
    "values": Status.INCORRECT_NUMERICAL,
    "shape": Status.INCORRECT_SHAPE,
    "dtype": Status.INCORRECT_DTYPE,
    "device": Status.RUNTIME_ERROR,
}


def _sol_failure(f: Failure) -> tuple[str, str]:
    """(status, log) of a SOL trace for a Failure of the engine's."""
    if f.kind == Failure.VIOLATION:
        return violation_status(f.code), reward_hack_log(f.code, f.message)
    if f.kind == Failure.WRONG:
        if f.code == "type":
            return violation_status("OUTPUT_NOT_PLAIN_TENSOR"), reward_hack_log(
                "OUTPUT_NOT_PLAIN_TENSOR", f.message
            )
        return _SOL_WRONG.get(f.code, Status.INCORRECT_NUMERICAL), f.message
    if f.kind == Failure.RAISED:  # `plain`: a message that says all (explain: a sys.exit, a wrong return)
        said = f.message if f.code == "plain" else f"solution raised {f.message}"
        return Status.RUNTIME_ERROR, said + (f"\n{f.tb}" if f.tb else "")
    if f.kind == Failure.SKIPPED:
        return Status.SKIPPED, f.message
    if f.kind == Failure.UNUSABLE and f.code == "reference":
        return Status.INVALID_REFERENCE, f.message
    return Status.RUNTIME_ERROR, f.message


@dataclass(frozen=True)
class SolCorrectness:
    """A SOL trace's `correctness`: the worst round's errors by upstream's rule."""

    max_relative_error: float
    max_absolute_error: float
    has_nan: bool
    has_inf: bool
    extra: dict

    @classmethod
    def of(cls, c: Matched | None) -> SolCorrectness | None:
        if c is None:
            return None
        extra = {"matched_ratio": c.matched_ratio}
        return cls(c.max_relative_error, c.max_absolute_error, c.has_nan, c.has_inf, extra)


@dataclass(frozen=True)
class WorkloadRecord:
    """The record of one SOL workload: its status and log, its trace's correctness and performance, its
    timing (benchmark.json's record), the census of its first call, when it finished."""

    id: str
    status: str
    log: str
    correctness: SolCorrectness | None
    performance: Performance | None
    bench: engine.Timing | None
    kernels: Census | None = field(default=None, metadata=engine.OMIT)
    finished_at: str = ""
    stream_checks: StreamChecks | None = field(default=None, metadata=engine.OMIT)


class _Laps:
    """`lap(name)`: add the seconds since the previous lap to phase_s["timing_<name>"] (bench -v's phase
    line sums them over the workloads: where the timing of a workload goes)."""

    def __init__(self, phase_s: dict):
        self.phase_s, self.last = phase_s, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        key = f"timing_{name}"
        self.phase_s[key] = self.phase_s.get(key, 0.0) + now - self.last
        self.last = now


class SolEvaluator:
    """Kind `sol`: `load` loads the reference (here, in the judge) and the solution (in the subject); a
    failed load says which status every workload gets. Per workload: correctness rounds, then timing,
    one record (evaluate_workload)."""

    STEPS = (Step("workload", "cases", Event.CASE),)

    def __init__(self, job, chan, fmt: SolFormat, guard):
        self.job, self.chan, self.fmt, self.settings = job, chan, fmt, job.settings
        budget = engine.RoundBudget(job.settings.budget_s, job.device)
        own = bool(job.settings.require_own_kernels)
        self.engine = engine.JobContext(
            fmt, guard, budget, own_kernels=own, references=job.reference_timings, timing=timing_event(chan)
        )

    @classmethod
    def load(cls, job, chan, subject) -> SolEvaluator | None:
        # a `begin` before each import: should the process exit, crash or hang inside one, the parent
        # knows whose code it was (the reference's: INVALID_REFERENCE, not the solution's fault)
        chan.send(event=Event.BEGIN, stage="reference", case="(loading the reference)")
        try:
            reference = load_source(job.reference)
            ref_fn = reference.run
        except BaseException as exc:  # noqa: BLE001 - also sys.exit() at import; the problem's fault either way
            return _fail(
                chan, Status.INVALID_REFERENCE, f"the reference does not load: {type(exc).__name__}: {exc}"
            )
        sol = job.solution
        chan.send(event=Event.BEGIN, stage="solution", case="(importing the solution)")
        reply = subject.request(
            "load", kind="sol", device=job.device, solution=sol, memory_limit_bytes=job.memory_limit_bytes
        )
        failed = _sol_load_failed(reply, sol)
        if failed:
            return _fail(chan, *failed)
        baseline = None
        if job.baseline:  # the regression gate's same-run comparison: in the reference's place in timing
            reply = subject.request("load_baseline", baseline=job.baseline, solution=sol)
            if not reply.get("ok"):  # a violation too: either way no same-run comparison
                why = (reply.get("error") or reply.get("violation") or {}).get("message")
                return _fail(chan, Status.RUNTIME_ERROR, f"the baseline's solution did not load: {why}")
            baseline = (RemoteOp(subject, "baseline"), job.baseline["dps"])
        chan.send(event=Event.LOAD, ok=True)
        candidate, ns = RemoteOp(subject, "candidate"), vars(reference)
        fmt = SolFormat(
            job.definition_name, job.device, job.salt, candidate, ref_fn, ns, sol["dps"], baseline
        )
        return cls(job, chan, fmt, RemoteGuard(subject))

    def workload(self, case: dict) -> tuple[WorkloadRecord, dict]:
        """The workload's record (correctness rounds, then its timing) and where its time went."""
        self.chan.send(event=Event.BEGIN, stage="correctness", case=case["id"])
        phase_s: dict[str, float] = {}
        record = evaluate_workload(self, SolCase.of(case), phase_s)
        return record, {"phase_s": phase_s}


def evaluate_workload(ev: SolEvaluator, case: SolCase, phase_s: dict) -> WorkloadRecord:
    """The record of one workload. `phase_s` receives the seconds spent in the correctness rounds and in
    timing, and the timing's parts (timing_inputs, timing_warmup, timing_sampling, timing_checks)."""
    settings = ev.settings
    t0 = time.perf_counter()
    ev.engine.kernels = None
    status, log, correctness, performance, bench, held = Status.PASSED, "", None, None, None, None
    try:
        passed = engine.correctness(ev.engine, case, settings.rounds or DEFAULTS.sol_rounds)
        held = passed.stream_checks
        correctness = SolCorrectness.of(passed.stats)
        phase_s["correctness"] = time.perf_counter() - t0
        budget = settings.budget_s
        # timing gets what the correctness rounds left of the workload's budget, and at least half of it
        left = max(budget / 2, budget - phase_s["correctness"]) if budget else None
        bench = _timing(ev, case, passed, left, _Laps(phase_s))
        phase_s["timing"] = time.perf_counter() - t0 - phase_s["correctness"]
        cand, ref = (side.summary.overall.p50 / 1e3 for side in (bench.candidate, bench.reference))
        performance = Performance(cand, ref, bench.speedup)
    except Failure as f:
        status, log = _sol_failure(f)
        correctness = SolCorrectness.of(f.stats) if status == Status.INCORRECT_NUMERICAL else None
        bench = None
        # a verdict (a failure, a skip for the budget) cut the workload short: its seconds still count,
        # in the phase it was in, so the phase line accounts for all of the worker's time
        spent = time.perf_counter() - t0
        if "correctness" not in phase_s:
            phase_s["correctness"] = spent
        elif "timing" not in phase_s:
            phase_s["timing"] = spent - phase_s["correctness"]
    # kernels: whose compute its first call ran (integrity.kernel_census)
    now = dt.datetime.now().isoformat()
    return WorkloadRecord(case.id, status, log, correctness, performance, bench, ev.engine.kernels, now, held)


def _timing(
    ev: SolEvaluator, case: SolCase, passed: engine.Passed, budget_s: float | None, lap
) -> engine.Timing:
    try:
        t = engine.time_case(ev.engine, case, ev.settings, budget_s, case.index, passed.round_s, lap)
    except Failure:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Failure(Failure.TIMING, f"timing failed: {type(exc).__name__}: {exc}\n{_tb()}") from None
    if t.post is not None:
        raise t.post
    return replace(t.record, sampling=replace(t.record.sampling, rounds_run=passed.rounds_run))


def _sol_load_failed(reply: dict, sol: dict) -> tuple[str, str] | None:
    """(status, reason) of a solution the subject could not load, or None when it loaded."""
    if reply.get("ok") is True:
        return None
    if isinstance(reply.get("violation"), dict):
        v = reply["violation"]
        code = str(v.get("code"))
        return violation_status(code), reward_hack_log(code, str(v.get("message")))
    if reply.get("missing_entry"):
        return (
            Status.COMPILE_ERROR,
            f"the solution has no function {sol['entry_function']!r} "
            f"(entry point {sol['entry_file']}::{sol['entry_function']})",
        )
    err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    what = "built module" if sol["group"] == "cpp" else sol["entry_file"]
    return (
        Status.COMPILE_ERROR,
        f"importing the solution ({what}) failed: {err.get('type')}: {err.get('message')}",
    )


def _fail(chan, status: str, reason: str) -> None:
    # a traceback only where an exception is being handled (else format_exc says "NoneType: None")
    tb = traceback.format_exc()[-4000:] if sys.exc_info()[0] is not None else None
    chan.send(event=Event.LOAD, ok=False, status=status, reason=reason, traceback=tb)


# the job kinds that run a candidate, and their evaluators (worker.child.run_job)
EVALUATORS = {"card": CardEvaluator, "sol": SolEvaluator}
