"""Baselines and the regression verdict.

A baseline (baselines/<task>.json) is promoted by hand from one complete, PASSED, stable attempt and
then never changes by itself. It carries a hash manifest (the SHA-256 of its own canonical content and
the file list of the attempt it came from); a baseline that no longer matches it is TAMPERED and is
never used. `compare_to_baseline` judges a new attempt's raw timing samples against it, case by case:

  * the two are comparable only when task id and version, operator version, suite hash, environment
    key and device all match; otherwise the verdict is INCOMPARABLE (never PASS);
  * the stored baseline is only a screen: its timings were taken at another time, under another
    machine load, so they are not evidence on their own. A case whose candidate P50 is more than
    `p50_threshold` (or P95 more than `p95_threshold`) slower than the stored one is decided by
    `confirm(case_id)`, which times the baseline's own code (rebuilt from its sources) and the
    candidate in one worker, interleaved, as asv's `continuous` does (stats.is_slower: Mann-Whitney U
    plus non-overlapping bootstrap CIs of the medians at `alpha`):
      - PASS when that same-run A/B shows no slowdown beyond the thresholds (the gap was the machine's);
      - FAIL only when it and a second same-run A/B both show the P50 significantly slower beyond the
        threshold;
      - WARN only where two same-run A/Bs agree with the screen on a smaller slowdown (a P95 beyond its
        threshold, or a significant P50 slowdown within the threshold);
      - UNCONFIRMED when the noise is too high to decide: an A/B P50 beyond the threshold but not
        significant, two A/Bs that disagree, or no A/B that could run (exit 8, its own line).
    A case with no slowdown against the stored timings is PASS, stable or not.

Overall: TAMPERED if the baseline or its source attempt fails its hashes; else FAIL if any case FAILs;
else UNCONFIRMED if any case is; else INCOMPARABLE if any case could not be compared (or was not
measured); else WARN if any case warns; else PASS.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from mini_kv.codec import to_json
from mini_kv.errors import BaselineTampered, ConfigError, ExitCode, UserError
from mini_kv.model import canonical_json, sha256_file, sha256_text
from mini_kv.status import Status, Verdict
from mini_kv.store.jsonfile import RecordUnusable, read_versioned
from mini_kv.store.records import timed

# 2: the baseline carries a hash manifest (a version 1 file has none and cannot be checked)
BASELINE_SCHEMA_VERSION = 2
REGRESSION_SCHEMA_VERSION = 1
BASELINE_KIND = "mini_kv.baseline"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    p50_threshold: float = 0.05  # candidate P50 more than 5 % slower: ask for a confirmation batch
    p95_threshold: float = 0.10  # candidate P95 more than 10 % slower: warning
    alpha: float = 0.01  # significance level of stats.is_slower
    n_boot: int = 2000
    seed: int = 0

    @classmethod
    def of(cls, value: Thresholds | dict | None) -> Thresholds:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown regression threshold(s): {', '.join(sorted(unknown))}")
        return cls(**value)


# (name shown in reasons, how to read it from an attempt header or a baseline)
COMPARABLE_KEYS: tuple[tuple[str, Callable[[dict], object]], ...] = (
    ("task_id", lambda d: d.get("task_id")),
    ("task_version", lambda d: d.get("task_version")),
    ("operator_version", lambda d: (d.get("operator") or {}).get("version")),
    ("suite_hash", lambda d: d.get("suite_hash")),
    ("environment_key", lambda d: d.get("environment_key")),
    ("device", lambda d: d.get("device")),
)


def _as_repeats(samples) -> list[list[float]]:
    """Samples as a list of repeats; a flat list of numbers is one repeat."""
    if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)) or len(samples) == 0:
        raise ValueError("samples must be a non-empty list of timings or of repeats of timings")
    if all(isinstance(x, (int, float)) for x in samples):
        return [[float(x) for x in samples]]
    return [[float(x) for x in rep] for rep in samples]


def _flat(repeats: list[list[float]]) -> list[float]:
    return [x for rep in repeats for x in rep]


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


# regression.json's records (schemas/regression.schema.json); the codec writes them, omitting the
# optional fields a case or a verdict does not have
_OPTIONAL = {"omit_none": True}


@dataclasses.dataclass(frozen=True)
class Times:
    p50: float
    p95: float
    n: int


@dataclasses.dataclass(frozen=True)
class CaseVerdict:
    """One bench case judged against the baseline."""

    id: str
    verdict: Verdict
    reasons: tuple[str, ...]
    first_batch: dict | None = None  # stats.is_slower of the stored screen, when the P50 was beyond it
    confirmation: dict | None = None  # the first same-run A/B (_same_run)
    second_confirmation: dict | None = None
    baseline: Times | None = dataclasses.field(default=None, metadata=_OPTIONAL)
    candidate: Times | None = dataclasses.field(default=None, metadata=_OPTIONAL)
    p50_ratio: float | None = dataclasses.field(default=None, metadata=_OPTIONAL)
    p95_ratio: float | None = dataclasses.field(default=None, metadata=_OPTIONAL)

    def said(self, verdict: Verdict | None = None, *reasons: str, **more) -> CaseVerdict:
        """This case with `verdict` (None: unchanged), `reasons` added and `more` fields set."""
        return dataclasses.replace(
            self, verdict=verdict or self.verdict, reasons=(*self.reasons, *reasons), **more
        )


@dataclasses.dataclass(frozen=True)
class KeyMatch:
    key: str
    baseline: object
    attempt: object
    match: bool


@dataclasses.dataclass(frozen=True)
class RegressionVerdict:
    """An attempt judged against a baseline: regression.json."""

    verdict: Verdict
    reasons: tuple[str, ...]
    thresholds: Thresholds
    keys: tuple[KeyMatch, ...] = ()
    baseline: dict = dataclasses.field(default_factory=dict)  # the baseline's task id and source attempt
    cases: tuple[CaseVerdict, ...] = ()
    schema_version: int = REGRESSION_SCHEMA_VERSION
    baseline_error: str | None = dataclasses.field(default=None, metadata=_OPTIONAL)
    tampered_file: str | None = dataclasses.field(default=None, metadata=_OPTIONAL)
    baseline_file: dict | None = dataclasses.field(default=None, metadata=_OPTIONAL)


def verdict_document(verdict: RegressionVerdict) -> dict:
    """regression.json's content, checked against its schema (what the store writes and reads)."""
    from mini_kv.load.schema import validate

    doc = to_json(verdict)
    validate(doc, "regression", "regression.json")
    return doc


