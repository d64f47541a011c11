"""The regression verdict: an attempt's raw timing samples judged against a promoted baseline
(store.baseline reads it), case by case (`judge`).

Comparable only when task id and version, operator version, suite hash, environment key and device all
match (else INCOMPARABLE, never PASS). The stored timings are only a screen, taken at another time under
another load: a case beyond `p50_threshold` (or `p95_threshold`) is decided by same-run, interleaved
A/Bs of the baseline's own code and the candidate (`confirm`, as asv's `continuous` does;
stats.is_slower), by the rules of `_decide_same_run`; the attempt's verdict is its cases' by `_overall`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from mini_kv import stats
from mini_kv.codec import optional
from mini_kv.errors import BaselineTampered, ExitCode
from mini_kv.stats import RepeatSummary, Slower
from mini_kv.status import Verdict

REGRESSION_SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Thresholds:
    p50_threshold: float = 0.05  # candidate P50 more than 5 % slower: ask for a confirmation batch
    p95_threshold: float = 0.10  # candidate P95 more than 10 % slower: warning
    alpha: float = 0.01  # significance level of stats.is_slower
    n_boot: int = 2000
    seed: int = 0


# (name shown in reasons, how to read it from an attempt header or a baseline)
COMPARABLE_KEYS: tuple[tuple[str, Callable[[dict], object]], ...] = (
    ("task_id", lambda d: d.get("task_id")),
    ("task_version", lambda d: d.get("task_version")),
    ("operator_version", lambda d: (d.get("operator") or {}).get("version")),
    ("suite_hash", lambda d: d.get("suite_hash")),
    ("environment_key", lambda d: d.get("environment_key")),
    ("device", lambda d: d.get("device")),
)


def timed(rec) -> bool:
    """A bench record with timings: the benchmark of its case ran (its `candidate` side is there)."""
    return isinstance(rec, dict) and "candidate" in rec


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


# regression.json's records (schemas/regression.schema.json), written by the codec
@dataclasses.dataclass(frozen=True)
class Times:
    p50: float
    p95: float
    n: int


@dataclasses.dataclass(frozen=True)
class BaselineSide:
    samples: list[list[float]]
    summary: RepeatSummary


@dataclasses.dataclass(frozen=True)
class Retimed:
    """What the gate's same-run re-timing of one case gives (`confirm(case_id)`): the candidate's and the
    baseline's own build's samples (repeats of timings), who went first in each repeat, the baseline's build."""

    candidate: list
    baseline: list
    order: object = None
    build: object = None


@dataclasses.dataclass(frozen=True)
class SameRun:
    """One same-run, interleaved A/B of the candidate (`samples`, `summary`) and the baseline's own build."""

    method: str
    samples: list[list[float]]
    summary: RepeatSummary
    baseline: BaselineSide
    test: Slower  # the P50 test (stats.is_slower)
    order: object
    build: object

    def said(self) -> str:
        """What it measured, for a reason line."""
        t = self.test
        return (
            f"same run, interleaved: candidate P50 {self.summary.overall.p50:.4g} us vs the baseline's own "
            f"build {self.baseline.summary.overall.p50:.4g} us ({_pct(t.ratio)}, p={t.p_value:.2g}, "
            + ("significant" if t.significant else "not significant")
            + ")"
        )

    @property
    def p95_ratio(self) -> float:
        return self.summary.overall.p95 / self.baseline.summary.overall.p95


@dataclasses.dataclass(frozen=True)
class CaseVerdict:
    """One bench case judged against the baseline."""

    id: str
    verdict: Verdict
    reasons: tuple[str, ...]
    first_batch: Slower | None = None  # stats.is_slower of the stored screen, when the P50 was beyond it
    confirmation: SameRun | None = None  # the first same-run A/B (_same_run)
    second_confirmation: SameRun | None = None
    baseline: Times | None = optional()
    candidate: Times | None = optional()
    p50_ratio: float | None = optional()
    p95_ratio: float | None = optional()

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
    baseline_error: str | None = optional()
    tampered_file: str | None = optional()
    baseline_file: dict | None = optional()


def _compare_case(case_id: str, base: dict, cand: dict, confirm, th: Thresholds) -> CaseVerdict:
    """One bench case: the stored comparison screens, the same-run A/B decides (see the module doc)."""
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
        rec = rec.said(first_batch=first)
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


def _same_run(case_id: str, confirm: Callable[[str], Retimed], th: Thresholds, seed: int) -> SameRun | str:
    """One same-run, interleaved A/B of the candidate and the baseline's own build: its record (samples,
    summaries, the P50 test), or why it could not run. BaselineTampered passes through."""
    try:
        run = confirm(case_id)
        cand, base = _as_repeats(run.candidate), _as_repeats(run.baseline)
        return SameRun(
            "same-run, interleaved with the baseline's own build",
            cand,
            stats.summarize_repeats(cand),
            BaselineSide(base, stats.summarize_repeats(base)),
            stats.is_slower(_flat(base), _flat(cand), th.p50_threshold, th.alpha, th.n_boot, seed),
            run.order,
            run.build,
        )
    except BaselineTampered:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed re-run must not turn into a verdict
        return f"{type(exc).__name__}: {exc}"


