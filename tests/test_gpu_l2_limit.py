"""The persisting-L2 limit is 0 before every timed call (timing.L2Flusher), hot and cold: a set-aside a
candidate made, with an access-policy window on its data, would keep those lines through the flush."""

from __future__ import annotations

import pytest
import torch

from mini_kv.worker import timing

pytestmark = pytest.mark.gpu


@pytest.fixture
def limit():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.zeros(1, device="cuda")  # a context for the runtime calls
    set_limit, get_limit, how = timing.persisting_l2_limit()
    assert set_limit is not None, how
    if set_limit(1 << 20) != 0:
        pytest.skip("this device has no persisting L2 set-aside")
    assert get_limit() > 0  # the device rounds it to its set-aside granularity (H200: 3.75 MiB)
    return get_limit


@pytest.mark.parametrize("cold", [False, True])
def test_the_flusher_leaves_no_persisting_l2_limit(limit, cold):
    flush = timing.L2Flusher("cuda", cold)
    flush()
    assert limit() == 0
    assert "SetLimit" in flush.describe().persisting_l2_limit


def test_every_timed_call_starts_with_the_limit_at_zero(limit):
    set_limit = timing.persisting_l2_limit()[0]
    seen = []

    def call():
        seen.append(limit())
        set_limit(1 << 20)  # what a candidate would do in every call
        torch.ones(1024, device="cuda").sum()

    for method in ("events", "cupti"):
        seen.clear()
        timing.measure([call], method, 5, "cuda", timing.L2Flusher("cuda", False))
        assert seen == [0] * len(seen) and seen, (method, seen)