def _compare_case(case_id: str, base: dict, cand: dict, confirm, th: Thresholds) -> CaseVerdict:
    """One bench case: the stored comparison screens, the same-run A/B decides (see the module doc)."""
    from mini_kv import stats

    differs = [
        f"{case_id}: timed with {key}={cand.get(key)!r}, baseline used {base.get(key)!r}"
        for key in ("method", "l2", "unit")
        if key in base and base.get(key) != cand.get(key)
    ]
    if differs:
        return CaseVerdict(case_id, Verdict.INCOMPARABLE, tuple(differs))
    base_flat = _flat(_as_repeats(base["samples"]))
    cand_flat = _flat(_as_repeats(cand["candidate"]["samples"]))
    bs, cs = stats.summarize(base_flat), stats.summarize(cand_flat)
    p50_ratio, p95_ratio = cs.p50 / bs.p50, cs.p95 / bs.p95
    rec = CaseVerdict(
        case_id,
        Verdict.PASS,
        (),
        baseline=Times(bs.p50, bs.p95, bs.n),
        candidate=Times(cs.p50, cs.p95, cs.n),
        p50_ratio=p50_ratio,
        p95_ratio=p95_ratio,
    )
    screen = []
    if p50_ratio > 1 + th.p50_threshold:
        first = stats.is_slower(base_flat, cand_flat, th.p50_threshold, th.alpha, th.n_boot, th.seed)
        rec = rec.said(first_batch=to_json(first))
        screen.append(
            f"{case_id}: P50 {cs.p50:.4g} us vs stored baseline {bs.p50:.4g} us ({_pct(p50_ratio)}, "
            f"p={first.p_value:.2g}{', significant' if first.significant else ', not significant'})"
        )
    if p95_ratio > 1 + th.p95_threshold:
        screen.append(
            f"{case_id}: P95 {cs.p95:.4g} us vs stored baseline {bs.p95:.4g} us ({_pct(p95_ratio)}, "
            f"above {th.p95_threshold:.0%})"
        )
    if not screen:
        if (cand.get("stability") or {}).get("stable") is False:
            return rec.said(None, f"{case_id}: no slowdown against the stored timings (measurement unstable)")
        return rec
    if confirm is None:
        return _undecided(rec, screen, "no same-run comparison with the baseline's own code could be run")
    return _decide_same_run(rec, screen, confirm, th)


