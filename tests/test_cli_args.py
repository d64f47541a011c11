"""Arguments are checked before any work starts: bad values, filters that select nothing and stores that
cannot be written are configuration errors (exit 2) that name the option and what is allowed, and never
archive an attempt. Read-only commands work on a read-only store."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_index import make_attempt

from mini_kv.cli import main

ROOT = Path(__file__).resolve().parents[1]
SOL_PROBLEM = "problems/sol-execbench/triton_ref_vecadd"
SOL_SOLUTION = "solutions/triton_ref_vecadd/pytorch/solution.json"


def _cli(*args, env=None, prefix=()):
    return subprocess.run(
        [*prefix, sys.executable, "-m", "mini_kv", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def _without_write_permission() -> tuple[str, ...]:
    """A command prefix under which permission bits bind: root ignores them unless it drops the
    capability that overrides them."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a directory unwritable")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if p.is_dir():
            p.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    yield d
    for p in [d, *d.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)


# ------------------------------------------------------------------------------------------ device


# (ids spelled out: an id "gpu" would be taken for the gpu marker and skipped without a GPU)
@pytest.mark.parametrize(
    "value",
    ["gpu", "CPU", "cuda:01", "cuda:x", "cpu:0"],
    ids=["word-gpu", "upper-CPU", "leading-zero", "bad-index", "cpu-index"],
)
def test_verify_rejects_a_device_spelling_before_any_work(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "verify",
                "--task",
                "tasks/vector_add.yaml",
                "--device",
                value,
                "--skip-benchmark",
                "--artifacts",
                str(tmp_path),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--device" in err and "cpu, cuda, cuda:N" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing archived


def test_bench_rejects_a_device_spelling(tmp_path):
    r = _cli(
        "bench", SOL_PROBLEM, "--solution", SOL_SOLUTION, "--device", "gpu", "--artifacts", str(tmp_path)
    )
    assert r.returncode == 2, r.stderr
    assert "--device" in r.stderr and "cpu, cuda, cuda:N" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "option,value",
    [
        ("--timeout", "-1"),
        ("--compile-timeout", "0"),
        ("--max-cv", "3"),
        ("--memory-limit", "nan"),
        ("--timeout", "soon"),
    ],
)
def test_verify_rejects_bad_numbers(option, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--task", "tasks/vector_add.yaml", option, value, "--artifacts", str(tmp_path)])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize("option,value", [("--rounds", "0"), ("--samples", "-3"), ("--warmup", "x")])
def test_bench_rejects_bad_counts(option, value, tmp_path):
    from mini_kv.cli_bench import main as bench_main

    assert (
        bench_main([SOL_PROBLEM, "--solution", SOL_SOLUTION, option, value, "--artifacts", str(tmp_path)])
        == 2
    )
    assert list(tmp_path.iterdir()) == []


def test_verify_prebuilt_must_exist(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--task", "tasks/vector_add.yaml", "--prebuilt", str(tmp_path / "no.so")])
    assert exc.value.code == 2 and "--prebuilt" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- filters


def test_a_case_filter_that_matches_no_case_is_an_error_listing_the_cases(tmp_path, capsys):
    rc = main(
        [
            "verify",
            "--task",
            "tasks/vector_add.yaml",
            "--case",
            "n99",
            "--device",
            "cpu",
            "--skip-benchmark",
            "--artifacts",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "n99" in err and "n31" in err and "bench_cpu_64k" in err
    assert list(tmp_path.iterdir()) == []


def test_one_unknown_case_among_known_ones_is_an_error(tmp_path, capsys):
    rc = main(
        [
            "verify",
            "--task",
            "tasks/vector_add.yaml",
            "--case",
            "n31",
            "--case",
            "n3l",
            "--device",
            "cpu",
            "--artifacts",
            str(tmp_path),
        ]
    )
    assert rc == 2 and "n3l" in capsys.readouterr().err


def test_a_case_filter_that_selects_nothing_on_this_device_is_an_error(tmp_path, capsys):
    # bench_16m is CUDA-only; with --skip-benchmark a bench case selects nothing either
    for extra in (["--case", "bench_16m"], ["--case", "bench_cpu_64k", "--skip-benchmark"]):
        rc = main(
            [
                "verify",
                "--task",
                "tasks/vector_add.yaml",
                "--device",
                "cpu",
                *extra,
                "--artifacts",
                str(tmp_path),
            ]
        )
        err = capsys.readouterr().err
        assert rc == 2, err
        assert "cases that run on cpu" in err and "n31" in err
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_candidate_is_an_error_listing_the_candidates(tmp_path, capsys):
    rc = main(
        [
            "verify",
            "--task",
            "tasks/vector_add.yaml",
            "--candidate",
            "v9*",
            "--device",
            "cpu",
            "--artifacts",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "v0_naive" in err and "v1_vectorized" in err


def test_leaderboard_for_an_unknown_task_is_an_error_listing_the_tasks(tmp_path, capsys):
    art = tmp_path / "artifacts"
    make_attempt(art, task="vector_add", candidate="v0", seed=1)
    make_attempt(art, task="rmsnorm", candidate="r0", seed=2)
    assert main(["leaderboard", "--artifacts", str(art), "--task", "vector_ad"]) == 2
    err = capsys.readouterr().err
    assert "vector_ad" in err and "rmsnorm, vector_add" in err
    # a known task without a valid attempt is not an error
    make_attempt(art, task="layernorm", candidate="l0", seed=3, status="INCORRECT")
    assert main(["leaderboard", "--artifacts", str(art), "--task", "layernorm", "--rebuild"]) == 0


def test_leaderboard_of_a_missing_store_is_an_error(tmp_path, capsys):
    assert main(["leaderboard", "--artifacts", str(tmp_path / "nope")]) == 2
    assert not (tmp_path / "nope").exists()


# --------------------------------------------------------------------------------- unwritable stores


def test_verify_refuses_a_store_that_is_a_file_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = main(
        ["verify", "--task", "tasks/vector_add.yaml", "--device", "cpu", "--artifacts", str(blocker / "a")]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "not a directory" in err and "nothing was run" in err and "--artifacts" in err


def test_bench_refuses_unwritable_store_and_output_before_any_work(tmp_path, capsys):
    from mini_kv.cli_bench import main as bench_main

    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bench_main([SOL_PROBLEM, "--solution", SOL_SOLUTION, "--artifacts", str(blocker)]) == 2
    assert "artifact store" in capsys.readouterr().err
    assert (
        bench_main(
            [
                SOL_PROBLEM,
                "--solution",
                SOL_SOLUTION,
                "--artifacts",
                str(tmp_path / "a"),
                "-o",
                str(blocker / "traces.jsonl"),
            ]
        )
        == 2
    )
    assert "-o" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_verify_and_bench_refuse_a_read_only_store(read_only_dir):
    _read_only(read_only_dir)
    prefix = _without_write_permission()
    r = _cli(
        "verify",
        "--task",
        "tasks/vector_add.yaml",
        "--device",
        "cpu",
        "--skip-benchmark",
        "--artifacts",
        str(read_only_dir),
        prefix=prefix,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not writable" in r.stderr and str(read_only_dir) in r.stderr and "Traceback" not in r.stderr
    assert "compile:" not in r.stdout  # refused before the build
    r = _cli(
        "bench",
        SOL_PROBLEM,
        "--solution",
        SOL_SOLUTION,
        "--device",
        "cpu",
        "--artifacts",
        str(read_only_dir),
        prefix=prefix,
    )
    assert r.returncode == 2 and "not writable" in r.stderr and "Traceback" not in r.stderr


def test_leaderboard_reads_a_read_only_store_and_refuses_to_rebuild_it(read_only_dir):
    art = read_only_dir / "artifacts"
    make_attempt(art, candidate="v0", seed=1, speedups={"bench_a": 1.5})
    make_attempt(art, candidate="v1", seed=2, speedups={"bench_a": 2.0})
    assert main(["rebuild-index", "--artifacts", str(art)]) == 0
    _read_only(read_only_dir)
    prefix = _without_write_permission()
    r = _cli("leaderboard", "--artifacts", str(art), env={"COLUMNS": "120"}, prefix=prefix)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "v1" in r.stdout and "v0" in r.stdout and "read-only" in r.stderr
    for args in (["leaderboard", "--rebuild"], ["rebuild-index"]):
        r = _cli(*args, "--artifacts", str(art), prefix=prefix)
        assert r.returncode == 2, r.stdout + r.stderr
        assert str(art) in r.stderr and "Traceback" not in r.stderr


def test_leaderboard_on_a_read_only_store_without_index_says_it_cannot_build_one(read_only_dir):
    art = read_only_dir / "artifacts"
    make_attempt(art, candidate="v0", seed=1)
    _read_only(read_only_dir)
    r = _cli("leaderboard", "--artifacts", str(art), prefix=_without_write_permission())
    assert r.returncode == 2 and "read-only" in r.stderr and "no index" in r.stderr


def test_bench_paths_that_select_nothing_list_what_exists(capsys):
    from mini_kv.cli_bench import main as bench_main

    assert bench_main(["problems/sol-execbench", "--solution", SOL_SOLUTION]) == 2
    err = capsys.readouterr().err
    assert "no definition.json" in err and "problems/sol-execbench/flux_rope" in err
    assert bench_main(["problems/sol-execbench/rmsnorm", "--solution", "solutions/rmsnorm"]) == 2
    err = capsys.readouterr().err
    assert "a directory" in err and "solutions/rmsnorm/pytorch/solution.json" in err


def test_profile_checks_its_numbers_and_store_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--task", "tasks/vector_add.yaml", "--warmup", "-1"])
    assert exc.value.code == 2 and "--warmup" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["profile", "--task", "tasks/vector_add.yaml", "--artifacts", str(blocker)]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ("validate-task", "tasks/vector_add.yaml"),  # exit 0, stdout
        ("validate-task", "tasks/no_such_card.yaml"),  # a UserError: one line on stderr, its exit code
        ("verify", "--task", "tasks/vector_add.yaml", "--device", "gpu"),  # argparse: usage, exit 2
        ("--help",),  # SystemExit(0) from argparse, the help on stdout
    ],
)
def test_a_command_run_in_the_test_process_answers_as_a_fresh_process_does(args):
    """conftest.run_cli runs most tests' commands in the test process: its exit code and output must be
    those of `python -m mini_kv` itself, or the tests would check something the user never sees."""
    from conftest import run_cli

    here = run_cli(*args)
    fresh = run_cli(*args, fresh_process=True)
    assert (here.returncode, here.stdout, here.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


EXIT_SCRIPT = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
if sys.argv[2] == "busy":  # a thread still working: the exit waits for it, as the interpreter's does
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread").write_text("done"))).start()
sys.stdout.write("no newline, still buffered")
from mini_kv.proc import exit_without_teardown
exit_without_teardown(3)
sys.stdout.write("never")
"""


@pytest.mark.parametrize("threads", ["idle", "busy"])
def test_a_command_ends_without_teardown_yet_runs_its_exit_handlers_and_flushes(threads, tmp_path):
    """The CLI entries end the process without the interpreter's module teardown (about 0.8 s with torch
    loaded), but nothing a normal exit does is lost: the exit code, the buffered output, the atexit
    handlers (they close zygotes and remove temporary directories), a thread still at work."""
    res = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(tmp_path), threads],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
    )
    assert res.returncode == 3, res.stderr
    assert res.stdout == "no newline, still buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    if threads == "busy":
        assert (tmp_path / "thread").read_text() == "done"
