"""Structured failure and refusal codes for `profile` and `compare-profiles`, with their exit codes.

A profile that cannot be trusted is still written, with one of these codes, so the evidence of
why (logs, the CSV that did not parse) is kept next to the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from mini_kv.errors import ExitCode, UserError

# code -> (exit code, what it means)
PROFILE_REASONS: dict[str, tuple[ExitCode, str]] = {
    "NCU_NOT_FOUND": (
        ExitCode.CONFIG,
        "Nsight Compute (ncu) was not found on PATH (or at $MINI_KV_NCU / --ncu)",
    ),
    "NO_CUDA": (ExitCode.CONFIG, "torch sees no CUDA device: there is no GPU kernel to profile"),
    "PERMISSION_DENIED": (
        ExitCode.CONFIG,
        "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM)",
    ),
    "NO_KERNEL_NAMES": (ExitCode.CONFIG, "no __global__ kernel was found in the candidate's CUDA sources"),
    "COMPILE_FAILED": (ExitCode.COMPILE, "the candidate did not build"),
    "NCU_FAILED": (ExitCode.BENCHMARK, "ncu exited with an error or timed out while profiling"),
    "TARGET_FAILED": (
        ExitCode.BENCHMARK,
        "the profiled process failed before or while calling the candidate",
    ),
    "WRONG_OUTPUT": (
        ExitCode.CORRECTNESS,
        "the candidate's output in the profiled run differs from the reference",
    ),
    "NO_MATCHING_KERNEL": (ExitCode.BENCHMARK, "no profiled kernel matches the candidate's kernel filter"),
    "MULTIPLE_MATCHING_KERNELS": (ExitCode.BENCHMARK, "more than one profiled row matches the kernel filter"),
    "REIMPORT_FAILED": (ExitCode.BENCHMARK, "the saved .ncu-rep report could not be re-imported"),
    "CSV_UNPARSABLE": (ExitCode.BENCHMARK, "the re-imported raw CSV could not be parsed"),
    "MISSING_METRICS": (ExitCode.BENCHMARK, "required metrics are absent or n/a in the target kernel's row"),
}

# compare-profiles refuses with one of these (exit CONFIG: the two profiles cannot be compared)
COMPARE_REASONS: dict[str, str] = {
    "PROFILE_INVALID": "not a readable profile directory (profile.json missing, unreadable, wrong schema or version)",
    "PROFILE_TAMPERED": "a file differs from its recorded SHA-256, or profile.json disagrees with its raw CSV",
    "PROFILE_FAILED": "the profile was recorded as failed",
    "TASK_MISMATCH": "the profiles are of different tasks (id, version or operator version)",
    "CASE_MISMATCH": "the profiles are of different cases (id, dtype or parameters)",
    "ENVIRONMENT_MISMATCH": "the profiles come from different environments (machine, driver, torch, compilers, ncu)",
    "INPUT_MISMATCH": "the profiled inputs differ (seed or input digest)",
}


@dataclass(frozen=True)
class FailureReason:
    """Why a profile failed (profile.json's `reason`): a PROFILE_REASONS code, what happened, its details."""

    code: str
    message: str
    details: dict


class ProfileFailure(Exception):
    """A step of `profile` failed for a recorded reason; carries the code and details."""

    def __init__(self, code: str, message: str, **details):
        if code not in PROFILE_REASONS:
            raise ValueError(f"unknown profile failure code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = code, message, details

    @property
    def reason(self) -> FailureReason:
        return FailureReason(self.code, self.message, self.details)

    @property
    def exit_code(self) -> ExitCode:
        return PROFILE_REASONS[self.code][0]


class CompareRefused(UserError):
    """compare-profiles will not compare these two profiles; `reasons` lists every code found."""

    def __init__(self, reasons: list):  # profile.compare.Refusal records
        self.reasons = reasons
        for r in reasons:
            if r.code not in COMPARE_REASONS:
                raise ValueError(f"unknown compare refusal code {r.code!r}")
        text = "; ".join(f"{r.code}: {r.message}" for r in reasons)
        super().__init__(f"refusing to compare: {text}", ExitCode.CONFIG)

    @property
    def code(self) -> str:
        return self.reasons[0].code