def _undecided(rec: CaseVerdict, screen: list[str], why: str, **more) -> CaseVerdict:
    """UNCONFIRMED: the stored timings suggest a slowdown that the same-run A/B could not decide."""
    why = "; ".join(screen) + f"; {why}: too noisy to decide (UNCONFIRMED, not a failure)"
    return rec.said(Verdict.UNCONFIRMED, why, **more)


def _same_run(case_id: str, confirm: Callable[[str], dict], th: Thresholds, seed: int) -> dict:
    """One same-run, interleaved A/B of the candidate and the baseline's own build: its record (samples,
    summaries, the P50 test). Raises what `confirm` raises."""
    from mini_kv import stats

    run = confirm(case_id)
    cand, base = _as_repeats(run["candidate"]), _as_repeats(run["baseline"])
    test = stats.is_slower(_flat(base), _flat(cand), th.p50_threshold, th.alpha, th.n_boot, seed)
    return {
        "method": "same-run, interleaved with the baseline's own build",
        "samples": cand,
        "summary": to_json(stats.summarize_repeats(cand)),
        "baseline": {"samples": base, "summary": to_json(stats.summarize_repeats(base))},
        "test": to_json(test),
        "order": run.get("order"),
        "build": run.get("build"),
    }


def _said(ab: dict) -> str:
    """What one same-run A/B measured, for a reason line."""
    t, p50 = ab["test"], lambda d: d["summary"]["overall"]["p50"]
    return (
        f"same run, interleaved: candidate P50 {p50(ab):.4g} us vs the baseline's own build "
        f"{p50(ab['baseline']):.4g} us ({_pct(t['ratio'])}, p={t['p_value']:.2g}, "
        + ("significant" if t["significant"] else "not significant")
        + ")"
    )


def _p95_ratio(ab: dict) -> float:
    return ab["summary"]["overall"]["p95"] / ab["baseline"]["summary"]["overall"]["p95"]


def _decide_same_run(
    rec: CaseVerdict, screen: list[str], confirm: Callable[[str], dict], th: Thresholds
) -> CaseVerdict:
    """The verdict of a case the stored timings flagged, from same-run A/Bs of the baseline's own build:

    * FAIL: two A/Bs in a row both significantly slower beyond the P50 threshold;
    * WARN: the A/Bs agree with the stored screen on a smaller slowdown (a P95 beyond its threshold, or
      a significant P50 slowdown within it, seen twice);
    * PASS: the first A/B sees no slowdown beyond the thresholds (the gap to the stored timings was the
      machine's, not the code's);
    * UNCONFIRMED: the A/Bs cannot decide (a P50 beyond the threshold but not significant, or the two
      disagree), or could not run."""
    try:
        first = _same_run(rec.id, confirm, th, th.seed + 2)
    except BaselineTampered:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed re-run must not turn into a verdict
        return _undecided(rec, screen, f"the same-run comparison could not run ({type(exc).__name__}: {exc})")
    rec = rec.said(confirmation=first)
    t1 = first["test"]
    if t1["exceeds"] and not t1["significant"]:
        return _undecided(rec, screen, f"{_said(first)}")
    p95_agrees = _p95_ratio(first) > 1 + th.p95_threshold
    if not (t1["slower"] or p95_agrees or (t1["significant"] and t1["ratio"] > 1)):
        return rec.said(
            None,
            "; ".join(screen) + f"; not seen in the {_said(first)}: the gap to the stored timings is the "
            "machine's, not the code's",
        )
    try:
        second = _same_run(rec.id, confirm, th, th.seed + 4)
    except BaselineTampered:
        raise
    except Exception as exc:  # noqa: BLE001
        return _undecided(
            rec, screen, f"{_said(first)}; the second could not run ({type(exc).__name__}: {exc})"
        )
    rec = rec.said(second_confirmation=second)
    t2 = second["test"]
    both = f"first {_said(first)}; second {_said(second)}"
    if t1["slower"] and t2["slower"]:
        return rec.said(Verdict.FAIL, "; ".join(screen) + f"; confirmed twice: {both}")
    if t1["slower"] != t2["slower"]:
        return _undecided(rec, screen, f"the two same-run comparisons disagree ({both})")
    if (p95_agrees and _p95_ratio(second) > 1 + th.p95_threshold) or (
        t1["significant"] and t2["significant"] and t1["ratio"] > 1 and t2["ratio"] > 1
    ):
        return rec.said(
            Verdict.WARN,
            "; ".join(screen) + f"; a slowdown within the P50 threshold or in the tail, seen in both "
            f"same-run comparisons ({both}): a warning",
        )
    return rec.said(None, "; ".join(screen) + f"; not seen twice ({both}): no slowdown to report")


