"""Baselines (promotion, loading) and the regression verdict against them."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from test_index import ENV_KEY, SUITE, correctness_records, make_attempt, salt_of, synth_samples

from mini_kv.codec import from_json, to_json
from mini_kv.errors import ConfigError, ExitCode, UserError
from mini_kv.judge.regression import (
    RegressionVerdict,
    Retimed,
    Thresholds,
    exit_code_for,
    find_card_baseline,
    judge,
)
from mini_kv.load.schema import validate
from mini_kv.model import WorkerResults
from mini_kv.status import Verdict
from mini_kv.store.attempts import read_attempt
from mini_kv.store.baseline import check_baseline, load_baseline, promote_baseline

FAIL, INCOMPARABLE, PASS, UNCONFIRMED, WARN = (
    Verdict.FAIL,
    Verdict.INCOMPARABLE,
    Verdict.PASS,
    Verdict.UNCONFIRMED,
    Verdict.WARN,
)

REPO = Path(__file__).resolve().parents[1]


def compare_to_baseline(baseline, header, bench, confirm=None, thresholds=None) -> dict:
    """regression.json's content for one attempt judged against a baseline."""
    return to_json(judge(baseline, header, bench, confirm, thresholds))


def code_of(doc: dict) -> ExitCode:
    """The exit code of a verdict read back from regression.json's content."""
    return exit_code_for(from_json(RegressionVerdict, doc))


def check_card_baseline(
    card, env: dict, bench_cases: list[dict], device: str, confirm_with=None, thresholds=None, artifacts=None
):
    """The verdict against the card's baseline (find_card_baseline, then check_baseline), as verify's
    pipeline asks for it, or None when there is none."""
    path, found_by, _ = find_card_baseline(card)
    if path is None:
        return None
    header = {
        "task_id": card.id,
        "task_version": card.version,
        "operator": {"name": card.operator.get("name"), "version": card.operator.get("version")},
        "suite_hash": card.suite_hash(),
        "environment_key": env.get("key"),
        "device": device,
    }
    return to_json(
        check_baseline(
            path, found_by, Path(card.project_root), header, bench_cases, confirm_with, thresholds, artifacts
        )
    )


@pytest.fixture
def baseline(tmp_path) -> dict:
    src = make_attempt(
        tmp_path / "artifacts", candidate="v0", seed=1, speedups={"bench_a": 1.5, "bench_b": 2.0}
    )
    return to_json(promote_baseline(src, tmp_path / "baselines" / "vector_add.json"))


def _attempt(tmp_path, **kw) -> tuple[dict, dict]:
    kw.setdefault("speedups", {"bench_a": 1.5, "bench_b": 2.0})
    a = make_attempt(tmp_path / "artifacts", candidate="v1", **kw)
    return read_attempt(a), json.loads((a / "benchmark.json").read_text())


class Confirm:
    """A same-run comparison: records the calls, returns candidate samples around `p50` (or, call by
    call, the next of `p50s`) and the baseline's own build's samples around `base_p50`, as if timed
    interleaved in one worker; `tail`: the candidate's slowest 10 % at that many times its P50."""

    def __init__(self, p50: float, base_p50: float = 10.0, seed: int = 77, tail=None, p50s=()):
        self.p50, self.base_p50, self.seed, self.calls = p50, base_p50, seed, []
        self.tail, self.p50s = tail, list(p50s)

    def __call__(self, case_id: str):
        self.calls.append(case_id)
        k = self.seed + 2 * len(self.calls)
        p50 = self.p50s[(len(self.calls) - 1) % len(self.p50s)] if self.p50s else self.p50
        cand = synth_samples(p50, k)
        if self.tail:
            for rep in cand:
                rep[-10:] = [p50 * self.tail] * 10
        order = [["candidate", "reference"], ["reference", "candidate"]]
        return Retimed(cand, synth_samples(self.base_p50, k + 1), order)


def test_identical_distributions_pass(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2)
    confirm = Confirm(10.0)
    v = compare_to_baseline(baseline, header, bench, confirm)
    assert v["verdict"] == PASS, v["reasons"]
    assert [c["verdict"] for c in v["cases"]] == [PASS, PASS]
    assert confirm.calls == []  # nothing was slow enough to need a confirmation
    assert v["schema_version"] == 1 and all(k["match"] for k in v["keys"])
    assert code_of(v) == ExitCode.OK


