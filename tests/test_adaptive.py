"""Adaptive sampling (stats.StoppingRule, worker.timing.measure_until), time budgets and the early
give-up on a hanging solution: the stopping reasons, the counts taken, and the records that say so."""

import json
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import torch

from mini_kv import stats
from mini_kv.codec import to_json
from mini_kv.load.schema import load_schema
from mini_kv.settings import DEFAULTS, RunSettings, resolve
from mini_kv.status import Status, StopReason
from mini_kv.store.headline import summarize_benchmark
from mini_kv.store.records import BenchmarkRecord
from mini_kv.worker import engine, timing
from mini_kv.worker.engine import SampledRepeats, timing_budget
from mini_kv.worker.formats import CardCase, CardFormat, bench_record
from mini_kv.worker.timing import L2Flusher, Measurement, measure_until

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"


class FakeTimer:
    """A timing method and a clock: each sample costs `cost_s` of fake time and is drawn from `draw`."""

    def __init__(self, draw, cost_s: float = 0.001):
        self.now, self.draw, self.cost_s = 0.0, draw, cost_s
        self.batches: list[int] = []

    def clock(self) -> float:
        return self.now

    def measure(self, calls, method, n, device, flush, launches):
        self.batches.append(n)
        self.now += n * self.cost_s
        return Measurement(method, [self.draw() for _ in range(n)])


def run(timer: FakeTimer, rule: stats.StoppingRule, per_sample_s=None) -> Measurement:
    return measure_until(
        lambda: None,
        "wallclock",
        rule,
        "cpu",
        L2Flusher("cpu", False),
        per_sample_s=per_sample_s,
        clock=timer.clock,
        measure_fn=timer.measure,
    )


RULE = stats.StoppingRule(target_rel_ci=0.005, min_samples=10, max_samples=1000, budget_s=10.0)


def test_median_ci_matches_the_order_statistics():
    xs = list(range(1, 101))  # n = 100: ranks 50 -+ 1.96 * 10 / 2 -> the 40th and 60th values
    assert stats.median_ci(xs) == (40.0, 61.0)
    assert stats.median_ci([5.0] * 30) == (5.0, 5.0)
    assert stats.median_rel_ci([5.0] * 30) == 0.0
    small = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.median_ci(small) == (1.0, 5.0)  # too few samples for anything narrower than the range


def test_a_stable_timer_converges_at_the_minimum_count():
    rng = random.Random(0)
    timer = FakeTimer(lambda: 100.0 * (1 + rng.uniform(-0.001, 0.001)))
    m = run(timer, RULE)
    assert m.notes["sampling"]["stopped"] == StopReason.CONVERGED
    assert m.notes["sampling"]["taken"] == RULE.min_samples == len(m.samples)
    assert m.notes["sampling"]["rel_ci"] <= RULE.target_rel_ci


def test_a_noisier_timer_takes_more_samples_then_converges():
    rng = random.Random(1)
    timer = FakeTimer(lambda: 100.0 * (1 + rng.gauss(0, 0.03)))
    m = run(timer, RULE)
    s = m.notes["sampling"]
    assert s["stopped"] == StopReason.CONVERGED
    assert RULE.min_samples < s["taken"] < RULE.max_samples
    assert stats.median_rel_ci(m.samples) <= RULE.target_rel_ci
    # batches grow (at most doubling) instead of one profiler session or graph capture per sample
    assert s["batches"] == len(timer.batches) < 12
    assert all(b <= sum(timer.batches[:i]) or i == 0 for i, b in enumerate(timer.batches))


def cupti_like(kernel_us: float, jitter_steps: float, seed: int, step: float = 0.032):
    """Spans as CUPTI gives them on an H200: a kernel's time on a 32-ns grid with `jitter_steps` of
    spread, each value then 1 ns off the grid or not (GPU timestamps converted to the host's clock)."""
    rng = random.Random(seed)
    return lambda: (
        (round(kernel_us / step) + round(rng.gauss(0, jitter_steps))) * step
        + rng.choice((-0.001, 0.0, 0.001))
    )