def compare_to_baseline(
    baseline: dict,
    attempt_header: dict,
    benchmark_json: dict,
    confirm: Callable[[str], dict] | None = None,
    thresholds: Thresholds | dict | None = None,
) -> dict:
    """regression.json's content for one attempt judged against a baseline (`judge`)."""
    return verdict_document(judge(baseline, attempt_header, benchmark_json, confirm, thresholds))


def judge(
    baseline: dict,
    attempt_header: dict,
    benchmark_json: dict,
    confirm: Callable[[str], dict] | None = None,
    thresholds: Thresholds | dict | None = None,
) -> RegressionVerdict:
    """The regression verdict of one attempt against a baseline (both already validated).

    `attempt_header` needs task_id, task_version, operator.version, suite_hash, environment_key, device;
    `benchmark_json` is an attempt's benchmark.json (only `cases` is read). `confirm(case_id)` times the
    candidate and the baseline's own code in one run, interleaved, and returns
    `{"candidate": samples, "baseline": samples, "order": ..., "build": ...}` (samples: a list of
    repeats, or one flat list). It may raise BaselineTampered: the verdict is then TAMPERED.
    """
    th = Thresholds.of(thresholds)
    keys = tuple(
        KeyMatch(
            name,
            get(baseline),
            get(attempt_header),
            get(baseline) is not None and get(baseline) == get(attempt_header),
        )
        for name, get in COMPARABLE_KEYS
    )
    out = RegressionVerdict(
        Verdict.INCOMPARABLE,
        (),
        th,
        keys,
        {"task_id": baseline.get("task_id"), **(baseline.get("source") or {})},
    )
    mismatched = [k for k in keys if not k.match]
    if mismatched:
        reasons = [f"{k.key} differs: attempt {k.attempt!r}, baseline {k.baseline!r}" for k in mismatched]
        reasons.append(
            "not comparable with this baseline; promote a baseline measured under the same "
            "task, suite and environment"
        )
        return dataclasses.replace(out, reasons=tuple(reasons))
    measured = {c.get("id"): c for c in benchmark_json.get("cases", []) if isinstance(c, dict)}
    try:
        cases = tuple(
            _case_verdict(base, measured.get(base["id"]), confirm, th) for base in baseline["cases"]
        )
    except BaselineTampered as exc:
        return _tampered_verdict(exc, th)
    verdict = _overall([c.verdict for c in cases])
    reasons = [r for c in cases for r in c.reasons]
    if verdict == Verdict.INCOMPARABLE:
        reasons.append("no bench case could be compared with the baseline")
    return dataclasses.replace(out, verdict=verdict, reasons=tuple(reasons), cases=cases)


def _case_verdict(base: dict, cand: dict | None, confirm, th: Thresholds) -> CaseVerdict:
    """One bench case: MISSING when not timed, INCOMPARABLE when its samples cannot be compared."""
    case_id = base["id"]
    if cand is None or not timed(cand):
        why = "not measured in this attempt" if cand is None else f"benchmark failed ({cand.get('status')})"
        return CaseVerdict(case_id, Verdict.MISSING, (f"{case_id}: {why}",))
    try:
        return _compare_case(case_id, base, cand, confirm, th)
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:  # malformed samples: not judged
        why = f"{case_id}: samples cannot be compared ({type(exc).__name__}: {exc})"
        return CaseVerdict(case_id, Verdict.INCOMPARABLE, (why,))


