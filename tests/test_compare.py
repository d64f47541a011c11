"""The value comparison of task-card outputs (worker/compare.py): the rule, its edge values, the
one-pass verdict the post-timing check uses agreeing with the full statistics, and the statistics
(and the degenerate-output check) computed in CPU chunks equal to the whole-tensor formulas."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_kv.worker import compare as compare_mod
from mini_kv.worker.compare import Compared, compare, tensor_errors, values_match
from mini_kv.worker.integrity import MAX_MEDIAN_REL, MIN_SMALL, degenerate

INF, NAN = math.inf, math.nan


def test_an_infinite_error_is_a_mismatch_whatever_rtol_allows():
    # rtol * |inf| is inf, so `diff <= atol + rtol*|ref|` alone would let these through
    errs = tensor_errors(torch.tensor([5.0, INF, -INF]), torch.tensor([INF, -INF, 7.0]), 1e-5, 1e-5)
    assert errs.mismatches == 3 and errs.first_mismatch == {"index": [0], "got": 5.0, "expected": INF}
    assert not values_match(torch.tensor([5.0]), torch.tensor([INF]), 1e-5, 1e-5)


def test_equal_infinities_and_nan_against_nan_match():
    out = torch.tensor([INF, -INF, NAN, 1.0])
    errs = tensor_errors(out, out.clone(), 0.0, 0.0)
    assert errs.mismatches == 0 and errs.max_abs_err == 0.0 and errs.max_rel_err == 0.0
    assert errs.has_nan and errs.has_inf
    assert values_match(out, out.clone(), 0.0, 0.0)
    assert tensor_errors(torch.tensor([NAN]), torch.tensor([1.0]), 1.0, 1.0).mismatches == 1


def test_the_verdict_only_compare_returns_the_statistics_on_a_mismatch():
    ref = torch.ones(4)
    assert compare(ref.clone(), ref, 0.0, 0.0, errors=False) == Compared(True)
    res = compare(ref + 1, ref, 0.0, 0.0, errors=False)
    assert not res.ok and res.errors.mismatches == 4 and "4 of 4 elements" in res.reason


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
    assert values_match(out, ref, atol, rtol) == (tensor_errors(out, ref, atol, rtol).mismatches == 0)


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


def test_the_verdict_alone_is_compares_verdict_without_the_statistics():
    ref = torch.ones(4)

    def ok(out, atol, rtol):
        return compare(out, ref, atol, rtol, errors=False).ok

    assert ok(ref.clone(), 0.0, 0.0) and not ok(ref + 1, 0.0, 0.0)
    assert not ok(ref.double(), 1.0, 1.0)  # dtype
    assert not ok(ref[:3].clone(), 1.0, 1.0)  # shape
    assert not ok([1.0] * 4, 1.0, 1.0)  # not a tensor
    assert compare(ref.clone(), ref, 0.0, 0.0, errors=False).errors is None  # no statistics computed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=0, max_size=4), st.data())
def test_unravel_agrees_with_torchs_unravel_index(shape, data):
    numel = math.prod(shape)
    flat = data.draw(st.integers(0, numel - 1))
    want = [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))] if shape else []
    assert compare_mod.unravel(flat, tuple(shape)) == want


def test_values_of_different_shapes_are_not_compared():
    with pytest.raises(ValueError, match=r"shape \[4\] with \[2, 2\]"):
        tensor_errors(torch.ones(4), torch.ones(2, 2), 0.0, 0.0)


# ------------------------------------------------------ chunked statistics == the whole-tensor formulas


def whole_tensor_errors(out, ref, atol, rtol):
    """tensor_errors as it was before the CPU chunks: the oracle."""
    if out.numel() == 0:
        return {
            "max_abs_err": 0.0,
            "max_rel_err": 0.0,
            "mismatches": 0,
            "first_mismatch": None,
            "numel": 0,
            "has_nan": False,
            "has_inf": False,
        }
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    same = (o == r) | (o.isnan() & r.isnan())
    diff = (o - r).abs_().masked_fill_(same, 0.0)
    ra = r.abs()
    bad = (~(diff <= ra * rtol + atol) | diff.isinf()) & ~same
    finite = torch.isfinite(diff)
    rel = (diff / ra.clamp_min_(torch.finfo(torch.float64).tiny)).masked_fill_(same, 0.0)
    n_bad = int(bad.sum())
    first = None
    if n_bad:
        flat = int(bad.flatten().nonzero()[0])
        idx = list(torch.unravel_index(torch.tensor(flat), bad.shape)) if bad.dim() else []
        first = {
            "index": [int(i) for i in idx],
            "got": float(o.flatten()[flat]),
            "expected": float(r.flatten()[flat]),
        }
    return {
        "max_abs_err": float(diff[finite].max()) if finite.any() else float("inf"),
        "max_rel_err": float(rel[finite].max()) if finite.any() else float("inf"),
        "mismatches": n_bad,
        "first_mismatch": first,
        "numel": out.numel(),
        "has_nan": bool(o.isnan().any()),
        "has_inf": bool(o.isinf().any()),
    }


def whole_tensor_degenerate(out, ref, atol):
    """integrity.degenerate as it was before the CPU chunks: the oracle."""
    if out.numel() < 2 or not (out.is_floating_point() and ref.is_floating_point()):
        return None
    o = out.detach().reshape(-1).to(torch.float64)
    r = ref.detach().reshape(-1).to(device=o.device, dtype=torch.float64)
    fin = torch.isfinite(r) & torch.isfinite(o)
    if int(fin.sum()) < 2:
        return None
    o, r = o[fin], r[fin]
    ref_varies = bool((r != r[0]).any())
    if ref_varies and not bool((o != o[0]).any()):
        what = "all zeros" if float(o[0]) == 0.0 else f"the constant {float(o[0]):g}"
        return f"the output is {what} while the reference varies"
    small = (r != 0) & (r.abs() <= atol)
    if int(small.sum()) >= MIN_SMALL and int(small.sum()) * 2 >= int((r != 0).sum()):
        rel = ((o[small] - r[small]).abs() / r[small].abs()).median()
        if float(rel) > MAX_MEDIAN_REL:
            return (
                f"where the reference is below atol={atol:g} ({int(small.sum())} elements) the output's "
                f"median relative error is {float(rel):.3g}: it passes the absolute tolerance without "
                "carrying the values"
            )
    return None


def bits(x):
    """x with every float as its exact bit pattern (NaN equal to NaN, -0.0 apart from 0.0) and every
    other scalar with its type (True is not 1)."""
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if isinstance(x, list):
        return [bits(v) for v in x]
    return x.hex() if isinstance(x, float) else (type(x).__name__, x)


FLOAT_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
# special values, values near each other and values below the degenerate check's atol
edge_values = st.one_of(
    values,
    st.sampled_from([1e-3, -1e-3, 2e-3, 5e-4, 0.25, 2.0, 1e4]),
)


def laid_out(vals: list, shape: list, dtype: torch.dtype, layout: str) -> torch.Tensor:
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    if layout == "permuted" and len(shape) > 1:  # non-contiguous: the last dims are strided
        return t.reshape(shape[::-1]).permute(*reversed(range(len(shape))))
    if layout == "strided":  # every other element of a larger buffer
        buf = torch.zeros(len(vals), 2, dtype=dtype)
        buf[:, 0] = t
        return buf[:, 0].reshape(shape)
    return t.reshape(shape)


@st.composite
def tensor_pairs(draw):
    """(out, ref) of one shape (0-d, empty, up to 3 dims crossing small chunk sizes), any float dtype
    each, any layout each, with pairs of equal, near and unrelated values (NaN, ±inf, ±0 among them)."""
    shape = draw(st.lists(st.integers(0, 6), max_size=3))
    n = math.prod(shape)
    refs = edge_values
    if draw(st.booleans()):  # a reference mostly below the degenerate check's atol
        refs = st.sampled_from([1e-3, -1e-3, 5e-4, 2e-3, 0.0, 0.0, 1.0])
    pair = st.one_of(
        st.tuples(edge_values, refs), refs.map(lambda v: (v, v)), refs.map(lambda v: (v * 1.5, v))
    )
    pairs = draw(st.lists(pair, min_size=n, max_size=n))
    if n and draw(st.booleans()):  # one value everywhere: the degenerate check's constant output
        pairs = [(pairs[0][0], b) for _, b in pairs]
    layouts = st.sampled_from(["contiguous", "permuted", "strided"])
    out = laid_out([a for a, _ in pairs], shape, draw(st.sampled_from(FLOAT_DTYPES)), draw(layouts))
    ref = laid_out([b for _, b in pairs], shape, draw(st.sampled_from(FLOAT_DTYPES)), draw(layouts))
    return out, ref


chunk_sizes = st.sampled_from([1, 2, 3, 7, 16, compare_mod.CPU_CHUNK])
tolerances = st.sampled_from([0.0, 1e-6, 1e-2, 1.0])


@settings(max_examples=500, deadline=None)
@given(pair=tensor_pairs(), atol=tolerances, rtol=tolerances, chunk=chunk_sizes)
def test_chunked_statistics_equal_the_whole_tensor_formula(pair, atol, rtol, chunk):
    out, ref = pair
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare_mod, "CPU_CHUNK", chunk)
        got = tensor_errors(out, ref, atol, rtol)
        verdict = values_match(out, ref, atol, rtol)
    want = whole_tensor_errors(out, ref, atol, rtol)
    assert bits(vars(got)) == bits(want)
    assert verdict == (want["mismatches"] == 0)


@settings(max_examples=500, deadline=None)
@given(pair=tensor_pairs(), atol=st.sampled_from([0.0, 1e-2, 1.0, 10.0]), chunk=chunk_sizes)
def test_chunked_degenerate_check_equals_the_whole_tensor_one(pair, atol, chunk):
    out, ref = pair
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare_mod, "CPU_CHUNK", chunk)
        got = degenerate(out, ref, atol)
    assert got == whole_tensor_degenerate(out, ref, atol)


def test_the_chunked_checks_see_every_branch_across_chunks(monkeypatch):
    """The cases the random ones may miss, each spread over several chunks of 3."""
    monkeypatch.setattr(compare_mod, "CPU_CHUNK", 3)
    ref = torch.arange(1.0, 11.0)
    out = ref.clone()
    out[0], out[7], out[8] = NAN, 100.0, INF  # mismatches in the first and the third chunk
    errs = tensor_errors(out.reshape(2, 5), ref.reshape(2, 5), 0.0, 0.0)
    assert bits(vars(errs)) == bits(whole_tensor_errors(out.reshape(2, 5), ref.reshape(2, 5), 0.0, 0.0))
    assert errs.mismatches == 3 and errs.first_mismatch["index"] == [0, 0]
    assert errs.max_abs_err == 92.0 and errs.has_nan and errs.has_inf
    # the first finite element is in the second chunk; the output is that constant after it
    out = torch.tensor([NAN, INF, -INF, 4.0, 4.0, 4.0, NAN, 4.0])
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 5.0, 4.5])
    assert degenerate(out, ref, 1.0) == "the output is the constant 4 while the reference varies"
    # more than half of the reference below atol, in every chunk: the median relative error there
    ref = torch.full((40,), 1e-3)
    ref[::4] = 1.0
    out = torch.where(ref < 0.5, torch.zeros(40), ref) + torch.linspace(0, 1e-4, 40)
    why = degenerate(out, ref, 1e-2)
    assert why == whole_tensor_degenerate(out, ref, 1e-2) and "30 elements" in why
    # exactly half of the nonzero reference below atol (16 of 32) is enough
    ref = torch.tensor([1e-3, 1.0] * 16 + [0.0] * 5)
    why = degenerate(torch.where(ref < 0.5, 0.0, ref), ref, 1e-2)
    assert (
        why == whole_tensor_degenerate(torch.where(ref < 0.5, 0.0, ref), ref, 1e-2) and "(16 elements)" in why
    )


def test_every_watched_harness_name_exists():
    """The names the tamper check watches (integrity.WATCHED_MODULES) are the harness's own: one removed
    or renamed fails here, not in every evaluation's import of the list."""
    from mini_kv.worker import integrity

    assert dict(integrity._watched_objects())  # raises AttributeError on a stale name
