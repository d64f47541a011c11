"""Fuzzing what a candidate can output (issue 35 finding 8): generated output tensors (values, dtypes,
shapes, NaN/Inf, garbage bits) through the comparisons and the trace writer.

Properties: the SOL comparison (worker.compare.compare_matched) and the task-card one (worker.compare.compare)
never raise; the SOL one's errors are finite non-negative numbers whatever the output holds, its
verdict agrees with its counts, and the trace built from it (PASSED or INCORRECT_NUMERICAL) is strict
JSON; a wrong shape, dtype or type is a verdict (not ok, with a reason), never an exception."""

from __future__ import annotations

import math

import torch
from fuzz_settings import examples
from hypothesis import example, given
from hypothesis import strategies as st

from mini_kv.solexec import traces
from mini_kv.worker import compare as card_compare
from mini_kv.worker.compare import compare_matched

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8, torch.uint8]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e38, -1e38, 3.4e38, 1e37, 1e30, 1e-45, 65504.0, 1e300]
ENV = {"hardware": "cpu", "libs": {}}
PERF = {"latency_ms": 1.0, "reference_latency_ms": 1.0, "speedup_factor": 1.0}

shapes = st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.sampled_from(SPECIALS))


@st.composite
def tensor(draw, shape=None, dtype=None):
    """A tensor of any listed dtype: drawn values (NaN, Inf, huge, tiny) or raw garbage bits."""
    shape = draw(shapes) if shape is None else shape
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    n = math.prod(shape)
    if n and draw(st.booleans()):  # garbage: whatever bits uninitialised memory holds
        raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone()
    vals = draw(st.lists(values, min_size=n, max_size=n))
    t = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    if dtype.is_floating_point:
        return t.to(dtype)
    info = torch.iinfo(dtype)
    return torch.nan_to_num(t, nan=0.0, posinf=info.max, neginf=info.min).clamp(info.min, info.max).to(dtype)


tolerances = st.fixed_dictionaries(
    {
        "max_atol": st.sampled_from([0.0, 1e-5, 1e-2, 1.0]),
        "max_rtol": st.sampled_from([0.0, 1e-3, 1e-2, 0.5]),
        "required_matched_ratio": st.sampled_from([0.0, 0.5, 0.99, 1.0]),
        "max_error_cap": st.sampled_from([None, 0.0, 1.0, 1e30]),
        "allow_negative_inf": st.booleans(),
    }
)


@st.composite
def pairs(draw):
    """(output, reference) of one shape and dtype, the output often the reference with a few elements changed."""
    ref = draw(tensor())
    if draw(st.booleans()):
        return draw(tensor(shape=tuple(ref.shape), dtype=ref.dtype)), ref
    out = ref.clone().reshape(-1)
    for i in draw(st.lists(st.integers(0, max(0, out.numel() - 1)), max_size=4)) if out.numel() else []:
        out[i] = draw(tensor(shape=(), dtype=ref.dtype))
    return out.reshape(ref.shape), ref


TOL = {"max_atol": 1e-2, "max_rtol": 1e-2, "required_matched_ratio": 0.99, "max_error_cap": None}


@examples(1.0)
@given(pairs(), tolerances)
# the three outputs that crashed bench (finding 8): 1e38 against 0, float32's extremes whose difference
# overflows float32, a few 1e37s where the reference is 0
@example((torch.tensor([1e38, 1e38]), torch.tensor([0.0, 1.0])), {**TOL, "allow_negative_inf": False})
@example((torch.tensor([3.4e38]), torch.tensor([-3.4e38])), {**TOL, "allow_negative_inf": False})
@example(
    (torch.cat([torch.full((3,), 1e37), torch.ones(997)]), torch.cat([torch.zeros(3), torch.ones(997)])),
    {**TOL, "allow_negative_inf": False},
)
def test_the_sol_comparison_and_the_trace_writer_never_raise(pair, tol):
    out, ref = pair
    res = compare_matched(out, ref, tol)
    for key in ("max_absolute_error", "max_relative_error"):
        assert (
            isinstance(getattr(res, key), float)
            and math.isfinite(getattr(res, key))
            and getattr(res, key) >= 0
        ), (key, res)
    assert 0.0 <= res.matched_ratio <= 1.0
    assert res.ok is (res.reason is None)
    if res.ok:
        assert res.matched_ratio >= tol["required_matched_ratio"]
    corr = {**vars(res), "extra": {"matched_ratio": res.matched_ratio}}
    status, perf = ("PASSED", PERF) if res.ok else ("INCORRECT_NUMERICAL", None)
    traces.dumps(traces.make_trace("d", {"uuid": "u"}, "s", status, ENV, res.reason or "", corr, perf))


@examples(1.0)
@given(tensor(), tensor(), st.sampled_from([0.0, 1e-3, 1.0]), st.sampled_from([0.0, 1e-3, 1.0]))
def test_the_task_card_comparison_never_raises_and_mismatches_are_verdicts(out, ref, atol, rtol):
    res = card_compare.compare(out, ref, atol, rtol)
    assert isinstance(res.ok, bool)
    if out.shape != ref.shape or out.dtype != ref.dtype:
        assert not res.ok and res.reason
    else:
        # the verdict alone (the post-timing check's) is the same verdict
        assert res.ok is card_compare.compare(out, ref, atol, rtol, errors=False).ok


@examples(0.5)
@given(st.sampled_from([None, 1, 1.5, "x", [1.0], object()]), tensor())
def test_an_output_that_is_not_a_tensor_is_a_verdict(out, ref):
    res = card_compare.compare(out, ref, 0.0, 0.0)
    assert res.ok is False and "expected exactly torch.Tensor" in res.reason
