"""SOL-ExecBench attempts are first-class: baselines, the regression gate of `bench`, the leaderboard."""

import json
import shutil
from pathlib import Path

import pytest
from sol_helpers import statuses, write_solution

from mini_kv.codec import to_json
from mini_kv.errors import ExitCode
from mini_kv.judge.regression import exit_code_for
from mini_kv.load.schema import validate
from mini_kv.solexec.run import BenchOptions, bench
from mini_kv.status import Verdict
from mini_kv.store.attempts import read_attempt
from mini_kv.store.baseline import load_baseline, promote_baseline

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

FAIL, PASS, WARN = Verdict.FAIL, Verdict.PASS, Verdict.WARN
ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"
PROBLEM = SOLS / "problem"
# enough samples for a median; stability limits a loaded 2-core CPU can meet (promotion needs stable)
SETTINGS = {
    "device": "cpu",
    "rounds": 1,
    "warmup": 2,
    "repeats": 1,
    "samples": 40,
    "timeout": 300.0,
    "max_cv": 0.9,
    "max_p95_cv": 0.9,
}
SLOWED = """import time

import torch


def forward(x, w, alpha):
    y = x * (w * alpha)
    end = time.perf_counter() + 0.002  # the same work, plus a 2 ms busy loop
    while time.perf_counter() < end:
        pass
    return {'y': y, 'total': y.sum()}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project of its own (baselines/, artifacts/), where bench runs."""
    (tmp_path / ".mini-kv-project").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def stable_good(tmp_path_factory):
    """(bench result, project): good_return benched until stable once for the module, in a project of its
    own; the tests that promote it or rank it copy that project into theirs (`_with_stable_good`)."""
    where = tmp_path_factory.mktemp("stable_good")
    (where / ".mini-kv-project").write_text("")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        res = _bench_stable(SOLS / "good_return" / "solution.json")
    return res, where


def _with_stable_good(stable_good, project: Path) -> Path:
    """The module's stable good_return attempt, in a copy of its store inside `project`."""
    res, where = stable_good
    shutil.copytree(where, project, dirs_exist_ok=True)
    return project / Path(res.attempt).resolve().relative_to(where.resolve())


def _bench(solution: Path) -> dict:
    return bench(str(PROBLEM), BenchOptions(solution=str(solution), **SETTINGS))


def _bench_stable(solution: Path, tries: int = 3) -> dict:
    """Bench until the attempt's timing is stable, as a user does when a busy machine (here: the other
    tests beside this one) made it unstable: the leaderboard ranks stable attempts only."""
    for _ in range(tries):
        res = _bench(solution)
        if json.loads((Path(res.attempt) / "benchmark.json").read_text())["summary"]["stable"]:
            return res
    return res


