"""Builds ahead of evaluation: a batch's C++ builds on every core while the GPU evaluates earlier items.

A build goes through the same compile step as `verify` (`compile.compiler.compile_candidate`) or `bench`
(`solexec.run.compile_problem`), into the project's content-addressed `.build/`, so the evaluation of
the same item is a cache hit; identical sources are built once (the cache's per-key file lock makes a
second build of a key wait for the first and read it). A build that fails here is simply not cached:
the evaluation builds it again and records its COMPILE_ERROR, so nothing is decided here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from mini_kv import jail
from mini_kv.environment import pick_device

if TYPE_CHECKING:
    from mini_kv.compile.compiler import CompileRecord


def build_solution(problem_dir: str, solution_json: str, compile_timeout: float) -> CompileRecord | None:
    """A SOL solution's build record, as `bench` would build it; None for a Python solution or a
    language that cannot build here (nothing to build)."""
    from mini_kv.solexec.build import stage_sources
    from mini_kv.solexec.run import BenchOptions, compile_problem, load_problem

    opts = BenchOptions(solution=solution_json, compile_timeout=compile_timeout)
    problem = load_problem(problem_dir, opts)
    if problem.candidates[0].group != "cpp":
        return None
    with jail.scratch("prebuild") as tmp:
        stage_sources(problem.candidates[0], tmp / "solution")
        rec, _ = compile_problem(problem, tmp, opts, lambda msg: None)
    return rec


def build_card_candidate(
    card_path: str, cand_id: str, device: str | None, compile_timeout: float
) -> CompileRecord:
    """A task card candidate's build record, as `verify` would build it for `device`."""
    from mini_kv.compile.compiler import compile_candidate
    from mini_kv.load.task_card import load_task_card

    card = load_task_card(card_path)
    with_cuda = None if (device or pick_device(None)).startswith("cuda") else False
    return compile_candidate(
        Path(card.project_root), card.candidate(cand_id), timeout=compile_timeout, with_cuda=with_cuda
    )


def pool_size() -> int:
    return max(1, os.cpu_count() or 1)


BUILD_NICENESS = 10  # added to the batch's own nice value (at most 19)


def lower_priority() -> None:
    """A build thread's initializer: this thread, and so every compiler it starts (a child inherits the
    nice value of the thread that spawns it), BUILD_NICENESS below the batch. The builds ahead take every
    idle core but yield to the evaluation beside them (its judge and subject: the harness's Python, the
    timed calls' launches), which is the batch's critical path and must not queue behind a compiler."""
    import threading

    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BUILD_NICENESS))


def overlaps_evaluation(devices: set[str | None], count: int) -> bool:
    """Builds run beside evaluation only where timing happens on a GPU: on a CPU device a compiler
    beside the timed code would take the cores the timing measures."""
    if count < 2:
        return False
    return all((d or pick_device(None)).startswith("cuda") for d in devices)
