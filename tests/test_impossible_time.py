"""Physically impossible times (issue 35): a timed case faster than its roofline floor (its bytes at twice
the measured copy bandwidth) is a verdict of its own, IMPOSSIBLE_TIME, and never ranked, however the
attempt is indexed or relabelled."""

from __future__ import annotations

import json

import pytest
from test_index import attempt_records, write_attempt
from test_store_forgery import _reseal

from mini_kv import roofline
from mini_kv.codec import from_json, to_json
from mini_kv.leaderboard import build_leaderboard, why_nothing_ranked
from mini_kv.model import WorkerResults
from mini_kv.status import Status
from mini_kv.store.headline import card_headline
from mini_kv.store.index import rebuild_index

GB = 1e9
PEAK = 4000 * GB  # an H200's measured copy bandwidth, about


def _rec(l2: str = "cold", nbytes: float = 2 * GB, peak=PEAK) -> dict:
    return {"id": "bench_a", "l2": l2, "bytes": nbytes, "peak_bw_Bps": peak}


def test_the_floor_is_bytes_at_twice_the_measured_bandwidth():
    floor_us = 2 * GB / (2 * PEAK) * 1e6  # 250 us
    assert roofline.impossible_time(_rec(), floor_us * 1.01) is None
    assert roofline.impossible_time(_rec(), 2 * GB / PEAK * 1e6) is None  # at the measured bandwidth: fine
    why = roofline.impossible_time(_rec(), floor_us / 10)
    assert why.startswith("IMPOSSIBLE_TIME: case bench_a") and "never ranked" in why


@pytest.mark.parametrize(
    "rec",
    [
        _rec(l2="hot"),  # a warm L2 serves the data without the memory bus: no bytes floor
        _rec(l2="n/a", peak=None),  # CPU: no bandwidth measured
        _rec(nbytes=None),
        _rec(peak=0),
        {"id": "x", "l2": "cold", "bytes": "1e9", "peak_bw_Bps": True},  # malformed: no verdict from it
    ],
)
def test_no_floor_where_none_is_known(rec):
    assert roofline.impossible_time(rec, 1e-3) is None


def _impossible_attempt(art, candidate="v0", seed=1, forge_passed=False):
    """A correct attempt whose one cold-L2 case moved 2 GB in about 10 us (200 TB/s)."""
    files, header = attempt_records(speedups={"bench_a": 50.0}, seed=seed)
    bench = files["benchmark.json"]
    for case in bench["cases"]:
        case.update(l2="cold", bytes=2 * GB, peak_bw_Bps=PEAK)
    head = card_headline(
        "ok", from_json(WorkerResults, files["correctness.json"]), bench["cases"], False, "cpu"
    )
    bench["summary"] = head.benchmark
    header.update(status=head.status, benchmark=head.benchmark, exit_code=5)
    attempt = write_attempt(art, "vector_add", candidate, files, header)
    if forge_passed:  # relabelled by hand, file list fixed up
        _reseal(attempt, {"status": "PASSED", "exit_code": 0})
    return attempt, head


def test_an_impossible_time_is_a_status_of_its_own_and_never_ranked(tmp_path):
    art = tmp_path / "artifacts"
    attempt, head = _impossible_attempt(art)
    assert head.status == Status.IMPOSSIBLE_TIME
    assert "IMPOSSIBLE_TIME: case bench_a" in head.benchmark["impossible"][0]
    assert rebuild_index(art).problems == []  # indexed as what it is
    board = build_leaderboard(art)
    assert board.groups == ()
    assert "1 not PASSED (IMPOSSIBLE_TIME)" in why_nothing_ranked(art, board)


def test_relabelling_it_passed_is_tampered(tmp_path):
    art = tmp_path / "artifacts"
    attempt, _ = _impossible_attempt(art, forge_passed=True)
    (p,) = rebuild_index(art).problems
    assert p.kind == "tampered" and "IMPOSSIBLE_TIME" in p.message and "PASSED" in p.message
    assert build_leaderboard(art).groups == ()
    assert json.loads((attempt / "attempt.json").read_text())["status"] == "PASSED"


# ----------------------------------------------------------------------------------- SOL-ExecBench


def _sol_outcomes(problem, l2="cold"):
    from test_index import synth_samples

    from mini_kv.solexec.run import WorkloadOutcome

    return tuple(
        WorkloadOutcome(
            wl.uuid,
            Status.PASSED,
            "",
            correctness={
                "max_relative_error": 0.0,
                "max_absolute_error": 0.0,
                "has_nan": False,
                "has_inf": False,
            },
            performance={"latency_ms": 0.01, "reference_latency_ms": 0.01, "speedup_factor": 1.0},
            bench={
                "l2": l2,
                "candidate": {"samples": synth_samples(10.0, i)},
                "reference": {"samples": synth_samples(10.0, i + 50)},
            },
        )
        for i, wl in enumerate(problem.payload[1])
    )


def test_a_sol_workload_under_its_floor_is_impossible_time_and_reward_hack_in_its_trace():
    from pathlib import Path

    from mini_kv import environment
    from mini_kv.solexec import floor
    from mini_kv.solexec.run import BenchOptions, build_traces, load_problem
    from mini_kv.store.headline import sol_headline

    sols = Path(__file__).parent / "sol_solutions"
    opts = BenchOptions(solution=str(sols / "good_return" / "solution.json"))
    problem = load_problem(str(sols / "problem"), opts)
    definition, workloads = problem.payload
    assert floor.output_bytes(definition, workloads[0]) == 3 * 8 * 4 + 4  # y (n x d float32) and total
    # a 1 kB/s "device": 100 bytes take at least 50 ms, so 10 us is impossible
    outcomes = floor.judge_times(definition, workloads, _sol_outcomes(problem), peak_bw_Bps=1e3)
    assert {o.status for o in outcomes} == {Status.IMPOSSIBLE_TIME}
    trace = to_json(build_traces(problem, outcomes, environment.collect())[0])["evaluation"]
    assert trace["status"] == "REWARD_HACK" and trace["log"].startswith("IMPOSSIBLE_TIME: ")
    assert trace["correctness"] is None and trace["performance"] is None
    records = [{"id": o.id, **o.bench} for o in outcomes]
    head = sol_headline([to_json(o) for o in outcomes], records)
    assert head.status == Status.IMPOSSIBLE_TIME
    relabelled = [{**to_json(o), "status": Status.PASSED} for o in outcomes]
    assert sol_headline(relabelled, records).status == Status.IMPOSSIBLE_TIME  # the records decide
    # a real device (4 TB/s), warm L2 or no bandwidth: no floor reached
    for peak, l2 in ((4e12, "cold"), (1e3, "hot"), (None, "cold")):
        outcomes = floor.judge_times(definition, workloads, _sol_outcomes(problem, l2), peak)
        assert {o.status for o in outcomes} == {Status.PASSED}