def test_the_timer_step_is_found_through_the_clock_conversions_jitter():
    step = 0.032
    rng = random.Random(0)
    clean = [(round(7.0 / step) + round(rng.gauss(0, 6))) * step for _ in range(60)]
    assert stats.timer_step(clean) == pytest.approx(step)
    draw = cupti_like(2.9, 1.5, seed=1)
    jittered = [draw() for _ in range(300)]
    assert len(set(jittered)) > 2 * len({round(x / step) for x in jittered})  # 1 ns apart: split points
    assert stats.timer_step(jittered) == pytest.approx(step, abs=0.001)
    # a fine timer, few values not on one step, and a smallest gap seen only once: no step
    assert stats.timer_step([7.0 + random.Random(1).gauss(0, 0.05) for _ in range(60)]) is None
    assert stats.timer_step([1.0, 1.3, 2.0] * 20) is None
    assert stats.timer_step([1.0, 2.0, 4.0] * 20) is None


def test_a_quantised_timer_is_not_chased_below_its_step(monkeypatch):
    """A 2.9-us kernel on CUPTI's 32-ns timer (an H200): the 0.5 % target is 14 ns, under half a step,
    which a median of stepped values reaches only by luck after hundreds of calls. The target is held
    at TIMER_STEPS steps (found in the samples) instead, and the median is still placed within it."""
    step = 0.032
    floored = run(FakeTimer(cupti_like(2.9, 2.0, seed=0)), RULE).notes["sampling"]
    assert floored["stopped"] == StopReason.CONVERGED
    assert floored["rel_ci"] <= stats.TIMER_STEPS * step / 2.9
    assert floored["taken"] <= 100
    monkeypatch.setattr(stats, "TIMER_STEPS", 0.0)  # without the floor: the same timer, many more calls
    chased = run(FakeTimer(cupti_like(2.9, 2.0, seed=0)), RULE).notes["sampling"]
    assert chased["taken"] >= 3 * floored["taken"], (floored, chased)


def test_the_floor_leaves_a_longer_kernels_target_alone():
    """At 7 us one 32-ns step is 0.46 % of the median, under the 0.5 % target: the floor does not bind."""
    draw = cupti_like(7.0, 6, seed=4)
    xs = [draw() for _ in range(200)]
    assert stats.timer_step(xs) == pytest.approx(0.032, abs=0.001)
    assert stats.effective_target(RULE, xs) == RULE.target_rel_ci


def test_the_budget_stops_a_slow_op():
    rng = random.Random(2)
    timer = FakeTimer(lambda: 1e6 * (1 + rng.gauss(0, 0.05)), cost_s=1.0)  # one second a call
    rule = stats.StoppingRule(target_rel_ci=0.005, min_samples=10, max_samples=1000, budget_s=3.5)
    m = run(timer, rule, per_sample_s=1.0)
    assert m.notes["sampling"]["stopped"] == StopReason.BUDGET
    assert 1 <= len(m.samples) <= 3  # never a batch that would run past the budget
    assert timer.now <= rule.budget_s


def test_a_sol_workloads_timing_budget_keeps_back_the_output_check_after_timing():
    """The check after timing calls both sides once per input set; its cost comes out of the sampling's
    budget, so sampling to the end of the budget does not push the workload past its timeout."""
    warm = timing.Warmup(1, [0.01, 0.02], 0.03)
    t0 = time.perf_counter()
    settings = _resolved(repeats=2)
    plain = timing_budget(10.0, t0, warm, 3, None, settings)
    kept = timing_budget(10.0, t0, warm, n_sets=3, round_s=0.5, settings=settings)
    assert plain.left_s - kept.left_s == pytest.approx(3.0, abs=0.05)  # two passes per input set
    assert kept.cost == plain.cost == {"candidate": 0.01, "reference": 0.02}
    # the repeats share what is left, and stop at its end
    plan = SampledRepeats(settings, kept)
    assert plan.share == pytest.approx(kept.left_s / 4, abs=0.01)
    assert plan.deadline - time.perf_counter() <= 7.0 + 0.05
    # before any correctness round has run (no round time yet) nothing is kept back
    none = timing_budget(10.0, t0, warm, n_sets=3, round_s=None, settings=settings)
    assert none.left_s == pytest.approx(plain.left_s, abs=0.05)


