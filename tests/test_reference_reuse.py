"""In a batch the reference is timed in full once per workload and device, and re-checked for drift by
the later solutions (worker/reference.py, pipeline.ReferenceCache); a drift re-times it; the option
--interleave-reference times it beside every solution, as a single run does; a candidate cannot put a
timing into the parent's cache. Real runs through the front doors (the Python API, bench), on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv import api, pipeline
from mini_kv.errors import UserError
from mini_kv.pipeline import ReferenceCache
from mini_kv.settings import switch_from_environment

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "sol_solutions" / "problem"
GOOD = [ROOT / "tests" / "sol_solutions" / name / "solution.json" for name in ("good_return", "good_dps")]
FORGER = ROOT / "tests" / "exploits" / "sol" / "forge_channel" / "solution.json"
# max_cv 3.0: a band of 300 % for the re-check (a median within 4x of the cached one either way), so a
# busy shared CPU cannot turn a reuse into a re-time (a CI run saw a 30-us reference at 68 us, drift 115 %;
# the drift tests force theirs, 50x); adaptive sampling, as a batch runs, within a short budget
FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "timeout": 120.0, "budget": 1.5, "max_cv": 3.0}


def third() -> api.Solution:
    source = "import torch\n\ndef forward(x, w, alpha):\n    y = (w * alpha) * x\n    return {'y': y, 'total': y.sum()}\n"
    return api.Solution(name="scale_mul_third", entry_point="m.py::forward", sources={"m.py": source})


def cases_of(result: api.Result) -> dict[str, dict]:
    doc = json.loads((result.attempt / "benchmark.json").read_text())
    return {c["id"]: c for c in doc["cases"]}


def assert_no_two_timings_overlapped(case_lists) -> None:
    """Every timed case's span (when its timing had the device), across all the attempts of a batch: in
    order, each ends before the next starts (at most one timing on a device at any moment)."""
    case_lists = [list(cases) for cases in case_lists]
    for c in (c for cases in case_lists for c in cases):
        # the span holds at least the candidate's timed calls (microseconds each)
        timed_s = sum(x for rep in c["candidate"]["samples"] for x in rep) * 1e-6
        assert c["span"]["end"] - c["span"]["start"] >= timed_s > 0, (c["id"], c["span"], timed_s)
    spans = sorted((c["span"]["start"], c["span"]["end"], c["id"]) for cases in case_lists for c in cases)
    assert spans, "no timed case"
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:], strict=False):
        assert s0 <= e0 <= s1 <= e1, f"{a} ({s0:.6f}-{e0:.6f}) overlaps {b} ({s1:.6f}-{e1:.6f})"


def test_the_overlap_check_fails_on_two_timings_that_shared_the_device():
    one = {"id": "a", "span": {"start": 10.0, "end": 12.0}, "candidate": {"samples": [[1.0]]}}
    assert_no_two_timings_overlapped([[one], [{**one, "id": "b", "span": {"start": 12.5, "end": 13.0}}]])
    with pytest.raises(AssertionError, match="a .* overlaps b"):
        assert_no_two_timings_overlapped([[one], [{**one, "id": "b", "span": {"start": 11.0, "end": 13.0}}]])


def run(tmp_path: Path, solutions: list, **options) -> list[tuple[api.Result, dict[str, dict]]]:
    results = list(api.evaluate(PROBLEM, solutions, artifacts=tmp_path / "a", **{**FAST, **options}))
    return [(r, cases_of(r)) for r in results]


@pytest.mark.slow
def test_a_batch_times_the_reference_once_per_workload_and_rechecks_it(tmp_path):
    (first, timed), *later = run(tmp_path, [*GOOD, third()])
    assert_no_two_timings_overlapped([timed.values(), *(cases.values() for _, cases in later)])
    assert (
        first.passed and timed and {c["reference_timing"]["source"] for c in timed.values()} == {"measured"}
    )
    for result, cases in later:
        assert result.passed, result.reason
        assert cases.keys() == timed.keys()
        for cid, case in cases.items():
            full, how = timed[cid]["reference"], case["reference_timing"]
            assert how["source"] == "reused", how
            assert how["attempt"] == first.attempt.name and how["solution"] == "scale_mul_good_return"
            check = how["recheck"]
            assert check["verdict"] == "within"
            assert 1 / (1 + check["band"]) <= 1 + check["drift"] <= 1 + check["band"]
            taken = sum(full["sampling"]["taken"])
            # the re-check: a tenth of the full count, at least min_samples (5 on CPU), timed here
            assert check["samples"] == min(taken, max(5, -(-taken // 10))) < taken
            assert case["sampling"]["timed_calls"]["reference"] == check["samples"]
            # the reference side is the cached full measurement, and the speedup is computed from it
            assert case["reference"]["samples"] == full["samples"]
            assert check["cached_p50"] == pytest.approx(case["reference"]["summary"]["overall"]["p50"])
            cand = case["candidate"]["summary"]["overall"]["p50"]
            assert case["speedup"] == pytest.approx(check["cached_p50"] / cand)


@pytest.mark.slow
def test_a_drifted_recheck_times_the_reference_again_and_replaces_the_entry(tmp_path, monkeypatch):
    offer, perturbed = ReferenceCache.offer, []

    def drifted(self, keys):  # the test hook: the first cached median handed out is 50 times too slow
        entries = offer(self, keys)
        if entries and not perturbed:
            perturbed.append(True)
            for entry in entries.values():
                entry["side"]["samples"] = [[50 * x for x in rep] for rep in entry["side"]["samples"]]
        return entries

    monkeypatch.setattr(ReferenceCache, "offer", drifted)
    (first, timed), (second, retimed), (_, reused) = run(tmp_path, [*GOOD, third()])
    assert second.passed, second.reason
    for cid, case in retimed.items():
        how = case["reference_timing"]
        assert how["source"] == "retimed" and how["attempt"] == first.attempt.name
        assert how["recheck"]["verdict"] == "drift" and how["recheck"]["drift"] < -0.9
        # timed in full again here: the side is this run's own measurement, not the (perturbed) cache's
        assert case["reference"]["samples"] != timed[cid]["reference"]["samples"]
        taken = sum(case["reference"]["sampling"]["taken"])
        assert case["sampling"]["timed_calls"]["reference"] == how["recheck"]["samples"] + taken
        p50 = case["reference"]["summary"]["overall"]["p50"]
        assert p50 < 10 * timed[cid]["reference"]["summary"]["overall"]["p50"]
    for cid, case in reused.items():  # the entry was replaced by the re-timed measurement
        how = case["reference_timing"]
        assert how["source"] == "reused" and how["attempt"] == second.attempt.name, how
        assert case["reference"]["samples"] == retimed[cid]["reference"]["samples"]


@pytest.mark.slow
def test_a_cached_measurement_taken_otherwise_is_not_reused(tmp_path, monkeypatch):
    """The judge's own choices (method, input sets, flush) must match the cached measurement's: one that
    says another input-set count is not re-checked but replaced by a full interleaved measurement."""
    offer = ReferenceCache.offer

    def elsewhere(self, keys):
        entries = offer(self, keys)
        for entry in entries.values():
            entry["how"]["input_sets"] = 7
        return entries

    monkeypatch.setattr(ReferenceCache, "offer", elsewhere)
    (_, _), (second, cases) = run(tmp_path, GOOD)
    assert second.passed and cases
    for case in cases.values():
        how = case["reference_timing"]
        assert how["source"] == "measured" and "input_sets (7, here 1)" in how["note"], how
        assert case["sampling"]["timed_calls"]["reference"] == sum(case["reference"]["sampling"]["taken"])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "environment"])
def test_interleaving_restores_per_solution_reference_timing(tmp_path, monkeypatch, how):
    options = {"interleave_reference": True} if how == "option" else {}
    if how == "environment":
        monkeypatch.setenv("MINI_KV_INTERLEAVE_REFERENCE", "1")
    results = run(tmp_path, GOOD, **options)
    for result, cases in results:
        assert result.passed and cases
        for case in cases.values():  # as a single run records it: no reuse, the reference timed in full
            assert "reference_timing" not in case
            assert case["sampling"]["timed_calls"]["reference"] == sum(case["reference"]["sampling"]["taken"])
    first, second = (cases for _, cases in results)
    assert all(first[c]["reference"]["samples"] != second[c]["reference"]["samples"] for c in first)


@pytest.mark.slow
def test_a_single_solution_is_timed_as_before(tmp_path):
    ((result, cases),) = run(tmp_path, GOOD[:1])
    assert result.passed and cases and all("reference_timing" not in c for c in cases.values())


@pytest.mark.slow
def test_a_candidate_cannot_put_a_timing_into_the_cache(tmp_path, monkeypatch):
    """The forger writes signed-looking PASSED records to every file descriptor it holds and exits: the
    judge's channel rejects them (REWARD_HACK), and the cache, in the parent, is filled only from a passing
    attempt's signed records: the next solution measures the reference itself, and the one after reuses
    that, never anything of the forger's run."""
    learned: list[tuple[str, str]] = []
    learn = ReferenceCache.learn

    def spy(self, keys, out, attempt, solution):
        learn(self, keys, out, attempt, solution)
        learned.append((solution, str(out.status)))

    monkeypatch.setattr(ReferenceCache, "learn", spy)
    (forger, _), (honest, measured), (_, reused) = run(tmp_path, [FORGER, *GOOD])
    assert forger.status == "REWARD_HACK"
    assert {c["reference_timing"]["source"] for c in measured.values()} == {"measured"}
    assert {c["reference_timing"]["attempt"] for c in reused.values()} == {honest.attempt.name}
    assert learned[0] == ("scale_mul_exploit_forge_channel", "REWARD_HACK")


