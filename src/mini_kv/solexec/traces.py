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

from mini_kv.status import Status

STATUSES = tuple(
    Status[s]
    for s in "PASSED INVALID_REFERENCE INCORRECT_SHAPE INCORRECT_NUMERICAL INCORRECT_DTYPE RUNTIME_ERROR "
    "COMPILE_ERROR TIMEOUT REWARD_HACK".split()
)
CORRECTNESS_KEYS = ("max_relative_error", "max_absolute_error", "has_nan", "has_inf", "extra")
PERFORMANCE_KEYS = ("latency_ms", "reference_latency_ms", "speedup_factor")


def trace_environment(env: dict) -> dict:
    """{hardware, libs}: the GPU's name (or the CPU's), and the torch, triton and CUDA versions present."""
    gpu = env.get("gpu") or {}
    hardware = gpu.get("name") or f"CPU ({platform.processor() or env.get('machine') or 'unknown'})"
    libs = {"torch": env["torch"]}
    try:
        libs["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass  # upstream's libs map holds versions only: an absent library is left out
    if env.get("torch_cuda"):
        libs["cuda"] = env["torch_cuda"]
    return {"hardware": hardware, "libs": libs}


def _correctness(c: dict) -> dict:
    """The trace's correctness block. An error that is not a finite number (the comparison computes
    finite ones, see check.py; a caller may not) is recorded SOL-ExecBench's way, never raised: 0.0,
    with `has_nan` / `has_inf` set to say why it is meaningless."""
    block = {"has_nan": bool(c["has_nan"]), "has_inf": bool(c["has_inf"])}
    for key in ("max_relative_error", "max_absolute_error"):
        value = c[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"trace {key} must be a non-negative number, got {value!r}")
        block[key] = float(value) if math.isfinite(value) else 0.0
        if math.isnan(value):
            block["has_nan"] = True
        elif math.isinf(value):
            block["has_inf"] = True
    return {**{k: block[k] for k in CORRECTNESS_KEYS if k in block}, "extra": c.get("extra")}


def _finite(value: float, name: str) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"trace {name} must be a finite non-negative number, got {value!r}")
    return float(value)


def make_trace(
    definition: str,
    workload: dict,
    solution: str,
    status: str,
    environment: dict,
    log: str = "",
    correctness: dict | None = None,
    performance: dict | None = None,
    timestamp: str | None = None,
) -> dict:
    """One trace; raises ValueError when the status and the blocks it carries disagree."""
    if status not in STATUSES:
        raise ValueError(f"unknown trace status {status!r}")
    if status == Status.PASSED and (correctness is None or performance is None):
        raise ValueError("a PASSED trace carries correctness and performance")
    if status == Status.INCORRECT_NUMERICAL and (correctness is None or performance is not None):
        raise ValueError("an INCORRECT_NUMERICAL trace carries correctness only")
    if status not in (Status.PASSED, Status.INCORRECT_NUMERICAL) and (
        correctness is not None or performance is not None
    ):
        raise ValueError(f"a {status} trace carries neither correctness nor performance")
    corr = None if correctness is None else _correctness(correctness)
    perf = None if performance is None else {k: _finite(performance[k], k) for k in PERFORMANCE_KEYS}
    return {
        "definition": definition,
        "workload": workload,
        "solution": solution,
        "evaluation": {
            "status": status,
            "environment": environment,
            "timestamp": timestamp or dt.datetime.now().isoformat(),
            "log": log,
            "correctness": corr,
            "performance": perf,
        },
    }


def dumps(trace: dict) -> str:
    """One JSONL line; strict JSON (no NaN or Infinity)."""
    return json.dumps(trace, allow_nan=False)
