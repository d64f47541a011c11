"""Baselines on disk: promoted by hand from one complete, PASSED, stable attempt (baselines/<task>.json),
read back schema-checked with their hash manifest, and the attempt they came from checked against it;
`check_baseline` hands a usable one to the regression verdict (judge.regression.judge)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable
from pathlib import Path

from mini_kv.codec import to_json
from mini_kv.errors import BaselineTampered, ConfigError, UserError
from mini_kv.judge import regression
from mini_kv.judge.regression import Thresholds, timed
from mini_kv.model import canonical_json, sha256_file, sha256_text
from mini_kv.status import Status, Verdict
from mini_kv.store.atomic import write_json
from mini_kv.store.attempts import AttemptInvalid
from mini_kv.store.index import CheckedAttempt, check_attempt
from mini_kv.store.jsonfile import RecordUnusable, read_versioned

# 2: the baseline carries a hash manifest (a version 1 file has none and cannot be checked)
BASELINE_SCHEMA_VERSION = 2
BASELINE_KIND = "mini_kv.baseline"


@dataclasses.dataclass(frozen=True)
class BaselineSource:
    """The attempt a baseline was promoted from: attempt.json's SHA-256 vouches for every file of it."""

    attempt_id: str
    attempt_json_sha256: str
    candidate: str
    created_at: str
    path: str


@dataclasses.dataclass(frozen=True)
class BaselineManifest:
    """The source attempt's file list, and the SHA-256 of the baseline's content (`content_sha256`)."""

    algorithm: str
    attempt_files: list
    content_sha256: str


@dataclasses.dataclass(frozen=True)
class Baseline:
    """baselines/<task>.json (schemas/baseline.schema.json): the identity keys an attempt must match, the
    source attempt's environment, its stable bench cases' samples, and the hash manifest."""

    task_id: str
    task_version: str
    operator: dict  # name, version
    suite_hash: str
    environment_key: str
    device: str | None
    environment: dict
    source: BaselineSource
    promoted_at: str
    cases: list
    manifest: BaselineManifest
    schema_version: int = BASELINE_SCHEMA_VERSION
    kind: str = BASELINE_KIND


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
    same-run timing of the baseline's own code (judge.regression.judge)."""
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


def promote_baseline(attempt_dir: Path, output: Path, force: bool = False) -> Baseline:
    """Write a baseline from one attempt (a task card's or a SOL-ExecBench one); refuses unless it is
    complete, PASSED, stable and benchmarked."""
    from mini_kv.load.schema import validate

    attempt_dir, output = Path(attempt_dir), Path(output)
    where = f"cannot promote {attempt_dir}"
    header, bench, env = _promotable(attempt_dir, where)
    source = BaselineSource(
        header["attempt_id"],
        sha256_file(attempt_dir / "attempt.json"),
        header["candidate"],
        header["created_at"],
        str(attempt_dir.resolve()),
    )
    draft = Baseline(
        header["task_id"],
        header["task_version"],
        {"name": header["operator"]["name"], "version": header["operator"]["version"]},
        header["suite_hash"],
        header["environment_key"],
        header.get("device"),
        env,
        source,
        dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        _baseline_cases(bench, where),
        BaselineManifest("sha256", header["files"], ""),  # content_sha256 hashes all but itself
    )
    manifest = dataclasses.replace(draft.manifest, content_sha256=content_sha256(to_json(draft)))
    baseline = dataclasses.replace(draft, manifest=manifest)
    validate(to_json(baseline), "baseline", str(output))
    if output.exists() and not force:
        raise UserError(
            f"{output} already exists; baselines never change by themselves: pass --force to "
            "replace it with this attempt"
        )
    write_json(output, baseline)
    return baseline


def check_baseline(
    path: Path,
    found_by: str,
    root: Path,
    header: dict,
    bench_cases: list[dict],
    confirm_with: Callable[[dict, str], regression.Retimed] | None = None,
    thresholds: Thresholds | None = None,
    artifacts: Path | None = None,
) -> regression.RegressionVerdict:
    """The verdict of an attempt (`header`: the ids judge.regression.judge reads; its bench cases) against
    the baseline file at `path`. A baseline that cannot be used gives INCOMPARABLE with `baseline_error`
    set; a forged or damaged one (or a source attempt that changed since) gives TAMPERED.

    `confirm_with(baseline, case_id)` runs the same-run comparison (judge.regression.judge);
    `artifacts` is the store where the baseline's source attempt may lie."""
    ref = {"path": str(Path(path).relative_to(root)), "found_by": found_by}
    try:
        ref["sha256"] = sha256_file(path)
        baseline = load_baseline(path)
        _check_source_attempt(baseline, artifacts)
    except BaselineTampered as exc:
        verdict = regression.tampered_verdict(exc, thresholds)
    except (UserError, OSError) as exc:
        verdict = regression.unused_baseline(Verdict.INCOMPARABLE, str(exc), thresholds)
    else:
        confirm = None if confirm_with is None else (lambda case_id: confirm_with(baseline, case_id))
        verdict = regression.judge(baseline, header, {"cases": bench_cases}, confirm, thresholds)
    return dataclasses.replace(verdict, baseline_file=ref)


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
        f"the attempt the baseline was promoted from is not available (looked in {', '.join(tried)}); "
        "its sources are needed to time the baseline beside the candidate"
    )


def checked_source_attempt(attempt_dir: Path, baseline: dict) -> CheckedAttempt:
    """The attempt a baseline names, after checking it is that attempt (the SHA-256 of its
    attempt.json, which lists every source's SHA-256, and every check of the index); else TAMPERED."""
    recorded = (baseline.get("source") or {}).get("attempt_json_sha256")
    actual = sha256_file(attempt_dir / "attempt.json") if (attempt_dir / "attempt.json").is_file() else None
    if actual != recorded:
        raise BaselineTampered(
            str(attempt_dir / "attempt.json"),
            f"SHA-256 {actual} differs from the baseline's record {recorded}: the attempt "
            "the baseline was promoted from has changed since",
        )
    try:
        checked = check_attempt(attempt_dir)
    except AttemptInvalid as exc:
        raise BaselineTampered(str(attempt_dir), str(exc)) from None
    recorded_files = (baseline.get("manifest") or {}).get("attempt_files")
    if recorded_files is not None and checked.header["files"] != recorded_files:
        raise BaselineTampered(
            str(attempt_dir / "attempt.json"),
            "its file list differs from the one the baseline's manifest recorded at promotion",
        )
    return checked


def _check_source_attempt(baseline: dict, artifacts: Path | None) -> None:
    """Where the attempt a baseline came from is at hand, it must still be the one it recorded: else
    TAMPERED. Absent is fine here; only a suspected regression needs its sources."""
    try:
        checked_source_attempt(find_source_attempt(baseline, artifacts or Path("artifacts")), baseline)
    except BaselineBuildError:
        return