def test_the_cache_keeps_only_a_passing_attempts_full_measurements():
    """Unit: a failed attempt's records, and a reused side (not measured here), are never kept."""
    side = {"samples": [[1.0, 1.1]], "sampling": {"taken": [2], "stopped": ["fixed"], "rel_ci": [None]}}
    rec = {
        "id": "w",
        "method": "wallclock",
        "calls_per_sample": 1,
        "input_sets": 1,
        "l2": "n/a",
        "reference": side,
        "reference_timing": {"source": "measured"},
    }

    def outcome(status: str, *records: dict) -> pipeline.Outcome:
        return pipeline.Outcome(status, 0, None, None, None, list(records))

    cache = ReferenceCache()
    cache.learn({"w": "k"}, outcome("REWARD_HACK", rec), "a1", "s1")
    cache.learn({"w": "k"}, outcome("PASSED", {**rec, "reference_timing": {"source": "reused"}}), "a2", "s2")
    assert cache.offer({"w": "k"}) == {}
    cache.learn({"w": "k"}, outcome("PASSED", rec), "a3", "s3")
    (entry,) = cache.offer({"w": "k"}).values()
    assert entry["attempt"] == "a3" and entry["side"] == side and entry["how"]["method"] == "wallclock"


def test_a_regression_confirmation_never_reuses_a_cached_reference():
    """Unit (the one place of the rule, worker.engine): a job with a baseline in the reference's place
    times it, whatever cached measurement came with the job; the same job without a baseline reuses it."""
    from types import SimpleNamespace

    from mini_kv.worker import engine
    from mini_kv.worker import reference as refs

    how = refs.ReferenceHow("wallclock", 1, 1, "n/a", None)
    cached = {
        "side": {"samples": [[1.0]]},
        "how": vars(how),
        "attempt": "a",
        "solution": "s",
        "measured_at": "t",
    }
    case = SimpleNamespace(id="w")

    def job(baseline):
        return SimpleNamespace(references={"w": cached}, fmt=SimpleNamespace(baseline=baseline))

    found, why = engine._cached_reference(job(None), case, how)
    assert found is not None and found.attempt == "a" and why is None
    assert engine._cached_reference(job({"entry": "the baseline's build"}), case, how) == (None, None)