def test_confirmed_significant_slowdown_fails(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    confirm = Confirm(12.0)
    v = compare_to_baseline(baseline, header, bench, confirm)
    assert v["verdict"] == FAIL
    assert confirm.calls == ["bench_a", "bench_a", "bench_b", "bench_b"]  # two same-run A/Bs each
    for case in v["cases"]:
        assert case["verdict"] == FAIL
        assert case["p50_ratio"] == pytest.approx(1.2, rel=0.02)
        assert case["first_batch"]["slower"] and case["confirmation"]["test"]["slower"]
        assert case["second_confirmation"]["test"]["slower"]
        # the verdict record keeps the confirmation batch's raw samples
        assert len(case["confirmation"]["samples"]) == 5 and len(case["confirmation"]["samples"][0]) == 100
        assert case["confirmation"]["summary"]["overall"]["p50"] == pytest.approx(12.0, rel=0.01)
    assert code_of(v) == ExitCode.REGRESSION
    json.dumps(v, allow_nan=False)  # the record is plain JSON


def test_report_prints_the_verdict_both_batches_and_the_reasons(tmp_path, baseline):
    from rich.console import Console

    from mini_kv.report import print_regression

    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    v = compare_to_baseline(baseline, header, bench, Confirm(12.0))
    v["baseline_file"] = {"path": "baselines/vector_add.json"}
    con = Console(record=True, width=200)
    print_regression(from_json(RegressionVerdict, v), con)
    text = con.export_text()
    assert "regression vs baselines/vector_add.json: FAIL" in text
    assert "+20." in text and "significant" in text and "P50 12.0" in text
    assert "confirmed twice" in text and "same run, interleaved" in text and "10.0" in text
    assert "Only the same run can FAIL" in text


def test_a_stored_slowdown_the_same_run_does_not_see_passes(tmp_path, baseline):
    """Finding 6 of issue 35: +20 % against the stored timings, -0 % in the same run: a PASS (the
    warning that fired on most unchanged runs taught users to ignore it)."""
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0))
    assert v["verdict"] == PASS
    assert {c["verdict"] for c in v["cases"]} == {PASS}
    assert all("not seen in the same run" in c["reasons"][0] for c in v["cases"])
    assert all(not c["confirmation"]["test"]["slower"] for c in v["cases"])
    assert all(c["second_confirmation"] is None for c in v["cases"])
    assert code_of(v) == ExitCode.OK


def test_a_slowdown_confirmed_once_but_not_twice_is_unconfirmed_never_fail(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    confirm = Confirm(0, p50s=[12.0, 10.0])
    v = compare_to_baseline(baseline, header, bench, confirm)
    assert v["verdict"] == UNCONFIRMED and code_of(v) == ExitCode.REGRESSION_UNCONFIRMED
    assert all("disagree" in c["reasons"][0] for c in v["cases"])


def test_a_same_run_slowdown_that_is_not_significant_is_unconfirmed(tmp_path, baseline):
    """Noise too high to decide: the A/B's P50 is beyond the threshold but the samples overlap."""
    import numpy as np

    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    rng = np.random.default_rng(5)

    def noisy(case_id):
        return {
            "candidate": [list(11.0 * rng.lognormal(0, 0.6, 15))],
            "baseline": [list(10.0 * rng.lognormal(0, 0.6, 15))],
        }

    v = compare_to_baseline(baseline, header, bench, noisy)
    assert {c["verdict"] for c in v["cases"]} <= {UNCONFIRMED, PASS} and v["verdict"] == UNCONFIRMED
    assert any("too noisy to decide" in c["reasons"][0] for c in v["cases"])


def test_unconfirmed_has_its_own_line_and_exit_code(tmp_path, baseline):
    from rich.console import Console

    from mini_kv.report import print_regression

    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    v = compare_to_baseline(baseline, header, bench, None)
    con = Console(record=True, width=200)
    print_regression(from_json(RegressionVerdict, v), con)
    text = con.export_text()
    assert "UNCONFIRMED" in text and "exit 8" in text and "too noisy to decide" in text
    assert code_of(v) == ExitCode.REGRESSION_UNCONFIRMED == 8


def test_unchanged_code_on_a_loaded_machine_is_not_a_regression(tmp_path, baseline):
    """The stored baseline was timed on a quiet machine; today the machine is loaded, so the candidate
    (the same code) is 18 % slower than the stored samples, and so is the baseline's own build timed
    beside it. The same-run comparison shows no slowdown: WARN, exit 0, never FAIL."""
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.18)
    confirm = Confirm(11.8, base_p50=11.8)
    v = compare_to_baseline(baseline, header, bench, confirm)
    assert confirm.calls == ["bench_a", "bench_b"]  # the screen against stored samples did fire
    assert all(c["first_batch"]["slower"] for c in v["cases"])
    assert v["verdict"] == PASS and code_of(v) == ExitCode.OK
    for c in v["cases"]:
        conf = c["confirmation"]
        assert conf["test"]["ratio"] == pytest.approx(1.0, abs=0.01) and not conf["test"]["slower"]
        assert conf["baseline"]["summary"]["overall"]["p50"] == pytest.approx(11.8, rel=0.01)
        assert "the gap to the stored timings is the machine's, not the code's" in c["reasons"][0]