def test_an_op_slower_than_the_whole_budget_still_gets_one_sample():
    timer = FakeTimer(lambda: 5e6, cost_s=5.0)
    m = run(timer, stats.StoppingRule(0.005, 10, 1000, budget_s=1.0), per_sample_s=5.0)
    assert len(m.samples) == 1 and m.notes["sampling"]["stopped"] == StopReason.BUDGET


def test_the_maximum_count_stops_a_noise_that_never_converges():
    rng = random.Random(3)
    timer = FakeTimer(lambda: rng.uniform(1.0, 100.0))
    rule = stats.StoppingRule(target_rel_ci=0.001, min_samples=10, max_samples=150, budget_s=1e6)
    m = run(timer, rule)
    assert m.notes["sampling"]["stopped"] == StopReason.MAX
    assert len(m.samples) == 150


def test_a_fixed_count_is_taken_as_asked_in_one_batch():
    rng = random.Random(4)
    timer = FakeTimer(lambda: rng.uniform(1.0, 100.0))
    fixed = stats.StoppingRule(0.005, 10, 1000, budget_s=100.0, fixed=37)
    m = run(timer, fixed)
    assert len(m.samples) == 37 and timer.batches == [37]
    assert m.notes["sampling"]["stopped"] == StopReason.FIXED
    # even a stable timer that would converge at 10 gets its 37
    timer = FakeTimer(lambda: 7.0)
    assert len(run(timer, fixed).samples) == 37


def test_settings_resolve_per_device_and_keep_a_fixed_count():
    cpu = resolve({"samples": "auto"}, "cpu", case_timeout=120.0, environ={})
    assert cpu.samples == "auto" and cpu.target_rel_ci == 0.02 and cpu.budget_s == 3.0
    assert (
        resolve({"samples": None}, "cuda:0", 120.0, environ={}).target_rel_ci == DEFAULTS.cuda.target_rel_ci
    )
    assert resolve({"samples": 100}, "cpu", 120.0, environ={}).samples == 100
    # the budget never takes more than half the per-case timeout: the timeout is for hangs
    assert resolve({"budget_s": 500.0}, "cpu", 60.0, environ={}).budget_s == 30.0
    rule = timing.stopping_rule(replace(cpu, samples=100), 1.0)
    assert rule.fixed == 100 and rule.budget_s == 1.0
    with pytest.raises(ValueError):
        stats.StoppingRule(0.0, 10, 100, 1.0)


def test_each_repeat_samples_to_the_target_of_the_pooled_p50_within_the_stability_gate():
    gpu = resolve({"target_rel_ci": 0.005, "max_cv": 0.03}, "cuda:0", None, environ={})
    assert timing.repeat_target(gpu, 1) == 0.005  # one repeat: the target itself (a SOL workload)
    assert timing.repeat_target(gpu, 4) == pytest.approx(0.01)  # 4 repeats pool 4x the samples
    assert timing.repeat_target(gpu, 5) == pytest.approx(0.005 * 5**0.5)
    # never looser than 2/3 of max_cv: the repeats' medians must still resolve the stability gate
    assert timing.repeat_target(gpu, 100) == pytest.approx(0.02)
    assert timing.repeat_target(replace(gpu, target_rel_ci=0.02), 5) == 0.02  # CPU: unchanged
    assert timing.repeat_target(replace(gpu, target_rel_ci=0.05), 5) == 0.05  # never tighter
    assert timing.stopping_rule(gpu, 1.0, 4).target_rel_ci == pytest.approx(0.01)


