"""The value comparison of task-card outputs (worker/compare.py): the rule, its edge values, and the
one-pass verdict the post-timing check uses agreeing with the full statistics."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_kv.worker.compare import compare, tensor_errors, values_match

INF, NAN = math.inf, math.nan


def test_an_infinite_error_is_a_mismatch_whatever_rtol_allows():
    # rtol * |inf| is inf, so `diff <= atol + rtol*|ref|` alone would let these through
    errs = tensor_errors(torch.tensor([5.0, INF, -INF]), torch.tensor([INF, -INF, 7.0]), 1e-5, 1e-5)
    assert errs["mismatches"] == 3 and errs["first_mismatch"] == {"index": [0], "got": 5.0, "expected": INF}
    assert not values_match(torch.tensor([5.0]), torch.tensor([INF]), 1e-5, 1e-5)


def test_equal_infinities_and_nan_against_nan_match():
    out = torch.tensor([INF, -INF, NAN, 1.0])
    errs = tensor_errors(out, out.clone(), 0.0, 0.0)
    assert errs["mismatches"] == 0 and errs["max_abs_err"] == 0.0 and errs["max_rel_err"] == 0.0
    assert errs["has_nan"] and errs["has_inf"]
    assert values_match(out, out.clone(), 0.0, 0.0)
    assert tensor_errors(torch.tensor([NAN]), torch.tensor([1.0]), 1.0, 1.0)["mismatches"] == 1


def test_the_verdict_only_compare_returns_the_statistics_on_a_mismatch():
    ref = torch.ones(4)
    assert compare(ref.clone(), ref, 0.0, 0.0, errors=False) == {"ok": True}
    res = compare(ref + 1, ref, 0.0, 0.0, errors=False)
    assert not res["ok"] and res["mismatches"] == 4 and "4 of 4 elements" in res["reason"]


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([0.0, -0.0, 1.0, 1.0 + 1e-6, 1e-30, INF, -INF, NAN]),
)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(values, values), min_size=1, max_size=12),
    atol=st.sampled_from([0.0, 1e-6, 1e-2, 1.0]),
    rtol=st.sampled_from([0.0, 1e-6, 1e-2, 1.0]),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.float64]),
)
def test_values_match_agrees_with_the_full_statistics(pairs, atol, rtol, dtype):
    out = torch.tensor([a for a, _ in pairs], dtype=torch.float64).to(dtype)
    ref = torch.tensor([b for _, b in pairs], dtype=torch.float64).to(dtype)
    assert values_match(out, ref, atol, rtol) == (tensor_errors(out, ref, atol, rtol)["mismatches"] == 0)


def test_values_match_sees_a_mismatch_in_any_chunk():
    from mini_kv.worker.compare import CPU_CHUNK

    ref = torch.zeros(2 * CPU_CHUNK + 5, dtype=torch.float16)
    out = ref.clone()
    assert values_match(out, ref, 0.0, 0.0)
    out[-1] = 1.0  # in the last, partial chunk
    assert not values_match(out, ref, 0.0, 0.0)
    out[-1], out[CPU_CHUNK] = 0.0, INF  # at a chunk's first element
    assert not values_match(out, ref, 0.0, 0.0)
    assert values_match(ref.reshape(1, -1).t(), ref.reshape(-1, 1), 0.0, 0.0)  # not contiguous
