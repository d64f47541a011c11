"""The timing methods on a real GPU (marker `gpu`; skipped without CUDA): `pytest -m gpu`."""

from __future__ import annotations

import statistics

import pytest
import torch

from mini_kv.references import vector_add
from mini_kv.settings import resolve
from mini_kv.worker import bandwidth, engine
from mini_kv.worker.formats import CardCase, CardFormat, bench_record
from mini_kv.worker.timing import (
    AUTO_CHAIN,
    CuptiUnavailableError,
    GraphCaptureError,
    L2Flusher,
    NoDeviceWorkError,
    measure,
    persisting_l2_reset,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timing,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA build of torch"),
]

DEV = "cuda"


def _pair(n: int, dtype=torch.float16):
    g = torch.Generator(device=DEV).manual_seed(0)
    return (
        torch.randn(n, device=DEV, dtype=dtype, generator=g),
        torch.randn(n, device=DEV, dtype=dtype, generator=g),
    )


@pytest.fixture(scope="module")
def hot():
    return L2Flusher(DEV, False)


@pytest.mark.parametrize("method", ["events", "graph", "cupti", "wallclock"])
def test_each_method_times_torch_add(method, hot):
    a, b = _pair(1 << 20)
    m = measure(lambda: torch.add(a, b), method, 20, DEV, hot)
    assert m.method == method and len(m.samples) == 20
    assert all(x > 0 for x in m.samples)
    if method == "cupti":
        assert m.kernel_us is not None and all(
            0 < k <= s * 1.001 + 0.01 for k, s in zip(m.kernel_us, m.samples, strict=True)
        )


def test_graph_and_cupti_agree_on_16m_add(hot):
    a, b = _pair(1 << 24)
    graph = statistics.median(measure(lambda: torch.add(a, b), "graph", 50, DEV, hot).samples)
    cupti = measure(lambda: torch.add(a, b), "cupti", 100, DEV, hot)
    span, kernel = statistics.median(cupti.samples), statistics.median(cupti.kernel_us)
    assert abs(graph - span) / span < 0.10, (graph, span, kernel)
    assert abs(graph - kernel) / kernel < 0.10, (graph, span, kernel)


def test_events_include_launch_overhead_graph_does_not(hot):
    # a 1M add runs in ~2 µs on an H100/H200; per-launch events pay the host's launch on top
    a, b = _pair(1 << 20)
    events = statistics.median(measure(lambda: torch.add(a, b), "events", 100, DEV, hot).samples)
    graph = statistics.median(measure(lambda: torch.add(a, b), "graph", 50, DEV, hot).samples)
    assert graph < events


def _bench(op, case: dict, settings: dict) -> dict:
    tol = {case["dtype"]: {"atol": 1e-3, "rtol": 1e-3}}
    fmt = CardFormat("vector_add", DEV, "salt", op, vector_add.reference, vector_add.make_inputs, tol)
    return bench_record(
        engine.JobContext.local(fmt), CardCase.of(case), resolve(settings, DEV, None, environ={}), None, {}
    )


def test_cold_mode_uses_distinct_buffers_per_call():
    seen = []

    def recording(a, b):
        seen.append(a.data_ptr())
        return torch.add(a, b)

    settings = {
        "method": "events",
        "l2": "cold",
        "warmup": 2,
        "repeats": 2,
        "samples": 10,
        "graph_launches": 8,
        "max_cv": 0.5,
        "max_p95_cv": 0.5,
    }
    case = {"id": "bench_1m-float16", "dtype": "float16", "params": {"n": 1 << 20}}
    rec = _bench(recording, case, settings)
    assert rec["l2"] == "cold" and rec["method"] == "events"
    assert rec["input_sets"] == 8  # small inputs: as many sets as graph launches
    assert rec["l2_flush"]["flush_bytes"] >= 2 * (rec["l2_flush"]["l2_bytes"] or 0)
    assert rec["post_check"]["ok"]
    rotated = seen[:-16]  # warm-up, probes and timed calls: before the post-check
    assert len(rotated) == 2 + engine.PROBE_SAMPLES + 2 * 10
    assert len(set(rotated)) == 8
    assert all(x != y for x, y in zip(rotated, rotated[1:], strict=False)), "consecutive calls shared inputs"
    # the post-check re-checks every input set, then every set again with new values in the same buffers
    assert len(set(seen[-16:-8])) == 8 and seen[-8:] == seen[-16:-8]


