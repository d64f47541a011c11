"""Tests for mini_kv.stats with hand-computed expected values."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from mini_kv.codec import to_json
from mini_kv.stats import (
    Stability,
    bootstrap_ci,
    geomean,
    is_slower,
    mann_whitney_u,
    speedup,
    stability,
    summarize,
    summarize_repeats,
)

K = 1.4826


# --------------------------------------------------------------------- summarize


def test_summarize_hand_computed_with_outlier():
    s = summarize([1, 2, 3, 4, 100])
    assert s.n == 5
    assert s.min == 1.0
    assert s.max == 100.0
    assert s.mean == pytest.approx(22.0, abs=1e-12)
    # deviations -21,-20,-19,-18,78 -> squares sum 7610 -> /(n-1) = 1902.5
    assert s.std == pytest.approx(math.sqrt(1902.5), abs=1e-12)
    assert s.p50 == 3.0
    # linear: index 0.95*(5-1) = 3.8 -> 4 + 0.8*(100-4) = 80.8
    assert s.p95 == pytest.approx(80.8, abs=1e-12)
    # |x-3| = 2,1,0,1,97 -> median 1
    assert s.mad == 1.0
    assert s.robust_cv == pytest.approx(K / 3, abs=1e-15)
    # p25 at index 1 -> 2, p75 at index 3 -> 4
    assert s.iqr == pytest.approx(2.0, abs=1e-12)


def test_summarize_unsorted_even_n():
    # sorted 1,2,3,4: median 2.5; p95 index 2.85 -> 3.85; p25 index .75 -> 1.75;
    # p75 index 2.25 -> 3.25; |x-2.5| = .5,.5,1.5,1.5 -> mad 1.0
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert s.p50 == 2.5
    assert s.p95 == pytest.approx(3.85, abs=1e-12)
    assert s.iqr == pytest.approx(1.5, abs=1e-12)
    assert s.mad == 1.0
    assert s.robust_cv == pytest.approx(K / 2.5, abs=1e-15)
    assert s.std == pytest.approx(math.sqrt(5.0 / 3.0), abs=1e-12)


def test_summarize_matches_numpy_percentile():
    rng = np.random.default_rng(123)
    x = rng.lognormal(size=37)
    s = summarize(x.tolist())
    assert s.p50 == pytest.approx(float(np.percentile(x, 50)), abs=1e-12)
    assert s.p95 == pytest.approx(float(np.percentile(x, 95)), abs=1e-12)
    assert s.std == pytest.approx(float(np.std(x, ddof=1)), abs=1e-12)


def test_summarize_single_sample():
    s = summarize([7.5])
    assert to_json(s) == {
        "n": 1,
        "min": 7.5,
        "max": 7.5,
        "mean": 7.5,
        "std": 0.0,
        "p50": 7.5,
        "p95": 7.5,
        "mad": 0.0,
        "robust_cv": 0.0,
        "iqr": 0.0,
    }


def test_summarize_all_equal():
    s = summarize([2.0] * 6)
    assert s.std == 0.0
    assert s.mad == 0.0
    assert s.robust_cv == 0.0
    assert s.iqr == 0.0
    assert s.p50 == s.p95 == 2.0


def test_summarize_zero_median_gives_zero_cv():
    s = summarize([0.0, 0.0, 0.0, 1.0])
    assert s.p50 == 0.0
    assert s.robust_cv == 0.0
    assert summarize([0.0, 0.0]).robust_cv == 0.0


def test_summarize_returns_python_types():
    s = summarize([1.0, 2.0, 3.0])
    assert type(s.n) is int
    for key in ("min", "max", "mean", "std", "p50", "p95", "mad", "robust_cv", "iqr"):
        assert type(getattr(s, key)) is float, key
    assert json.loads(json.dumps(to_json(summarize_repeats([[1.0, 2.0]]))))["overall"]["n"] == 2


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")], [[1.0, 2.0]]])
def test_summarize_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        summarize(bad)


# ------------------------------------------------------------- summarize_repeats


def test_summarize_repeats_across_repeats():
    r = summarize_repeats([[1, 2, 3], [2, 3, 4], [3, 4, 5]])
    assert r.n_repeats == 3
    assert r.cv_basis == "repeats"
    assert r.overall.n == 9
    assert r.overall.p50 == 3.0
    # per-repeat p95: index 1.9 -> 2.9, 3.9, 4.9
    assert [d.p50 for d in r.per_repeat] == [2.0, 3.0, 4.0]
    assert [d.p95 for d in r.per_repeat] == pytest.approx([2.9, 3.9, 4.9], abs=1e-12)
    # p50s 2,3,4: median 3, MAD 1
    assert r.p50_robust_cv == pytest.approx(K / 3, abs=1e-15)
    # p95s 2.9,3.9,4.9: median 3.9, MAD 1
    assert r.p95_robust_cv == pytest.approx(K / 3.9, abs=1e-12)


def test_summarize_repeats_two_repeats():
    # p50s 10 and 12: median 11, MAD 1 -> K/11
    r = summarize_repeats([[10.0, 10.0], [12.0, 12.0]])
    assert r.p50_robust_cv == pytest.approx(K / 11, abs=1e-15)
    assert r.p95_robust_cv == pytest.approx(K / 11, abs=1e-15)


def test_summarize_repeats_single_repeat_uses_five_chunks():
    r = summarize_repeats([[1, 1, 2, 2, 3, 3, 4, 4, 5, 5]])
    assert r.n_repeats == 1
    assert r.cv_basis == "chunks"
    assert len(r.per_repeat) == 5
    assert [d.p50 for d in r.per_repeat] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # chunk p50s 1..5: median 3, |d| = 2,1,0,1,2 -> MAD 1
    assert r.p50_robust_cv == pytest.approx(K / 3, abs=1e-15)
    assert r.p95_robust_cv == pytest.approx(K / 3, abs=1e-15)
    assert r.overall.n == 10


def test_summarize_repeats_single_repeat_uneven_and_tiny():
    # 7 samples -> chunk sizes 2,2,1,1,1 (contiguous)
    r = summarize_repeats([[1, 3, 5, 5, 7, 9, 11]])
    assert [d.p50 for d in r.per_repeat] == [2.0, 5.0, 7.0, 9.0, 11.0]
    # fewer samples than chunks: one chunk per sample
    r = summarize_repeats([[4.0, 6.0]])
    assert len(r.per_repeat) == 2
    assert r.p50_robust_cv == pytest.approx(K * 1 / 5, abs=1e-15)
    # a single sample: no observable variation
    r = summarize_repeats([[3.0]])
    assert r.p50_robust_cv == 0.0 and r.p95_robust_cv == 0.0


def test_summarize_repeats_identical_repeats_zero_cv():
    r = summarize_repeats([[1.0, 2.0, 3.0]] * 4)
    assert r.p50_robust_cv == 0.0
    assert r.p95_robust_cv == 0.0


def test_summarize_repeats_rejects_empty():
    with pytest.raises(ValueError):
        summarize_repeats([])
    with pytest.raises(ValueError):
        summarize_repeats([[1.0], []])


# --------------------------------------------------------------------- stability


def _cvs(p50_cv, p95_cv):
    return SimpleNamespace(p50_robust_cv=p50_cv, p95_robust_cv=p95_cv)


def test_stability_passes_within_limits_and_at_boundary():
    assert stability(_cvs(0.01, 0.1), _cvs(0.02, 0.9)) == Stability(True, ())
    # limits are inclusive
    assert stability(_cvs(0.03, 0.15), _cvs(0.03, 0.0)).stable is True
    # no reference: only candidate checked
    assert stability(_cvs(0.0, 0.0), None).stable is True


def test_stability_fails_and_names_each_violation():
    out = stability(_cvs(0.05, 0.2), _cvs(0.04, 0.0))
    assert out.stable is False
    assert len(out.reasons) == 3
    assert "candidate p50_robust_cv 0.05" in out.reasons[0] and "max_cv 0.03" in out.reasons[0]
    assert "reference p50_robust_cv 0.04" in out.reasons[1] and "max_cv 0.03" in out.reasons[1]
    assert "candidate p95_robust_cv 0.2" in out.reasons[2] and "max_p95_cv 0.15" in out.reasons[2]


def test_stability_reference_only_violation_and_custom_limits():
    out = stability(_cvs(0.01, 0.01), _cvs(0.031, 0.0))
    assert out.stable is False
    assert out.reasons == ("reference p50_robust_cv 0.031 exceeds max_cv 0.03",)
    out = stability(_cvs(0.05, 0.2), None, max_cv=0.1, max_p95_cv=0.25)
    assert out.stable is True


def test_stability_nan_is_unstable():
    assert stability(_cvs(float("nan"), 0.0), None).stable is False


def test_stability_on_summarize_repeats_output():
    stable = summarize_repeats([[1.0, 1.0, 1.0]] * 3)
    noisy = summarize_repeats([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    assert stability(stable, stable).stable is True
    assert stability(noisy, stable).stable is False
    assert stability(stable, noisy).stable is False


# ------------------------------------------------------------ speedup / geomean


def test_speedup():
    assert speedup(2.0, 1.0) == 2.0
    assert speedup(1.0, 4.0) == 0.25
    for bad in [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)]:
        with pytest.raises(ValueError):
            speedup(*bad)


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0, abs=1e-12)
    assert geomean([1.0, 3.0, 9.0]) == pytest.approx(3.0, abs=1e-12)
    assert geomean([5.0]) == pytest.approx(5.0, abs=1e-12)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("bad", [[], [1.0, 0.0], [2.0, -1.0], [float("nan")]])
def test_geomean_rejects(bad):
    with pytest.raises(ValueError):
        geomean(bad)


# ------------------------------------------------------------------ Mann-Whitney


def test_mann_whitney_small_tie_example_by_hand():
    # pooled sorted: 1,2,2,2,3,3,4,5 -> ranks 1, 3,3,3, 5.5,5.5, 7, 8
    # R1(x) = 1 + 3 + 3 + 5.5 = 12.5 -> U1 = 12.5 - 4*5/2 = 2.5, U2 = 13.5
    # mu = 8; ties: (27-3) + (8-2) = 30
    # sigma^2 = 16/12 * (9 - 30/56) = 79/7; z = (13.5 - 8 - 0.5) / sqrt(79/7)
    u, p = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 5])
    assert u == 2.5
    z = 5.0 / math.sqrt(79.0 / 7.0)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2.0)), abs=1e-15)
    assert p == pytest.approx(0.1366582477381475, abs=1e-12)  # scipy 1.17.1 value


def test_mann_whitney_no_ties_separated():
    # x entirely below y: U1 = 0, U = 9, mu = 4.5, sigma^2 = 9/12*7 = 5.25
    u, p = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert u == 0.0
    z = (9 - 4.5 - 0.5) / math.sqrt(5.25)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2.0)), abs=1e-15)
    # symmetric: swapping gives U1' = n1*n2 - U1 and the same p
    u2, p2 = mann_whitney_u([4, 5, 6], [1, 2, 3])
    assert u2 == 9.0 and p2 == p


def test_mann_whitney_identical_and_all_tied():
    assert mann_whitney_u([1, 2, 3], [1, 2, 3]) == (4.5, 1.0)
    assert mann_whitney_u([2, 2], [2, 2, 2]) == (3.0, 1.0)


def test_mann_whitney_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    cases = [
        ([1, 2, 2, 3], [2, 3, 4, 5]),
        ([1.0], [2.0]),
        ([5.0, 5.0, 5.0], [5.0, 5.0]),
    ]
    for n1, n2, shift in [(5, 7, 0.0), (20, 20, 0.3), (50, 31, 1.0), (3, 200, -0.5)]:
        # rounding creates many ties, exercising the tie correction
        x = np.round(rng.normal(size=n1), 1)
        y = np.round(rng.normal(loc=shift, size=n2), 1)
        cases.append((x.tolist(), y.tolist()))
    for x, y in cases:
        ref = scipy_stats.mannwhitneyu(
            x, y, alternative="two-sided", method="asymptotic", use_continuity=True
        )
        u, p = mann_whitney_u(x, y)
        assert u == pytest.approx(float(ref.statistic), abs=1e-9)
        assert p == pytest.approx(float(ref.pvalue), abs=1e-9)


def test_mann_whitney_rejects_empty():
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])


# --------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_deterministic_and_seed_dependent():
    x = np.random.default_rng(11).lognormal(size=15).tolist()
    a = bootstrap_ci(x, seed=0)
    assert a == bootstrap_ci(x, seed=0)
    # continuous data: a different seed almost surely moves an endpoint
    assert bootstrap_ci(x, seed=1) != a
    lo, hi = a
    assert min(x) <= lo <= np.median(x) <= hi <= max(x)
    assert type(lo) is float and type(hi) is float


def test_bootstrap_ci_constant_and_single():
    assert bootstrap_ci([3.0] * 8) == (3.0, 3.0)
    assert bootstrap_ci([4.2]) == (4.2, 4.2)


def test_bootstrap_ci_reproduces_manual_computation():
    # Same algorithm written out: default_rng(seed) indices, percentile interval.
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    rng = np.random.default_rng(5)
    idx = rng.integers(0, x.size, size=(300, x.size))
    boot = np.median(x[idx], axis=1)
    expected = tuple(float(v) for v in np.percentile(boot, [5.0, 95.0]))
    assert bootstrap_ci(x.tolist(), n_boot=300, alpha=0.1, seed=5) == expected


def test_bootstrap_ci_custom_stat_and_width():
    x = list(np.random.default_rng(0).normal(10.0, 1.0, size=200))
    lo, hi = bootstrap_ci(x, stat=np.mean)
    assert lo < 10.0 < hi
    lo99, hi99 = bootstrap_ci(x, stat=np.mean, alpha=0.01)
    assert lo99 <= lo and hi <= hi99


@pytest.mark.parametrize("kwargs", [{"n_boot": 0}, {"alpha": 0.0}, {"alpha": 1.0}])
def test_bootstrap_ci_rejects_bad_params(kwargs):
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 2.0], **kwargs)


# --------------------------------------------------------------------- is_slower


def test_is_slower_detects_20_percent_slowdown():
    rng = np.random.default_rng(1)
    base = 1.0 + 0.01 * rng.random(40)
    cand = 1.2 * (1.0 + 0.01 * rng.random(40))
    out = is_slower(base.tolist(), cand.tolist())
    assert out.ratio == pytest.approx(1.2, rel=0.01)
    assert out.p_value < 1e-10
    assert out.significant is True
    assert out.exceeds is True
    assert out.slower is True
    assert out.baseline_ci[1] < out.candidate_ci[0]
    assert set(to_json(out)) == {
        "ratio",
        "p_value",
        "significant",
        "exceeds",
        "slower",
        "baseline_ci",
        "candidate_ci",
    }


def test_is_slower_identical_distributions_not_flagged():
    x = (1.0 + 0.01 * np.random.default_rng(2).random(40)).tolist()
    out = is_slower(x, list(x))
    assert out.ratio == 1.0
    assert out.p_value == 1.0
    assert out.significant is False
    assert out.exceeds is False
    assert out.slower is False


def test_is_slower_same_distribution_different_draws_not_flagged():
    rng = np.random.default_rng(3)
    base = rng.lognormal(0.0, 0.02, size=50)
    cand = rng.lognormal(0.0, 0.02, size=50)
    out = is_slower(base.tolist(), cand.tolist())
    assert out.slower is False
    assert out.exceeds is False


def test_is_slower_faster_candidate_is_significant_but_not_slower():
    base = [1.0 + 0.001 * i for i in range(30)]
    cand = [0.8 * v for v in base]
    out = is_slower(base, cand)
    assert out.significant is True
    assert out.exceeds is False
    assert out.slower is False


def test_is_slower_small_shift_below_threshold():
    # 2% slower, clearly separated: significant but does not exceed 5%.
    base = [1.0 + 0.0001 * i for i in range(30)]
    cand = [1.02 * v for v in base]
    out = is_slower(base, cand)
    assert out.significant is True
    assert out.exceeds is False
    assert is_slower(base, cand, threshold=0.01).exceeds is True


def test_is_slower_deterministic_and_rejects_zero_baseline():
    base = [1.0, 1.1, 0.9, 1.05]
    cand = [1.3, 1.2, 1.25, 1.4]
    assert is_slower(base, cand) == is_slower(base, cand)
    with pytest.raises(ValueError):
        is_slower([0.0, 0.0, 0.0], [1.0])