def test_pooled_repeats_reach_the_target_with_about_the_samples_of_one():
    """Five repeats sampled to target * sqrt(5) each take about the samples one repeat needs for the
    target, and the P50 of them all has about the target's interval."""
    rng = random.Random(5)
    timer = FakeTimer(lambda: 100.0 * (1 + rng.gauss(0, 0.02)))
    one = run(timer, RULE)
    rule = timing.stopping_rule(
        resolve({"target_rel_ci": 0.005, "max_cv": 0.03}, "cpu", None, environ={}), 10.0, 5
    )
    repeats = [run(timer, rule) for _ in range(5)]
    pooled = [x for m in repeats for x in m.samples]
    assert all(m.notes["sampling"]["stopped"] == StopReason.CONVERGED for m in repeats)
    assert len(pooled) < 2 * len(one.samples)  # not 5x
    assert stats.median_rel_ci(pooled) <= 1.5 * RULE.target_rel_ci


# ------------------------------------------------------------------------ a real bench case on CPU


def _add(x, y):
    return x + y


def _factory(params, dtype, device, g):
    n = params["n"]
    return [torch.rand(n, generator=g).to(device), torch.rand(n, generator=g).to(device)]


def _slow_add(x, y):
    time.sleep(0.3)
    return x + y


SETTINGS = {"method": "auto", "l2": "hot", "warmup": 3, "repeats": 3, "max_cv": 0.5, "max_p95_cv": 1.0}


def _resolved(**given) -> RunSettings:
    """SETTINGS with `given` over them, resolved for the CPU (the environment's overrides left out)."""
    return resolve({**SETTINGS, **given}, "cpu", 120.0, environ={})


def _bench(op, settings, reference=_add):
    case = {"id": "c0", "dtype": "float32", "params": {"n": 4096}}
    fmt = CardFormat("t", "cpu", "salt", op, reference, _factory, {"float32": {"atol": 1e-6, "rtol": 1e-6}})
    return bench_record(engine.JobContext.local(fmt), CardCase.of(case), settings, None, {})


def _valid(records: list) -> dict:
    doc = json.loads(
        json.dumps(to_json(BenchmarkRecord("task-card", "cpu", None, records, None)), allow_nan=False)
    )
    jsonschema.Draft202012Validator(load_schema("benchmark")).validate(doc)
    return doc


@pytest.mark.parametrize("samples", ["auto", 12])
def test_a_bench_record_says_how_it_was_sampled_and_is_schema_valid(samples):
    settings = _resolved(samples=samples)
    rec = _bench(_add, settings)
    _valid([rec])
    s = rec["sampling"]
    assert s["mode"] == ("adaptive" if samples == "auto" else "fixed")
    for who in ("candidate", "reference"):
        side = rec[who]["sampling"]
        assert side["taken"] == [len(r) for r in rec[who]["samples"]]  # the samples taken are the ones stored
        assert s["timed_calls"][who] == sum(side["taken"])
        if samples == 12:
            assert side["taken"] == [12] * s["repeats_run"] and set(side["stopped"]) == {StopReason.FIXED}
            assert s["repeat_rel_ci"] is None
        else:
            assert set(side["stopped"]) <= {StopReason.CONVERGED, StopReason.MAX, StopReason.BUDGET}
            assert s["repeat_rel_ci"] == timing.repeat_target(settings, SETTINGS["repeats"])
    # the stability gate is computed from exactly these samples
    cs = stats.summarize_repeats(rec["candidate"]["samples"])
    assert rec["candidate"]["summary"] == to_json(cs)


def test_a_case_slower_than_its_budget_is_timed_with_fewer_samples():
    settings = _resolved(warmup=1, budget_s=2.5)
    t0 = time.perf_counter()
    rec = _bench(_slow_add, settings)
    assert time.perf_counter() - t0 < 2 * 2.5 + 2.0  # the budget, plus the post-timing check's calls
    assert StopReason.BUDGET in rec["sampling"]["stopped"]
    # each repeat's share of the budget holds one 0.3 s call, but the floor (timing.sample_floor) is not
    # the candidate's to lower: the reference could take the minimum count in its share, so the candidate
    # takes it too, and the budget cuts the repeats instead
    assert set(rec["candidate"]["sampling"]["taken"]) == {settings.min_samples}
    assert set(rec["candidate"]["sampling"]["stopped"]) == {StopReason.BUDGET}
    assert rec["sampling"]["repeats_run"] < SETTINGS["repeats"]
    _valid([rec])


