"""The reference's timing across the solutions of a batch: timed in full once per case, device and timing
settings, re-checked briefly for drift by every later solution.

The parent keeps the full measurements (pipeline.ReferenceCache), filled only from the judge's signed
records of passing attempts; a later job carries the entry of each of its cases (`reference_timings`),
and the judge (engine.time_case) then times the candidate as always but the reference only for a short
re-check (`recheck_count` samples). The re-check's median within `band` of the full measurement's: the
full measurement stands in for the reference side (speedup = its median / the candidate's, as always);
outside it: the reference is timed in full again, and the parent replaces its entry. Every timed case of
a batch records which way its reference side was measured (ReferenceTiming, benchmark.json's
`reference_timing`).
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields

from mini_kv import stats
from mini_kv.codec import optional
from mini_kv.settings import DEFAULTS, RunSettings

MEASURED, REUSED, RETIMED = "measured", "reused", "retimed"
WITHIN, DRIFTED = "within", "drift"


@dataclass(frozen=True)
class ReferenceHow:
    """What a reuse must match in the judge's own choices (the method `auto` resolved to, the input sets
    memory allowed, the flush): a cached measurement taken otherwise is not comparable."""

    method: str
    calls_per_sample: int
    input_sets: int
    l2: str
    l2_flush: dict | None


@dataclass(frozen=True)
class CachedReference:
    """A full measurement of one case's reference side, as a later job gets it: the side's record
    (engine.Side as JSON: samples per repeat, summary, sampling), how it was timed (`how`),
    and where it came from (the attempt and solution whose run measured it, when)."""

    side: dict
    how: ReferenceHow
    attempt: str
    solution: str
    measured_at: str

    @classmethod
    def from_json(cls, doc: dict) -> CachedReference:
        """A job's entry (ReferenceCache.offer: this record as JSON) back as the record."""
        return cls(**{**doc, "how": ReferenceHow(**doc["how"])})


@dataclass(frozen=True)
class Recheck:
    """The short re-check of a cached reference: its samples and median, the cached median, the relative
    difference (`drift`: p50 / cached_p50 - 1), the band it is held to and the verdict (within, drift)."""

    samples: int
    p50: float
    cached_p50: float
    drift: float
    band: float
    verdict: str


@dataclass(frozen=True)
class ReferenceTiming:
    """benchmark.json's `reference_timing` of a case timed in a batch: `source` measured (timed in full
    here, interleaved with the candidate), reused (the full measurement of `attempt`/`solution` at
    `measured_at`, confirmed by `recheck`) or retimed (the re-check drifted: timed in full again here);
    `note`: why a cached measurement was not used."""

    source: str
    attempt: str | None = optional()
    solution: str | None = optional()
    measured_at: str | None = optional()
    recheck: Recheck | None = optional()
    note: str | None = optional()


def mismatch(cached: CachedReference, how: ReferenceHow) -> str | None:
    """Why `cached` cannot stand in for a measurement taken `how` (None: it can)."""
    if cached.how == how:
        return None
    differ = [
        (f.name, a, b)
        for f, a, b in zip(fields(how), astuple(cached.how), astuple(how), strict=True)
        if a != b
    ]
    return "the cached measurement differs in " + ", ".join(f"{k} ({a!r}, here {b!r})" for k, a, b in differ)


def recheck_count(cached: CachedReference, settings: RunSettings) -> int:
    """Samples of the re-check: `reference_recheck_share` of the full measurement's, at least the
    minimum the stopping rule takes, never more than the full measurement took."""
    taken = sum(cached.side.get("sampling", {}).get("taken") or [len(r) for r in cached.side["samples"]])
    least = settings.min_samples
    return max(1, min(taken, max(least, math.ceil(DEFAULTS.reference_recheck_share * taken))))


def cached_p50(cached: CachedReference) -> float:
    return stats.summarize([x for rep in cached.side["samples"] for x in rep]).p50


def band(settings: RunSettings) -> float:
    """How far a re-check's median may be from the full measurement's, in ratio: the stability gate's
    max_cv (what the gate lets two repeats' medians differ by) or the drift floor, the larger. Not
    widened by a noisy full measurement's own interval: one whose median is that uncertain is timed
    again rather than stood behind."""
    return max(settings.cv_limits[0], DEFAULTS.reference_drift_floor)


def recheck(cached: CachedReference, samples: list[float], settings: RunSettings) -> Recheck:
    """The re-check's verdict on `cached`: within the band (its median between cached / (1 + band) and
    cached * (1 + band): as far slower as faster, in ratio), or drifted."""
    p50, ref = stats.summarize(samples).p50, cached_p50(cached)
    rel = p50 / ref - 1.0 if ref > 0 else math.inf
    limit = band(settings)
    verdict = WITHIN if ref > 0 and ref / (1 + limit) <= p50 <= ref * (1 + limit) else DRIFTED
    return Recheck(len(samples), p50, ref, round(rel, 6), round(limit, 6), verdict)
