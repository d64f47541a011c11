"""Pure pieces of `bench`: the correctness rule, trace invariants, input generation, result mapping, exit codes."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mini_kv.codec import to_json
from mini_kv.errors import ExitCode
from mini_kv.model import WorkerResults
from mini_kv.settings import DEFAULT_TOLERANCE
from mini_kv.solexec import traces
from mini_kv.solexec.definition import load_definition
from mini_kv.solexec.run import _case, exit_code, outcomes_from_results
from mini_kv.solexec.workload import load_workloads
from mini_kv.worker import compare, inputs
from mini_kv.worker.compare import compare_matched
from mini_kv.worker.explain import WrongReturn

TEST_PROBLEM = Path(__file__).resolve().parent / "sol_solutions" / "problem"
TOL = dict(DEFAULT_TOLERANCE)


def test_within_tolerance_passes_with_exact_errors():
    ref = torch.tensor([1.0, 2.0, -4.0, 0.0])
    out = ref + torch.tensor([0.005, -0.02, 0.04, 0.0])  # 0.02 <= 0.01 + 0.01*2; 0.04 <= 0.01 + 0.04
    res = compare_matched(out, ref, TOL)
    assert res.ok, res
    assert res.max_absolute_error == pytest.approx(0.04)
    assert res.max_relative_error == pytest.approx(0.01)  # 0.04 / 4 (denominator floored at atol)


def test_matched_ratio_decides():
    ref = torch.zeros(100)
    out = ref.clone()
    out[:1] = 1.0  # 1 % of elements off: 99 % matched is exactly the default requirement
    assert compare_matched(out, ref, TOL).ok
    out[:2] = 1.0
    res = compare_matched(out, ref, TOL)
    assert not res.ok and "matched 98.0000% < required 99.00%" in res.reason
    assert compare_matched(out, ref, {**TOL, "required_matched_ratio": 0.98}).ok


def test_max_error_cap():
    ref = torch.zeros(1000)
    out = ref.clone()
    out[0] = 5.0
    assert compare_matched(out, ref, TOL).ok
    res = compare_matched(out, ref, {**TOL, "max_error_cap": 1.0})
    assert not res.ok and "max_error_cap" in res.reason


def _whole_tensor_rule(out: torch.Tensor, ref: torch.Tensor, tol: dict) -> dict:
    """The rule written out on whole tensors, as check.compare computed it before it went in passes
    with a finite fast path (the relative error now 0 where a side is not finite, as the absolute one
    was: a NaN reference made it NaN; the arithmetic in float64 on the float32-rounded values, so no
    error overflows): the oracle those must agree with."""
    x, y = out.to(torch.float32).to(torch.float64), ref.to(torch.float32).to(torch.float64)
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
    monkeypatch.setattr(compare, "HOST_CHUNK", 7)
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
    got, want = compare_matched(out, ref, tol), _whole_tensor_rule(out, ref, tol)
    for key, value in want.items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-6, abs=0.0), (key, out, ref)
    monkeypatch.setattr(compare, "HOST_CHUNK", 1 << 22)  # one pass: the same verdict and reason
    assert compare_matched(out, ref, tol) == got


def test_nan_and_inf_fail_even_when_rare():
    ref = torch.ones(1000)
    out = ref.clone()
    out[3] = float("nan")
    res = compare_matched(out, ref, TOL)
    assert not res.ok and res.has_nan and "output holds NaN" in res.reason
    assert math.isfinite(res.max_absolute_error)  # strict JSON: no NaN in the trace
    out[3] = float("inf")
    res = compare_matched(out, ref, TOL)
    assert not res.ok and res.has_inf and not res.has_nan
    res = compare_matched(ref, out, TOL)
    assert not res.ok and "reference holds" in res.reason


def test_negative_infinity_only_when_allowed_and_matching():
    ref = torch.tensor([float("-inf"), 1.0])
    out = ref.clone()
    assert not compare_matched(out, ref, TOL).ok
    allowed = {**TOL, "allow_negative_inf": True}
    res = compare_matched(out, ref, allowed)
    assert res.ok and not res.has_inf
    assert not compare_matched(torch.tensor([float("inf"), 1.0]), ref, allowed).ok


def test_all_zero_output_against_nonzero_reference_fails():
    ref = torch.full((10,), 1e-3)  # every element within atol of zero
    res = compare_matched(torch.zeros(10), ref, TOL)
    assert not res.ok and "all zeros" in res.reason
    assert compare_matched(torch.zeros(10), torch.zeros(10), TOL).ok


def test_low_precision_and_integer_dtypes():
    ref = torch.randn(64).to(torch.bfloat16)
    assert compare_matched(ref.clone(), ref, TOL).ok
    ints = torch.arange(10, dtype=torch.int32)
    assert compare_matched(ints.clone(), ints, TOL).ok
    assert not compare_matched(ints + 1, ints, TOL).ok
    packed = torch.randint(0, 256, (8,), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert compare_matched(packed.clone(), packed, TOL).ok
    other = (packed.view(torch.uint8) ^ 1).view(torch.float4_e2m1fn_x2)
    assert not compare_matched(other, packed, TOL).ok


def _trace(status, **kw):
    env = {"hardware": "cpu", "libs": {"torch": "x"}}
    return to_json(
        traces.make_trace(
            "d", {"axes": {}, "inputs": {}, "uuid": "u", "tolerance": TOL}, "s", status, env, **kw
        )
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
    with pytest.raises(ValueError, match="finite"):  # a time is measured, never a NaN
        _trace("PASSED", correctness=CORR, performance={**PERF, "latency_ms": float("nan")})
    # a non-finite error is recorded, not raised (test_the_trace_writer_records_a_non_finite_error_the_sol_way)


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
    d = load_definition(TEST_PROBLEM / "definition.json")
    wl = load_workloads(TEST_PROBLEM / "workload.jsonl", d)[1]
    sig = _case(d, wl, 1).record["signature"]
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
    expected = r"expected 2 torch.Tensors: a tuple or list in the order \['y', 'total'\], or a dict"
    with pytest.raises(
        WrongReturn, match=r"the solution returned a list of 1 value\(s\) \(Tensor\); " + expected
    ):
        inputs.normalize_outputs([y], sig, "cpu")
    with pytest.raises(WrongReturn, match=r"returned a dict with keys \['y'\]; " + expected):
        inputs.normalize_outputs({"y": y}, sig, "cpu")
    with pytest.raises(WrongReturn, match="the reference returned None"):
        inputs.normalize_outputs(None, sig, "cpu", "the reference")


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
            {
                "id": "tall",
                "status": "PASSED",
                "log": "",
                "finished_at": "t",
                "stream_checks": {"held": 3, "checked": 2},
            },
        ],
    }
    out = {o.id: o for o in outcomes_from_results(WorkerResults(**crashed), wls)}
    assert out["small"].status == "RUNTIME_ERROR" and "SIGSEGV" in out["small"].log
    assert "Fatal Python error" in out["small"].log and out["tall"].status == "PASSED"
    # a CUDA workload's count of the calls held for the stream-order check is kept (correctness.json)
    assert out["tall"].stream_checks == {"held": 3, "checked": 2}
    from mini_kv.errors import UserError
    from mini_kv.load.schema import validate

    doc = {"schema_version": 2, "format": "sol-execbench", "device": "cuda", "summary": None}
    validate({**doc, "cases": [{"id": "tall", "status": "PASSED", "stream_checks": out["tall"].stream_checks}]},
             "correctness", "correctness.json")  # fmt: skip
    with pytest.raises(UserError, match="stream_checks.held"):
        validate({**doc, "cases": [{"id": "t", "status": "PASSED", "stream_checks": {"held": 0, "checked": 0}}]},
                 "correctness", "correctness.json")  # fmt: skip

    hung_at_load = {
        "load": {
            "ok": False,
            "reason": "worker killed by signal SIGKILL before loading the op",
            "timed_out": True,
        },
        "cases": [],
        "incidents": [],
    }
    assert {o.status for o in outcomes_from_results(WorkerResults(**hung_at_load), wls)} == {"TIMEOUT"}

    bad_import = {
        "load": {"ok": False, "status": "COMPILE_ERROR", "reason": "SyntaxError"},
        "cases": [],
        "incidents": [],
    }
    assert {o.status for o in outcomes_from_results(WorkerResults(**bad_import), wls)} == {"COMPILE_ERROR"}

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
    out = {o.id: o for o in outcomes_from_results(WorkerResults(**forged), wls)}
    assert out["small"].status == "PASSED" and out["tall"].status == "REWARD_HACK"


def test_exit_codes():
    def t(status):
        return SimpleNamespace(evaluation=SimpleNamespace(status=status))

    assert exit_code([t("PASSED")], None) == ExitCode.OK
    assert exit_code([t("PASSED"), t("COMPILE_ERROR")], None) == ExitCode.COMPILE
    assert exit_code([t("INVALID_REFERENCE")], None) == ExitCode.CONFIG
    assert exit_code([t("COMPILE_ERROR"), t("TIMEOUT")], None) == ExitCode.CORRECTNESS
    assert exit_code([t("RUNTIME_ERROR")], "cutile: needs compute capability >= 10.0") == ExitCode.CONFIG


# --------------------------------------------- issue 35 finding 8: outputs that used to crash the tool


def _garbage(n: int, seed: int = 0) -> torch.Tensor:
    """What uninitialised memory returns: random bits read as float32 (huge values, NaN, Inf, denormals)."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(-(2**31), 2**31, (n,), dtype=torch.int64, generator=g)
        .to(torch.int32)
        .view(torch.float32)
    )


