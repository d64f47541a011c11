"""Every status word mini_kv writes or reads, in one place.

`StrEnum` members are `str`s: they compare equal to the words stored in JSON records (so records
written before this module still read), serialise with `json.dumps` unchanged, and print as the word.
Code compares and builds statuses with these members; the words themselves appear only here and in
the JSON Schemas under `schemas/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """The verdict of a case, a workload, a contract check or a whole attempt (both front doors)."""

    PASSED = "PASSED"
    INCORRECT = "INCORRECT"  # a task-card case or attempt whose output is wrong
    INCORRECT_SHAPE = "INCORRECT_SHAPE"  # SOL-ExecBench's finer words for a wrong output
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    FAILED = "FAILED"  # a contract check that failed; a SOL attempt with a failed workload
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    BENCHMARK_ERROR = "BENCHMARK_ERROR"
    INVALID_CASE = "INVALID_CASE"  # the card's own input factory failed: the card's fault
    INVALID_REFERENCE = "INVALID_REFERENCE"  # the problem's reference failed: the problem's fault
    REWARD_HACK = "REWARD_HACK"
    # a timed case faster than its roofline floor (roofline.impossible_time): a verdict of its own, never ranked
    IMPOSSIBLE_TIME = "IMPOSSIBLE_TIME"
    SKIPPED = "SKIPPED"  # not applicable here (device, no core case); says why
    NOT_RUN = "NOT_RUN"  # not attempted (an earlier failure decided it); says why
    WORKER_LOST = "WORKER_LOST"  # a batch item whose every cluster worker died under it: no attempt


@dataclass(frozen=True)
class ViolationClass:
    """One class of integrity violation: the status every front door gives a case, workload or attempt
    where it fired (`status`), SOL-ExecBench's word for it in a trace (`sol_name`: upstream has no
    IMPOSSIBLE_TIME), and what it means (docs/integrity.md renders this table: `violation_table`)."""

    status: Status
    sol_name: Status
    meaning: str


def _hack(meaning: str) -> ViolationClass:
    return ViolationClass(Status.REWARD_HACK, Status.REWARD_HACK, meaning)


# The one verdict vocabulary: reason code -> its class. Task cards (`verify`) and SOL-ExecBench (`bench`)
# both read the status here, whichever check or engine saw the violation first.
VIOLATIONS: dict[str, ViolationClass] = {
    "HARNESS_TAMPERED": _hack(
        "a function the verdict or the timer depends on was replaced, or the process state the harness "
        "set (environment, thread settings, trace hooks, files) changed"
    ),
    "PRECISION_FLAGS_CHANGED": _hack(
        "a torch.backends precision switch (TF32, reduced-precision reductions, float32 matmul "
        "precision) changed"
    ),
    "STREAM_SWITCHED": _hack("the current CUDA stream is not the one the harness set"),
    "STREAM_ESCAPE": _hack(
        "the output was not ready on the caller's stream when the call returned: work on another stream "
        "not joined back"
    ),
    "THREAD_ESCAPE": _hack(
        "work left running after the call returned (a new thread, or an output that completed after "
        "the call without another call)"
    ),
    "DEFERRED_WORK": _hack(
        "the output was completed by a later call (in a correctness round, or a timed call's output "
        "that changed between its return and the end of its batch)"
    ),
    "OUTPUT_NOT_PLAIN_TENSOR": _hack("the output is not exactly a torch.Tensor with real, dense storage"),
    "OUTPUT_ALIASES_INPUT": _hack("the output shares memory with an input"),
    "OUTPUT_ALIASES_REFERENCE": _hack("the output shares memory with the reference's output"),
    "INPUT_MUTATED": _hack("the call changed its inputs"),
    "CALL_ORDER_DEPENDENT": _hack(
        "right or wrong depending on when it is called (before or after the reference, or how many "
        "calls came before)"
    ),
    "REPLAYED_RESULT": _hack(
        "the output was not computed from this call's inputs (a cached or earlier result)"
    ),
    "DEGENERATE_OUTPUT": _hack(
        "an all-zero, constant or near-zero output that passes the tolerance only because the "
        "reference's values are small"
    ),
    "STALE_OUTPUT_AFTER_TIMING": _hack(
        "a timed call's output wrong when the judge checked it, or wrong after the timed calls, or on "
        "new values written into the same buffers (a call there that runs out of device memory is a "
        "`RUNTIME_ERROR` saying so: beside other processes on the device an honest solution can)"
    ),
    "NO_DEVICE_WORK": _hack("timed calls launched no device work at all"),
    "FORGED_RESULT_CHANNEL": _hack(
        "unsigned data on the worker's result channel, or an answer from the subject process out of "
        "turn or out of protocol"
    ),
    "LIBRARY_DELEGATION": _hack(
        "under --require-own-kernels: the candidate's calls ran no kernel of its own, only library "
        "ones (aten, cuBLAS, cuDNN...)"
    ),
    "IMPOSSIBLE_TIME": ViolationClass(
        Status.IMPOSSIBLE_TIME,
        Status.REWARD_HACK,
        "timings the subject claimed that the judge's own clock rules out, or a time below the "
        "roofline floor",
    ),
}

# which status wins when several violations fired in one attempt
_SEVERITY = (Status.REWARD_HACK, Status.IMPOSSIBLE_TIME)


def violation_status(code: str) -> Status:
    """The status of a case, workload or attempt where the defence `code` fired (VIOLATIONS). A code no
    defence gives (a subject naming one it made up) is a cheat all the same."""
    return VIOLATIONS[code].status if code in VIOLATIONS else Status.REWARD_HACK


def verdict_of(codes) -> Status | None:
    """The status of an attempt whose records name these reason codes (None without any)."""
    return verdict_of_statuses({VIOLATIONS[c].status for c in codes if c in VIOLATIONS})


def verdict_of_statuses(statuses) -> Status | None:
    """The status of an attempt whose cases or workloads have these statuses, where one is a
    violation's (None without any)."""
    return next((s for s in _SEVERITY if s in statuses), None)