def test_a_case_too_large_for_its_budget_is_skipped_with_the_reason():
    settings = _resolved(warmup=1, budget_s=0.2)
    rec = _bench(_slow_add, settings, reference=_slow_add)  # the reference itself outruns the budget
    assert rec["status"] == Status.SKIPPED and "too large for cpu" in rec["reason"]
    _valid([rec])
    summary, cases = summarize_benchmark([rec], skipped=False)
    assert summary["ok"] and summary["skipped"] == ["c0"] and summary["failed"] == [] and not cases


def test_a_candidate_alone_too_slow_for_the_budget_fails_rather_than_skips():
    """A skip is neutral (the attempt passes on the other cases), so the candidate's own warm-up time,
    which it can make what it likes by sleeping, cannot buy one: where the reference fits, it fails."""
    settings = _resolved(warmup=1, budget_s=0.2)
    rec = _bench(_slow_add, settings)
    assert rec["status"] == Status.BENCHMARK_ERROR and "too slow to time" in rec["reason"], rec
    summary, _ = summarize_benchmark([rec], skipped=False)
    assert not summary["ok"] and summary["failed"] == ["c0"]


def test_records_without_sampling_still_validate():
    old = {"id": "c", "candidate": {"samples": [[1.0, 2.0]]}, "reference": {"samples": [[1.0]]}}
    _valid([old])


# ------------------------------------------------------------------------- giving up on a hang


def _problem(tmp_path, rows: dict[str, int]) -> Path:
    """tests/sol_solutions' scale_mul problem with one workload of `rows` rows per uuid."""
    problem = tmp_path / "problem"
    problem.mkdir()
    shutil.copy(SOLS / "problem" / "definition.json", problem)
    inputs = {"x": {"type": "random"}, "w": {"type": "random"}, "alpha": {"type": "scalar", "value": 1.0}}
    lines = [json.dumps({"uuid": u, "axes": {"n": n}, "inputs": inputs}) for u, n in rows.items()]
    (problem / "workload.jsonl").write_text("\n".join(lines) + "\n")
    return problem


def _solution(tmp_path, kernel: str) -> Path:
    """A Python scale_mul solution (tests/sol_solutions/hangs' spec: kernel.py::run) with this kernel.py."""
    sol = tmp_path / "sol"
    sol.mkdir()
    shutil.copy(SOLS / "hangs" / "solution.json", sol)
    (sol / "kernel.py").write_text(kernel)
    return sol / "solution.json"


@pytest.mark.slow
def test_a_solution_hanging_on_every_workload_is_given_up_after_two_timeouts(tmp_path):
    from mini_kv.solexec.run import BenchOptions, bench

    problem = _problem(tmp_path, {f"w{i}": 3 + i for i in range(8)})
    # it sleeps until the kill (tests/sol_solutions/hangs is the spinning hang: test_sol_bench.py); the
    # statuses show what ran: two timed out, the rest were never started (no wall-clock bound: a loaded
    # CI machine once took 27 s for the two 4-s timeouts and the start-up)
    sol = _solution(tmp_path, "import time\n\n\ndef run(x, w, alpha):\n    time.sleep(3600)\n")
    timeout = 4.0
    opts = BenchOptions(
        solution=str(sol),
        artifacts=str(tmp_path / "artifacts"),
        device="cpu",
        rounds=2,
        warmup=1,
        timeout=timeout,
    )
    result = bench(str(problem), opts)
    got = {t.workload.uuid: (t.evaluation.status, t.evaluation.log) for t in result.traces}
    assert [s for s, _ in got.values()] == ["TIMEOUT"] * 8
    assert "process group killed" in got["w0"][1] and "process group killed" in got["w1"][1]
    assert all("--give-up-after 2" in got[f"w{i}"][1] for i in range(2, 8))
    corr = json.loads((Path(result.attempt) / "correctness.json").read_text())
    assert [c["status"] for c in corr["cases"]][2:] == [Status.NOT_RUN] * 6