def test_cold_graph_captures_one_launch_per_input_set():
    seen = []

    def recording(a, b):
        seen.append(a.data_ptr())
        return torch.add(a, b)

    settings = {
        "method": "graph",
        "l2": "cold",
        "warmup": 0,
        "repeats": 1,
        "samples": 5,
        "graph_launches": 6,
        "max_cv": 0.5,
        "max_p95_cv": 0.5,
    }
    case = {"id": "bench_1m-float16", "dtype": "float16", "params": {"n": 1 << 20}}
    rec = _bench(recording, case, settings)
    assert rec["method"] == "graph" and rec["calls_per_sample"] == rec["input_sets"] == 6
    assert len(set(seen)) == 6


def _side_stream_op():
    side = torch.cuda.Stream()

    def sneaky(a, b):
        out = torch.empty_like(a)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the real work, never joined back to the caller's stream
            for _ in range(20):
                torch.add(a, b, out=out)
        return out

    return sneaky


def test_side_stream_work_is_counted_by_events_and_cupti(hot):
    a, b = _pair(1 << 24)
    single = statistics.median(measure(lambda: torch.add(a, b), "cupti", 30, DEV, hot).kernel_us)
    sneaky = _side_stream_op()
    events = statistics.median(measure(lambda: sneaky(a, b), "events", 30, DEV, hot).samples)
    cupti = statistics.median(measure(lambda: sneaky(a, b), "cupti", 30, DEV, hot).samples)
    # 20 adds of ~single each: a timer blind to the side stream would see ~launch time only
    assert events > 0.7 * 20 * single, (events, single)
    assert cupti > 0.7 * 20 * single, (cupti, single)


def test_graph_capture_refusal_falls_back(hot):
    a, b = _pair(1 << 20)

    def syncing():
        out = torch.add(a, b)
        torch.cuda.synchronize()  # forbidden while capturing
        return out

    with pytest.raises(GraphCaptureError, match="capture"):
        measure(syncing, "graph", 3, DEV, hot)
    torch.add(a, b).sum().item()  # the device is still usable
    method, fallbacks = engine.choose_method(["graph", "events"], [[syncing]], DEV, hot, 20)
    assert method == "events"
    assert fallbacks[0]["method"] == "graph" and "capture" in fallbacks[0]["reason"]
    # auto tries CUPTI first, which times a syncing op without trouble
    assert engine.choose_method(list(AUTO_CHAIN), [[syncing]], DEV, hot, 20) == ("cupti", [])


def test_auto_falls_back_to_graph_when_the_profiler_is_busy(hot):
    a, b = _pair(1 << 20)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        with pytest.raises(CuptiUnavailableError):
            measure(lambda: torch.add(a, b), "cupti", 3, DEV, hot)
        method, fallbacks = engine.choose_method(list(AUTO_CHAIN), [[lambda: torch.add(a, b)]], DEV, hot, 20)
    assert method == "graph" and fallbacks[0]["method"] == "cupti"


def test_cupti_reports_an_op_without_kernels(hot):
    x = torch.ones(4)
    with pytest.raises(NoDeviceWorkError, match="launched no CUDA kernel"):
        measure(lambda: x + 1, "cupti", 5, DEV, hot)


def test_cold_flusher_and_persisting_reset():
    f = L2Flusher(DEV, True)
    f()
    d = f.describe()
    assert d.flush_bytes >= 2 * (d.l2_bytes or 0) > 0
    fn, how = persisting_l2_reset()
    assert how
    if fn is not None:
        assert fn() == 0, how


def test_bandwidth_measurement():
    got = bandwidth.measure(DEV, nbytes=256 * 2**20, iterations=5)
    assert got.copy_bandwidth_Bps > 1e11  # any datacenter GPU copies faster than 100 GB/s
