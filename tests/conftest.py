import os
import subprocess
import sys
from pathlib import Path

import pytest

from mini_kv import pycache

ROOT = Path(__file__).resolve().parents[1]
# What a console command does first (cli_common's entry), done once here for the commands these tests
# run in this process (run_cli): bytecode kept in mini_kv's own cache where the environment keeps none,
# so that their jailed children read mini_kv's and torch's modules compiled, as a user's do, instead
# of compiling mini_kv's worker modules at every start
pycache.redirect()


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run without xdist (the red-team run) has none
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core and one more. Many tests wait on a hang's timeout, a sleep or a
    killed build while their core idles; the extra worker fills it (CI on 2 cores, otherwise the same
    commit: pytest 675 s with 2 workers, 626 s with 3; docs/measurements/ci-time.md)."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a CUDA build of torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def started(monkeypatch):
    """The role of every worker child started in this process, in order: judge, subject, or the one-shot
    kind (which says judge: it is the child that judges). A build's child (the one that writes: a cold
    cache's compile) is no worker and is left out."""
    from mini_kv import jail

    roles, real = [], jail.popen

    def popen(argv, spec, *args, **kw):
        if "mini_kv.worker.child" in argv and not spec.writable:
            roles.append("subject" if "--subject-fd" in argv else "judge")
        return real(argv, spec, *args, **kw)

    monkeypatch.setattr(jail, "popen", popen)
    return roles


@pytest.fixture(scope="module")
def judges_kept():
    """Judges kept between the module's evaluations (mini_kv.api.kept_judges), as a generation loop
    keeps them: each candidate still runs in a fresh subject, and a judge is kept only where its job
    ended cleanly. The suite is CPU-bound and a judge's start is mostly its torch import (about 1.5 s of
    CPU here): modules of many single evaluations use it (`pytestmark`)."""
    from mini_kv.api import kept_judges

    with kept_judges():
        yield


class QuietShow:
    """cluster.batch's display (its rows, lines and verdicts), showing nothing."""

    def row(self, label):
        return None

    def line(self, text):
        pass

    def done(self, label, status, where=None):
        pass


def sol_item(problem, solution, store, label: str | None = None):
    """A batch item (cluster.batch.Item): `bench` of one SOL solution (its solution.json) on the CPU, its
    attempt stored in `store`; named `label`, else the solution's folder."""
    from mini_kv.cluster import batch
    from mini_kv.solexec.run import BenchOptions

    opts = BenchOptions(solution=str(solution), device="cpu", artifacts=str(store))
    return batch.Item(batch.BENCH, label or Path(solution).parent.name, str(problem), None, opts, str(store))


def run_batch(items: list) -> list:
    """The items' results (cluster.batch.ItemResult), evaluated in this process as `bench` of several
    solutions, `verify` of several candidates and `batch` evaluate them, showing nothing."""
    from mini_kv.cluster import batch

    return batch.run_here(items, QuietShow(), lambda item, result: None)


def cmdline(pid: int | str) -> str:
    """The command line of process `pid`, its arguments joined by spaces; "" where it has ended."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_cli(*args, cwd=ROOT, timeout=900, env=None, fresh_process=False):
    """Run `mini-kv ARGS` and return a CompletedProcess (text).

    In this process (mini_kv.cli.main with stdout and stderr captured, from `cwd`) unless `env` is
    given, `fresh_process` is set or MINI_KV_TEST_CLI=subprocess: the command's own workers are fresh
    processes either way (fresh jailed children), so a test saves the few seconds of CPU that a new
    interpreter importing torch costs (about 40 commands in the suite). `env` needs a process of its
    own: the environment key reads it.
    `python -m mini_kv` itself is run by the tests that say `fresh_process=True` and by test_packaging."""
    if env is None and not fresh_process and os.environ.get("MINI_KV_TEST_CLI") != "subprocess":
        return _run_in_process([str(a) for a in args], cwd)
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mini_kv", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def _run_in_process(argv: list[str], cwd) -> subprocess.CompletedProcess:
    import contextlib
    import io

    from mini_kv.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors and --help, as the interpreter maps them
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["mini-kv", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def fuzz_project(tmp_path_factory):
    """For tests/fuzz: a project holding the shipped cards' candidates; fuzzed cards are written into it.
    (Here, not in a tests/fuzz/conftest.py: two modules named `conftest` would shadow each other.)"""
    from fuzz_helpers import card_project

    return card_project(tmp_path_factory.mktemp("fuzz-project"))


@pytest.fixture
def no_memory_cgroup(monkeypatch):
    """Jails made without a memory cgroup whatever this machine allows (as on a GPU machine's container):
    their memory cap is jail.MemoryWatch's, from outside the tree."""
    from mini_kv import jail

    made = jail._groups

    def without_memory(limits):
        groups = made(limits)
        for g in groups:
            if g.is_memory:
                g.remove()
        return [g for g in groups if not g.is_memory]

    monkeypatch.setattr(jail, "_groups", without_memory)
