"""What a user reads when a solution misbehaves: each message names what the solution did (its slowness,
its own exit, what it returned, an output it never wrote), in the solution's terms, never as a failure
of mini_kv's (its exit codes, a traceback of its own frames), and each workload's log holds only that
workload's output. One `bench` of every planted solution (module fixture), then one test per message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv.solexec.run import BenchOptions, bench
from mini_kv.worker import explain

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "tests" / "sol_solutions" / "problem"
MINI_KV_SRC = str(ROOT / "src" / "mini_kv")
FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "repeats": 1, "samples": 3}

# name -> (destination-passing, main.py); every one a solution of tests/sol_solutions/problem (y, total)
SOLUTIONS = {
    "sys_exit": (False, "import sys\n\ndef forward(x, w, alpha):\n    sys.exit(3)\n"),
    "exit_zero": (False, "def forward(x, w, alpha):\n    raise SystemExit(0)\n"),
    "os_exit": (
        False,
        "import os\n\ndef forward(x, w, alpha):\n    print(f'leaving on {x.shape[0]} rows', flush=True)\n"
        "    os._exit(3)\n",
    ),
    "bad_str": (
        False,
        "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\n\n"
        "def forward(x, w, alpha):\n    raise Odd('the hidden reason')\n",
    ),
    "returns_none": (False, "def forward(x, w, alpha):\n    return None\n"),
    "returns_one_tuple": (False, "def forward(x, w, alpha):\n    return (x * (w * alpha),)\n"),
    "returns_numpy": (
        False,
        "def forward(x, w, alpha):\n    y = x * (w * alpha)\n    return y.numpy(), y.sum().numpy()\n",
    ),
    "dps_returns": (
        True,
        "def forward(x, w, alpha, y, total):\n    r = x * (w * alpha)\n    return r, r.sum()\n",
    ),
}


def _write(folder: Path, name: str, dps: bool, source: str) -> Path:
    folder.mkdir(parents=True)
    spec = {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "main.py::forward"}
    sol = {
        "name": f"scale_mul_{name}",
        "definition": "scale_mul",
        "author": "tests",
        "spec": {**spec, "destination_passing_style": dps},
        "sources": [{"path": "main.py", "content": source}],
    }
    (folder / "solution.json").write_text(json.dumps(sol))
    return folder / "solution.json"


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """name -> {workload uuid: evaluation} from one `bench` of every planted solution."""
    base = tmp_path_factory.mktemp("messages")
    files = [_write(base / n, n, *SOLUTIONS[n]) for n in SOLUTIONS]
    out = base / "traces.jsonl"
    args = ["--device", "cpu", "--rounds", "2", "--warmup", "1", "--repeats", "1", "--samples", "3"]
    res = run_cli(
        "bench", str(PROBLEM), "--solution", *map(str, files), *args,
        "--artifacts", str(base / "a"), "-o", str(out), timeout=600,
    )  # fmt: skip
    got: dict[str, dict] = {}
    for line in out.read_text().splitlines():
        t = json.loads(line)
        got.setdefault(t["solution"].removeprefix("scale_mul_"), {})[t["workload"]["uuid"]] = t["evaluation"]
    assert set(got) == set(SOLUTIONS), res.stdout + res.stderr
    got["stdout"] = res.stdout
    return got


def _logs(traces, name) -> dict[str, str]:
    return {uuid: ev["log"] for uuid, ev in traces[name].items()}


def test_a_slow_solution_is_blamed_for_its_slowness_with_its_per_call_time_and_the_budget(tmp_path):
    """A fixed second per call: with a 1.5-s budget two rounds do not fit, whatever the workload's size.
    SKIPPED workloads are not traces (upstream's layout has no status for them): correctness.json."""
    source = "import time\n\ndef forward(x, w, alpha):\n    time.sleep(1.0)\n    y = x * (w * alpha)\n    return y, y.sum()\n"
    sol = _write(tmp_path / "slow", "slow", False, source)
    opts = BenchOptions(solution=str(sol), artifacts=str(tmp_path / "a"), budget=1.5, **FAST)
    attempt = Path(bench(str(PROBLEM), opts).attempt)
    cases = {c["id"]: c for c in json.loads((attempt / "correctness.json").read_text())["cases"]}
    small, tall = ({"status": cases[u]["status"], "log": cases[u]["log"]} for u in ("small", "tall"))
    assert small["status"] == tall["status"] == "SKIPPED", traces["slow"]
    assert "too large" not in small["log"] + tall["log"]
    assert small["log"].startswith("the solution is too slow on cpu"), small["log"]
    call_s = float(small["log"].split("one call took ")[1].split(" s")[0])
    assert 0.9 <= call_s < 5, small["log"]
    assert "budget of 1.5 s (--budget)" in small["log"]
    # the larger workload is not run: the same solution would be no quicker, and it says why
    assert "not run: the solution is too slow" in tall["log"] and "'small'" in tall["log"], tall["log"]


@pytest.mark.parametrize(("name", "said"), [("sys_exit", "sys.exit(3)"), ("exit_zero", "sys.exit(0)")])
def test_a_solution_that_calls_sys_exit_is_told_so_on_every_workload(traces, name, said):
    for uuid, log in _logs(traces, name).items():
        assert traces[name][uuid]["status"] == "RUNTIME_ERROR"
        assert f"the solution called {said}" in log, (uuid, log)
        assert "status" not in log.split("called")[0] and "SIGKILL" not in log, (uuid, log)


def test_a_solution_that_ends_its_process_is_told_its_own_status_never_a_kill(traces):
    """os._exit(3): the process's own status on every workload, said as the candidate's; never SIGKILL
    (the judge seeing the link close first once made the subject's end read as our kill)."""
    for uuid, log in _logs(traces, "os_exit").items():
        assert "the candidate's process exited with status 3" in log, (uuid, log)
        assert "not one of mini_kv's exit codes" in log and "SIGKILL" not in log, (uuid, log)


def test_each_workloads_log_holds_only_its_own_output(traces):
    logs = _logs(traces, "os_exit")
    assert "leaving on 3 rows" in logs["small"] and "leaving on 17 rows" not in logs["small"], logs
    assert "leaving on 17 rows" in logs["tall"] and "leaving on 3 rows" not in logs["tall"], logs


def test_an_exception_whose_str_raises_still_shows_a_reason(traces):
    for log in _logs(traces, "bad_str").values():
        assert "solution raised Odd" in log and "the hidden reason" in log, log
        assert "main.py" in log and MINI_KV_SRC not in log, log  # the solution's frame, none of ours


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("returns_none", "the solution returned None; expected 2 torch.Tensors"),
        (
            "returns_one_tuple",
            "the solution returned a tuple of 1 value(s) (Tensor); expected 2 torch.Tensors",
        ),
        ("returns_numpy", "numpy.ndarray as output 'y'; expected a torch.Tensor"),
    ],
)
def test_a_wrong_return_says_what_came_back_and_what_was_expected_without_our_traceback(traces, name, said):
    for log in _logs(traces, name).values():
        assert said in log, log
        assert "Traceback" not in log and MINI_KV_SRC not in log, log


