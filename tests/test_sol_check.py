"""Pure pieces of `bench`: the correctness rule, trace invariants, input generation, result mapping, exit codes."""

import math
from pathlib import Path

import pytest
import torch

from mini_kv.errors import ExitCode
from mini_kv.solexec import check, inputs, traces
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.run import _case, exit_code, outcomes_from_results
from mini_kv.solexec.workload import DEFAULT_TOLERANCE, load_workloads

TEST_PROBLEM = Path(__file__).resolve().parent / "sol_solutions" / "problem"
TOL = dict(DEFAULT_TOLERANCE)


def test_within_tolerance_passes_with_exact_errors():
    ref = torch.tensor([1.0, 2.0, -4.0, 0.0])
    out = ref + torch.tensor([0.005, -0.02, 0.04, 0.0])  # 0.02 <= 0.01 + 0.01*2; 0.04 <= 0.01 + 0.04
    res = check.compare(out, ref, TOL)
    assert res["ok"], res
    assert res["max_absolute_error"] == pytest.approx(0.04)
    assert res["max_relative_error"] == pytest.approx(0.01)  # 0.04 / 4 (denominator floored at atol)


def test_matched_ratio_decides():
    ref = torch.zeros(100)
    out = ref.clone()
    out[:1] = 1.0  # 1 % of elements off: 99 % matched is exactly the default requirement
    assert check.compare(out, ref, TOL)["ok"]
    out[:2] = 1.0
    res = check.compare(out, ref, TOL)
    assert not res["ok"] and "matched 98.0000% < required 99.00%" in res["reason"]
    assert check.compare(out, ref, {**TOL, "required_matched_ratio": 0.98})["ok"]


def test_max_error_cap():
    ref = torch.zeros(1000)
    out = ref.clone()
    out[0] = 5.0
    assert check.compare(out, ref, TOL)["ok"]
    res = check.compare(out, ref, {**TOL, "max_error_cap": 1.0})
    assert not res["ok"] and "max_error_cap" in res["reason"]


def _whole_tensor_rule(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> dict:
    """The rule written out on whole tensors, as check.compare computed it before it went in passes
    with a finite fast path (the relative error now 0 where a side is not finite, as the absolute one
    was: a NaN reference made it NaN): the oracle those must agree with."""
    x, y = out.to(torch.float32), ref.to(torch.float32)
    atol, rtol = float(tol["max_atol"]), float(tol["max_rtol"])
    neg = (
        (x == float("-inf")) & (y == float("-inf"))
        if tol["allow_negative_inf"]
        else torch.zeros_like(x, dtype=torch.bool)
    )
    nonfinite = (~torch.isfinite(x) | ~torch.isfinite(y)) & ~neg
    diff = torch.where(neg | nonfinite, torch.zeros_like(x), (x - y).abs())
    bad = ((diff > atol + rtol * y.abs()) | nonfinite) & ~neg
    rel = torch.where(neg | nonfinite, 0.0, diff / y.abs().clamp_min(atol or torch.finfo(torch.float32).tiny))
    return {
        "max_absolute_error": float(diff.max()),
        "max_relative_error": float(rel.max()),
        "has_nan": bool(x.isnan().any()),
        "has_inf": bool((x.isinf() & ~neg).any()),
        "matched_ratio": 1.0 - float(bad.sum()) / bad.numel(),
    }


@pytest.mark.parametrize("seed", range(40))
def test_the_passes_and_the_finite_fast_path_give_the_whole_tensor_rule(seed, monkeypatch):
    """Random outputs against random references, some with NaN, Inf, -inf on both sides, zeros and
    overflowing differences, in passes of 7 elements: every statistic and the verdict as the rule on
    whole tensors gives them."""
    monkeypatch.setattr(check, "HOST_CHUNK", 7)
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 60, (1,), generator=g))
    ref = torch.randn(n, generator=g) * 10 ** float(torch.randint(-3, 4, (1,), generator=g))
    out = ref + torch.randn(n, generator=g) * 0.02
    specials = [float("nan"), float("inf"), float("-inf"), 0.0, 3e38, -3e38]
    for t in (out, ref):
        if seed % 3 == 0:  # about a third of the cases hold special values
            idx = torch.randint(0, n, (3,), generator=g)
            t[idx] = torch.tensor([specials[int(i)] for i in torch.randint(0, 6, (3,), generator=g)])
    if seed % 5 == 0:
        out[: n // 2] = ref[: n // 2]
        both = torch.randint(0, n, (1,), generator=g)
        out[both], ref[both] = float("-inf"), float("-inf")
    tol = {**TOL, "allow_negative_inf": seed % 2 == 0, "max_atol": [0.0, 0.01, 0.1][seed % 3]}
    got, want = check.compare(out, ref, tol), _whole_tensor_rule(out, ref, tol)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=0.0), (key, out, ref)
    monkeypatch.setattr(check, "HOST_CHUNK", 1 << 22)  # one pass: the same verdict and reason
    assert check.compare(out, ref, tol) == got


