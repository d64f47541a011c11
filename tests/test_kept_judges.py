"""One judge for a batch's items alike, a fresh subject for each (runner.KeptJudges): real batches on the
CPU, with every jailed child counted by its role as it starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import QuietShow, run_batch, sol_item

from mini_kv import jail, runner
from mini_kv.cluster import batch
from mini_kv.solexec.run import BenchOptions

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"
MARK = "mini-kv-test: the reference loaded"


def _problem(tmp_path: Path) -> Path:
    """tests/sol_solutions/problem with a reference that says, on the judge's output, that it loaded."""
    prob = tmp_path / "problem"
    shutil.copytree(SOLS / "problem", prob)
    definition = json.loads((prob / "definition.json").read_text())
    definition["reference"] = f"print({MARK!r}, flush=True)\n" + definition["reference"]
    (prob / "definition.json").write_text(json.dumps(definition))
    return prob


def _bench(prob: Path, names: list[str], tmp_path: Path) -> list:
    return run_batch([sol_item(prob, SOLS / name / "solution.json", tmp_path / "store") for name in names])


def test_one_judge_serves_the_whole_batch_a_crash_costing_only_a_fresh_subject(started, tmp_path):
    prob = _problem(tmp_path)
    results = _bench(prob, ["good_dps", "crashes", "good_return", "wrong_values"], tmp_path)
    assert [r.status for r in results] == ["PASSED", "FAILED", "PASSED", "FAILED"]
    statuses = [t.evaluation.status for t in results[1].detail.traces]
    assert "RUNTIME_ERROR" in statuses and "PASSED" in statuses  # the crash pinned on its workload only
    # the first item's judge and subject; each next item's subject, started ahead, waits for that judge;
    # the crash ends the subject only (the judge's `lost` event): the crash's workload after it runs in a
    # fresh subject beside the same judge, which then judges the third and fourth items
    assert started[:2] == ["judge", "subject"] and started.count("judge") == 1, started
    assert started.count("subject") == 5, started
    assert runner.KeptJudges._idle == [] and not runner.KeptJudges.keeping()  # ended with the batch
    # each attempt's log holds what the judge printed for its own jobs only: the log follows the job (the
    # crash's item is two jobs, its workloads before the crash and those after)
    logs = [(Path(r.attempt) / "logs" / "worker.log").read_text() for r in results]
    assert [log.count(MARK) for log in logs] == [1, 2, 1, 1], logs


def test_a_solution_crashing_on_every_workload_keeps_its_judge_and_gets_a_fresh_subject_for_each(
    started, tmp_path
):
    """One `bench`, no judges kept around it: the subject dies on each workload (SIGABRT), its judge says
    so (`lost`) and waits, and the next workload runs beside it in a fresh subject. One judge for the
    solution, a subject per workload, and each workload says how its own subject ended."""
    from mini_kv.solexec.run import bench

    folder = tmp_path / "aborts"
    folder.mkdir()
    sol = json.loads((SOLS / "crashes" / "solution.json").read_text())
    source = "import os\n\ndef run(x, w, alpha):\n    os.abort()\n"
    sol.update(name="scale_mul_aborts", sources=[{"path": "kernel.py", "content": source}])
    (folder / "solution.json").write_text(json.dumps(sol))
    opts = BenchOptions(
        solution=str(folder / "solution.json"), artifacts=str(tmp_path / "store"), device="cpu", rounds=2
    )
    result = bench(str(SOLS / "problem"), opts)
    evaluations = [t.evaluation for t in result.traces]
    assert [e.status for e in evaluations] == ["RUNTIME_ERROR"] * 2, evaluations
    assert all("SIGABRT" in e.log and "SIGKILL" not in e.log for e in evaluations), evaluations
    assert started == ["judge", "subject", "subject"], started