def test_a_destination_passing_solution_that_returns_its_result_is_told_it_never_wrote_the_output(traces):
    for log in _logs(traces, "dps_returns").values():
        assert "output 'y' was never written: it still holds the fill" in log, log
        assert "returned a tuple of 2 value(s)" in log and "NaN" not in log, log


def test_candidate_frames_drop_mini_kvs_own_and_keep_the_candidates():
    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{MINI_KV_SRC}/worker/subject.py", line 3, in handle\n    return handler(msg)\n'
        '  File "/tmp/sol/main.py", line 2, in forward\n    raise ValueError(1)\n'
        "ValueError: 1\n"
    )
    kept = explain.candidate_frames(tb)
    assert "main.py" in kept and "subject.py" not in kept and kept.endswith("ValueError: 1")
    only_ours = tb.replace('"/tmp/sol/main.py"', f'"{MINI_KV_SRC}/x.py"')
    assert explain.candidate_frames(only_ours) == ""


def test_the_same_failure_on_every_workload_is_printed_once(traces):
    """As for triton_ref_vecadd's reference on CPU (one traceback per workload, three times over): the
    report prints a log once and refers back to it."""
    out = " ".join(traces["stdout"].split())
    assert out.count("the solution returned None; expected") == 1, traces["stdout"]
    assert "the same log as workload 0" in out