def test_the_interleave_switch_reads_the_environment():
    assert switch_from_environment("interleave_reference", False, {}) is False
    assert switch_from_environment("interleave_reference", False, {"MINI_KV_INTERLEAVE_REFERENCE": "yes"})
    assert not switch_from_environment("interleave_reference", True, {"MINI_KV_INTERLEAVE_REFERENCE": "0"})
    with pytest.raises(UserError, match="MINI_KV_INTERLEAVE_REFERENCE='maybe'"):
        switch_from_environment("interleave_reference", False, {"MINI_KV_INTERLEAVE_REFERENCE": "maybe"})


@pytest.mark.slow
def test_bench_with_several_solutions_reuses_and_the_flag_interleaves(tmp_path):
    """The command line's front door: `bench` with two solutions, with and without the flag."""
    args = ["bench", PROBLEM, "--solution", *GOOD, "--device", "cpu", "--rounds", "2", "--warmup", "1"]
    args += ["--budget", "1.5", "--max-cv", "0.99", "--artifacts"]
    for flag, want in (([], {"reused", "retimed"}), (["--interleave-reference"], {None})):
        store = tmp_path / ("i" if flag else "r")
        done = run_cli(*args, store, *flag)
        assert done.returncode == 0, done.stdout + done.stderr
        second = sorted(store.glob("*/*good_dps*/benchmark.json"))
        assert len(second) == 1
        cases = json.loads(second[0].read_text())["cases"]
        sources = {(c.get("reference_timing") or {}).get("source") for c in cases}
        assert cases and sources <= want, sources