def test_same_run_slowdown_fails_even_when_both_are_slower_than_stored(tmp_path, baseline):
    """Loaded machine and a real 20 % regression: the baseline's build at 11.8, the candidate at 14.2."""
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.42)
    v = compare_to_baseline(baseline, header, bench, Confirm(14.16, base_p50=11.8))
    assert v["verdict"] == FAIL and code_of(v) == ExitCode.REGRESSION
    assert all(c["confirmation"]["test"]["ratio"] == pytest.approx(1.2, rel=0.02) for c in v["cases"])


def test_a_confirmation_without_the_baselines_own_timings_is_not_evidence(tmp_path, baseline):
    """Re-timing the candidate alone against the stored samples is what failed unchanged code; a
    confirm that returns no baseline timings cannot make a FAIL."""
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    v = compare_to_baseline(baseline, header, bench, lambda case_id: Retimed(synth_samples(12.0, 5), []))
    assert v["verdict"] == UNCONFIRMED and code_of(v) == ExitCode.REGRESSION_UNCONFIRMED
    assert all("could not run" in c["reasons"][0] for c in v["cases"])


def test_without_a_confirm_callable_a_slowdown_is_unconfirmed_never_fail(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    v = compare_to_baseline(baseline, header, bench, None)
    assert v["verdict"] == UNCONFIRMED
    assert {c["verdict"] for c in v["cases"]} == {UNCONFIRMED}
    assert all(c["first_batch"]["slower"] and c["confirmation"] is None for c in v["cases"])


def test_a_failing_confirmation_run_is_unconfirmed(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)

    def broken(case_id):
        raise RuntimeError("worker died")

    v = compare_to_baseline(baseline, header, bench, broken)
    assert v["verdict"] == UNCONFIRMED and "worker died" in v["reasons"][0]


def _heavier_tail(bench: dict) -> None:
    for case in bench["cases"]:
        for rep in case["candidate"]["samples"]:
            rep[-10:] = [15.0] * 10  # 10 % of the samples 50 % slower: P95 moves, P50 does not


def test_heavier_tail_warns_only_where_the_same_run_agrees(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2)
    _heavier_tail(bench)
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0, tail=1.5))
    assert v["verdict"] == WARN and code_of(v) == ExitCode.OK
    assert all(c["verdict"] == WARN and "P95" in c["reasons"][0] for c in v["cases"])
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0))  # the same run: no heavier tail
    assert v["verdict"] == PASS


def test_thresholds_are_configurable(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.2)
    loose = Thresholds(p50_threshold=0.25, p95_threshold=0.3)
    assert compare_to_baseline(baseline, header, bench, Confirm(12.0), loose)["verdict"] == PASS
    assert (
        compare_to_baseline(
            baseline, header, bench, Confirm(12.0), Thresholds(p50_threshold=0.25, p95_threshold=0.3)
        )["thresholds"]["p50_threshold"]
        == 0.25
    )


