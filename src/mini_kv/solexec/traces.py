"""Trace records in upstream's layout, field for field, with the status invariants checked where built.

{definition, workload {axes, inputs, uuid, tolerance}, solution, evaluation {status, environment
{hardware, libs}, timestamp, log, correctness, performance}}: PASSED carries correctness and
performance, INCORRECT_NUMERICAL correctness only, every other status neither (null).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import math
import platform
from dataclasses import dataclass

from mini_kv.codec import to_json
from mini_kv.environment import Environment
from mini_kv.model import Performance
from mini_kv.solexec.workload import TraceWorkload
from mini_kv.status import Status

STATUSES = tuple(
    Status[s]
    for s in "PASSED INVALID_REFERENCE INCORRECT_SHAPE INCORRECT_NUMERICAL INCORRECT_DTYPE RUNTIME_ERROR "
    "COMPILE_ERROR TIMEOUT REWARD_HACK".split()
)
PERFORMANCE_KEYS = ("latency_ms", "reference_latency_ms", "speedup_factor")


@dataclass(frozen=True)
class TraceEnvironment:
    hardware: str
    libs: dict[str, str]


@dataclass(frozen=True)
class Correctness:
    max_relative_error: float
    max_absolute_error: float
    has_nan: bool
    has_inf: bool
    extra: object = None


@dataclass(frozen=True)
class Evaluation:
    status: str
    environment: TraceEnvironment
    timestamp: str
    log: str
    correctness: Correctness | None
    performance: Performance | None


@dataclass(frozen=True)
class Trace:
    """One trace, in upstream's field order (to_json writes it as upstream does)."""

    definition: str
    workload: TraceWorkload
    solution: str
    evaluation: Evaluation


def trace_environment(env: Environment) -> TraceEnvironment:
    """{hardware, libs}: the GPU's name (or the CPU's), and the torch, triton and CUDA versions present."""
    hardware = env.gpu.name if env.gpu else f"CPU ({platform.processor() or env.machine or 'unknown'})"
    libs = {"torch": env.torch}
    try:
        libs["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass  # upstream's libs map holds versions only: an absent library is left out
    if env.torch_cuda:
        libs["cuda"] = env.torch_cuda
    return TraceEnvironment(hardware, libs)


def _correctness(c: dict) -> Correctness:
    """The trace's correctness block. An error that is not a finite number (the comparison computes
    finite ones, see check.py; a caller may not) is recorded SOL-ExecBench's way, never raised: 0.0,
    with `has_nan` / `has_inf` set to say why it is meaningless."""
    has_nan, has_inf, errors = bool(c["has_nan"]), bool(c["has_inf"]), []
    for key in ("max_relative_error", "max_absolute_error"):
        value = c[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"trace {key} must be a non-negative number, got {value!r}")
        errors.append(float(value) if math.isfinite(value) else 0.0)
        has_nan, has_inf = has_nan or math.isnan(value), has_inf or math.isinf(value)
    return Correctness(*errors, has_nan, has_inf, c.get("extra"))


def _finite(value: float, name: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"trace {name} must be a finite non-negative number, got {value!r}")
    return float(value)


def make_trace(
    definition: str,
    workload: TraceWorkload,
    solution: str,
    status: str,
    environment: TraceEnvironment,
    log: str = "",
    correctness: dict | None = None,
    performance: dict | None = None,
    timestamp: str | None = None,
) -> Trace:
    """One trace; raises ValueError when the status and the blocks it carries disagree."""
    if status not in STATUSES:
        raise ValueError(f"unknown trace status {status!r}")
    blocks = {Status.PASSED: (True, True), Status.INCORRECT_NUMERICAL: (True, False)}.get(
        status, (False, False)
    )
    if (correctness is not None, performance is not None) != blocks:
        what = {(True, True): "correctness and performance", (True, False): "correctness only"}
        raise ValueError(
            f"a {status} trace carries {what.get(blocks, 'neither correctness nor performance')}"
        )
    corr = None if correctness is None else _correctness(correctness)
    perf = (
        None if performance is None else Performance(*(_finite(performance[k], k) for k in PERFORMANCE_KEYS))
    )
    evaluation = Evaluation(status, environment, timestamp or dt.datetime.now().isoformat(), log, corr, perf)
    return Trace(definition, workload, solution, evaluation)


def dumps(trace: Trace) -> str:
    """One JSONL line; strict JSON (no NaN or Infinity)."""
    return json.dumps(to_json(trace), allow_nan=False)