def _overall(verdicts: list[Verdict]) -> Verdict:
    """The attempt's verdict from its cases', in this order of precedence: FAIL (a slowdown confirmed
    twice in the same run), UNCONFIRMED (one that could not be decided), INCOMPARABLE (a case could not
    be compared, or none measured), WARN (a smaller slowdown the same run agreed with), PASS."""
    for verdict in (Verdict.FAIL, Verdict.UNCONFIRMED):
        if verdict in verdicts:
            return verdict
    if not verdicts or any(v in (Verdict.INCOMPARABLE, Verdict.MISSING) for v in verdicts):
        return Verdict.INCOMPARABLE
    return Verdict.WARN if Verdict.WARN in verdicts else Verdict.PASS


def _tampered_verdict(
    exc: BaselineTampered, thresholds: Thresholds | dict | None, **where
) -> RegressionVerdict:
    """The verdict when the baseline's evidence is forged or damaged: neither PASS nor FAIL."""
    why = (
        f"baseline TAMPERED: {exc}; it was not used, the candidate was not judged. Restore the file "
        "(e.g. from version control) or promote a new baseline with `mini-kv promote-baseline --force`"
    )
    return _unused_baseline(Verdict.TAMPERED, why, thresholds, tampered_file=exc.path, **where)


def _unused_baseline(verdict: Verdict, why: str, thresholds, **where) -> RegressionVerdict:
    """The verdict when the baseline could not be used (`baseline_error` says why): neither PASS nor FAIL."""
    return RegressionVerdict(verdict, (why,), Thresholds.of(thresholds), baseline_error=why, **where)


def exit_code_for(verdict: dict | None) -> ExitCode:
    """REGRESSION for a FAIL, REGRESSION_UNCONFIRMED when the noise was too high to decide, CONFIG when
    the declared baseline could not be used (unreadable or TAMPERED), else OK."""
    if not verdict:
        return ExitCode.OK
    if verdict.get("verdict") == Verdict.FAIL:
        return ExitCode.REGRESSION
    if verdict.get("verdict") == Verdict.UNCONFIRMED:
        return ExitCode.REGRESSION_UNCONFIRMED
    if verdict.get("baseline_error"):
        return ExitCode.CONFIG
    return ExitCode.OK


def regression_summary(verdict: dict | None) -> dict:
    """The `regression` entry of an attempt's header ({} without a verdict)."""
    return (
        {}
        if verdict is None
        else {"regression": {"verdict": verdict["verdict"], "reasons": verdict["reasons"]}}
    )


# ---------------------------------------------------------------------------------------------- baselines