@pytest.mark.parametrize(
    "field, change",
    [
        ("task_id", {"task_id": "other_task"}),
        ("task_version", {"task_version": "2.0.0"}),
        ("operator_version", {"operator": {"name": "vector_add", "version": "1.1.0"}}),
        ("suite_hash", {"suite_hash": "b" * 64}),
        ("environment_key", {"environment_key": "another-gpu"}),
        ("device", {"device": "cuda:0"}),
    ],
)
def test_each_mismatched_key_is_incomparable(tmp_path, baseline, field, change):
    header, bench = _attempt(tmp_path, seed=2, slowdown=1.5)  # even a big slowdown is not judged
    header.update(change)
    confirm = Confirm(15.0)
    v = compare_to_baseline(baseline, header, bench, confirm)
    assert v["verdict"] == INCOMPARABLE
    assert [k["key"] for k in v["keys"] if not k["match"]] == [field]
    assert v["reasons"][0].startswith(f"{field} differs")
    assert confirm.calls == [] and v["cases"] == []
    assert code_of(v) == ExitCode.OK


def test_missing_cases_and_other_timing_method(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2, speedups={"bench_a": 1.5})  # bench_b not measured
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0))
    assert v["verdict"] == INCOMPARABLE  # the gate did not see the whole suite
    assert {c["id"]: c["verdict"] for c in v["cases"]} == {"bench_a": PASS, "bench_b": "MISSING"}
    bench["cases"][0]["method"] = "events"
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0))
    assert v["verdict"] == INCOMPARABLE  # nothing left to compare
    assert any("method='events'" in r for r in v["reasons"])


def test_malformed_samples_are_not_judged_and_do_not_raise(tmp_path, baseline):
    header, bench = _attempt(tmp_path, seed=2)
    bench["cases"][0]["candidate"]["samples"] = [[float("nan")]]
    bench["cases"][1]["candidate"]["samples"] = []
    v = compare_to_baseline(baseline, header, bench, Confirm(10.0))
    assert v["verdict"] == INCOMPARABLE
    assert all("cannot be compared" in c["reasons"][0] for c in v["cases"])


# ------------------------------------------------------------------------------------------ baselines


def test_promoted_baseline_content(tmp_path):
    src = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    out = tmp_path / "baselines" / "vector_add.json"
    base = to_json(promote_baseline(src, out))
    on_disk = json.loads(out.read_text())
    assert on_disk == base
    validate(on_disk, "baseline", str(out))
    assert base["schema_version"] == 2 and base["task_id"] == "vector_add" and base["task_version"] == "1.0.0"
    assert base["operator"]["version"] == "1.0.0" and base["suite_hash"] == SUITE
    assert base["environment_key"] == ENV_KEY == base["environment"]["key"]
    import hashlib

    assert base["source"]["attempt_id"] == src.name
    assert (
        base["source"]["attempt_json_sha256"]
        == hashlib.sha256((src / "attempt.json").read_bytes()).hexdigest()
    )
    bench = json.loads((src / "benchmark.json").read_text())
    assert base["cases"][0]["samples"] == bench["cases"][0]["candidate"]["samples"]
    assert base["cases"][0]["summary"] == bench["cases"][0]["candidate"]["summary"]
    assert load_baseline(out) == base


def test_promotion_refuses_to_overwrite_unless_forced(tmp_path):
    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    b = make_attempt(tmp_path / "artifacts", candidate="v1", seed=2)
    out = tmp_path / "b.json"
    promote_baseline(a, out)
    before = out.read_bytes()
    with pytest.raises(UserError, match="--force"):
        promote_baseline(b, out)
    assert out.read_bytes() == before  # baselines never change by themselves
    assert promote_baseline(b, out, force=True).source.attempt_id == b.name


@pytest.mark.parametrize(
    "kw, damage, message",
    [
        ({"status": "INCORRECT"}, None, "status is INCORRECT"),
        ({"stable": False}, None, "not stable"),
        ({"bench": False, "stable": None}, None, "no benchmark data"),
        ({}, "tamper", "SHA-256"),
        ({}, "partial", "still .partial"),
    ],
)
def test_promotion_refuses_unfit_attempts(tmp_path, kw, damage, message):
    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1, **kw)
    if damage == "tamper":
        (a / "benchmark.json").write_text("{}")
    elif damage == "partial":
        a = a.rename(a.with_name(a.name + ".partial"))
    with pytest.raises(UserError, match=message):
        promote_baseline(a, tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists()


def test_future_baseline_version_is_refused_with_what_to_do(tmp_path, baseline):
    path = tmp_path / "future.json"
    path.write_text(json.dumps({**baseline, "schema_version": 3}))
    with pytest.raises(ConfigError) as exc:
        load_baseline(path)
    msg = str(exc.value)
    assert "schema_version" in msg and "reads version 2" in msg and "promote-baseline" in msg


def test_malformed_baseline_names_the_field(tmp_path, baseline):
    path = tmp_path / "bad.json"
    bad = json.loads(json.dumps(baseline))
    bad["cases"][0]["samples"] = [[1.0, -2.0]]
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=r"cases\[0\]\.samples\[0\]\[1\]"):
        load_baseline(path)


