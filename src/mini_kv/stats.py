"""Pure statistics over benchmark timing samples.

Everything here is a pure function of its arguments: no torch, no I/O, no global
random state (bootstrap takes an explicit seed). Inputs are plain sequences of
floats (e.g. per-iteration kernel times in ms); outputs are plain Python floats and
bools, or frozen records of them (codec.to_json gives their JSON form).

Conventions, chosen to match numpy/scipy so numbers can be cross-checked:
  * percentiles use linear interpolation (numpy.percentile's default method);
  * std is the sample std (ddof=1) because the samples estimate a population;
  * MAD is unscaled (median of |x - median|); the 1.4826 factor that makes it a
    consistent estimator of sigma for normal data is applied only in robust_cv.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mini_kv.settings import DEFAULTS

# Scale factor making MAD a consistent estimator of the standard deviation for
# normally distributed data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826

# Number of contiguous chunks a single repeat is split into when estimating the
# across-repeat variability (see summarize_repeats).
SINGLE_REPEAT_CHUNKS = 5


@dataclass(frozen=True)
class Summary:
    n: int
    min: float
    max: float
    mean: float
    std: float
    p50: float
    p95: float
    mad: float
    robust_cv: float
    iqr: float


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p95: float


@dataclass(frozen=True)
class RepeatSummary:
    overall: Summary
    per_repeat: tuple[Percentiles, ...]
    p50_robust_cv: float
    p95_robust_cv: float
    n_repeats: int
    cv_basis: str


@dataclass(frozen=True)
class Stability:
    stable: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Slower:
    ratio: float
    p_value: float
    significant: bool
    exceeds: bool
    slower: bool
    baseline_ci: tuple[float, float]
    candidate_ci: tuple[float, float]


def _as_array(samples: Sequence[float], name: str = "samples") -> np.ndarray:
    # Validate once at the boundary so every statistic below can assume a
    # non-empty, finite 1-D float array; NaN/inf timings mean a broken
    # measurement and must not silently poison a verdict.
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values")
    return arr


def _mad(arr: np.ndarray) -> float:
    # Unscaled median absolute deviation: robust to the occasional huge outlier
    # (preemption, clock change) that would dominate std.
    med = np.median(arr)
    return float(np.median(np.abs(arr - med)))


def _robust_cv(arr: np.ndarray) -> float:
    # Robust analogue of std/mean. abs() keeps it non-negative for
    # (unusual) negative data; a zero median has no meaningful relative spread,
    # so it is defined as 0 rather than dividing by zero.
    med = float(np.median(arr))
    if med == 0.0:
        return 0.0
    return MAD_TO_SIGMA * _mad(arr) / abs(med)


def summarize(samples: Sequence[float]) -> Summary:
    """Descriptive statistics of one sample set (conventions in the module's docstring)."""
    arr = _as_array(samples)
    n = int(arr.size)
    # ddof=1 is undefined for a single sample; 0 says "no observed spread".
    std = float(np.std(arr, ddof=1)) if n >= 2 else 0.0
    p25, p50, p75, p95 = (float(v) for v in np.percentile(arr, [25, 50, 75, 95]))
    return Summary(
        n,
        float(arr.min()),
        float(arr.max()),
        float(arr.mean()),
        std,
        p50,
        p95,
        _mad(arr),
        _robust_cv(arr),
        p75 - p25,
    )


def summarize_repeats(repeats: Sequence[Sequence[float]]) -> RepeatSummary:
    """Summarize several independent repeats of the same benchmark: the pooled summary, each repeat's
    P50/P95 and the robust CVs of those across repeats. The across-repeat CVs measure run-to-run
    reproducibility, which is what a stability gate needs (within-run spread is already in ``overall``).

    A single repeat is split into 5 contiguous chunks (or one per sample), treated as repeats
    (``cv_basis`` "chunks"): contiguous, not interleaved, so that drift over time, e.g. thermal
    throttling, shows up as chunk-to-chunk variation. A single sample yields CVs of 0.
    """
    if len(repeats) == 0:
        raise ValueError("repeats must not be empty")
    arrays = [_as_array(r, name=f"repeats[{i}]") for i, r in enumerate(repeats)]
    pooled = np.concatenate(arrays)

    if len(arrays) == 1:
        groups = np.array_split(arrays[0], min(SINGLE_REPEAT_CHUNKS, arrays[0].size))
        basis = "chunks"
    else:
        groups = arrays
        basis = "repeats"

    # one call per group for both (np.percentile's own cost is most of a summary's over a store's index)
    p50s, p95s = np.array([np.percentile(g, [50, 95]) for g in groups]).T
    return RepeatSummary(
        summarize(pooled),
        tuple(Percentiles(float(a), float(b)) for a, b in zip(p50s, p95s, strict=True)),
        _robust_cv(p50s),
        _robust_cv(p95s),
        len(arrays),
        basis,
    )


def stability(
    candidate: RepeatSummary,
    reference: RepeatSummary | None,
    max_cv: float = DEFAULTS.max_cv,
    max_p95_cv: float = DEFAULTS.max_p95_cv,
) -> Stability:
    """Gate on measurement reproducibility before comparing timings: both P50 robust CVs within
    ``max_cv``, the candidate's P95 one within ``max_p95_cv``, looser because tail latency is inherently
    noisier than the median; one reason per violated limit."""
    checks = [("candidate", "p50_robust_cv", candidate.p50_robust_cv, "max_cv", max_cv)]
    if reference is not None:
        checks.append(("reference", "p50_robust_cv", reference.p50_robust_cv, "max_cv", max_cv))
    checks.append(("candidate", "p95_robust_cv", candidate.p95_robust_cv, "max_p95_cv", max_p95_cv))

    reasons = []
    for who, key, value, limit_name, limit in checks:
        # Written as "not <=" so a NaN measurement counts as a violation.
        if not value <= limit:
            reasons.append(f"{who} {key} {value:.6g} exceeds {limit_name} {limit:.6g}")
    return Stability(not reasons, tuple(reasons))


def speedup(ref_p50: float, cand_p50: float) -> float:
    """Speedup of candidate over reference: ref_p50 / cand_p50 (>1 is faster)."""
    # Times must be positive: a zero or negative time means a broken
    # measurement, and the ratio would be meaningless or infinite.
    if not (ref_p50 > 0 and cand_p50 > 0):
        raise ValueError(f"times must be positive, got ref_p50={ref_p50}, cand_p50={cand_p50}")
    return float(ref_p50) / float(cand_p50)


def geomean(values: Sequence[float]) -> float:
    """Equal-weight geometric mean; the right average for ratios like speedups.

    Raises ValueError on an empty input or any non-positive value (the log is
    undefined there, and a non-positive speedup indicates a bug upstream).
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("geomean of an empty sequence")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError("geomean requires finite, strictly positive values")
    # Mean of logs avoids overflow/underflow of a long product.
    return float(np.exp(np.mean(np.log(arr))))


def _rankdata_average(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Average ranks (1-based) for ties, plus the size of every tie group;
    # equivalent to scipy.stats.rankdata(method="average").
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    # Boundaries of runs of equal values in the sorted array.
    starts = np.flatnonzero(np.r_[True, sorted_a[1:] != sorted_a[:-1]])
    counts = np.diff(np.r_[starts, sorted_a.size])
    # Average of ranks start+1 .. start+count is start + (count+1)/2.
    avg = starts + (counts + 1) / 2.0
    ranks = np.empty(a.size, dtype=np.float64)
    ranks[order] = np.repeat(avg, counts)
    return ranks, counts


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test, normal approximation.

    Matches scipy.stats.mannwhitneyu(x, y, alternative="two-sided",
    method="asymptotic", use_continuity=True): the returned U is U1, the
    statistic for ``x``; the p-value uses max(U1, U2) with tie-corrected
    variance and a 0.5 continuity correction, doubled and clipped to [0, 1].
    Rank-based, so it is robust to the heavy right tail of timing data.
    """
    xa = _as_array(x, "x")
    ya = _as_array(y, "y")
    n1, n2 = xa.size, ya.size
    n = n1 + n2
    ranks, tie_counts = _rankdata_average(np.concatenate([xa, ya]))
    r1 = float(ranks[:n1].sum())
    u1 = r1 - n1 * (n1 + 1) / 2.0
    u2 = n1 * n2 - u1
    u = max(u1, u2)

    mu = n1 * n2 / 2.0
    tie_term = float(np.sum(tie_counts.astype(np.float64) ** 3 - tie_counts))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    numerator = u - mu - 0.5
    if var <= 0.0:
        # All values tied: no evidence of any difference. (scipy gets here via
        # z = -inf -> p = 2 -> clipped to 1.)
        return u1, 1.0
    z = numerator / math.sqrt(var)
    # Two-sided p = 2 * normal survival function(z) = erfc(z / sqrt(2)).
    p = math.erfc(z / math.sqrt(2.0))
    return u1, min(max(p, 0.0), 1.0)


def bootstrap_ci(
    x: Sequence[float],
    stat: Callable[[np.ndarray], float] = np.median,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap (1 - alpha) confidence interval of stat(x).

    Deterministic: resampling uses numpy.random.Generator(PCG64(seed)) via
    default_rng(seed), never global state, so the same inputs always give the
    same interval (verdicts must be reproducible).
    """
    arr = _as_array(x, "x")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    # Generic loop so any callable statistic works, not only axis-aware ones.
    boot = np.array([stat(arr[row]) for row in idx], dtype=np.float64)
    lo, hi = np.percentile(boot, [100.0 * alpha / 2.0, 100.0 * (1.0 - alpha / 2.0)])
    return float(lo), float(hi)


def is_slower(
    baseline_samples: Sequence[float],
    candidate_samples: Sequence[float],
    threshold: float = 0.05,
    alpha: float = 0.01,
    n_boot: int = 2000,
    seed: int = 0,
) -> Slower:
    """Decide whether the candidate is a real regression relative to baseline: `slower` needs both
    `significant` (Mann-Whitney p < alpha AND non-overlapping (1 - alpha) bootstrap CIs of the medians,
    guarding against a tiny but "significant" shift from large n and against CI noise) and `exceeds`
    (median ratio > 1 + threshold), since significance alone is two-sided. The two CIs use seeds
    ``seed`` and ``seed + 1`` so their resamples are independent yet reproducible.
    """
    base = _as_array(baseline_samples, "baseline_samples")
    cand = _as_array(candidate_samples, "candidate_samples")
    base_med = float(np.median(base))
    if base_med <= 0.0:
        raise ValueError(f"baseline median must be positive, got {base_med}")
    ratio = float(np.median(cand)) / base_med

    _, p_value = mann_whitney_u(base, cand)
    base_ci = bootstrap_ci(base, np.median, n_boot=n_boot, alpha=alpha, seed=seed)
    cand_ci = bootstrap_ci(cand, np.median, n_boot=n_boot, alpha=alpha, seed=seed + 1)
    overlap = base_ci[0] <= cand_ci[1] and cand_ci[0] <= base_ci[1]

    significant = bool(p_value < alpha and not overlap)
    exceeds = bool(ratio > 1.0 + threshold)
    return Slower(ratio, p_value, significant, exceeds, significant and exceeds, base_ci, cand_ci)


# ------------------------------------------------------------------------------ adaptive sampling
#
# nvbench's stopping criterion ("stdrel") keeps timing until the relative standard deviation is under
# `max-noise` (0.5 %), after `min-samples` (10) and `min-time`, giving up at a `timeout` (15 s). We keep
# its shape but stop on the quantity our verdicts use, the median: sampling ends when the 95 %
# confidence interval of the median is within `target_rel_ci` of it (half-width / median), which a
# few slow outliers (preemption, a clock change) cannot hold open the way they hold up a std.

Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95 % interval


@dataclass(frozen=True)
class StoppingRule:
    """When one measurement (one side, one repeat) stops taking samples.

    `fixed`: take exactly this many (a card's or the command line's count), unless the budget runs out
    first; otherwise sample until the median's 95 % CI half-width is within `target_rel_ci` of the
    median, with at least `min_samples`, at most `max_samples`, and no new batch once `budget_s` is spent
    (a measurement always keeps at least one sample)."""

    target_rel_ci: float
    min_samples: int
    max_samples: int
    budget_s: float
    fixed: int | None = None

    def __post_init__(self) -> None:
        if not (self.target_rel_ci > 0 and self.budget_s > 0 and 1 <= self.min_samples <= self.max_samples):
            raise ValueError(f"invalid stopping rule {self}")
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"fixed sample count must be >= 1, got {self.fixed}")


def median_ci(samples: Sequence[float], z: float = Z_95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median from order statistics: the ranks
    n/2 -+ z*sqrt(n)/2 (normal approximation of the binomial). Below about 6 samples it is the whole
    range: no interval narrower than that is justified."""
    arr = np.sort(_as_array(samples))
    n = arr.size
    half = z * math.sqrt(n) / 2.0
    lo = max(0, int(math.floor(n / 2.0 - half)) - 1)
    hi = min(n - 1, int(math.ceil(n / 2.0 + half)))
    return float(arr[lo]), float(arr[hi])


def median_rel_ci(samples: Sequence[float]) -> float:
    """The median's 95 % CI half-width relative to the median (inf for a zero median)."""
    lo, hi = median_ci(samples)
    med = float(np.median(np.asarray(samples, dtype=np.float64)))
    return (hi - lo) / (2.0 * abs(med)) if med != 0.0 else math.inf


# A timer that counts in steps (CUPTI's timestamps: 32 ns on an H200) cannot place a median closer than
# about a step: for a 2.9-us kernel the 0.5 % target is 14 ns, under half a step, and sampling ran to its
# 1000-call maximum chasing it. The target is therefore never below this many of the timer's steps
# (found in the samples) relative to the median. One step leaves the target of kernels from about
# 6.4 us up (on a 32-ns timer) as it is, so the 1 % agreement of their medians is not traded away.
TIMER_STEPS = 1.0
# CUPTI's spans are differences of GPU timestamps converted to the host's clock, so a 32-ns step shows
# up as 31, 32 or 33 ns and one grid point as two or three values 1 ns apart (seen on an H200: a
# 2.9-us kernel's 326 samples took 46 values in 16 groups). Gaps this many times smaller than the
# next larger kind of gap are such jitter, and their values are one grid point.
JITTER_RATIO = 8.0
GRID_TOLERANCE = 0.1  # of a step: how far a gap between grid points may be from a whole number of steps


def _grid_points(values: np.ndarray) -> np.ndarray | None:
    """Sorted distinct `values` with neighbours closer than a jitter bound merged into their mean; None
    when no kind of gap is JITTER_RATIO times the next smaller kind (no jitter to merge)."""
    gaps = np.diff(values)
    kinds = np.unique(gaps)
    jumps = np.nonzero(kinds[1:] >= JITTER_RATIO * kinds[:-1])[0]
    if not len(jumps):
        return None
    jitter = kinds[jumps[0]]
    breaks = np.nonzero(gaps > jitter)[0] + 1
    return np.asarray([group.mean() for group in np.split(values, breaks)])


def _step_of(points: np.ndarray, n: int) -> float | None:
    """The grid step of sorted distinct `points` from `n` samples: the points repeat (at most half as many
    as the samples), there are at least three, one-step gaps (under 1.5 times the smallest) are seen at
    least twice (a step the timer keeps taking, not a chance gap), and every gap is a whole number of
    their median, the step (merged points sit up to half a jitter off the grid, so not the smallest)."""
    if len(points) < 3 or len(points) * 2 > n:
        return None
    gaps = np.diff(points)
    one = gaps[gaps < 1.5 * gaps.min()]
    if len(one) < 2:  # (points are sorted and distinct: every gap, so the step, is positive)
        return None
    step = float(np.median(one))
    units = gaps / step
    return step if bool(np.all(np.abs(units - np.round(units)) <= GRID_TOLERANCE)) else None


def timer_step(samples: Sequence[float]) -> float | None:
    """The step of a quantised timer, read from the samples (_step_of), after merging values a clock
    conversion's jitter split (_grid_points); None for a timer finer than the spread."""
    arr = _as_array(samples)
    values = np.unique(arr)
    if len(values) < 3:
        return None
    merged = _grid_points(values)
    step = _step_of(merged, len(arr)) if merged is not None else None
    return step if step is not None else _step_of(values, len(arr))


def effective_target(rule: StoppingRule, samples: Sequence[float]) -> float:
    """The rule's target, raised to TIMER_STEPS of a quantised timer's step relative to the median."""
    step = timer_step(samples)
    if step is None:
        return rule.target_rel_ci
    med = abs(float(np.median(_as_array(samples))))
    return max(rule.target_rel_ci, TIMER_STEPS * step / med) if med > 0 else rule.target_rel_ci


def sampling_step(
    rule: StoppingRule, samples: Sequence[float], elapsed_s: float, per_sample_s: float | None
) -> tuple[str | None, int]:
    """(why sampling stops, None while it goes on; the size of the next batch).

    `per_sample_s` is the cost of one sample so far (or an estimate before the first), so a batch that
    would run past the budget is cut to what fits. The reasons are mini_kv.status.StopReason's words."""
    from mini_kv.status import StopReason

    n = len(samples)
    left = rule.budget_s - elapsed_s
    goal = rule.fixed if rule.fixed is not None else rule.max_samples
    if n >= goal:
        return (StopReason.FIXED if rule.fixed is not None else StopReason.MAX), 0
    if n >= 1 and left <= 0:  # the budget wins over the minimum count: the timeout is for hangs
        return StopReason.BUDGET, 0
    adaptive = rule.fixed is None and n >= rule.min_samples
    rel_ci, target = (median_rel_ci(samples), effective_target(rule, samples)) if adaptive else (None, None)
    if adaptive and rel_ci <= target:
        return StopReason.CONVERGED, 0
    if rule.fixed is not None:
        want = goal - n
    elif n < rule.min_samples:
        want = rule.min_samples - n
    else:  # the half-width shrinks as 1/sqrt(n): aim for the count that reaches the target, at most doubling
        ratio = rel_ci / target
        want = min(n, max(rule.min_samples, int(math.ceil(n * (ratio * ratio - 1.0)))))
    want = min(want, goal - n)
    if per_sample_s is not None and per_sample_s > 0 and math.isfinite(left):
        fits = int(max(0.0, left) // per_sample_s)
        if fits < 1 and n >= 1:
            return StopReason.BUDGET, 0
        want = max(1, min(want, fits))
    return None, want
