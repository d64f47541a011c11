"""The regression gate's confirmation batch is a real, independent re-measurement in a fresh worker."""

from pathlib import Path

import pytest

from mini_kv.build.compiler import compile_candidate
from mini_kv.load.task_card import load_task_card
from mini_kv.pipeline import VerifyOptions, _confirmation_batch, _job


@pytest.mark.slow
def test_confirmation_batch_remeasures_one_case():
    card = load_task_card("tasks/vector_add.yaml")
    cand = card.candidate("v0_naive")
    comp = compile_candidate(Path(card.project_root), cand, with_cuda=False)
    assert comp["status"] == "ok"
    opts = VerifyOptions(device="cpu")
    job = _job(card, cand, comp["library"], "cpu", opts, salt="s")
    job["benchmark"] = {**job["benchmark"], "repeats": 2, "samples": 10, "warmup": 1}
    samples = _confirmation_batch(job, opts, card, None)("bench_cpu_64k-float32")
    assert len(samples) == 2 and all(len(r) == 10 for r in samples)
    assert all(x > 0 for r in samples for x in r)