# ------------------------------------------------------------------------------ the pipeline's hook


def _card(tmp_path, baseline_rel):
    return types.SimpleNamespace(
        project_root=str(tmp_path),
        baseline=baseline_rel,
        id="vector_add",
        version="1.0.0",
        operator={"name": "vector_add", "version": "1.0.0"},
        suite_hash=lambda: SUITE,
    )


def test_card_hook(tmp_path, baseline):
    _, bench = _attempt(tmp_path, seed=2)
    env = {"key": ENV_KEY}
    assert check_card_baseline(_card(tmp_path, "baselines/none_yet.json"), env, bench["cases"], "cpu") is None
    v = check_card_baseline(_card(tmp_path, "baselines/vector_add.json"), env, bench["cases"], "cpu")
    assert v["verdict"] == PASS and v["baseline_file"]["path"] == "baselines/vector_add.json"
    (tmp_path / "baselines" / "broken.json").write_text("{")
    v = check_card_baseline(_card(tmp_path, "baselines/broken.json"), env, bench["cases"], "cpu")
    assert v["verdict"] == INCOMPARABLE and "unreadable baseline" in v["baseline_error"]
    assert code_of(v) == ExitCode.CONFIG


def test_baseline_found_by_convention_and_unused_ones_are_named(tmp_path, baseline):
    """promote-baseline writes baselines/<task>.json when the card names none; verify used to skip it
    silently. Now it is used (found by convention), and a baseline that exists but is not used is named."""
    from mini_kv.judge.regression import find_card_baseline

    _, bench = _attempt(tmp_path, seed=2)
    env = {"key": ENV_KEY}
    v = check_card_baseline(_card(tmp_path, None), env, bench["cases"], "cpu")
    assert v is not None and v["verdict"] == PASS
    assert v["baseline_file"] == {
        "path": "baselines/vector_add.json",
        "found_by": "convention",
        "sha256": v["baseline_file"]["sha256"],
    }
    path, how, notes = find_card_baseline(_card(tmp_path, "baselines/other.json"))
    assert path is None and how is None
    assert "baselines/other.json, which does not exist" in notes[0]
    assert "baselines/vector_add.json exists but is not used" in notes[1]
    (tmp_path / "baselines" / "other.json").write_text("{}")
    path, how, notes = find_card_baseline(_card(tmp_path, "baselines/other.json"))
    assert how == "card" and notes == [
        "baselines/vector_add.json exists but is not used: the card's `baseline:` names baselines/other.json"
    ]
    (tmp_path / "baselines" / "vector_add.json").unlink()
    assert find_card_baseline(_card(tmp_path, None)) == (None, None, [])


def test_verify_prints_baseline_notes_and_the_convention(tmp_path, baseline):
    from rich.console import Console

    from mini_kv.report import print_regression

    _, bench = _attempt(tmp_path, seed=2)
    v = check_card_baseline(_card(tmp_path, None), {"key": ENV_KEY}, bench["cases"], "cpu")
    con = Console(record=True, width=200)
    print_regression(from_json(RegressionVerdict, v), con)
    assert "regression vs baselines/vector_add.json (found by convention" in con.export_text()