def test_nan_and_inf_fail_even_when_rare():
    ref = torch.ones(1000)
    out = ref.clone()
    out[3] = float("nan")
    res = check.compare(out, ref, TOL)
    assert not res["ok"] and res["has_nan"] and "output holds NaN" in res["reason"]
    assert math.isfinite(res["max_absolute_error"])  # strict JSON: no NaN in the trace
    out[3] = float("inf")
    res = check.compare(out, ref, TOL)
    assert not res["ok"] and res["has_inf"] and not res["has_nan"]
    res = check.compare(ref, out, TOL)
    assert not res["ok"] and "reference holds" in res["reason"]


def test_negative_infinity_only_when_allowed_and_matching():
    ref = torch.tensor([float("-inf"), 1.0])
    out = ref.clone()
    assert not check.compare(out, ref, TOL)["ok"]
    allowed = {**TOL, "allow_negative_inf": True}
    res = check.compare(out, ref, allowed)
    assert res["ok"] and not res["has_inf"]
    assert not check.compare(torch.tensor([float("inf"), 1.0]), ref, allowed)["ok"]


def test_all_zero_output_against_nonzero_reference_fails():
    ref = torch.full((10,), 1e-3)  # every element within atol of zero
    res = check.compare(torch.zeros(10), ref, TOL)
    assert not res["ok"] and "all zeros" in res["reason"]
    assert check.compare(torch.zeros(10), torch.zeros(10), TOL)["ok"]


def test_low_precision_and_integer_dtypes():
    ref = torch.randn(64).to(torch.bfloat16)
    assert check.compare(ref.clone(), ref, TOL)["ok"]
    ints = torch.arange(10, dtype=torch.int32)
    assert check.compare(ints.clone(), ints, TOL)["ok"]
    assert not check.compare(ints + 1, ints, TOL)["ok"]
    packed = torch.randint(0, 256, (8,), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert check.compare(packed.clone(), packed, TOL)["ok"]
    other = (packed.view(torch.uint8) ^ 1).view(torch.float4_e2m1fn_x2)
    assert not check.compare(other, packed, TOL)["ok"]


def _trace(status, **kw):
    env = {"hardware": "cpu", "libs": {"torch": "x"}}
    return traces.make_trace(
        "d", {"axes": {}, "inputs": {}, "uuid": "u", "tolerance": TOL}, "s", status, env, **kw
    )


CORR = {
    "max_relative_error": 0.0,
    "max_absolute_error": 0.0,
    "has_nan": False,
    "has_inf": False,
    "extra": None,
}
PERF = {"latency_ms": 1.0, "reference_latency_ms": 2.0, "speedup_factor": 2.0}


def test_trace_invariants_live_where_traces_are_built():
    assert _trace("PASSED", correctness=CORR, performance=PERF)["evaluation"]["performance"] == PERF
    assert _trace("INCORRECT_NUMERICAL", correctness=CORR)["evaluation"]["performance"] is None
    assert _trace("TIMEOUT", log="x")["evaluation"]["correctness"] is None
    with pytest.raises(ValueError, match="PASSED trace carries"):
        _trace("PASSED", correctness=CORR)
    with pytest.raises(ValueError, match="correctness only"):
        _trace("INCORRECT_NUMERICAL", correctness=CORR, performance=PERF)
    with pytest.raises(ValueError, match="neither"):
        _trace("RUNTIME_ERROR", correctness=CORR)
    with pytest.raises(ValueError, match="unknown trace status"):
        _trace("FAILED")
    with pytest.raises(ValueError, match="finite"):
        _trace("PASSED", correctness={**CORR, "max_absolute_error": float("nan")}, performance=PERF)


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float4_e2m1fn_x2",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "float64",
        "float16",
    ],
)
def test_random_inputs_for_every_listed_dtype(dtype):
    gen = torch.Generator().manual_seed(1)
    t = inputs.random_tensor((4, 6), dtype, "cpu", gen)
    assert t.dtype == getattr(torch, dtype) and tuple(t.shape) == (4, 6)
    again = inputs.random_tensor((4, 6), dtype, "cpu", torch.Generator().manual_seed(1))
    assert torch.equal(
        t.view(torch.uint8) if dtype == "float4_e2m1fn_x2" else t,
        again.view(torch.uint8) if dtype == "float4_e2m1fn_x2" else again,
    )
    if dtype in inputs.INT_RANGES:
        low, high = inputs.INT_RANGES[dtype]
        assert low <= int(t.min()) and int(t.max()) < high


