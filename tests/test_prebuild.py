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

    order, real_stages, real_door = [], pipeline.run_stages, batch.door_of

    def stages(door, *args, **kw):
        order.append(("run", door.cand.id))
        try:
            return real_stages(door, *args, **kw)
        finally:
            order.append(("done", door.cand.id))

    def door_of(item):
        order.append(("door", item.candidate))
        return real_door(item)

    monkeypatch.setattr(pipeline, "run_stages", stages)
    monkeypatch.setattr(batch, "door_of", door_of)
    seen = []
    results = batch.run_here(items, _Show(), lambda item, result: seen.append(item.candidate))
    assert sorted(built) == ["v0_naive", "v1_vectorized"]  # both builds were started ahead
    assert seen == ["v0_naive", "v1_vectorized"]  # evaluated in order, one at a time
    assert [r.status for r in results] == ["PASSED", "PASSED"]
    assert all(r.detail.compile.cache_hit for r in results)  # the evaluation found the build made ahead
    # each item's door (its judge and subject) is made in its own turn, after the item before it ended:
    # a worker's start (Python, torch) beside another item's timing shifts that timing
    assert order == [
        ("door", "v0_naive"),
        ("run", "v0_naive"),
        ("done", "v0_naive"),
        ("door", "v1_vectorized"),
        ("run", "v1_vectorized"),
        ("done", "v1_vectorized"),
    ]