def test_write_attempt_stores_the_verdict_and_the_index_shows_it(tmp_path, baseline):
    """pipeline._write_attempt writes regression.json inside the sealed attempt."""
    from mini_kv.compile.compiler import CompileRecord
    from mini_kv.environment import collect
    from mini_kv.jail import resolve as resolve_sandbox
    from mini_kv.load.task_card import load_task_card
    from mini_kv.pipeline import Built, CardDoor, Outcome, Prepared, VerifyOptions, _write_attempt
    from mini_kv.store.headline import card_headline
    from mini_kv.store.index import read_index, update_index

    card = load_task_card(REPO / "tasks" / "vector_add.yaml")
    cand = card.candidate(card.default_candidate)
    _, bench = _attempt(tmp_path, seed=2)
    verdict = compare_to_baseline(baseline, {**baseline, "device": "cpu"}, bench, None)
    corr = correctness_records("PASSED", "cpu", salt_of(2))
    results = WorkerResults(
        **{k: corr[k] for k in ("load", "cases", "contract", "incidents")}, bench=bench["cases"]
    )
    head = card_headline("ok", results, bench["cases"], False, "cpu")  # what verify() computes
    summary = {
        "status": head.status,
        "exit_code": 0,
        "device": "cpu",
        "correctness": to_json(head.correctness),
        "benchmark": head.benchmark,
        "compile": {},
        "duration_s": 0.0,
        "regression": {"verdict": verdict["verdict"], "reasons": []},
    }
    store = tmp_path / "store"
    prep = Prepared(
        "cpu",
        collect(tag="cpu-env-0001"),
        salt_of(2),
        resolve_sandbox("off"),
        {},
        1.0,
        1.0,
        Path(card.project_root),
        store,
    )
    out = Outcome(head.status, 0, head.correctness, head.benchmark, results, bench["cases"])
    a = _write_attempt(
        CardDoor(card, cand, VerifyOptions()),
        prep,
        Built(CompileRecord(status="ok")),
        out,
        summary,
        verdict,
        store,
    )
    header = read_attempt(a)
    assert "regression.json" in {f["path"] for f in header["files"]}
    assert json.loads((a / "regression.json").read_text()) == verdict
    update_index(store, a)
    rows, _ = read_index(store)
    assert rows[0].regression == verdict["verdict"] == PASS


def test_every_kind_of_verdict_meets_the_regression_schema(tmp_path, baseline):
    """regression.json is a contract: PASS, confirmed FAIL, WARN, UNCONFIRMED, INCOMPARABLE and a
    baseline that cannot be read all validate against schemas/regression.schema.json."""
    verdicts = []
    for kw, confirm in (
        ({"seed": 2}, Confirm(10.0)),
        ({"seed": 3, "slowdown": 1.2}, Confirm(12.0)),
        ({"seed": 4, "slowdown": 1.2}, Confirm(10.0)),
        ({"seed": 5, "slowdown": 1.2}, None),
    ):
        header, bench = _attempt(tmp_path / str(kw["seed"]), **kw)
        verdicts.append(compare_to_baseline(baseline, header, bench, confirm))
    header, bench = _attempt(tmp_path / "6", seed=6)
    verdicts.append(compare_to_baseline(baseline, {**header, "environment_key": "other"}, bench, None))
    header, bench = _attempt(tmp_path / "7", seed=7)
    _heavier_tail(bench)
    verdicts.append(compare_to_baseline(baseline, header, bench, Confirm(10.0, tail=1.5)))
    assert [v["verdict"] for v in verdicts] == [PASS, FAIL, PASS, UNCONFIRMED, INCOMPARABLE, WARN]
    for v in verdicts:
        validate(json.loads(json.dumps(v)), "regression", "regression.json")
    bad = tmp_path / "card"
    (bad / "baselines").mkdir(parents=True)
    (bad / "baselines" / "vector_add.json").write_text("{")
    card = types.SimpleNamespace(
        baseline="baselines/vector_add.json",
        project_root=str(bad),
        id="vector_add",
        version="1.0.0",
        operator={"name": "vector_add", "version": "1.0.0"},
        suite_hash=lambda: "x",
    )
    v = check_card_baseline(card, {"key": "k"}, [], "cpu")
    assert v["verdict"] == INCOMPARABLE and v["baseline_error"]
    validate(v, "regression", "regression.json")


# ------------------------------------------------------------------------------ tamper evidence