def test_inputs_follow_the_workload_and_differ_per_seed():
    from mini_kv.solexec.run import signature

    d = load_definition(TEST_PROBLEM / "definition.json")
    wl = load_workloads(TEST_PROBLEM / "workload.jsonl", d)[1]
    sig = signature(d, wl)
    work = {"inputs": wl.inputs, "resolved_axes": wl.resolved_axes, "safetensors": {}}
    a = inputs.make_inputs(sig, work, {}, "cpu", 1, {})
    b = inputs.make_inputs(sig, work, {}, "cpu", 2, {})
    assert [tuple(x.shape) for x in a[:2]] == [(17, 8), (8,)] and a[2] == 2.0
    assert not torch.equal(a[0], b[0])
    outs = inputs.allocate_outputs(sig, "cpu")
    assert tuple(outs[0].shape) == (17, 8) and outs[1].dim() == 0 and outs[0].isnan().all()


def test_normalize_outputs_accepts_upstream_forms():
    sig = {
        "outputs": [
            {"name": "y", "shape": [2], "dtype": "float32"},
            {"name": "total", "shape": [], "dtype": "float32"},
        ]
    }
    y = torch.ones(2)
    assert inputs.normalize_outputs((y, 2.0), sig, "cpu")[1].item() == 2.0
    assert inputs.normalize_outputs({"total": 1.0, "y": y}, sig, "cpu")[0] is y
    with pytest.raises(RuntimeError, match="returned 1 values"):
        inputs.normalize_outputs([y], sig, "cpu")
    with pytest.raises(RuntimeError, match="lacks output"):
        inputs.normalize_outputs({"y": y}, sig, "cpu")


def _problem_cases():
    d = load_definition(TEST_PROBLEM / "definition.json")
    return tuple(_case(d, wl, i) for i, wl in enumerate(load_workloads(TEST_PROBLEM / "workload.jsonl", d)))


def test_runner_results_map_to_statuses():
    wls = _problem_cases()
    crashed = {
        "load": {"ok": True},
        "incidents": [],
        "cases": [
            {
                "id": "small",
                "status": "RUNTIME_ERROR",
                "reason": "worker killed by signal SIGSEGV",
                "log_tail": "Fatal Python error",
                "kind": "workload",
                "dtype": None,
                "params": {},
            },
            {"id": "tall", "status": "PASSED", "log": "", "finished_at": "t"},
        ],
    }
    out = outcomes_from_results(crashed, wls)
    assert out["small"]["status"] == "RUNTIME_ERROR" and "SIGSEGV" in out["small"]["log"]
    assert "Fatal Python error" in out["small"]["log"] and out["tall"]["status"] == "PASSED"

    hung_at_load = {
        "load": {
            "ok": False,
            "reason": "worker killed by signal SIGKILL before loading the op",
            "timed_out": True,
        },
        "cases": [],
        "incidents": [],
    }
    assert {o["status"] for o in outcomes_from_results(hung_at_load, wls).values()} == {"TIMEOUT"}

    bad_import = {
        "load": {"ok": False, "status": "COMPILE_ERROR", "reason": "SyntaxError"},
        "cases": [],
        "incidents": [],
    }
    assert {o["status"] for o in outcomes_from_results(bad_import, wls).values()} == {"COMPILE_ERROR"}

    forged = {
        "load": {"ok": True},
        "cases": [
            {"id": "small", "status": "PASSED", "log": "", "finished_at": "t"},
            {"id": "tall", "status": "PASSED", "log": "", "finished_at": "t"},
        ],
        "incidents": [
            {
                "stage": "channel",
                "integrity": "FORGED_RESULT_CHANNEL",
                "case": "tall",
                "reason": "unsigned data on the result channel",
            }
        ],
    }
    out = outcomes_from_results(forged, wls)
    assert out["small"]["status"] == "PASSED" and out["tall"]["status"] == "REWARD_HACK"


def test_exit_codes():
    def t(status):
        return {"evaluation": {"status": status}}

    assert exit_code([t("PASSED")], None) == ExitCode.OK
    assert exit_code([t("PASSED"), t("COMPILE_ERROR")], None) == ExitCode.COMPILE
    assert exit_code([t("INVALID_REFERENCE")], None) == ExitCode.CONFIG
    assert exit_code([t("COMPILE_ERROR"), t("TIMEOUT")], None) == ExitCode.CORRECTNESS
    assert exit_code([t("RUNTIME_ERROR")], "cutile: needs compute capability >= 10.0") == ExitCode.CONFIG
