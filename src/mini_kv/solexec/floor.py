"""Physically impossible times on SOL-ExecBench workloads: the parent's check of each timed workload
against its roofline floor (roofline.impossible_time), before traces and the attempt are written.

The floor's bytes are the workload's outputs only: every output byte must be written, whatever the
kernel does, while an input need not be read whole (a gather reads a few rows of a large table), so
input bytes would flag honest kernels. A workload under its floor gets the status IMPOSSIBLE_TIME
(SOL-ExecBench's REWARD_HACK in its trace, the log starting with the code), and no correctness or
performance block: its time is not a measurement of work."""

from __future__ import annotations

from dataclasses import replace

from mini_kv import roofline, stats
from mini_kv.judge.regression import timed
from mini_kv.solexec.definition import Definition
from mini_kv.solexec.workload import Workload
from mini_kv.status import Status


def output_bytes(definition: Definition, workload: Workload) -> int:
    """Bytes every correct run of the workload writes: the sum of its output tensors' sizes."""
    return sum(definition.nbytes(spec, workload.resolved_axes) for spec in definition.outputs)


def judge_times(
    definition: Definition, workloads: list[Workload], outcomes: tuple, peak_bw_Bps: float | None
) -> tuple:
    """The outcomes (run.WorkloadOutcome) with every PASSED workload timed below its floor IMPOSSIBLE_TIME,
    and the floor's inputs (`bytes`, `peak_bw_Bps`) in each timed workload's bench record, so the index
    recomputes it."""
    by_uuid = {wl.uuid: wl for wl in workloads}
    return tuple(
        _judged(definition, by_uuid[o.id], o, peak_bw_Bps) if o.id in by_uuid else o for o in outcomes
    )


def _judged(definition: Definition, wl: Workload, o, peak_bw_Bps: float | None):
    if not o.bench or not timed(o.bench):
        return o
    bench = {**o.bench, "bytes": float(output_bytes(definition, wl)), "peak_bw_Bps": peak_bw_Bps}
    p50 = stats.summarize_repeats(bench["candidate"]["samples"]).overall.p50
    why = roofline.impossible_time({"id": wl.uuid, **bench}, p50)
    if why and o.status == Status.PASSED:
        return replace(
            o, status=Status.IMPOSSIBLE_TIME, log=why, correctness=None, performance=None, bench=bench
        )
    return replace(o, bench=bench)