def _with(ref: torch.Tensor, value: float, count: int) -> torch.Tensor:
    out = ref.clone()
    out[:count] = value
    return out


# the wrong values land where the reference is 0, so their relative error overflows float32
REF = torch.cat([torch.zeros(3), torch.linspace(-2.0, 2.0, 997)])


@pytest.mark.parametrize(
    "name, out",
    [
        ("garbage bits", _garbage(1000)),
        (
            "garbage bits, all finite",
            torch.nan_to_num(_garbage(1000, 1), nan=3e38, posinf=3e38, neginf=-3e38),
        ),
        ("1e38 everywhere", torch.full((1000,), 1e38)),
        ("-3.4e38 everywhere", torch.full((1000,), -3.4e38)),
        ("three elements of 1e37", _with(REF, 1e37, 3)),
        ("three elements of float32 max", _with(REF, torch.finfo(torch.float32).max, 3)),
    ],
)
def test_every_huge_or_garbage_output_gets_finite_errors_and_a_trace(name, out):
    for tol in (TOL, {**TOL, "max_atol": 0.0}, {**TOL, "max_atol": 0.0, "max_rtol": 0.0}):
        res = compare_matched(out, REF, tol)
        assert math.isfinite(res.max_absolute_error) and math.isfinite(res.max_relative_error), (
            name,
            res,
        )
        status = "PASSED" if res.ok else "INCORRECT_NUMERICAL"
        perf = {"latency_ms": 1.0, "reference_latency_ms": 1.0, "speedup_factor": 1.0} if res.ok else None
        trace = traces.make_trace(
            "d", {"uuid": "u"}, "s", status, {"hardware": "cpu", "libs": {}}, "", vars(res), perf
        )
        traces.dumps(trace)  # strict JSON: no NaN or Infinity