def _decide_same_run(
    rec: CaseVerdict, screen: list[str], confirm: Callable[[str], Retimed], th: Thresholds
) -> CaseVerdict:
    """The verdict of a case the stored timings flagged, from same-run A/Bs of the baseline's own build:

    * FAIL: two A/Bs in a row both significantly slower beyond the P50 threshold;
    * WARN: the A/Bs agree with the stored screen on a smaller slowdown (a P95 beyond its threshold, or
      a significant P50 slowdown within it, seen twice);
    * PASS: the first A/B sees no slowdown beyond the thresholds (the gap to the stored timings was the
      machine's, not the code's);
    * UNCONFIRMED: the A/Bs cannot decide (a P50 beyond the threshold but not significant, or the two
      disagree), or could not run."""
    first = _same_run(rec.id, confirm, th, th.seed + 2)
    if isinstance(first, str):
        return _undecided(rec, screen, f"the same-run comparison could not run ({first})")
    rec = rec.said(confirmation=first)
    t1 = first.test
    if t1.exceeds and not t1.significant:
        return _undecided(rec, screen, first.said())
    p95_agrees = first.p95_ratio > 1 + th.p95_threshold
    if not (t1.slower or p95_agrees or (t1.significant and t1.ratio > 1)):
        return rec.said(
            None,
            "; ".join(screen) + f"; not seen in the {first.said()}: the gap to the stored timings is the "
            "machine's, not the code's",
        )
    second = _same_run(rec.id, confirm, th, th.seed + 4)
    if isinstance(second, str):
        return _undecided(rec, screen, f"{first.said()}; the second could not run ({second})")
    rec = rec.said(second_confirmation=second)
    t2 = second.test
    both = f"first {first.said()}; second {second.said()}"
    if t1.slower and t2.slower:
        return rec.said(Verdict.FAIL, "; ".join(screen) + f"; confirmed twice: {both}")
    if t1.slower != t2.slower:
        return _undecided(rec, screen, f"the two same-run comparisons disagree ({both})")
    if (p95_agrees and second.p95_ratio > 1 + th.p95_threshold) or (
        t1.significant and t2.significant and t1.ratio > 1 and t2.ratio > 1
    ):
        return rec.said(
            Verdict.WARN,
            "; ".join(screen) + f"; a slowdown within the P50 threshold or in the tail, seen in both "
            f"same-run comparisons ({both}): a warning",
        )
    return rec.said(None, "; ".join(screen) + f"; not seen twice ({both}): no slowdown to report")


def judge(
    baseline: dict,
    attempt_header: dict,
    benchmark_json: dict,
    confirm: Callable[[str], Retimed] | None = None,
    thresholds: Thresholds | None = None,
) -> RegressionVerdict:
    """The regression verdict of one attempt against a baseline (both already validated).

    `attempt_header` needs task_id, task_version, operator.version, suite_hash, environment_key, device;
    `benchmark_json` is an attempt's benchmark.json (only `cases` is read). `confirm(case_id)` times the
    candidate and the baseline's own code in one run, interleaved, and returns
    `{"candidate": samples, "baseline": samples, "order": ..., "build": ...}` (samples: a list of
    repeats, or one flat list). It may raise BaselineTampered: the verdict is then TAMPERED.
    """
    th = thresholds or Thresholds()
    pairs = [(name, get(baseline), get(attempt_header)) for name, get in COMPARABLE_KEYS]
    keys = tuple(KeyMatch(name, b, a, b is not None and b == a) for name, b, a in pairs)
    source = {"task_id": baseline.get("task_id"), **(baseline.get("source") or {})}
    out = RegressionVerdict(Verdict.INCOMPARABLE, (), th, keys, source)
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
        return tampered_verdict(exc, th)
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


def tampered_verdict(exc: BaselineTampered, thresholds: Thresholds | None) -> RegressionVerdict:
    """The verdict when the baseline's evidence is forged or damaged: neither PASS nor FAIL."""
    why = (
        f"baseline TAMPERED: {exc}; it was not used, the candidate was not judged. Restore the file "
        "(e.g. from version control) or promote a new baseline with `mini-kv promote-baseline --force`"
    )
    return unused_baseline(Verdict.TAMPERED, why, thresholds, tampered_file=exc.path)


def unused_baseline(verdict: Verdict, why: str, thresholds, **where) -> RegressionVerdict:
    """The verdict when the baseline could not be used (`baseline_error` says why): neither PASS nor FAIL."""
    return RegressionVerdict(verdict, (why,), thresholds or Thresholds(), baseline_error=why, **where)


def exit_code_for(verdict: RegressionVerdict | None) -> ExitCode:
    """REGRESSION for a FAIL, REGRESSION_UNCONFIRMED when the noise was too high to decide, CONFIG when
    the declared baseline could not be used (unreadable or TAMPERED), else OK."""
    if not verdict:
        return ExitCode.OK
    if verdict.verdict == Verdict.FAIL:
        return ExitCode.REGRESSION
    if verdict.verdict == Verdict.UNCONFIRMED:
        return ExitCode.REGRESSION_UNCONFIRMED
    if verdict.baseline_error:
        return ExitCode.CONFIG
    return ExitCode.OK


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