@pytest.mark.parametrize(
    "cap, device", [("cgroup", "cpu"), ("watch", "cpu"), pytest.param("watch", "cuda", marks=pytest.mark.gpu)]
)
def test_a_solution_killed_at_its_jails_memory_cap_is_told_it_ran_out_of_memory(
    tmp_path, request, cap, device
):
    """A helper process holding 600 MiB beside a solution that takes 800 MiB more (on CUDA, where the cap
    is a larger RLIMIT_DATA that a CUDA context fits: 3.75 GiB and 0.5 GiB under a 4-GiB cap, the solution's
    process holding a CUDA context, which counts over 1 GiB of its data cap on an H100): each stays under its
    own cap, the tree does not, and the kernel kills the
    solution's process at the jail's memory cgroup, or, without one, jail.MemoryWatch kills its tree. The
    workload says so, with the cap and the option that sets it, not only 'killed by signal SIGKILL'."""
    from mini_kv import jail

    if cap == "watch":
        if not jail.resolve("auto").enabled:
            pytest.skip("no jail here")
        request.getfixturevalue("no_memory_cgroup")
    elif (state := dict(jail.resolve("auto").layers).get("memory_cap")) != "active":
        pytest.skip(f"no memory cgroup here: {state}")
    helper_mib, own_mib, cap_gib = (600, 800, 1.5) if device == "cpu" else (3840, 512, 4)
    hog = (
        f"b = bytearray({helper_mib} << 20); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(120)"
    )
    source = (
        "import subprocess, sys, time\n\n"
        "def forward(x, w, alpha):\n"
        "    float(x.sum())\n"  # on CUDA: the process holds its context, as every GPU solution's does
        f"    helper = subprocess.Popen([sys.executable, '-c', {hog!r}])\n"
        "    time.sleep(3)\n"
        f"    b = bytearray({own_mib} << 20)\n"
        "    b[::4096] = b'x' * len(b[::4096])\n"
        "    time.sleep(5)\n"  # held: a watch that reads every 0.1 s on a loaded machine sees it too
        "    y = x * (w * alpha)\n"
        "    return y, y.sum()\n"
    )
    sol = _write(tmp_path / "oom", "oom", False, source)
    opts = BenchOptions(
        solution=str(sol),
        artifacts=str(tmp_path / "a"),
        memory_limit_gb=cap_gib,
        give_up_after=1,
        **{**FAST, "device": device},
    )
    result = bench(str(PROBLEM), opts)
    first = result.traces[0].evaluation
    assert first.status == "RUNTIME_ERROR", first
    assert "out of memory" in first.log and f"memory cap of {cap_gib:g} GiB" in first.log, first.log
    assert "--memory-limit" in first.log, first.log


@pytest.mark.parametrize(
    "hog, raised",
    [
        ("bytearray(8 << 30)", "(MemoryError)"),  # Python's own: an empty message
        ("torch.empty(8 << 30, dtype=torch.uint8)", "(RuntimeError: "),  # torch's allocator: its own words
    ],
    ids=["python", "torch"],
)
def test_a_solution_past_its_memory_cap_is_told_the_cap_and_the_option_that_sets_it(tmp_path, hog, raised):
    """A solution that asks for more than its process's cap (here the CPU's address-space cap,
    --memory-limit 4) is told what ran out, the cap and the option, whichever allocator refused it."""
    source = f"import torch\n\ndef forward(x, w, alpha):\n    hoard = {hog}\n    return x * w, hoard\n"
    sol = _write(tmp_path / "hog", "hog", False, source)
    opts = BenchOptions(
        solution=str(sol), artifacts=str(tmp_path / "a"), memory_limit_gb=4, give_up_after=1, **FAST
    )
    first = bench(str(PROBLEM), opts).traces[0].evaluation
    assert first.status == "RUNTIME_ERROR", first
    said = " ".join(first.log.split())
    assert f"the solution ran out of memory {raised}" in said, first.log
    assert raised == "(MemoryError)" or "can't allocate memory" in said, first.log
    assert "under its process's cap of 4 GiB of address space (RLIMIT_AS; --memory-limit sets it)" in said
    assert "solution raised" not in said, first.log


@pytest.mark.gpu
def test_on_cuda_the_workers_data_cap_binds_and_cuda_runs_under_it(tmp_path):
    """proc.cap_memory on CUDA, in mini_kv's own GPU workers: under --memory-limit 6 the solution's process
    holds RLIMIT_DATA of exactly 6 GiB (soft and hard), its CUDA context and kernels run under it (PASSED),
    and a solution that asks for 12 GiB of host memory fails with a MemoryError as its reason."""
    cap = 6 << 30
    honest = (
        "import resource\n\n"
        "def forward(x, w, alpha):\n"
        "    limits = resource.getrlimit(resource.RLIMIT_DATA)\n"
        f"    assert limits == ({cap}, {cap}), f'RLIMIT_DATA is {{limits}}'\n"
        "    y = x * (w * alpha)\n"
        "    return y, y.sum()\n"
    )
    hog = "def forward(x, w, alpha):\n    hoard = bytearray(12 << 30)\n    return x * w, hoard\n"
    files = [_write(tmp_path / n, n, False, src) for n, src in (("capped", honest), ("hog", hog))]
    gpu = {**FAST, "device": "cuda"}
    for sol, expected in zip(files, ("PASSED", "RUNTIME_ERROR"), strict=True):
        opts = BenchOptions(
            solution=str(sol), artifacts=str(tmp_path / "a"), memory_limit_gb=6, give_up_after=1, **gpu
        )
        first = bench(str(PROBLEM), opts).traces[0].evaluation
        assert first.status == expected, (sol, first)
        if expected == "RUNTIME_ERROR":
            assert "cap of 6 GiB of data (RLIMIT_DATA; --memory-limit sets it)" in " ".join(first.log.split())
