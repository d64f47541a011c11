"""`mini-kv profile --solution` and `compare-profiles` on SOL-ExecBench solutions and bench attempts.

On CPU, ncu is tests/fixtures/ncu/fake_ncu.py (see test_profile_capture.py): the selection, the
validation, the job the target gets and the profile directory are real; the GPU test runs ncu."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sol_helpers import write_solution
from test_profile_capture import FIX, fake_ncu  # noqa: F401 - the fixture

from mini_kv.errors import ConfigError
from mini_kv.profile import sol
from mini_kv.profile.capture import ProfileOptions
from mini_kv.profile.store import read_profile
from mini_kv.solexec.run import BenchOptions, load_problem
from mini_kv.worker.inputs import case_seed

ROOT = Path(__file__).resolve().parents[1]
SOLS = ROOT / "tests" / "sol_solutions"
PROBLEM = SOLS / "problem"
TRITON = """import triton
import triton.language as tl


@triton.jit
def scale_mul_kernel(x, y, n):
    pass


@triton.jit(do_not_specialize=["n"])
def total_kernel(y, out, n):
    pass


def run(x, w, alpha, y, total):
    pass
"""


def test_selection_and_validation_before_anything_runs(tmp_path):
    prob = load_problem(str(PROBLEM), BenchOptions(str(SOLS / "cuda_good" / "solution.json")))
    p = sol.plan(prob, ProfileOptions())
    assert p.case.uuid == "small" and p.kernel_names == ["scale_mul_kernel"]
    assert p.seed == case_seed("scale_mul", "small", ProfileOptions().seed_salt)
    assert sol.plan(prob, ProfileOptions(case="tall")).case.uuid == "tall"
    with pytest.raises(ConfigError, match="'wide' is not a workload of scale_mul; choose one of small, tall"):
        sol.plan(prob, ProfileOptions(case="wide"))
    with pytest.raises(ConfigError, match="'other' is not a kernel of scale_mul_cuda_good"):
        sol.plan(prob, ProfileOptions(kernel="other"))
    with pytest.raises(ConfigError, match="warm-up"):
        sol.plan(prob, ProfileOptions(warmup=0))
    tri = write_solution(
        tmp_path / "tri", "scale_mul_triton", "scale_mul", "main.py", TRITON, languages=("triton",)
    )
    assert sol.kernel_names(load_problem(str(PROBLEM), BenchOptions(str(tri))).candidates[0]) == [
        "scale_mul_kernel",
        "total_kernel",
    ]
    # a PyTorch solution defines no kernel: any --kernel names the one to profile
    torch_only = load_problem(str(PROBLEM), BenchOptions(str(SOLS / "good_return" / "solution.json")))
    assert sol.plan(torch_only, ProfileOptions()).kernel_names == []
    assert sol.plan(torch_only, ProfileOptions(kernel="vectorized_elementwise_kernel")).kernel_names == [
        "vectorized_elementwise_kernel"
    ]


def test_the_cli_refuses_ambiguous_or_unknown_targets(tmp_path, cli):
    both = cli(
        "profile", "--task", "tasks/rmsnorm.yaml", "--solution", str(SOLS / "good_return" / "solution.json")
    )
    assert both.returncode == 2 and "not both or neither" in both.stderr
    neither = cli("profile")
    assert neither.returncode == 2 and "not both or neither" in neither.stderr
    bad = cli(
        "profile",
        "--solution",
        str(SOLS / "good_return" / "solution.json"),
        "--problem",
        str(PROBLEM),
        "--case",
        "wide",
        "--artifacts",
        str(tmp_path / "a"),
    )
    assert bad.returncode == 2 and "is not a workload of scale_mul" in bad.stderr
    assert not (tmp_path / "a").exists()  # refused before anything was written


def _profile(fake, monkeypatch, solution, **kw):
    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    monkeypatch.setenv("FAKE_NCU_CSV", str(FIX / "rmsnorm-v0_naive.raw.csv"))
    prob = load_problem(kw.pop("problem", str(PROBLEM)), BenchOptions(str(solution)))
    return sol.profile_solution(prob, ProfileOptions(artifacts=str(fake["artifacts"]), **kw))


def test_a_bench_attempt_is_profiled_with_the_sol_target_job(fake_ncu, monkeypatch, tmp_path):  # noqa: F811
    from mini_kv.solexec.run import bench

    attempt = Path(
        bench(
            str(PROBLEM),
            BenchOptions(
                solution=str(SOLS / "good_return" / "solution.json"),
                artifacts=str(tmp_path / "store"),
                device="cpu",
                rounds=1,
                warmup=1,
                samples=3,
            ),
        ).attempt
    )
    # the attempt's solution.json (every source inlined); its definition.json is stored with sorted keys,
    # which loses the order of the inputs, so the problem comes from the problem directory
    res = _profile(
        fake_ncu,
        monkeypatch,
        attempt / "solution.json",
        problem=str(PROBLEM),
        case="tall",
        kernel="rmsnorm_row_kernel",
    )
    assert res.status == "ok", res.reason
    doc = read_profile(Path(res.path))  # schema-valid, every file hashed, summary re-derived
    assert doc.task.id == "scale_mul" and doc.task.version.startswith("sol-")
    assert (doc.case.id, doc.case.kind, doc.case.params) == ("tall", "workload", {"n": 17})
    assert doc.candidate.id == "scale_mul_good_return" and doc.candidate.op == "main.py::forward"
    job = json.loads((Path(res.path) / "job.json").read_text())
    assert job["kind"] == "sol_profile_target" and job["case"]["id"] == "tall" and job["calls"] == 1
    assert job["seed"] == doc.case.seed == case_seed("scale_mul", "tall", doc.case.seed_salt)
    assert job["solution"]["entry_function"] == "forward" and job["solution"]["dps"] is False
    assert job["reference"] == json.loads((PROBLEM / "definition.json").read_text())["reference"]
    profiled = json.loads(fake_ncu["log"].read_text().splitlines()[-2])
    assert profiled[-6:-4] == ["-m", "mini_kv.worker.child"]
    assert {"definition.json", "solution.json", "environment.json"} <= {f["path"] for f in doc.files}


def test_compare_profiles_of_two_solutions_leaves_the_latency_to_bench(
    fake_ncu,  # noqa: F811
    monkeypatch,
    tmp_path,
    capsys,
):
    from mini_kv.cli import main

    a = _profile(
        fake_ncu,
        monkeypatch,
        SOLS / "good_return" / "solution.json",
        problem=str(PROBLEM),
        kernel="rmsnorm_row_kernel",
    )
    b = _profile(
        fake_ncu,
        monkeypatch,
        SOLS / "good_dps" / "solution.json",
        problem=str(PROBLEM),
        kernel="rmsnorm_row_kernel",
    )
    assert main(["compare-profiles", a.path, b.path, "--json", str(tmp_path / "c.json")]) == 0
    out = json.loads((tmp_path / "c.json").read_text())
    assert out["timing"]["ran"] is False and "`bench`" in out["timing"]["reason"]
    assert "scale_mul_good_dps" in capsys.readouterr().out


def test_a_solution_without_kernels_of_its_own_needs_kernel(fake_ncu, monkeypatch):  # noqa: F811
    res = _profile(fake_ncu, monkeypatch, SOLS / "good_return" / "solution.json", problem=str(PROBLEM))
    assert res.status == "failed" and res.reason.code == "NO_KERNEL_NAMES"
    assert "--kernel" in res.reason.message


@pytest.mark.gpu
@pytest.mark.timing  # ncu takes the GPU's performance counters: alone on the GPU
def test_profile_a_cuda_solution_on_the_gpu(tmp_path):
    """Real ncu around the SOL target: the C++ solution built, its kernel profiled once, output checked."""
    from mini_kv.profile.ncu import find_ncu

    if find_ncu() is None:
        pytest.skip("no ncu")
    prob = load_problem(str(PROBLEM), BenchOptions(str(SOLS / "cuda_good" / "solution.json")))
    res = sol.profile_solution(prob, ProfileOptions(artifacts=str(tmp_path / "a"), case="tall"))
    assert res.status == "ok", res.reason
    doc = read_profile(Path(res.path))
    assert "scale_mul_kernel" in doc.kernel["Kernel Name"] and doc.summary.grid_size >= 1
    assert doc.target["output_check"]["ok"] and doc.candidate.library
