"""The SM clock record of timed cases (mini_kv.clocks): sampled through NVML (a stand-in module here; the
GPU test in test_sol_gpu.py reads a real one), sliced by each case's span, throttling said in the summary."""

import sys
import time
import types

import pytest

from mini_kv import clocks
from mini_kv.report import timing_word
from mini_kv.store.headline import sol_headline, summarize_benchmark


def fake_nvml(mhz: list[int], masks: list[int], fail_init: bool = False) -> types.ModuleType:
    """A pynvml whose SM clock and clock-event reasons step through the lists (then stay at the last)."""
    state = {"i": 0, "shutdown": 0}
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM = 1

    def init():
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def step(values):
        return values[min(state["i"], len(values) - 1)]

    def clock(handle, which):
        assert which == m.NVML_CLOCK_SM
        state["handle"] = handle
        return step(mhz)

    def reasons(handle):
        value = step(masks)
        state["i"] += 1
        return value

    m.nvmlInit = init
    m.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("index", i)
    m.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)
    m.nvmlDeviceGetMaxClockInfo = lambda h, w: 1980
    m.nvmlDeviceGetClockInfo = clock
    m.nvmlDeviceGetCurrentClocksEventReasons = reasons
    m.state = state
    return m


def test_the_device_is_named_to_nvml_through_cuda_visible_devices():
    assert clocks.nvml_index("cuda", None) == 0
    assert clocks.nvml_index("cuda:1", "") == 1
    assert clocks.nvml_index("cuda:1", "3,2") == 2
    assert clocks.nvml_index("cuda", "GPU-8f2c") == "GPU-8f2c"
    assert clocks.nvml_index("cuda:2", "0,1") is None  # no such visible device
    assert clocks.nvml_index("cuda", "MIG-1234") is None  # a MIG slice: NVML's clocks are the GPU's


def test_samples_inside_a_span_give_its_clocks_and_throttle_reasons(monkeypatch):
    # idle (0x1) is not throttling; a power cap (0x4) and a thermal slowdown (0x20) are
    nvml = fake_nvml([1980, 1980, 1755, 1500, 1980], [0x1, 0x0, 0x4, 0x24, 0x0])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    watch = clocks.ClockWatch("cuda:1", interval_s=0.01, environ={"CUDA_VISIBLE_DEVICES": "0,2"})
    deadline = time.time() + 5
    while len(watch.samples) < 5 and time.time() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert watch.unavailable is None and nvml.state["shutdown"] == 1
    assert nvml.state["handle"] == ("index", 2)  # cuda:1 of CUDA_VISIBLE_DEVICES=0,2
    (t0, *_), (t4, *_) = watch.samples[0], watch.samples[4]
    calm = watch.during(t0, watch.samples[1][0])
    assert (calm.samples, calm.sm_mhz_min, calm.sm_mhz_max, calm.throttled) == (2, 1980, 1980, False)
    hot = watch.during(t0, t4)
    assert (hot.sm_mhz_min, hot.sm_mhz_max, hot.sm_mhz_limit) == (1500, 1980, 1980)
    assert hot.throttled and hot.reasons == ["sw_power_cap", "sw_thermal"]
    # a span between two samples takes the one before and the one after it
    between = watch.during(watch.samples[2][0] + 1e-6, watch.samples[2][0] + 2e-6)
    assert between.samples == 2 and between.sm_mhz_min == 1500

    records = [
        {"id": "a", "span": {"start": t0, "end": watch.samples[1][0]}},
        {"id": "b", "bench": {"span": {"start": t0, "end": t4}}},  # a SOL workload's record holds it
        {"id": "c", "status": "TIMEOUT"},  # not timed: no span, no clocks
    ]
    clocks.attach(records, watch)
    assert records[0]["clocks"]["throttled"] is False and "clocks" in records[1]["bench"]
    assert "clocks" not in records[2]
    assert clocks.throttled([records[0], {"id": "b", **records[1]["bench"]}]) == {
        "b": ["sw_power_cap", "sw_thermal"]
    }


def test_without_nvml_nothing_is_recorded_and_the_run_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([1980], [0], fail_init=True))
    watch = clocks.ClockWatch("cuda")
    watch.stop()
    assert watch.samples == [] and "NVML Shared Library Not Found" in watch.unavailable
    assert watch.during(0, time.time()) is None
    cpu = clocks.ClockWatch("cpu")  # no thread at all on a CPU device
    cpu.stop()
    assert cpu.unavailable == "not a CUDA device" and cpu._thread is None


@pytest.mark.parametrize("fmt", ["card", "sol"])
def test_a_throttled_case_is_in_the_headline_and_the_summary_line(fmt):
    side = {"samples": [[10.0, 10.1, 9.9]], "summary": {"overall": {"p50": 10.0}}}
    rec = {
        "id": "big",
        "candidate": side,
        "reference": side,
        "speedup": 1.0,
        "stability": {"stable": True, "reasons": []},
        "post_check": {"ok": True},
        "clocks": {"throttled": True, "reasons": ["hw_slowdown"]},
    }
    calm = {**rec, "id": "small", "clocks": {"throttled": False, "reasons": []}}
    if fmt == "card":
        bench, _ = summarize_benchmark([rec, calm], skipped=False)
    else:
        bench = sol_headline([{"status": "PASSED"}, {"status": "PASSED"}], [rec, calm]).benchmark
    assert bench["throttled"] == {"big": ["hw_slowdown"]}
    assert timing_word(bench) == "timing stable, GPU throttled (hw_slowdown) while timing 1 case(s): big"
    bench_calm, _ = summarize_benchmark([calm], skipped=False)
    assert "throttled" not in bench_calm and timing_word(bench_calm) == "timing stable"


def test_doctor_says_whether_the_sm_clock_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([1755], [0x4]))
    ok, found = clocks.probe("cuda", environ={})
    assert ok and found == "1755 MHz now of 1980 MHz, throttled (sw_power_cap)"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([1980], [0], fail_init=True))
    ok, found = clocks.probe("cuda", environ={})
    assert not ok and "NVML Shared Library Not Found" in found