@pytest.mark.slow
def test_a_dask_worker_keeps_the_batchs_reference_timings(tmp_path):
    """On a cluster each worker process keeps its own for the batch, and its judge: one worker, two
    solutions."""
    args = ["bench", PROBLEM, "--solution", *GOOD, "--device", "cpu", "--rounds", "2", "--warmup", "1"]
    done = run_cli(*args, "--budget", "1.5", "--max-cv", "0.99", "--workers", "1", "--artifacts", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (second,) = tmp_path.glob("*/*good_dps*/benchmark.json")
    sources = {c["reference_timing"]["source"] for c in json.loads(second.read_text())["cases"]}
    assert sources and sources <= {"reused", "retimed"}, sources
    # and its judge: the first solution's, kept by the worker for the batch (batch.WorkerJudges)
    (first_log,) = tmp_path.glob("*/*good_return*/logs/worker.log")
    assert "kept from an earlier job" not in first_log.read_text()
    assert "kept from an earlier job" in (second.parent / "logs" / "worker.log").read_text()


@pytest.mark.slow
def test_verify_with_two_candidates_reuses_the_cards_reference(tmp_path):
    """A task card's bench cases (five repeats a side) through `verify`: the second candidate times its
    five repeats and one short re-check of the reference, in the first repeat only."""
    done = run_cli(
        "verify", "--task", "tasks/vector_add.yaml", "--candidate", "v0_naive", "--candidate", "v1_vectorized",
        "--device", "cpu", "--budget", "1", "--max-cv", "0.99", "--artifacts", tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    by = {
        p.parent.name.split("-")[1]: json.loads(p.read_text())["cases"]
        for p in tmp_path.glob("*/*/benchmark.json")
    }
    first, second = by["v0_naive"], by["v1_vectorized"]
    assert_no_two_timings_overlapped([first, second])
    assert first and {c["reference_timing"]["source"] for c in first} == {"measured"}
    for case in second:
        how = case["reference_timing"]
        assert how["source"] in ("reused", "retimed") and how["solution"] == "v0_naive"
        assert [o for o in case["order"] if "reference" in o] == [case["order"][0]] or how[
            "source"
        ] == "retimed"
        if how["source"] == "reused":
            assert len(case["candidate"]["samples"]) == case["sampling"]["repeats_run"]
            assert case["sampling"]["timed_calls"]["reference"] == how["recheck"]["samples"]


@pytest.mark.gpu
@pytest.mark.timing
def test_on_cuda_a_batch_reuses_the_reference_of_every_workload(tmp_path):
    """The shipped rmsnorm solutions on a GPU (cold L2, CUPTI): the later solutions reuse every
    workload's reference within the drift band, and their speedups are computed from it."""
    sols = [ROOT / "solutions/rmsnorm" / lang / "solution.json" for lang in ("pytorch", "triton")]
    problem = ROOT / "problems/sol-execbench/rmsnorm"
    # six of the problem's 14 workloads, the smallest and the five largest: the reuse is the same for
    # each, and the gate's time is not
    lines = (problem / "workload.jsonl").read_text().splitlines()
    picked = sorted(lines, key=lambda ln: json.loads(ln)["axes"]["batch_size"])
    (tmp_path / "workload.jsonl").write_text("\n".join(picked[:1] + picked[-5:]) + "\n")
    results = list(
        api.evaluate(
            problem, sols, device="cuda", artifacts=tmp_path / "a", workload=str(tmp_path / "workload.jsonl")
        )
    )
    (first, timed), (second, cases) = ((r, cases_of(r)) for r in results)
    assert first.passed and second.passed, (first.reason, second.reason)
    assert {c["reference_timing"]["source"] for c in timed.values()} == {"measured"}
    # the builds and checks of the batch may overlap; no two timings on the GPU did
    assert_no_two_timings_overlapped([timed.values(), cases.values()])
    sources = [c["reference_timing"]["source"] for c in cases.values()]
    # a re-check outside the drift band retimes, as it should: on the few-microsecond workloads that is
    # noise now and then (2 of 14 on an H200 once), never the rule
    drifts = [(c["reference_timing"]["source"], c["reference_timing"]["recheck"]) for c in cases.values()]
    assert set(sources) <= {"reused", "retimed"} and sources.count("reused") >= 0.75 * len(sources), drifts
    for case in cases.values():
        assert case["reference_timing"]["recheck"]["samples"] >= 10
        assert case["l2_flush"] == timed[case["id"]]["l2_flush"]