@pytest.mark.parametrize("value", [1e30, 1e37, 3.4e38, -1e37])
def test_the_verdict_does_not_depend_on_the_size_of_the_wrong_values(value):
    """Three wrong elements in 1000 (99.7 % matched): upstream's rule lets 1 % be wrong, whatever their size,
    so 1e30 and 1e37 and float32's largest all PASS (they used to crash the trace writer above 1e37);
    with a `max_error_cap` they all fail; three NaNs or Infs fail on their own."""
    out = _with(REF, value, 3)
    assert compare_matched(out, REF, TOL).ok
    capped = compare_matched(out, REF, {**TOL, "max_error_cap": 1.0})
    assert not capped.ok and "max_error_cap" in capped.reason
    for bad in (float("nan"), float("inf"), float("-inf")):
        res = compare_matched(_with(REF, bad, 3), REF, TOL)
        assert not res.ok and "NaN or Inf" in res.reason
        assert res.has_nan or res.has_inf


def test_float64_outputs_beyond_float32_are_compared_as_upstream_does():
    """Upstream compares in float32, where a float64 1e300 is Inf: it fails as a non-finite value."""
    ref = REF.to(torch.float64)
    res = compare_matched(_with(ref, 1e300, 3), ref, TOL)
    assert not res.ok and res.has_inf and math.isfinite(res.max_relative_error)


@pytest.mark.parametrize("field, value", [("max_relative_error", math.inf), ("max_absolute_error", math.nan)])
def test_the_trace_writer_records_a_non_finite_error_the_sol_way(field, value):
    corr = {"max_relative_error": 0.5, "max_absolute_error": 0.5, "has_nan": False, "has_inf": False}
    trace = traces.make_trace(
        "d",
        {"uuid": "u"},
        "s",
        "INCORRECT_NUMERICAL",
        {"hardware": "cpu", "libs": {}},
        "",
        {**corr, field: value},
    )
    c = to_json(trace)["evaluation"]["correctness"]
    assert c[field] == 0.0 and (c["has_inf"] if math.isinf(value) else c["has_nan"])
    traces.dumps(trace)
    with pytest.raises(ValueError, match="non-negative"):
        traces.make_trace(
            "d",
            {"uuid": "u"},
            "s",
            "INCORRECT_NUMERICAL",
            {"hardware": "cpu", "libs": {}},
            "",
            {**corr, field: -1.0},
        )


@pytest.mark.parametrize("field", ["content", "path"])
def test_a_lone_surrogate_in_a_solution_is_a_clear_error_naming_file_and_field(tmp_path, field):
    import json

    from conftest import run_cli

    from mini_kv.errors import ConfigError
    from mini_kv.solexec.solution import load_solution

    sol = json.loads((TEST_PROBLEM.parent / "good_return" / "solution.json").read_text())
    sol["sources"][0][field] += "\ud800"  # json.dumps writes it as the escape \\ud800, as a model might
    path = tmp_path / "solution.json"
    path.write_text(json.dumps(sol))
    with pytest.raises(ConfigError) as err:
        load_solution(path)
    assert err.value.file == str(path) and err.value.field == f"sources[0].{field}"
    assert "lone surrogate" in err.value.expected
    proc = run_cli(
        "bench", TEST_PROBLEM, "--solution", path, "--device", "cpu", "--artifacts", tmp_path / "a"
    )
    assert proc.returncode == ExitCode.CONFIG, proc.stdout + proc.stderr
    assert f"sources[0].{field}" in proc.stderr and "Traceback" not in proc.stderr
