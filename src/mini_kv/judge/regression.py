"""Baselines and the regression verdict.

A baseline (baselines/<task>.json) is promoted by hand from one complete, PASSED, stable attempt and
then never changes by itself. `compare_to_baseline` judges a new attempt's raw timing samples against
it, case by case:

  * the two are comparable only when task id and version, operator version, suite hash, environment
    key and device all match; otherwise the verdict is INCOMPARABLE (never PASS);
  * a case whose candidate P50 is more than `p50_threshold` slower than the baseline P50 triggers
    `confirm(case_id)`, an independent batch of new samples. The case FAILs only when both batches
    exceed the threshold and are significantly slower (stats.is_slower: Mann-Whitney U plus
    non-overlapping bootstrap CIs of the medians at `alpha`). Without a confirm callable the case
    is UNCONFIRMED; a confirmation that does not reproduce the slowdown is a WARN;
  * a P95 more than `p95_threshold` slower is a WARN.

Overall: FAIL if any case FAILs; else INCOMPARABLE if nothing could be compared; else WARN if any case
is not PASS; else PASS.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from mini_kv.errors import ConfigError, ExitCode, UserError
from mini_kv.model import sha256_file

BASELINE_SCHEMA_VERSION = 1
REGRESSION_SCHEMA_VERSION = 1
BASELINE_KIND = "mini_kv.baseline"

PASS, FAIL, WARN, INCOMPARABLE = "PASS", "FAIL", "WARN", "INCOMPARABLE"
UNCONFIRMED, MISSING = "UNCONFIRMED", "MISSING"  # case verdicts that count as WARN overall


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


def _compare_case(case_id: str, base: dict, cand: dict, confirm, th: Thresholds) -> dict:
    from mini_kv.judge import stats

    rec: dict = {"id": case_id, "verdict": PASS, "reasons": [], "first_batch": None, "confirmation": None}
    for key in ("method", "l2", "unit"):
        if key in base and base.get(key) != cand.get(key):
            rec.update(verdict=INCOMPARABLE)
            rec["reasons"].append(f"{case_id}: timed with {key}={cand.get(key)!r}, baseline used {base.get(key)!r}")
    if rec["verdict"] == INCOMPARABLE:
        return rec
    base_flat = _flat(_as_repeats(base["samples"]))
    cand_flat = _flat(_as_repeats(cand["candidate"]["samples"]))
    bs, cs = stats.summarize(base_flat), stats.summarize(cand_flat)
    p50_ratio, p95_ratio = cs["p50"] / bs["p50"], cs["p95"] / bs["p95"]
    rec.update(baseline={"p50": bs["p50"], "p95": bs["p95"], "n": bs["n"]},
               candidate={"p50": cs["p50"], "p95": cs["p95"], "n": cs["n"]},
               p50_ratio=p50_ratio, p95_ratio=p95_ratio)
    reasons = rec["reasons"]
    if p50_ratio > 1 + th.p50_threshold:
        first = stats.is_slower(base_flat, cand_flat, th.p50_threshold, th.alpha, th.n_boot, th.seed)
        rec["first_batch"] = first
        what = (f"{case_id}: P50 {cs['p50']:.4g} us vs baseline {bs['p50']:.4g} us ({_pct(p50_ratio)}, "
                f"p={first['p_value']:.2g}{', significant' if first['significant'] else ', not significant'})")
        if confirm is None:
            rec["verdict"] = UNCONFIRMED
            reasons.append(what + "; no confirmation batch was run, so this is a warning, not a failure")
        else:
            try:
                again = _as_repeats(confirm(case_id))
                second = stats.is_slower(base_flat, _flat(again), th.p50_threshold, th.alpha, th.n_boot,
                                         th.seed + 2)
            except Exception as exc:  # noqa: BLE001 - a failed re-run must not turn into a verdict
                rec["verdict"] = WARN
                reasons.append(what + f"; the confirmation batch failed ({type(exc).__name__}: {exc})")
            else:
                rec["confirmation"] = {"samples": again, "summary": stats.summarize_repeats(again), "test": second}
                if first["slower"] and second["slower"]:
                    rec["verdict"] = FAIL
                    reasons.append(what + f"; confirmed by an independent batch ({_pct(second['ratio'])}, "
                                   f"p={second['p_value']:.2g})")
                else:
                    rec["verdict"] = WARN
                    why = [f"{name} batch {_pct(t['ratio'])}, "
                           + ("significant" if t["significant"] else "not significant")
                           for name, t in (("first", first), ("confirmation", second))]
                    reasons.append(what + "; not confirmed (" + "; ".join(why) + ")")
    if p95_ratio > 1 + th.p95_threshold:
        reasons.append(f"{case_id}: P95 {cs['p95']:.4g} us vs baseline {bs['p95']:.4g} us ({_pct(p95_ratio)}, "
                       f"warning above {th.p95_threshold:.0%})")
        if rec["verdict"] == PASS:
            rec["verdict"] = WARN
    if rec["verdict"] == PASS and (cand.get("stability") or {}).get("stable") is False:
        rec["verdict"] = WARN
        reasons.append(f"{case_id}: measurement unstable, a PASS would not mean much")
    return rec


def compare_to_baseline(baseline: dict, attempt_header: dict, benchmark_json: dict,
                        confirm: Callable[[str], list] | None = None,
                        thresholds: Thresholds | dict | None = None) -> dict:
    """The regression verdict of one attempt against a baseline (both already validated).

    `attempt_header` needs task_id, task_version, operator.version, suite_hash, environment_key, device;
    `benchmark_json` is an attempt's benchmark.json (only `cases` is read). `confirm(case_id)` runs an
    independent batch and returns its raw samples (a list of repeats, or one flat list).
    """
    th = Thresholds.of(thresholds)
    keys = []
    for name, get in COMPARABLE_KEYS:
        b, a = get(baseline), get(attempt_header)
        keys.append({"key": name, "baseline": b, "attempt": a, "match": b is not None and b == a})
    out: dict = {
        "schema_version": REGRESSION_SCHEMA_VERSION,
        "verdict": INCOMPARABLE,
        "reasons": [],
        "thresholds": dataclasses.asdict(th),
        "keys": keys,
        "baseline": {"task_id": baseline.get("task_id"), **(baseline.get("source") or {})},
        "cases": [],
    }
    mismatched = [k for k in keys if not k["match"]]
    if mismatched:
        out["reasons"] = [f"{k['key']} differs: attempt {k['attempt']!r}, baseline {k['baseline']!r}"
                          for k in mismatched]
        out["reasons"].append("not comparable with this baseline; promote a baseline measured under the same "
                              "task, suite and environment")
        return out
    measured = {c.get("id"): c for c in benchmark_json.get("cases", []) if isinstance(c, dict)}
    for base in baseline["cases"]:
        cand = measured.get(base["id"])
        if cand is None or "candidate" not in cand:
            why = "not measured in this attempt" if cand is None else f"benchmark failed ({cand.get('status')})"
            out["cases"].append({"id": base["id"], "verdict": MISSING, "reasons": [f"{base['id']}: {why}"],
                                 "first_batch": None, "confirmation": None})
            continue
        try:
            out["cases"].append(_compare_case(base["id"], base, cand, confirm, th))
        except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:  # malformed samples: not judged
            out["cases"].append({"id": base["id"], "verdict": INCOMPARABLE, "first_batch": None,
                                 "confirmation": None,
                                 "reasons": [f"{base['id']}: samples cannot be compared ({type(exc).__name__}: {exc})"]})
    verdicts = [c["verdict"] for c in out["cases"]]
    out["reasons"] = [r for c in out["cases"] for r in c["reasons"]]
    if FAIL in verdicts:
        out["verdict"] = FAIL
    elif not any(v not in (INCOMPARABLE, MISSING) for v in verdicts):
        out["verdict"] = INCOMPARABLE
        out["reasons"].append("no bench case could be compared with the baseline")
    elif any(v != PASS for v in verdicts):
        out["verdict"] = WARN
    else:
        out["verdict"] = PASS
    return out


def exit_code_for(verdict: dict | None) -> ExitCode:
    """REGRESSION for a FAIL, CONFIG when the declared baseline could not be used, else OK."""
    if not verdict:
        return ExitCode.OK
    if verdict.get("verdict") == FAIL:
        return ExitCode.REGRESSION
    if verdict.get("baseline_error"):
        return ExitCode.CONFIG
    return ExitCode.OK


# ---------------------------------------------------------------------------------------------- baselines

def load_baseline(path: Path) -> dict:
    """A baseline file, schema-checked; ConfigError (naming file and field) otherwise."""
    from mini_kv.load.schema import validate

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), "", "baseline file does not exist; create it with "
                          "`mini-kv promote-baseline --attempt <attempt dir>`") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(str(path), "", f"unreadable baseline ({exc}); promote it again with "
                          "`mini-kv promote-baseline --force`") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "(top level)", "a baseline is a JSON object")
    version = data.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise ConfigError(str(path), "schema_version",
                          f"unsupported baseline schema_version {version!r}; this mini_kv reads version "
                          f"{BASELINE_SCHEMA_VERSION}. Use the mini_kv version that wrote it, or promote a new "
                          "baseline with this one (`mini-kv promote-baseline --attempt <dir> --force`)")
    validate(data, "baseline", str(path))
    return data


def promote_baseline(attempt_dir: Path, output: Path, force: bool = False) -> dict:
    """Write a baseline from one attempt; refuses unless it is complete, PASSED, stable and benchmarked."""
    from mini_kv.load.schema import validate
    from mini_kv.store.atomic import write_json
    from mini_kv.store.attempts import AttemptInvalid, read_attempt

    attempt_dir, output = Path(attempt_dir), Path(output)
    where = f"cannot promote {attempt_dir}"
    try:
        header = read_attempt(attempt_dir)
    except AttemptInvalid as exc:
        raise UserError(f"{where}: {exc}") from None
    if header.get("status") != "PASSED":
        raise UserError(f"{where}: its status is {header.get('status')}; only a PASSED (fully correct) attempt "
                        "can become a baseline")
    bsum = header.get("benchmark") or {}
    listed = {f["path"] for f in header.get("files", [])}
    if not bsum.get("ran") or "benchmark.json" not in listed:
        raise UserError(f"{where}: it has no benchmark data (it ran with --skip-benchmark?); verify it again "
                        "with the benchmark")
    if bsum.get("stable") is not True:
        raise UserError(f"{where}: its benchmark was not stable (stable={bsum.get('stable')}); a baseline must be "
                        "reproducible: verify again on a quiet machine and promote a stable attempt")
    for rel in ("benchmark.json", "environment.json"):
        if rel not in listed:
            raise UserError(f"{where}: {rel} is missing from the attempt")
    try:
        bench = json.loads((attempt_dir / "benchmark.json").read_text())
        env = json.loads((attempt_dir / "environment.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{where}: unreadable attempt file ({exc})") from None
    for name, obj in (("benchmark.json", bench), ("environment.json", env)):
        if not isinstance(obj, dict) or obj.get("schema_version") != 1:
            raise UserError(f"{where}: {name} has schema_version {(obj or {}).get('schema_version')!r}, not 1; it "
                            "was written by another mini_kv version: promote it with that version")
    if env.get("key") != header.get("environment_key"):
        raise UserError(f"{where}: environment.json key {env.get('key')!r} differs from attempt.json "
                        f"environment_key {header.get('environment_key')!r}")
    cases = []
    for c in bench.get("cases", []):
        if "candidate" not in c:
            raise UserError(f"{where}: bench case {c.get('id')} has no timings ({c.get('status')})")
        if not (c.get("stability") or {}).get("stable"):
            raise UserError(f"{where}: bench case {c.get('id')} was not stable")
        cases.append({"id": c["id"], "dtype": c.get("dtype"), "params": c.get("params", {}),
                      "method": c.get("method"), "l2": c.get("l2"), "unit": c.get("unit", "us"),
                      "samples": c["candidate"]["samples"], "summary": c["candidate"]["summary"],
                      "stability": c.get("stability")})
    if not cases:
        raise UserError(f"{where}: its benchmark has no cases")
    baseline = {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "kind": BASELINE_KIND,
        "task_id": header["task_id"], "task_version": header["task_version"],
        "operator": {"name": header["operator"]["name"], "version": header["operator"]["version"]},
        "suite_hash": header["suite_hash"], "environment_key": header["environment_key"],
        "device": header.get("device"),
        "environment": env,
        "source": {"attempt_id": header["attempt_id"],
                   "attempt_json_sha256": sha256_file(attempt_dir / "attempt.json"),
                   "candidate": header["candidate"], "created_at": header["created_at"],
                   "path": str(attempt_dir.resolve())},
        "promoted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cases": cases,
    }
    validate(baseline, "baseline", str(output))
    if any(not math.isfinite(x) for c in cases for rep in c["samples"] for x in rep):
        raise UserError(f"{where}: non-finite timing samples")
    if output.exists() and not force:
        raise UserError(f"{output} already exists; baselines never change by themselves: pass --force to "
                        "replace it with this attempt")
    write_json(output, baseline)
    return baseline


def check_card_baseline(card, env: dict, bench_cases: list[dict], device: str,
                        confirm: Callable[[str], list] | None = None,
                        thresholds: Thresholds | dict | None = None) -> dict | None:
    """The pipeline's hook: the verdict against the card's baseline, or None when it declares none or the
    file does not exist yet. A baseline that cannot be used gives INCOMPARABLE with `baseline_error` set."""
    if not card.baseline:
        return None
    path = Path(card.project_root) / card.baseline
    if not path.exists():
        return None
    header = {"task_id": card.id, "task_version": card.version,
              "operator": {"name": card.operator.get("name"), "version": card.operator.get("version")},
              "suite_hash": card.suite_hash(), "environment_key": env.get("key"), "device": device}
    ref = {"path": card.baseline}
    try:
        ref["sha256"] = sha256_file(path)
        baseline = load_baseline(path)
    except (UserError, OSError) as exc:
        return {"schema_version": REGRESSION_SCHEMA_VERSION, "verdict": INCOMPARABLE, "reasons": [str(exc)],
                "baseline_error": str(exc), "baseline_file": ref, "thresholds": dataclasses.asdict(Thresholds.of(thresholds)),
                "keys": [], "baseline": {}, "cases": []}
    verdict = compare_to_baseline(baseline, header, {"cases": bench_cases}, confirm, thresholds)
    verdict["baseline_file"] = ref
    return verdict