def test_promote_a_sol_attempt_then_the_gate_fails_a_slowed_copy_and_passes_the_same_solution(
    project, capsys, stable_good
):
    from mini_kv.cli import main

    good = SOLS / "good_return" / "solution.json"
    first = stable_good[0]  # promotion takes a stable attempt only
    assert first.exit_code == ExitCode.OK and first.regression is None  # no baseline yet
    assert main(["promote-baseline", "--attempt", str(_with_stable_good(stable_good, project))]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "`mini-kv bench` of scale_mul will use it (found by convention at baselines/scale_mul.json)" in out
    base = load_baseline(project / "baselines" / "scale_mul.json")  # the task cards' schema and hash manifest
    assert base["source"]["candidate"] == "scale_mul_good_return" and {c["id"] for c in base["cases"]} == {
        "small",
        "tall",
    }

    slowed = write_solution(
        project / "slowed", "scale_mul_slowed", "scale_mul", "main.py", SLOWED, entry="forward", dps=False
    )
    res = _bench(slowed)
    assert statuses(res) == {"small": "PASSED", "tall": "PASSED"}
    reg = to_json(res.regression)  # regression.json's content
    assert reg["verdict"] == FAIL and res.exit_code == ExitCode.REGRESSION, reg["reasons"]
    assert (
        reg["baseline_file"]["path"] == "baselines/scale_mul.json"
        and reg["baseline_file"]["found_by"] == "definition"
    )
    for case in reg[
        "cases"
    ]:  # decided in the same run: the baseline's own solution timed beside the candidate
        conf = case["confirmation"]
        assert case["verdict"] == FAIL and conf["test"]["slower"], case["reasons"]
        assert conf["build"]["group"] == "python" and conf["build"]["dir"].endswith("baseline")
        assert conf["baseline"]["summary"]["overall"]["p50"] < conf["summary"]["overall"]["p50"] / 5
    attempt = Path(res.attempt)
    assert json.loads((attempt / "regression.json").read_text()) == json.loads(json.dumps(reg))
    validate(json.loads(json.dumps(reg)), "regression", "regression.json")
    header = read_attempt(attempt)
    assert header["regression"]["verdict"] == FAIL and header["exit_code"] == ExitCode.REGRESSION
    from mini_kv.store.index import read_index

    rows, _ = read_index(project / "artifacts")
    assert {r.candidate: r.regression for r in rows}["scale_mul_slowed"] == FAIL

    # unchanged code: never a FAIL (on a loaded CPU the same-run A/B may be too noisy: UNCONFIRMED, exit 8)
    again = _bench(good)
    verdict = again.regression.verdict
    assert verdict in (PASS, WARN, Verdict.UNCONFIRMED), again.regression.reasons
    assert again.exit_code == exit_code_for(again.regression) != ExitCode.REGRESSION


def test_the_cli_prints_the_regression_table_and_exits_6(project, stable_good):
    from conftest import run_cli

    base = promote_baseline(_with_stable_good(stable_good, project), project / "baselines" / "scale_mul.json")
    assert base.task_id == "scale_mul"
    slowed = write_solution(
        project / "slowed", "scale_mul_slowed", "scale_mul", "main.py", SLOWED, entry="forward", dps=False
    )
    proc = run_cli(
        "bench",
        str(PROBLEM),
        "--solution",
        str(slowed),
        "--rounds",
        "1",
        "--warmup",
        "2",
        "--samples",
        "40",
        "--device",
        "cpu",
        "--max-cv",
        "0.9",
        "--max-p95-cv",
        "0.9",
        cwd=project,
    )  # in this process (conftest.run_cli): its piped console is wide enough for whole headers
    text = " ".join(proc.stdout.split())
    assert proc.returncode == ExitCode.REGRESSION, proc.stdout + proc.stderr
    assert "regression vs baselines/scale_mul.json: FAIL" in text and "regression (times in µs)" in text
    assert "confirmed twice" in text and "same run, interleaved" in text
    # another suite (the settings are part of it): no verdict at all, never a FAIL
    proc = run_cli(
        "bench",
        str(PROBLEM),
        "--solution",
        str(slowed),
        "--rounds",
        "1",
        "--samples",
        "40",
        "--device",
        "cpu",
        "--max-cv",
        "0.9",
        cwd=project,
    )
    text = " ".join(proc.stdout.split())
    assert "regression vs baselines/scale_mul.json: INCOMPARABLE" in text and "suite_hash differs" in text, (
        text
    )
    assert proc.returncode == 0


def test_promotion_refuses_a_failed_sol_attempt(project):
    from mini_kv.errors import UserError

    res = bench(str(PROBLEM), BenchOptions(solution=str(SOLS / "wrong_values" / "solution.json"), **SETTINGS))
    with pytest.raises(UserError, match="only a PASSED"):
        promote_baseline(Path(res.attempt), project / "baselines" / "scale_mul.json")


def test_leaderboard_ranks_the_solutions_of_one_sol_problem(project, stable_good):
    from conftest import run_cli

    _with_stable_good(stable_good, project)  # good_return's stable attempt, in this project's store
    assert stable_good[0].exit_code == ExitCode.OK
    assert _bench_stable(SOLS / "good_dps" / "solution.json").exit_code == ExitCode.OK
    slowed = write_solution(
        project / "slowed", "scale_mul_slowed", "scale_mul", "main.py", SLOWED, entry="forward", dps=False
    )
    assert _bench_stable(slowed).exit_code == ExitCode.OK
    proc = run_cli(
        "leaderboard",
        "--task",
        "scale_mul",
        "--json",
        str(project / "lb.json"),
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    board = json.loads((project / "lb.json").read_text())
    [group] = board["groups"]  # one suite, one environment, one device
    entries = group["entries"]
    assert [e["rank"] for e in entries] == [1, 2, 3]
    assert {e["candidate"] for e in entries} == {
        "scale_mul_good_return",
        "scale_mul_good_dps",
        "scale_mul_slowed",
    }
    assert entries[-1]["candidate"] == "scale_mul_slowed"  # 2 ms per call: last
    speedups = [e["geomean_speedup"] for e in entries]
    assert speedups == sorted(speedups, reverse=True)
    assert "scale_mul_slowed" in proc.stdout