def load_baseline(path: Path) -> dict:
    """A baseline file, schema-checked; ConfigError (naming file and field) otherwise."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            str(path),
            "",
            "baseline file does not exist; create it with `mini-kv promote-baseline --attempt <attempt dir>`",
        )
    try:
        data = read_versioned(
            path,
            BASELINE_SCHEMA_VERSION,
            "baseline",
            hint=(
                "use the mini_kv version that wrote it, or promote a new baseline with this one "
                "(`mini-kv promote-baseline --attempt <dir> --force`)"
            ),
        )
    except RecordUnusable as exc:
        what = "unreadable baseline: " if exc.reason == "unreadable" else ""
        raise ConfigError(str(path), "", f"{what}{str(exc)[len(exc.file) + 2 :]}") from None
    check_manifest(data, path)
    return data


def content_sha256(baseline: dict) -> str:
    """SHA-256 of the baseline's canonical JSON, all but the hash itself: what the manifest vouches for
    (the source attempt's file list included)."""
    manifest = {k: v for k, v in (baseline.get("manifest") or {}).items() if k != "content_sha256"}
    return sha256_text(
        canonical_json({**{k: v for k, v in baseline.items() if k != "manifest"}, "manifest": manifest})
    )


def check_manifest(baseline: dict, path: Path) -> None:
    """Refuse a baseline whose content (samples, identity keys, source) changed after promotion.

    A hash is tamper evidence, not a signature: it catches edits by hand or by a tool that does not
    know the format. It cannot make a forged FAIL: a suspected regression is judged only on the
    same-run timing of the baseline's own code (see compare_to_baseline)."""
    recorded = baseline["manifest"]["content_sha256"]
    actual = content_sha256(baseline)
    if actual != recorded:
        raise BaselineTampered(
            str(path),
            f"content SHA-256 {actual} differs from its manifest's {recorded}: the "
            "file was edited after `mini-kv promote-baseline` (samples, keys or source)",
        )
    source_files = {f["path"]: f for f in baseline["manifest"]["attempt_files"]}
    if len(source_files) != len(baseline["manifest"]["attempt_files"]):
        raise BaselineTampered(str(path), "manifest.attempt_files lists a path twice")


def _promotable(attempt_dir: Path, where: str) -> tuple[dict, dict, dict]:
    """(header, benchmark.json, environment.json) of an attempt fit to be a baseline: every check of the
    index (schema, hashed files inside the attempt, ids, a headline its records give), PASSED, benchmarked
    and stable by that recomputed headline; UserError naming what is wrong otherwise."""
    from mini_kv.store.attempts import AttemptInvalid
    from mini_kv.store.index import check_attempt

    try:
        checked = check_attempt(attempt_dir)
    except AttemptInvalid as exc:
        raise UserError(f"{where}: {exc}") from None
    except (OSError, RecursionError) as exc:
        raise UserError(f"{where}: unreadable ({type(exc).__name__}: {exc})") from None
    row = checked.row
    if row.status != Status.PASSED:
        raise UserError(
            f"{where}: its status is {row.status}; only a PASSED (fully correct) attempt can become a baseline"
        )
    if row.stable is None:
        raise UserError(
            f"{where}: it has no benchmark data (it ran with --skip-benchmark?); verify it again "
            "with the benchmark"
        )
    if not row.stable:
        raise UserError(
            f"{where}: its benchmark was not stable (stable=False); a baseline must be "
            "reproducible: verify again on a quiet machine and promote a stable attempt"
        )
    # the index requires both of every format, so the check read and hashed them
    return checked.header, checked.files["benchmark.json"], checked.files["environment.json"]


def _baseline_cases(bench: dict, where: str) -> list[dict]:
    cases = []
    for c in bench.get("cases", []):
        if not timed(c):
            raise UserError(f"{where}: bench case {c.get('id')} has no timings ({c.get('status')})")
        if not (c.get("stability") or {}).get("stable"):
            raise UserError(f"{where}: bench case {c.get('id')} was not stable")
        cases.append(
            {
                "id": c["id"],
                "dtype": c.get("dtype"),
                "params": c.get("params", {}),
                "method": c.get("method"),
                "l2": c.get("l2"),
                "unit": c.get("unit", "us"),
                "samples": c["candidate"]["samples"],
                "summary": c["candidate"]["summary"],
                "stability": c.get("stability"),
            }
        )
    if not cases:
        raise UserError(f"{where}: its benchmark has no cases")
    if any(not math.isfinite(x) for c in cases for rep in c["samples"] for x in rep):
        raise UserError(f"{where}: non-finite timing samples")
    return cases


def promote_baseline(attempt_dir: Path, output: Path, force: bool = False) -> dict:
    """Write a baseline from one attempt (a task card's or a SOL-ExecBench one); refuses unless it is
    complete, PASSED, stable and benchmarked."""
    from mini_kv.load.schema import validate
    from mini_kv.store.atomic import write_json

    attempt_dir, output = Path(attempt_dir), Path(output)
    where = f"cannot promote {attempt_dir}"
    header, bench, env = _promotable(attempt_dir, where)
    baseline = {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "kind": BASELINE_KIND,
        "task_id": header["task_id"],
        "task_version": header["task_version"],
        "operator": {"name": header["operator"]["name"], "version": header["operator"]["version"]},
        "suite_hash": header["suite_hash"],
        "environment_key": header["environment_key"],
        "device": header.get("device"),
        "environment": env,
        "source": {
            "attempt_id": header["attempt_id"],
            "attempt_json_sha256": sha256_file(attempt_dir / "attempt.json"),
            "candidate": header["candidate"],
            "created_at": header["created_at"],
            "path": str(attempt_dir.resolve()),
        },
        "promoted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cases": _baseline_cases(bench, where),
    }
    baseline["manifest"] = {"algorithm": "sha256", "attempt_files": header["files"]}
    baseline["manifest"]["content_sha256"] = content_sha256(baseline)
    validate(baseline, "baseline", str(output))
    if output.exists() and not force:
        raise UserError(
            f"{output} already exists; baselines never change by themselves: pass --force to "
            "replace it with this attempt"
        )
    write_json(output, baseline)
    return baseline


def find_baseline(
    root: Path, task_id: str, declared: str | None = None
) -> tuple[Path | None, str | None, list[str]]:
    """The baseline file of a task: `declared` (a card's `baseline:`), else baselines/<task>.json under the
    project by convention (promote-baseline's default output; the only place for a SOL problem).
    Returns (path or None, "card" | "convention" | None, notes that tell the user about a baseline that
    exists but is not used)."""
    root = Path(root)
    conventional = f"baselines/{task_id}.json"
    has_conventional = (root / conventional).is_file()
    if has_conventional and not (root / conventional).resolve().is_relative_to(root.resolve()):
        # a card's own `baseline:` may not leave the project (load.task_card.resolve_inside); nor may this
        return None, None, [f"{conventional} is not used: it resolves outside the project root {root}"]
    if declared:
        path = root / declared
        other = has_conventional and Path(declared) != Path(conventional)
        notes = (
            [f"{conventional} exists but is not used: the card's `baseline:` names {declared}"]
            if other
            else []
        )
        if path.exists():
            return path, "card", notes
        return (
            None,
            None,
            [
                f"no regression check: the card's `baseline:` names {declared}, which does not "
                "exist; create it with `mini-kv promote-baseline --attempt <attempt dir>`",
                *notes,
            ],
        )
    if has_conventional:
        return root / conventional, "convention", []
    return None, None, []


def find_card_baseline(card) -> tuple[Path | None, str | None, list[str]]:
    """The baseline file `verify` uses (see find_baseline)."""
    return find_baseline(Path(card.project_root), card.id, card.baseline)


def _baseline_target(attempt_dir: Path, project_root: Path) -> tuple[Path, str | None, str]:
    """Where the next run of the attempt's task looks for its baseline: (path, the card's `baseline:` or
    None, the command). A card as it is now, if it is at hand: its `baseline:` may have been edited."""
    import yaml

    header = json.loads((attempt_dir / "attempt.json").read_text())
    if header.get("format") == "sol-execbench":
        return (
            project_root / f"baselines/{header['task_id']}.json",
            None,
            f"`mini-kv bench` of {header['task_id']}",
        )
    doc = json.loads((attempt_dir / "task_card.json").read_text())
    card_path, card = doc.get("path") or "<card>", doc.get("card") or {}
    try:
        card = yaml.safe_load((project_root / card_path).read_text()) or card
    except (OSError, yaml.YAMLError):
        pass
    declared = card.get("baseline") if isinstance(card, dict) else None
    return (
        project_root / (declared or f"baselines/{card.get('id')}.json"),
        declared,
        f"`mini-kv verify --task {card_path}`",
    )


def default_baseline_output(attempt_dir: Path, project_root: Path) -> Path:
    """promote-baseline's default output: where the next verify or bench of the task will look."""
    try:
        return _baseline_target(Path(attempt_dir), project_root)[0]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # promote_baseline says what is wrong
        return project_root / "baselines" / "unknown.json"


def promoted_baseline_use(attempt_dir: Path, output: Path, project_root: Path) -> tuple[bool, str]:
    """Whether the next `verify` of the attempt's card (or `bench` of its SOL problem) will use a
    just-promoted baseline, and a line saying so."""
    used, declared, command = _baseline_target(Path(attempt_dir), project_root)
    conventional = used.relative_to(project_root)
    try:
        rel = Path(output).resolve().relative_to(project_root.resolve())
    except ValueError:
        rel = Path(output).resolve()
    if Path(output).resolve() == used.resolve():
        how = "the card's `baseline:`" if declared else f"found by convention at {conventional}"
        return True, f"{command} will use it ({how})"
    if declared:
        return False, (
            f"{command} will NOT use this file: the card's `baseline:` names "
            f"{declared}. Point `baseline:` at {rel}, or promote with `--output {declared}`"
        )
    fix = (
        "promote without --output"
        if command.startswith("`mini-kv bench")
        else f"Add `baseline: {rel}` to the card, or promote without --output"
    )
    return False, f"{command} will NOT use this file: it looks for {conventional} in this project. {fix}"


def check_baseline(
    path: Path,
    found_by: str,
    root: Path,
    header: dict,
    bench_cases: list[dict],
    confirm_with: Callable[[dict, str], dict] | None = None,
    thresholds: Thresholds | dict | None = None,
    artifacts: Path | None = None,
) -> dict:
    """The verdict of an attempt (`header`: the ids compare_to_baseline reads; its bench cases) against
    the baseline file at `path`. A baseline that cannot be used gives INCOMPARABLE with `baseline_error`
    set; a forged or damaged one (or a source attempt that changed since) gives TAMPERED.

    `confirm_with(baseline, case_id)` runs the same-run comparison (see compare_to_baseline);
    `artifacts` is the store where the baseline's source attempt may lie."""
    ref = {"path": str(Path(path).relative_to(root)), "found_by": found_by}
    try:
        ref["sha256"] = sha256_file(path)
        baseline = load_baseline(path)
        _check_source_attempt(baseline, artifacts)
    except BaselineTampered as exc:
        return verdict_document(_tampered_verdict(exc, thresholds, baseline_file=ref))
    except (UserError, OSError) as exc:
        return verdict_document(
            _unused_baseline(Verdict.INCOMPARABLE, str(exc), thresholds, baseline_file=ref)
        )
    confirm = None if confirm_with is None else (lambda case_id: confirm_with(baseline, case_id))
    verdict = judge(baseline, header, {"cases": bench_cases}, confirm, thresholds)
    return verdict_document(dataclasses.replace(verdict, baseline_file=ref))


# ------------------------------------------------------------------- the attempt a baseline came from


class BaselineBuildError(Exception):
    """The baseline's code cannot be built or found; the message says why (no same-run comparison)."""


def find_source_attempt(baseline: dict, artifacts: Path) -> Path:
    """The attempt a baseline was promoted from: its recorded path, else artifacts/<task>/<attempt_id>
    (a baseline committed to the repository, verified on another machine with its own store)."""
    source = baseline.get("source") or {}
    tried = []
    for cand in (
        source.get("path"),
        Path(artifacts) / str(baseline.get("task_id")) / str(source.get("attempt_id")),
    ):
        if cand and Path(cand).is_dir():
            return Path(cand)
        if cand:
            tried.append(str(cand))
    raise BaselineBuildError(
        "the attempt the baseline was promoted from is not available (looked in "
        + ", ".join(tried)
        + "); its sources are needed to time the baseline beside "
        "the candidate"
    )


def checked_source_attempt(attempt_dir: Path, baseline: dict) -> dict:
    """attempt.json of the attempt a baseline names, after checking it is that attempt (the SHA-256 of its
    attempt.json, which lists every source's SHA-256, and every check of the index); else TAMPERED."""
    from mini_kv.store.attempts import AttemptInvalid
    from mini_kv.store.index import read_checked_attempt

    recorded = (baseline.get("source") or {}).get("attempt_json_sha256")
    actual = sha256_file(attempt_dir / "attempt.json") if (attempt_dir / "attempt.json").is_file() else None
    if actual != recorded:
        raise BaselineTampered(
            str(attempt_dir / "attempt.json"),
            f"SHA-256 {actual} differs from the baseline's record {recorded}: the attempt "
            "the baseline was promoted from has changed since",
        )
    try:
        header = read_checked_attempt(attempt_dir)
    except AttemptInvalid as exc:
        raise BaselineTampered(str(attempt_dir), str(exc)) from None
    recorded_files = (baseline.get("manifest") or {}).get("attempt_files")
    if recorded_files is not None and header["files"] != recorded_files:
        raise BaselineTampered(
            str(attempt_dir / "attempt.json"),
            "its file list differs from the one the baseline's manifest recorded at promotion",
        )
    return header


def _check_source_attempt(baseline: dict, artifacts: Path | None) -> None:
    """Where the attempt a baseline came from is at hand, it must still be the one it recorded: else
    TAMPERED. Absent is fine here; only a suspected regression needs its sources."""
    try:
        checked_source_attempt(find_source_attempt(baseline, artifacts or Path("artifacts")), baseline)
    except BaselineBuildError:
        return