def test_a_kept_judge_sees_no_solution_of_the_batch(tmp_path):
    """The judge's jail leaves out every solution's staged files (JailSpec.candidate); its subject's
    shows them."""
    spec = jail.JailSpec(read_only=("/a",), candidate=("/staging",))
    assert spec.view(runs_candidate=False).read_only == ("/a",)
    assert spec.view(runs_candidate=True).read_only == ("/a", "/staging")
    assert spec.view(runs_candidate=True).candidate == ()


def test_a_card_and_a_problem_in_one_batch_each_get_a_judge_of_their_own(started, tmp_path):
    """A judge serves only items started alike: a card's (its modules imported) is no SOL problem's."""
    from mini_kv.pipeline import VerifyOptions

    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    card = batch.Item(
        batch.VERIFY, "v0_naive", str(ROOT / "tasks/vector_add.yaml"), "v0_naive", opts, str(tmp_path)
    )
    sol = sol_item(SOLS / "problem", SOLS / "good_dps" / "solution.json", tmp_path)
    results = run_batch([card, sol])
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    # the card's judge and subject; the problem's worker, started ahead as the card's item began, with a
    # judge of its own although the card's was busy: none of its kind existed
    assert started == ["judge", "subject", "judge", "subject"]
    assert runner.KeptJudges._idle == []


def test_a_batch_alternating_among_three_kinds_starts_one_judge_for_each(started, tmp_path):
    """Two candidates of a card and two solutions of each of two problems, given alternately: the items
    of one card or problem run together (cluster.batch.grouped), so three judges start, not one for
    nearly every item (KeptJudges keeps at most IDLE_MAX = 2 kinds), and the results keep the given
    order."""
    from mini_kv.pipeline import VerifyOptions

    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))

    def card(cand: str) -> batch.Item:
        return batch.Item(batch.VERIFY, cand, str(ROOT / "tasks/vector_add.yaml"), cand, opts, str(tmp_path))

    def sol(prob: Path, name: str) -> batch.Item:
        return sol_item(prob, SOLS / name / "solution.json", tmp_path, f"{prob.parent.name}/{name}")

    other = _problem(tmp_path / "other")  # a second problem: its own jail view, so its own kind of judge
    items = [
        card("v0_naive"), sol(SOLS / "problem", "good_dps"), sol(other, "good_dps"),
        card("v1_vectorized"), sol(SOLS / "problem", "good_return"), sol(other, "good_return"),
    ]  # fmt: skip
    assert batch.grouped(items) == [0, 3, 1, 4, 2, 5]
    results = run_batch(items)
    assert [r.label for r in results] == [it.label for it in items]
    assert [r.status for r in results] == ["PASSED"] * 6, [(r.label, r.status, r.reason) for r in results]
    assert started.count("judge") == 3 and started.count("subject") == 6, started


def test_a_kept_judge_that_died_waiting_is_passed_over(started, tmp_path):
    """Killed between two items (its jail's parent-death signal fires with the thread that started it,
    say): the next item starts a judge of its own instead of sending its job to a dead one."""

    def kill_kept(item, result):
        for judge in runner.KeptJudges._idle:
            judge.proc.kill_tree()
            judge.proc.wait(timeout=30)

    items = [
        sol_item(SOLS / "problem", SOLS / name / "solution.json", tmp_path)
        for name in ("good_dps", "good_return")
    ]
    results = batch.run_here(items, QuietShow(), kill_kept)
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    assert started == ["judge", "subject", "subject", "judge"]


def test_a_kept_judges_view_gathers_no_candidates_library(tmp_path):
    """Each candidate's library is staged into its subject's view alone: the judge loads none, and a
    kept judge's view would otherwise gather every library of the batch."""
    from mini_kv.pipeline import VerifyOptions

    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    items = [
        batch.Item(batch.VERIFY, c, str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path))
        for c in ("v0_naive", "v1_vectorized")
    ]
    staged = []

    def look(item, result):
        for judge in runner.KeptJudges._idle:
            staged.extend(
                p for inbox in judge.proc.inboxes.values() for p in Path(inbox).rglob("*") if p.is_file()
            )

    results = batch.run_here(items, QuietShow(), look)
    assert [r.status for r in results] == ["PASSED", "PASSED"]  # each subject loaded its library
    assert all(r.detail.compile.library for r in results)
    assert staged == []