def _bench_budget_2s(tmp_path, rows: dict[str, int], kernel: str) -> dict:
    """`bench` of a scale_mul solution with this kernel.py on workloads of `rows` rows, on CPU with 4
    rounds and a 2-s budget per workload (the size-estimate tests)."""
    from mini_kv.solexec.run import BenchOptions, bench

    problem, sol = _problem(tmp_path, rows), _solution(tmp_path, kernel)

    opts = BenchOptions(
        solution=str(sol),
        artifacts=str(tmp_path / "artifacts"),
        device="cpu",
        rounds=4,
        warmup=1,
        budget=2.0,
        timeout=60.0,
    )
    return bench(str(problem), opts)


def test_a_first_calls_one_off_cost_does_not_get_a_larger_workload_skipped(tmp_path):
    """The bytes-scaled estimate that skips a workload as too large comes from a warm round: a solution
    whose first call costs 0.5 s once (a plan built on first use) runs its 16x larger workload."""
    # the first round's 0.5 s x 16 x 2 rounds would not fit in the 2-s budget; a warm round's would
    result = _bench_budget_2s(
        tmp_path,
        {"s": 4, "l": 64},
        "import time\n\nFIRST = [True]\n\n\ndef run(x, w, alpha):\n"
        "    if FIRST.pop() if FIRST else False:\n        time.sleep(0.5)\n"
        "    y = x * (w * alpha)\n    return {'y': y, 'total': y.sum()}\n",
    )
    got = {t.workload.uuid: t.evaluation.status for t in result.traces}
    assert got == {"s": "PASSED", "l": "PASSED"}, [t.evaluation.log for t in result.traces]


def test_a_workload_measured_too_large_bounds_the_others_without_a_call(tmp_path):
    """A per-byte estimate from a small warm round can fall short for large workloads (on CPU their data
    leaves the caches: 1.7x at rmsnorm's 169-227 MiB). Once one workload's first round shows it too large,
    workloads of about its size are judged by that measurement, SKIPPED before any call of theirs."""
    result = _bench_budget_2s(
        tmp_path,
        {"s": 4, "a": 64, "b": 60, "c": 56},
        "import time\n\n\ndef run(x, w, alpha):\n"
        "    time.sleep(1.5 if x.shape[0] > 32 else 0.02)  # far slower than its size says once large\n"
        "    y = x * (w * alpha)\n    return {'y': y, 'total': y.sum()}\n",
    )
    passed = {t.workload.uuid: t.evaluation.status for t in result.traces}
    skipped = {s.id: s.reason for s in result.skipped}
    assert passed == {"s": "PASSED"} and set(skipped) == {"a", "b", "c"}, (passed, skipped)
    # measured: it ran one round, and its slowness is the solution's (the reference's call was quick)
    assert "too slow" in skipped["a"] and "one call took 1.5" in skipped["a"], skipped
    for u in "bc":  # judged by a's measurement, not run
        assert "took 1.5" in skipped[u], skipped


def test_a_round_on_few_bytes_is_not_scaled_to_a_large_case():
    """On an H200 a correctness round on 68 bytes took 0.26 s, all of it the harness's own (messages,
    holds, checks); scaled by size, a 4-MiB case was SKIPPED as a 4,800-s one. Only rounds on at least
    SCALE_FROM_BYTES are scaled; one that grows with size still skips what is too large."""
    quick = engine.RoundBudget(60.0, "cuda:0")
    quick.note_round(12, 0.25, warm=True)
    quick.note_round(68, 0.26, warm=True)
    quick.skip_if_too_large(4 * 2**20)

    slow = engine.RoundBudget(9.0, "cpu")
    row = 4096 * 2
    slow.note_round(1 * row, 0.01, warm=True)
    slow.note_round(170 * row, 0.5, warm=True)
    with pytest.raises(engine.Failure) as skipped:
        slow.skip_if_too_large(14418 * row)
    assert skipped.value.kind == engine.Failure.SKIPPED and "would take about 42.4 s" in skipped.value.message
