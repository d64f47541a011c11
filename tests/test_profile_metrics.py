"""Parsing ncu's raw-page CSV: the target row, required metrics, units, and every parse failure."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from mini_kv.codec import to_json
from mini_kv.load.task_card import load_task_card
from mini_kv.profile import metrics as m
from mini_kv.profile.ncu import kernel_names
from mini_kv.profile.reasons import ProfileFailure

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "ncu"
ROWS, HIDDEN = 4096, 8192  # rmsnorm's bench case


def card():
    return load_task_card(ROOT / "tasks" / "rmsnorm.yaml")


def fixture(cand: str) -> str:
    return (FIX / f"rmsnorm-{cand}.raw.csv").read_text()


def candidate_filter(cand_id: str) -> str:
    cand = card().candidate(cand_id)
    return m.kernel_regex(kernel_names(ROOT / cand.path, list(cand.cuda_sources)))


def table(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def render(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def edit_metric(text: str, metric: str, value: str | None = None, unit: str | None = None, drop=False) -> str:
    rows = table(text)
    i = rows[0].index(metric)
    if drop:
        return render([r[:i] + r[i + 1 :] for r in rows])
    if unit is not None:
        rows[1][i] = unit
    if value is not None:
        rows[2][i] = value
    return render(rows)


# -------------------------------------------------------------------------- the fixtures

# What the kernels' launch code implies for the bench case: v0_naive one thread per row in blocks
# of 128, v1_block_reduce one block of 512 threads per row (hidden >= 512).
LAUNCH = {"v0_naive": (-(-ROWS // 128), 128), "v1_block_reduce": (ROWS, 512)}


@pytest.mark.parametrize("cand", ["v0_naive", "v1_block_reduce"])
def test_fixture_yields_one_row_and_every_required_metric(cand):
    res = m.analyze(fixture(cand), candidate_filter(cand))
    s = res.summary
    grid, block = LAUNCH[cand]
    assert (s.grid_size, s.block_size) == (grid, block)
    assert res.kernel["Kernel Name"] == s.kernel_name
    for concept in m.REQUIRED:
        assert getattr(s, concept) is not None and getattr(s, concept) >= 0, concept
    assert 0 < s.achieved_occupancy_pct <= 100
    assert s.waves_per_sm > 0 and s.dram_bandwidth_Bps > 1e6 and s.duration_ns > 0
    assert s.top_stalls and all(t.reason != "selected" for t in s.top_stalls)
    values = [t.value for t in s.top_stalls]
    assert values == sorted(values, reverse=True) and len(values) <= m.TOP_STALLS


def test_one_candidates_filter_does_not_match_the_other():
    with pytest.raises(ProfileFailure) as exc:
        m.analyze(fixture("v1_block_reduce"), candidate_filter("v0_naive"))
    assert exc.value.code == "NO_MATCHING_KERNEL"
    assert exc.value.details["kernels"] == [
        m.analyze(fixture("v1_block_reduce"), candidate_filter("v1_block_reduce")).summary.kernel_name
    ]


@pytest.mark.parametrize("cand", ["v0_naive", "v1_block_reduce"])
def test_real_profile_json_fixture_matches_its_csv(cand):
    path = FIX / f"rmsnorm-{cand}.profile.json"
    if not path.is_file():
        pytest.skip("no captured profile.json yet (scripts/capture_ncu_fixtures.sh on a GPU machine)")
    from mini_kv.load.schema import validate

    doc = json.loads(path.read_text())
    validate(doc, "profile", str(path))
    assert doc["status"] == "ok" and doc["candidate"]["id"] == cand
    from mini_kv.profile.store import same_values

    assert same_values(to_json(m.analyze(fixture(cand), doc["ncu"]["kernel_filter"]).summary), doc["summary"])


# ------------------------------------------------------------------------- kernel filter


def test_kernel_names_come_from_the_candidates_cuda_sources():
    c = card()
    assert kernel_names(ROOT / c.candidate("v0_naive").path, ["kernel.cu", "op_cuda.cpp"]) == [
        "rmsnorm_row_kernel"
    ]
    assert kernel_names(ROOT / c.candidate("v1_block_reduce").path, ["kernel.cu"]) == ["rmsnorm_block_kernel"]


def test_kernel_names_ignore_comments_and_read_launch_bounds(tmp_path):
    (tmp_path / "k.cu").write_text(
        "// __global__ void commented_out(int* p)\n/* __global__ void also_not(int) */\n"
        "template <int N>\n__global__ __launch_bounds__(256, 2) void real_kernel(float* x) {}\n"
        'extern "C" __global__ void other_kernel (int n) {}\n'
    )
    assert kernel_names(tmp_path, ["k.cu"]) == ["real_kernel", "other_kernel"]


def test_kernel_names_of_the_roofline_candidates_skip_launch_bounds_after_void():
    # `__global__ void __launch_bounds__(256) name(`: the bounds must not be taken for the name
    found = {
        t: kernel_names(ROOT / "candidates" / t / v, ["kernel.cu"])
        for t, v in (
            ("vector_add", "v1_vectorized"),
            ("fused_bias_relu", "v1_vectorized"),
            ("rmsnorm", "v2_vectorized"),
        )
    }
    assert "vector_add_vec_kernel" in found["vector_add"]
    assert "bias_relu_rows_kernel" in found["fused_bias_relu"]
    assert "rmsnorm_reg_kernel" in found["rmsnorm"]
    assert not any("__launch_bounds__" in n for names in found.values() for n in names)


@pytest.mark.parametrize(
    "name,hit",
    [
        ("rmsnorm_row_kernel", True),
        ("(anonymous namespace)::rmsnorm_row_kernel", True),
        (
            "void (anonymous namespace)::rmsnorm_row_kernel<__half>(const T1 *, const T1 *, T1 *, long, long, float)",
            True,
        ),
        ("rmsnorm_row_kernel2", False),
        ("my_rmsnorm_row_kernel", False),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int, T2, T3)",
            False,
        ),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(T3)", False),
    ],
)
def test_kernel_regex_is_bounded(name, hit):
    import re

    assert bool(re.search(m.kernel_regex(["rmsnorm_row_kernel"]), name)) is hit


# ----------------------------------------------------------------------- failure reasons


def code_of(text: str, pattern: str | None = None) -> str:
    with pytest.raises(ProfileFailure) as exc:
        m.analyze(text, pattern or candidate_filter("v0_naive"))
    return exc.value.code


def test_two_matching_rows_are_refused():
    rows = table(fixture("v0_naive"))
    rows.append(["1"] + rows[2][1:])
    with pytest.raises(ProfileFailure) as exc:
        m.analyze(render(rows), candidate_filter("v0_naive"))
    assert exc.value.code == "MULTIPLE_MATCHING_KERNELS" and exc.value.details["ids"] == ["0", "1"]


def test_header_and_units_without_data_rows_match_nothing():
    assert code_of(render(table(fixture("v0_naive"))[:2])) == "NO_MATCHING_KERNEL"


def test_other_kernels_rows_do_not_count():
    rows = table(fixture("v0_naive"))
    other = list(rows[2])
    other[0], other[rows[0].index("Kernel Name")] = "1", "void at::native::reduce_kernel<512, 1>(T3)"
    res = m.analyze(render(rows + [other]), candidate_filter("v0_naive"))
    assert res.rows == 2 and res.kernel["ID"] == "0"


@pytest.mark.parametrize(
    "metric,concept",
    [
        ("dram__bytes.sum.per_second", "dram_bandwidth_Bps"),
        ("launch__waves_per_multiprocessor", "waves_per_sm"),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved_occupancy_pct"),
        ("gpu__time_duration.sum", "duration_ns"),
    ],
)
def test_missing_or_na_required_metric_is_named(metric, concept):
    for text in (
        edit_metric(fixture("v0_naive"), metric, drop=True),
        edit_metric(fixture("v0_naive"), metric, "n/a"),
    ):
        with pytest.raises(ProfileFailure) as exc:
            m.analyze(text, candidate_filter("v0_naive"))
        assert exc.value.code == "MISSING_METRICS"
        assert any(x.startswith(concept) for x in exc.value.details["missing"])


def test_missing_stall_metrics_are_named():
    text = fixture("v0_naive")
    for name in [h for h in table(text)[0] if m.STALL.match(h)]:
        text = edit_metric(text, name, drop=True)
    with pytest.raises(ProfileFailure) as exc:
        m.analyze(text, candidate_filter("v0_naive"))
    assert exc.value.code == "MISSING_METRICS" and "warp stall" in exc.value.details["missing"][0]


def test_alternative_metric_name_is_used_and_recorded():
    text = fixture("v0_naive").replace(
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    )
    s = m.analyze(text, candidate_filter("v0_naive")).summary
    assert s.sources["dram_throughput_pct"] == "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not,a,profile\n1,2,3\n",
        '"ID","Process ID","Block Size"\n"","",""\n"0","1","(1, 1, 1)"\n',  # no Kernel Name column
        '"ID","Kernel Name","launch__grid_size"\n"","",""\n"0","k"\n',  # a short row
        '"ID","Kernel Name","Kernel Name"\n"0","a","b"\n',  # a repeated column
    ],
)
def test_unparsable_csv(text):
    assert code_of(text) == "CSV_UNPARSABLE"


def test_unknown_unit_is_unparsable():
    assert (
        code_of(edit_metric(fixture("v0_naive"), "gpu__time_duration.sum", unit="fortnight"))
        == "CSV_UNPARSABLE"
    )


# ------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize(
    "text,value",
    [
        ("1,234,567", 1234567.0),
        ("1,598,000.25", 1598000.25),
        ("0.50", 0.5),
        ("n/a", None),
        ("", None),
        ("(128, 1, 1)", None),
        ("12,34", None),
    ],
)
def test_parse_number(text, value):
    assert m.parse_number(text) == value


@pytest.mark.parametrize(
    "value,unit,concept,expected",
    [
        (1.5, "Tbyte/second", "dram_bandwidth_Bps", 1.5e12),
        (800.0, "Gbyte/second", "dram_bandwidth_Bps", 8e11),
        (3.0, "byte/nsecond", "dram_bandwidth_Bps", 3e9),
        (2.5, "usecond", "duration_ns", 2500.0),
        (2.5, "msecond", "duration_ns", 2.5e6),
        (42.0, "%", "achieved_occupancy_pct", 42.0),
    ],
)
def test_units_are_converted_to_base(value, unit, concept, expected):
    assert m.to_base(value, unit, concept) == pytest.approx(expected)


def test_scaled_units_give_the_same_summary_as_base_units():
    base = m.analyze(fixture("v1_block_reduce"), candidate_filter("v1_block_reduce")).summary
    scaled = edit_metric(
        fixture("v1_block_reduce"),
        "dram__bytes.sum.per_second",
        f"{base.dram_bandwidth_Bps / 1e9:.6f}",
        "Gbyte/second",
    )
    scaled = edit_metric(scaled, "gpu__time_duration.sum", f"{base.duration_ns / 1e3:.6f}", "usecond")
    s = m.analyze(scaled, candidate_filter("v1_block_reduce")).summary
    assert s.dram_bandwidth_Bps == pytest.approx(base.dram_bandwidth_Bps)
    assert s.duration_ns == pytest.approx(base.duration_ns)


def test_prof_lines_around_the_table_are_ignored():
    text = (
        "==PROF== Connected to process 1\n" + fixture("v0_naive") + "==PROF== Disconnected from process 1\n"
    )
    assert m.analyze(text, candidate_filter("v0_naive")).summary.grid_size == LAUNCH["v0_naive"][0]


def test_not_issued_variants_and_selected_are_not_stall_reasons():
    rows = table(fixture("v0_naive"))
    rows[0].append("smsp__average_warps_issue_stalled_long_scoreboard_not_issued_per_issue_active.ratio")
    rows[1].append("")
    rows[2].append("99")
    s = m.analyze(render(rows), candidate_filter("v0_naive")).summary
    reasons = [t.reason for t in s.top_stalls]
    assert "long_scoreboard_not_issued" not in reasons and "selected" not in reasons
    assert reasons.count("long_scoreboard") == 1


def test_same_values_tolerates_summation_order_not_edits():
    from mini_kv.profile.store import same_values

    assert same_values({"a": [30.889999999999997, "x"]}, {"a": [30.89, "x"]})
    assert not same_values({"a": [30.9, "x"]}, {"a": [30.89, "x"]})
    assert not same_values({"a": 1}, {"a": 1, "b": 2})
    assert not same_values({"a": True}, {"a": 1.0000000001})