def test_a_changed_environment_is_another_kind_of_judge(started, tmp_path, monkeypatch):
    """The kind of judge is its environment as the jail makes it: a variable the jail passes on, changed
    between two runs (a user's loop within api.kept_judges), gets a judge started with it."""
    from mini_kv.solexec.run import bench

    opts = {"device": "cpu", "artifacts": str(tmp_path / "store"), "rounds": 2, "samples": 3, "warmup": 1}
    with runner.keep_judges():
        for threads in ("1", "1", "2"):
            monkeypatch.setenv("OMP_NUM_THREADS", threads)
            res = bench(
                str(SOLS / "problem"), BenchOptions(solution=str(SOLS / "good_dps" / "solution.json"), **opts)
            )
            assert {t.evaluation.status for t in res.traces} == {"PASSED"}
    assert started == ["judge", "subject", "subject", "judge", "subject"]


def test_a_daemon_left_by_a_crashed_subject_cannot_reach_the_workloads_after_it(started, tmp_path):
    """The attacker's view of a judge that goes on: on the first workload the solution forks a process that
    keeps writing into its input (shared with the judge) and setsid()s away, then its subject exits. The
    subject's jail ends with it (its PID namespace; the parent kills its tree too) before the next
    workload, which gets fresh buffers and a fresh subject beside the same judge: it is judged on its own
    outputs and passes."""
    from mini_kv.solexec.run import bench

    folder = tmp_path / "daemon"
    folder.mkdir()
    sol = json.loads((SOLS / "crashes" / "solution.json").read_text())
    source = (
        "import os\n\n"
        "def run(x, w, alpha):\n"
        "    if x.shape[0] == 3:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()\n"
        "            while True:\n"
        "                x.fill_(1e30)\n"
        "        os._exit(3)\n"
        "    y = x * w * alpha\n"
        "    return y, y.sum()\n"
    )
    sol.update(name="scale_mul_daemon", sources=[{"path": "kernel.py", "content": source}])
    (folder / "solution.json").write_text(json.dumps(sol))
    opts = BenchOptions(
        solution=str(folder / "solution.json"), artifacts=str(tmp_path / "store"), device="cpu", rounds=2
    )
    result = bench(str(SOLS / "problem"), opts)
    by_uuid = {t.workload.uuid: t.evaluation for t in result.traces}
    assert by_uuid["small"].status == "RUNTIME_ERROR" and "status 3" in by_uuid["small"].log, by_uuid
    assert by_uuid["tall"].status == "PASSED", by_uuid["tall"]
    assert started == ["judge", "subject", "subject"], started


def test_a_card_candidate_that_aborts_on_a_case_goes_on_beside_the_same_judge(started, cli, tmp_path):
    """A task card's candidate (tests/planted: SIGABRT on n33 only), one `verify`: the case is pinned on it,
    the cases after it and the contract checks run in a fresh subject beside the same judge."""
    res = cli(
        "verify", "--task", "tests/planted/planted.yaml", "--candidate", "abort", "--skip-benchmark",
        "--artifacts", str(tmp_path), "--json", timeout=600,
    )  # fmt: skip
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    corr = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())
    cases = {c["id"]: c for c in corr["cases"]}
    assert cases["n33-float32"]["status"] == "RUNTIME_ERROR", cases["n33-float32"]
    assert "SIGABRT" in cases["n33-float32"]["reason"], cases["n33-float32"]
    assert cases["n31-float32"]["status"] == cases["n64-float32"]["status"] == "PASSED", cases
    assert corr["contract"]["opcheck"]["status"] == "PASSED", corr["contract"]
    assert started == ["judge", "subject", "subject"], started
