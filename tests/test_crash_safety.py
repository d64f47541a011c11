"""Crash safety and concurrency of the attempt store and its index.

Children (separate processes, from a multiprocessing forkserver) write attempts and index updates in a
loop; the parent SIGKILLs them at random points and then checks that the store is still sound. A child
signals when it is ready and waits for "go", so the kills land in the writing loop, not in start-up.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
from test_index import snapshot

from mini_kv.store.attempts import PARTIAL, read_attempt
from mini_kv.store.index import rebuild_index

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@functools.cache
def _records(seed: int) -> dict:
    """Real records (consistent with their headline) of both tasks, made once per seed in this process
    (about 2 s) and handed to every child that writes with it: the children's loop only writes and indexes."""
    from test_index import attempt_records

    return {task: attempt_records(task, seed=seed, repeats=2, n=10) for task in ("vector_add", "rmsnorm")}


def _child_loop(art: str, name: str, seed: int, count: int, rebuild_p: float, records, ready, go) -> None:
    """Write attempts and index updates: forever (count < 0) or `count` times."""
    from test_index import write_attempt

    from mini_kv.load.schema import load_schema
    from mini_kv.store.index import rebuild_index, update_index

    rnd = random.Random(seed)
    for schema in ("attempt", "correctness", "benchmark"):  # built once per process, in start-up
        load_schema(schema)
    ready.set()
    go.wait()
    i = 0
    while count < 0 or i < count:
        task = "vector_add" if i % 3 else "rmsnorm"
        a = write_attempt(Path(art), task, name, *records[task], log_text="x" * rnd.randrange(1, 100_000))
        update_index(art, a)
        if rnd.random() < rebuild_p:
            rebuild_index(art)
        i += 1


@pytest.fixture(scope="module")
def ctx():
    # forkserver: every child is a fresh process forked from a clean server that has the store modules
    # imported already (not from this pytest process), so starting one costs milliseconds, not an interpreter
    c = multiprocessing.get_context("forkserver")
    c.set_forkserver_preload(
        [
            "jsonschema",
            "filelock",
            "sqlite3",
            "numpy",
            "mini_kv.load.schema",
            "mini_kv.store.index",
            "mini_kv.store.headline",
            "mini_kv.environment",
            "mini_kv.worker.inputs",
            "test_index",
            "pytest",
            __name__,
        ]
    )
    return c


def _start(ctx, art: Path, name: str, seed: int, count: int = -1, rebuild_p: float = 0.15):
    ready, go = ctx.Event(), ctx.Event()
    records = _records(seed % 4)  # four sets of records serve every child
    proc = ctx.Process(
        target=_child_loop, args=(str(art), name, seed, count, rebuild_p, records, ready, go), daemon=True
    )
    proc.start()
    assert ready.wait(60), "child did not start"
    return proc, go


def _dirs(art: Path) -> tuple[set[str], set[str]]:
    """(names of committed attempt dirs, names of .partial dirs)."""
    committed, partial = set(), set()
    for task in art.iterdir():
        if task.is_dir() and not task.name.startswith("."):
            for d in task.iterdir():
                (partial if d.name.endswith(PARTIAL) else committed).add(d.name)
    return committed, partial


def _check_store(art: Path, previously: set[str], rebuild: bool = True) -> set[str]:
    """After a kill: every attempt committed since the last check is whole (committed attempts never
    change, so each is read once), none is lost, the live index holds only committed attempts; with
    `rebuild`, a rebuilt index holds exactly the committed ones and finds nothing but the .partial dirs
    (that scan reads the whole store, so a long run does it every few kills and at the end)."""
    committed, partial = _dirs(art)
    for task in art.iterdir():
        if task.is_dir() and not task.name.startswith("."):
            for d in task.iterdir():
                if not d.name.endswith(PARTIAL) and d.name not in previously:
                    read_attempt(d)
    assert previously <= committed, f"attempts lost: {previously - committed}"
    if (art / "index.sqlite").exists():
        live = set(snapshot(art))  # the live index opens and holds only committed attempts
        assert live <= committed
        assert not any(a + PARTIAL in partial for a in live)
    if rebuild:
        result = rebuild_index(art)
        assert set(snapshot(art)) == committed
        assert {p.kind for p in result.problems} <= {"partial"}
        assert {Path(p.path).name for p in result.problems} == partial
    return committed


def test_sigkill_at_random_points_never_breaks_the_store(tmp_path, ctx):
    art = tmp_path / "artifacts"
    art.mkdir()
    rnd = random.Random(1234)
    rounds = 50
    t0 = time.monotonic()
    committed: set[str] = set()
    partials: set[str] = set()
    kills_mid_write = 0
    for r in range(rounds):
        proc, go = _start(ctx, art, f"c{r % 4}", r)
        go.set()
        time.sleep(rnd.uniform(0.0, 0.2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL, proc.exitcode  # killed, not crashed on its own
        committed = _check_store(art, committed, rebuild=r % 5 == 4)  # the last round (49) rebuilds
        now = _dirs(art)[1]
        kills_mid_write += bool(now - partials)  # this kill interrupted an attempt being written
        partials = now
    # the children did real work between kills (an attempt is 5 fsynced files plus its index update, so
    # about one per two rounds on a busy machine)
    assert len(committed) >= rounds // 4
    assert kills_mid_write >= 5  # and many kills landed in the middle of writing an attempt
    assert time.monotonic() - t0 < 60
    print(f"{rounds} kills, {len(committed)} attempts, {kills_mid_write} kills left a .partial dir")


def test_four_concurrent_writers_leave_an_index_equal_to_a_rebuild(tmp_path, ctx):
    art = tmp_path / "artifacts"
    art.mkdir()
    per_child = 8
    children = [_start(ctx, art, f"w{i}", 100 + i, count=per_child, rebuild_p=0.1) for i in range(4)]
    for _, go in children:  # start them together
        go.set()
    for proc, _ in children:
        proc.join(120)
        assert proc.exitcode == 0
    committed, partial = _dirs(art)
    assert len(committed) == 4 * per_child and not partial
    live = snapshot(art)
    rebuild_index(art)
    assert snapshot(art) == live
    assert set(live) == committed
