"""Physically impossible times on SOL-ExecBench workloads: the parent's check of each timed workload
against its roofline floor (roofline.impossible_time), before traces and the attempt are written.

The floor's bytes are the workload's outputs only: every output byte must be written, whatever the
kernel does, while an input need not be read whole (a gather reads a few rows of a large table), so
input bytes would flag honest kernels. A workload under its floor gets the status IMPOSSIBLE_TIME
(SOL-ExecBench's REWARD_HACK in its trace, the log starting with the code), and no correctness or
performance block: its time is not a measurement of work."""

from __future__ import annotations

from mini_kv import roofline, stats
from mini_kv.judge.regression import timed
from mini_kv.solexec.definition import Definition
from mini_kv.solexec.workload import Workload
from mini_kv.status import Status


def output_bytes(definition: Definition, workload: Workload) -> int:
    """Bytes every correct run of the workload writes: the sum of its output tensors' sizes."""
    return sum(definition.nbytes(spec, workload.resolved_axes) for spec in definition.outputs)


def judge_times(
    definition: Definition, workloads: list[Workload], outcomes: dict[str, dict], peak_bw_Bps: float | None
) -> None:
    """Mark every PASSED workload timed below its floor IMPOSSIBLE_TIME (in place); record the floor's
    inputs (`bytes`, `peak_bw_Bps`) in each timed workload's bench record, so the index recomputes it."""
    for wl in workloads:
        o = outcomes.get(wl.uuid) or {}
        bench = o.get("bench")
        if not bench or not timed(bench):
            continue
        bench.update(bytes=float(output_bytes(definition, wl)), peak_bw_Bps=peak_bw_Bps)
        why = roofline.impossible_time(
            {"id": wl.uuid, **bench}, stats.summarize_repeats(bench["candidate"]["samples"]).overall.p50
        )
        if why and o.get("status") == Status.PASSED:
            o.update(status=Status.IMPOSSIBLE_TIME, log=why, correctness=None, performance=None)