def test_baseline_carries_a_hash_manifest_of_itself_and_its_attempt(tmp_path):
    from mini_kv.store.baseline import content_sha256

    src = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    base = to_json(promote_baseline(src, tmp_path / "b.json"))
    m = base["manifest"]
    assert m["algorithm"] == "sha256" and m["content_sha256"] == content_sha256(base)
    assert m["attempt_files"] == read_attempt(src)["files"]
    assert {f["path"] for f in m["attempt_files"]} >= {"benchmark.json", "environment.json"}


def _forge(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "what, edit",
    [
        (
            "samples",
            lambda d: [
                rep.__setitem__(slice(None), [x / 2 for x in rep]) for rep in d["cases"][0]["samples"]
            ],
        ),
        ("summary", lambda d: d["cases"][0]["summary"]["overall"].__setitem__("p50", 1.0)),
        ("environment key", lambda d: d.update(environment_key="forged")),
        ("attempt file list", lambda d: d["manifest"]["attempt_files"].pop()),
    ],
)
def test_an_edited_baseline_is_tampered_never_a_candidate_fail(tmp_path, baseline, what, edit):
    """Halving the stored samples made the unchanged candidate a 'confirmed' regression (exit 6)."""
    path = tmp_path / "baselines" / "vector_add.json"
    _forge(path, edit)
    _, bench = _attempt(tmp_path, seed=2)
    confirm_calls = []
    v = check_card_baseline(
        _card(tmp_path, "baselines/vector_add.json"),
        {"key": ENV_KEY},
        bench["cases"],
        "cpu",
        confirm_with=lambda b, c: confirm_calls.append(c),
    )
    assert v["verdict"] == "TAMPERED", v["reasons"]
    assert v["tampered_file"] == str(path) and str(path) in v["reasons"][0] and "TAMPERED" in v["reasons"][0]
    assert confirm_calls == [] and v["cases"] == []
    assert code_of(v) == ExitCode.CONFIG
    validate(json.loads(json.dumps(v)), "regression", "regression.json")
    # the attempt that carries this verdict is still a valid, indexable attempt
    a = make_attempt(
        tmp_path / "store",
        candidate="v1",
        seed=3,
        extra_files={"regression.json": {**v, "schema_version": 1}},
    )
    header = json.loads((a / "attempt.json").read_text())
    validate(
        {**header, "regression": {"verdict": v["verdict"], "reasons": v["reasons"]}},
        "attempt",
        "attempt.json",
    )


def test_a_changed_source_attempt_is_tampered(tmp_path, baseline):
    """The attempt a baseline was promoted from is part of its evidence: re-sealing it by hand
    (new attempt.json) is caught by the SHA-256 the baseline recorded."""
    src = Path(baseline["source"]["path"])
    header = json.loads((src / "attempt.json").read_text())
    header["created_at"] = "2001-01-01T00:00:00+00:00"
    (src / "attempt.json").write_text(json.dumps(header))
    _, bench = _attempt(tmp_path, seed=2)
    v = check_card_baseline(
        _card(tmp_path, "baselines/vector_add.json"), {"key": ENV_KEY}, bench["cases"], "cpu"
    )
    assert v["verdict"] == "TAMPERED" and v["tampered_file"] == str(src / "attempt.json")
    assert code_of(v) == ExitCode.CONFIG


def test_a_deeply_nested_baseline_is_a_clear_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ConfigError, match="nested too deeply") as exc:
        load_baseline(path)
    assert str(path) in str(exc.value) and exc.value.exit_code == ExitCode.CONFIG
    deep = {"schema_version": 2}
    node = deep
    for _ in range(900):  # parses, but deeper than anything a baseline holds
        node["x"] = {}
        node = node["x"]
    path.write_text(json.dumps(deep))
    with pytest.raises(ConfigError):
        load_baseline(path)


def test_a_deeply_nested_baseline_does_not_crash_verify(tmp_path):
    """verify's hook turns it into an unusable baseline (exit 2), not a traceback (exit 10)."""
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    v = check_card_baseline(_card(tmp_path, "baselines/deep.json"), {"key": ENV_KEY}, [], "cpu")
    assert v["verdict"] == INCOMPARABLE and "nested too deeply" in v["baseline_error"]
    assert code_of(v) == ExitCode.CONFIG


# ---------------------------------------------------------------- promote-baseline: store checks