VIOLATION_STATUSES = frozenset(v.status for v in VIOLATIONS.values())


def violation_table() -> str:
    """VIOLATIONS as the Markdown table docs/integrity.md holds (a test keeps the two equal)."""
    rows = ["| code | status | SOL-ExecBench trace | what was seen |", "| --- | --- | --- | --- |"]
    rows += [f"| `{c}` | `{v.status}` | `{v.sol_name}` | {v.meaning} |" for c, v in VIOLATIONS.items()]
    return "\n".join(rows)


# what a task-card attempt's status means for the exit code's severity (see errors.ExitCode)
INCORRECT_STATUSES = frozenset(
    {Status.INCORRECT, Status.INCORRECT_SHAPE, Status.INCORRECT_NUMERICAL, Status.INCORRECT_DTYPE}
)


# the words of records written before schema_version 2 (store.records migrates them on read)
V1_CASE_WORDS = {"PASS": Status.PASSED, "FAIL": Status.INCORRECT}  # a task-card case
V1_CHECK_WORDS = {"PASS": Status.PASSED, "FAIL": Status.FAILED}  # a contract check
V1_BENCH_WORDS = {"ERROR": Status.BENCHMARK_ERROR}  # a bench case that did not time


class Verdict(StrEnum):
    """The regression gate's verdict on a case and on an attempt (regression.json)."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    UNCONFIRMED = "UNCONFIRMED"  # a suspected regression the same-run comparison did not confirm
    MISSING = "MISSING"  # a baseline case the attempt did not time
    INCOMPARABLE = "INCOMPARABLE"  # other environment, suite or settings
    TAMPERED = "TAMPERED"  # a baseline file that does not match its own hashes


class StopReason(StrEnum):
    """Why a measurement stopped taking samples (benchmark.json's `sampling`; stats.sampling_step)."""

    CONVERGED = "converged"  # the median's 95 % CI reached the target width
    BUDGET = "budget"  # the case's time budget was spent first
    MAX = "max"  # the maximum sample count was reached first
    FIXED = "fixed"  # a fixed count was asked for and taken


class BuildStatus(StrEnum):
    """A build's outcome (compile.json)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    INCONCLUSIVE = "inconclusive"
    UNAVAILABLE = "unavailable"  # a solution language this machine cannot build


class ProfileStatus(StrEnum):
    """A profile's outcome (profile.json)."""

    OK = "ok"
    FAILED = "failed"


if __name__ == "__main__":  # the verdict table docs/integrity.md holds
    print(violation_table())
