"""Every status word mini_kv writes or reads, in one place.

`StrEnum` members are `str`s: they compare equal to the words stored in JSON records (so records
written before this module still read), serialise with `json.dumps` unchanged, and print as the word.
Code compares and builds statuses with these members; the words themselves appear only here and in
the JSON Schemas under `schemas/`.
"""

from __future__ import annotations

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
