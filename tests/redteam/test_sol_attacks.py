"""The red-team suite, SOL solutions: real candidates that each try one escape from the jail (mini_kv.jail).

`sol/<attack>/` are SOL-ExecBench solutions of tests/sol_solutions/problem whose answer is right only
while their attack failed; `card/` holds C++ task-card candidates that attack from a static initializer
(run by the build's load check and by the worker) or through the compiler's input. The module fixtures
run every attack once, the way `bench` runs several solutions (one batch: one judge kept between them,
a fresh subject each) and `verify` runs a candidate, against a planted world: a fake
$HOME full of secrets, a secret environment variable, a TCP and a unix-socket listener on the host, a
file in the host's /tmp, the artifact store, the project's .build/. Each test then asserts that its
attack failed, seen from the host, and that mini_kv ended with a normal verdict (never a crash).

CI runs this directory as root and as an unprivileged user (.ci/run). Without a jail on the machine
every test skips itself, naming why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_batch
from redteam_world import (
    FAST,
    HERE,
    INFO,
    PROBLEM,
    SOL_ATTACKS,
    alive,
    copy_filled,
    escaped_files,
    planted_world,
    statuses,
    store_leaks,
)

from mini_kv.solexec.run import BenchOptions, bench

pytestmark = pytest.mark.skipif(not INFO.enabled, reason=f"no jail on this machine: {INFO.reason}")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with planted_world(tmp_path_factory.mktemp("redteam")) as w:
        yield w


@pytest.fixture(scope="module")
def sol_runs(world):
    """Every SOL attack benched once, from the project, as `bench` runs several solutions there: one
    batch, one judge kept between them (runner.KeptJudges), a fresh subject each."""
    from mini_kv.cluster import batch

    items = []
    for name in SOL_ATTACKS:
        dest = world["base"] / "sols" / name
        copy_filled(HERE / "sol" / name, dest, world)
        opts = BenchOptions(solution=str(dest / "solution.json"), artifacts=str(world["store"]), **FAST)
        items.append(batch.Item(batch.BENCH, name, str(PROBLEM), None, opts, str(world["store"])))
    here = os.getcwd()
    os.chdir(world["project"])
    try:
        results = run_batch(items)
    finally:
        os.chdir(here)
    return {item.label: {"result": result.detail} for item, result in zip(items, results, strict=True)}


# SOL attacks that may end otherwise than PASSED when the jail holds: past the worker's file-size cap a
# write fails (EFBIG: Python ignores SIGXFSZ), which the candidate may or may not survive
EXPECTED = {"flood_output": {"PASSED", "RUNTIME_ERROR"}}


@pytest.mark.parametrize("name", SOL_ATTACKS)
def test_sol_attack_fails_with_a_normal_verdict(name, world, sol_runs):
    result = sol_runs[name]["result"]
    assert result.traces, result  # a normal result, not a crash of mini_kv
    got = statuses(result)
    assert got <= EXPECTED.get(name, {"PASSED"}), {t.workload.uuid: t.evaluation for t in result.traces}
    assert escaped_files(world) == []
    assert world["listener"].calls == []
    assert store_leaks(world) == []
    assert world["sentinel"].poll() is None, "a process outside the jail was killed"
    assert not alive(f"sleep {world['sleep_mark']}"), "a daemon outlived the run"


def test_the_flood_is_cut_and_the_archive_keeps_a_bounded_log(world, sol_runs):
    from mini_kv.store.atomic import LOG_CAP

    attempt = Path(sol_runs["flood_output"]["result"].attempt)
    log = attempt / "logs" / "worker.log"
    assert log.is_file() and log.stat().st_size <= LOG_CAP + 1024
    assert b"bytes of this log dropped here" in log.read_bytes()


def test_the_fork_bomb_met_the_process_cap(world, sol_runs):
    """The fork bomb's answer is right only when it could not start FORKS processes: PASSED says the cap
    bound (a pids cgroup as root, RLIMIT_NPROC for a non-zero uid)."""
    assert statuses(sol_runs["fork_bomb"]["result"]) == {"PASSED"}


def test_the_suite_runs_every_attack_in_a_jail_with_every_layer_recorded(world, sol_runs):
    assert len(SOL_ATTACKS) >= 20
    for name, run in sol_runs.items():
        corr = json.loads((Path(run["result"].attempt) / "correctness.json").read_text())
        assert corr["sandbox"]["enabled"] is True, name
        # (the stored layers are in key order, `missing` in the jail's order of layers)
        assert sorted(corr["sandbox"]["missing"]) == sorted(
            n for n, s in corr["sandbox"]["layers"].items() if s != "active"
        )


@pytest.mark.parametrize("name", ["write_home", "tcp_loopback", "env_secrets"])
def test_the_control_without_the_jail_each_attack_escapes(name, tmp_path):
    """The attacks are real: with --sandbox off the same solution escapes, and the verdict shows it."""
    with planted_world(tmp_path) as w:
        dest = tmp_path / "sols" / name
        copy_filled(HERE / "sol" / name, dest, w)
        opts = BenchOptions(
            solution=str(dest / "solution.json"), artifacts=str(w["store"]), sandbox="off", **FAST
        )
        result = bench(str(PROBLEM), opts)
        assert statuses(result) == {"INCORRECT_NUMERICAL"}, result
        assert escaped_files(w) or w["listener"].calls or name == "env_secrets"