def test_promotion_refuses_a_manifest_that_points_outside_the_attempt(tmp_path):
    """attempt.json listing ../../../../etc/hostname (with its true hash) must not be read and vouched for."""
    import hashlib

    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    target = Path("/etc/hostname")
    if not target.is_file():
        target = tmp_path / "outside.txt"
        target.write_text("outside")
    rel = "../" * len(a.resolve().parts) + str(target.resolve()).lstrip("/")
    header = json.loads((a / "attempt.json").read_text())
    header["files"].append(
        {
            "path": rel,
            "sha256": hashlib.sha256(target.read_bytes()).hexdigest(),
            "size": target.stat().st_size,
        }
    )
    (a / "attempt.json").write_text(json.dumps(header))
    with pytest.raises(UserError, match="files") as exc:
        promote_baseline(a, tmp_path / "b.json")
    assert str(a) in str(exc.value)
    assert not (tmp_path / "b.json").exists()


def test_promotion_refuses_a_file_listed_through_a_link_out_of_the_attempt(tmp_path):
    import hashlib

    from mini_kv.store.attempts import AttemptInvalid

    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any attempt")
    (a / "logs" / "link").symlink_to(secret)
    header = json.loads((a / "attempt.json").read_text())
    header["files"].append(
        {
            "path": "logs/link",
            "sha256": hashlib.sha256(secret.read_bytes()).hexdigest(),
            "size": secret.stat().st_size,
        }
    )
    (a / "attempt.json").write_text(json.dumps(header))
    with pytest.raises(AttemptInvalid, match="is a symbolic link"):
        read_attempt(a)
    with pytest.raises(UserError, match="is a symbolic link"):
        promote_baseline(a, tmp_path / "b.json")


@pytest.mark.parametrize("move", ["rename", "other_task"])
def test_promotion_refuses_a_moved_attempt_as_rebuild_index_does(tmp_path, move):
    from mini_kv.store.index import rebuild_index

    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    if move == "rename":
        moved = a.rename(a.with_name("20990101T000000000000Z-v0-abcdef"))
    else:
        (tmp_path / "artifacts" / "other_task").mkdir()
        moved = a.rename(tmp_path / "artifacts" / "other_task" / a.name)
    assert rebuild_index(tmp_path / "artifacts").attempts == 0  # the index refuses it ...
    with pytest.raises(UserError, match="attempt_id|belongs to task"):  # ... and so does promotion
        promote_baseline(moved, tmp_path / "b.json")
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize(
    "card_baseline, output, used",
    [
        (None, "baselines/vector_add.json", True),  # promote-baseline's default: found by convention
        (None, "elsewhere/b.json", False),
        ("gate/vector_add.json", "gate/vector_add.json", True),
        ("gate/vector_add.json", "baselines/vector_add.json", False),
    ],
)
def test_promote_baseline_says_whether_verify_will_use_it(
    tmp_path, monkeypatch, capsys, card_baseline, output, used
):
    import yaml

    from mini_kv.cli import main

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "tasks").mkdir()
    card = {"id": "vector_add", **({"baseline": card_baseline} if card_baseline else {})}
    (tmp_path / "tasks" / "vector_add.yaml").write_text(yaml.safe_dump(card))
    a = make_attempt(tmp_path / "artifacts", candidate="v0", seed=1)
    monkeypatch.chdir(tmp_path)
    assert main(["promote-baseline", "--attempt", str(a), "--output", output]) == 0
    text = " ".join(capsys.readouterr().out.split())
    if used:
        assert "`mini-kv verify --task tasks/vector_add.yaml` will use it" in text
    else:
        assert "will NOT use this file" in text and "note:" in text


def test_a_conventional_baseline_linked_out_of_the_project_is_not_used(tmp_path, baseline):
    from mini_kv.judge.regression import find_card_baseline

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "baselines").symlink_to(tmp_path / "baselines")
    path, how, notes = find_card_baseline(_card(proj, None))
    assert path is None and "outside the project root" in notes[0]


def test_an_attempt_never_holds_a_regression_json_that_breaks_its_schema(tmp_path):
    from mini_kv.store.attempts import AttemptWriter

    w = AttemptWriter(tmp_path / "artifacts", "vector_add", "v1")
    with pytest.raises(ConfigError, match="regression.json"):
        w.json("regression.json", {"verdict": "MAYBE", "reasons": []})
    assert not (w.partial / "regression.json").exists()
