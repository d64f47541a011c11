"""Builds ahead of evaluation (cluster.prebuild): only where timing is on a GPU, and the same verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from mini_kv.cluster import batch, prebuild

ROOT = Path(__file__).resolve().parents[1]


def test_builds_overlap_evaluation_only_for_several_gpu_items():
    assert prebuild.overlaps_evaluation({"cuda", "cuda:1"}, 2)
    assert not prebuild.overlaps_evaluation({"cuda"}, 1)  # nothing to overlap with
    assert not prebuild.overlaps_evaluation({"cpu", "cuda"}, 3)  # a compiler beside CPU timing: never


class _Show:
    def row(self, label):
        return None

    def line(self, text):
        pass

    def done(self, label, status, where=None):
        pass


@pytest.mark.slow
def test_a_batch_with_builds_ahead_gives_the_same_verdicts(monkeypatch, tmp_path):
    from mini_kv.pipeline import VerifyOptions

    built = []
    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    real = batch.build_item
    monkeypatch.setattr(batch, "build_item", lambda item: built.append(item.candidate) or real(item))
    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    items = [
        batch.Item(
            batch.VERIFY, f"vector_add/{c}", str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path)
        )
        for c in ("v0_naive", "v1_vectorized")
    ]
    import mini_kv.pipeline as pipeline

    order, real_stages, real_ahead = [], pipeline.run_stages, batch.Ready.ahead

    def stages(door, *args, prepared=None, **kw):
        order.append(("run", door.cand.id, prepared is not None, door.warm is not None))
        return real_stages(door, *args, prepared=prepared, **kw)

    def ahead(item):
        order.append(("ahead", item.candidate))
        return real_ahead(item)

    monkeypatch.setattr(pipeline, "run_stages", stages)
    monkeypatch.setattr(batch.Ready, "ahead", staticmethod(ahead))
    seen = []
    results = batch.run_here(items, _Show(), lambda item, result: seen.append(item.candidate))
    assert sorted(built) == ["v0_naive", "v1_vectorized"]  # both builds were started ahead
    assert seen == ["v0_naive", "v1_vectorized"]  # evaluated in order, one at a time
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    assert all(r.detail.compile.cache_hit for r in results)  # the evaluation found the build made ahead
    # the second item was prepared (its worker started) before the first was evaluated, and its run
    # used that door and worker; the first item, with nothing before it, prepared in its own run
    assert order == [
        ("ahead", "v1_vectorized"),
        ("run", "v0_naive", False, False),
        ("run", "v1_vectorized", True, True),
    ]


def test_an_item_that_cannot_be_prepared_ahead_meets_its_error_in_its_own_turn(monkeypatch, tmp_path):
    from mini_kv.pipeline import VerifyOptions

    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    monkeypatch.setattr(batch, "build_item", lambda item: None)
    good = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    card = str(ROOT / "tasks/vector_add.yaml")
    items = [
        batch.Item(batch.VERIFY, "ok", card, "v0_naive", good, str(tmp_path)),
        batch.Item(batch.VERIFY, "bad", card, "no_such_candidate", good, str(tmp_path)),
    ]
    assert batch.Ready.ahead(items[1]) is None  # the look-ahead swallows it ...
    finished = batch.evaluate_here(items)
    item, first = next(finished)
    assert first.status == "PASSED"
    with pytest.raises(Exception, match="no_such_candidate"):  # ... and the item's own run raises it
        next(finished)


def test_a_batch_stopped_early_ends_the_worker_it_prepared_ahead(monkeypatch, tmp_path):
    from mini_kv.pipeline import VerifyOptions

    monkeypatch.setattr(prebuild, "overlaps_evaluation", lambda devices, count: True)
    monkeypatch.setattr(batch, "build_item", lambda item: None)
    opts = VerifyOptions(device="cpu", skip_benchmark=True, case_filter=["n31"], artifacts=str(tmp_path))
    items = [
        batch.Item(batch.VERIFY, c, str(ROOT / "tasks/vector_add.yaml"), c, opts, str(tmp_path))
        for c in ("v0_naive", "v1_vectorized")
    ]
    prepared = []
    real_ahead = batch.Ready.ahead
    monkeypatch.setattr(
        batch.Ready, "ahead", staticmethod(lambda item: prepared.append(real_ahead(item)) or prepared[-1])
    )
    finished = batch.evaluate_here(items)
    next(finished)
    (ready,) = prepared
    proc = ready.door.warm.proc
    assert proc.poll() is None  # the second item's worker is up, waiting for its job
    finished.close()  # -x after the first item, or Ctrl-C
    assert proc.wait(timeout=30) is not None and ready.door.warm is None


def test_a_door_prepared_ahead_touches_nothing_on_the_gpu(monkeypatch, tmp_path):
    """Ahead (while another item may be timing): the worker starts without CUPTI's warm-up (a CUDA
    context), and a bandwidth that is not cached yet is not measured (a probe on the GPU): the item is
    prepared in its own turn instead."""
    import mini_kv.pipeline as pipeline
    from mini_kv import environment
    from mini_kv.solexec import run as sol_run
    from mini_kv.solexec.run import BenchOptions, sol_door

    started = []

    class Child:  # stands in for the jailed worker (runner.ChildRun)
        def __init__(self, job, log, env, warm_profiler=False, sandbox=None, spec=None):
            started.append(warm_profiler)

        def close(self, kill):
            pass

    monkeypatch.setattr(sol_run, "ChildRun", Child)
    monkeypatch.setattr(environment, "pick_device", lambda d: "cuda:0")
    monkeypatch.setattr(sol_run, "check_timing_options", lambda *a: None)
    monkeypatch.setattr(sol_run, "check_memory", lambda *a: None)  # the GPU's memory, through torch
    opts = BenchOptions(
        solution=str(ROOT / "solutions/rmsnorm/pytorch/solution.json"), device="cuda", artifacts=str(tmp_path)
    )
    door = sol_door(str(ROOT / "problems/sol-execbench/rmsnorm"), opts)
    with pytest.raises(pipeline.NotAhead, match="not measured yet"):
        door.prepare(ahead=True)
    door.close()
    assert started == [False]  # no --warm-profiler: no CUDA context before its job
    assert (
        batch.Ready.ahead(
            batch.Item(
                batch.BENCH, "r", str(ROOT / "problems/sol-execbench/rmsnorm"), None, opts, str(tmp_path)
            )
        )
        is None
    )
    assert started == [False, False]


def test_ctrl_c_while_preparing_ahead_ends_that_worker_and_stops_the_batch(monkeypatch):
    closed = []

    class Door:
        def prepare(self, ahead=False):
            raise KeyboardInterrupt

        def close(self):
            closed.append(True)

    monkeypatch.setattr(batch, "door_of", lambda item: Door())
    with pytest.raises(KeyboardInterrupt):
        batch.Ready.ahead(None)
    assert closed == [True]
