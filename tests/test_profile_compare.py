"""`mini-kv compare-profiles`: every refusal, the deltas, and the A/B timing process."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_profile_capture import FIX, ROOT, cli, fake_ncu, run_profile  # noqa: F401 - fixture

from mini_kv.profile import ab
from mini_kv.profile.compare import compare, load_pair, metric_rows
from mini_kv.profile.reasons import CompareRefused

VECTOR_ADD = ROOT / "tasks" / "vector_add.yaml"


@pytest.fixture
def pair(fake_ncu, monkeypatch):  # noqa: F811 - the fixture imported above
    a = run_profile(fake_ncu, monkeypatch, cand="v0_naive")
    b = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce")
    assert a.status == b.status == "ok"
    return Path(a.path), Path(b.path)


def refused(a, b, artifacts=Path("/nonexistent")) -> list[str]:
    with pytest.raises(CompareRefused) as exc:
        compare(str(a), str(b), artifacts)
    assert exc.value.exit_code == 2
    return [r.code for r in exc.value.reasons]


def test_deltas_of_v0_and_v1(pair):
    res, _, _ = compare(str(pair[0]), str(pair[1]), Path("/nonexistent"))
    rows = {r.key: r for r in res.rows}
    assert (rows["grid_size"].A, rows["grid_size"].B, rows["grid_size"].ratio) == (32, 4096, 128)
    assert rows["block_size"].ratio == 4
    for key in ("waves_per_sm", "achieved_occupancy_pct", "dram_throughput_pct", "dram_bandwidth_Bps"):
        assert rows[key].ratio == pytest.approx(rows[key].B / rows[key].A)
    assert "not latency" in rows["duration_ns"].label
    assert res.A.candidate == "v0_naive" and res.B.candidate == "v1_block_reduce"
    stalls = res.stalls
    reasons = [s.reason for s in stalls]
    assert len(reasons) == len(set(reasons)) and "long_scoreboard" in reasons
    # ordered by the larger of the two values
    peaks = [max(s.A or 0, s.B or 0) for s in stalls]
    assert peaks == sorted(peaks, reverse=True)


def test_profile_ids_resolve_under_artifacts(pair):
    artifacts = pair[0].parents[1]
    res, _, _ = compare(pair[0].name, pair[1].name, artifacts)
    assert res.A.profile_id == pair[0].name


def test_task_mismatch(fake_ncu, monkeypatch, tmp_path, pair):  # noqa: F811
    csv = tmp_path / "va.csv"
    csv.write_text(
        (FIX / "rmsnorm-v0_naive.raw.csv").read_text().replace("rmsnorm_row_kernel", "vector_add_kernel")
    )
    other = run_profile(fake_ncu, monkeypatch, cand="v0_naive", csv=csv, card_path=VECTOR_ADD)
    assert other.status == "ok"
    codes = refused(pair[0], other.path)
    assert codes[0] == "TASK_MISMATCH" and "CASE_MISMATCH" in codes


def test_case_mismatch(fake_ncu, monkeypatch, pair):  # noqa: F811
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce", case="r1000_h4097-float16")
    assert refused(pair[0], other.path)[0] == "CASE_MISMATCH"


def test_environment_mismatch_ncu_version(fake_ncu, monkeypatch, pair):  # noqa: F811
    monkeypatch.setenv("FAKE_NCU_VERSION", "2098.4.0.0")
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce")
    assert refused(pair[0], other.path) == ["ENVIRONMENT_MISMATCH"]


def test_environment_mismatch_machine(fake_ncu, monkeypatch, pair):  # noqa: F811
    from mini_kv.profile import capture

    real = capture.environment.collect
    monkeypatch.setattr(
        capture.environment, "collect", lambda *a: dataclasses.replace(real(*a), key="another-machine")
    )
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce")
    with pytest.raises(CompareRefused) as exc:
        compare(str(pair[0]), other.path, Path("/nonexistent"))
    (r,) = exc.value.reasons
    assert r.code == "ENVIRONMENT_MISMATCH" and r.fields["environment_key"]["B"] == "another-machine"


def test_input_mismatch_seed(fake_ncu, monkeypatch, pair):  # noqa: F811
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce", seed_salt="another salt")
    assert refused(pair[0], other.path) == ["INPUT_MISMATCH"]


def test_input_mismatch_digest(fake_ncu, monkeypatch, pair):  # noqa: F811
    # same seed, different tensors (e.g. the input factory changed between the two runs)
    monkeypatch.setenv("FAKE_NCU_INPUT", "0" * 64)
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce")
    assert refused(pair[0], other.path) == ["INPUT_MISMATCH"]


def test_failed_profile_is_refused(fake_ncu, monkeypatch, pair):  # noqa: F811
    failed = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce", mode="perm")
    with pytest.raises(CompareRefused) as exc:
        compare(str(pair[0]), failed.path, Path("/nonexistent"))
    assert exc.value.code == "PROFILE_FAILED" and "PERMISSION_DENIED" in str(exc.value)


def test_tampered_and_invalid_are_refused(pair, tmp_path):
    raw = pair[1] / "raw.csv"
    text = raw.read_text()
    assert '"4,096"' in text  # the grid size, as ncu writes it
    raw.write_text(text.replace('"4,096"', '"4,097"'))
    assert refused(pair[0], pair[1]) == ["PROFILE_TAMPERED"]
    assert refused(tmp_path / "no-such-profile", pair[1]) == ["PROFILE_INVALID", "PROFILE_TAMPERED"]


def test_deltas_handle_missing_optional_metrics(pair):
    a, b = load_pair(str(pair[0]), str(pair[1]), Path("/nonexistent"))
    a = dataclasses.replace(a, summary=dataclasses.replace(a.summary, registers_per_thread=None))
    row = next(r for r in metric_rows(a, b) if r.key == "registers_per_thread")
    assert row.A is None and row.ratio is None


# ----------------------------------------------------------------------------------- CLI


def test_cli_compare_prints_deltas_and_why_no_timing(pair, tmp_path):
    out = tmp_path / "cmp.json"
    r = cli("compare-profiles", str(pair[0]), str(pair[1]), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "grid size" in r.stdout and "achieved occupancy" in r.stdout and "long_scoreboard" in r.stdout
    assert "128x" in r.stdout  # the grid's B/A
    assert "A/B timing: not run: no CUDA device" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["timing"]["ran"] is False and doc["A"]["candidate"] == "v0_naive" and doc["rows"]


def test_cli_compare_refusal_exit_code(fake_ncu, monkeypatch, pair):  # noqa: F811
    other = run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce", seed_salt="x")
    r = cli("compare-profiles", str(pair[0]), other.path, "--no-timing")
    assert r.returncode == 2 and "INPUT_MISMATCH" in r.stderr


# ------------------------------------------------------------------------------ A/B timing


def _profiled(card_path: Path, cid: str, case_id: str, device: str = "cpu") -> SimpleNamespace:
    """A stand-in for a Profile of candidate `cid` on `case_id`: its build for `device` as the profiled library."""
    from mini_kv.compile.compiler import compile_candidate
    from mini_kv.load.task_card import load_task_card
    from mini_kv.model import sha256_file

    card = load_task_card(card_path)
    cand = card.candidate(cid)
    comp = compile_candidate(ROOT, cand, with_cuda=device == "cuda")
    assert comp.status == "ok", comp
    return SimpleNamespace(
        candidate=SimpleNamespace(
            id=cid, op=cand.op, library=comp.library, library_sha256=sha256_file(comp.library)
        ),
        task=SimpleNamespace(card_path=str(card_path), suite_hash=card.suite_hash()),
        case=SimpleNamespace(id=case_id, seed_salt="ab-test"),
    )


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.timing])])
def test_ab_timing_is_the_engines_same_run_comparison_alternating_on_the_same_case(device):
    """B in the candidate's place and A's build in the reference's, timed by one judge and subject pair
    (wallclock on CPU, CUPTI on a GPU, as in the benchmark)."""
    card = ROOT / "tasks" / "rmsnorm.yaml"
    a, b = (_profiled(card, cid, "r5_h127-float32", device) for cid in ("v0_naive", "v1_block_reduce"))
    res = ab.run_ab(a, b, repeats=4, samples=5, warmup=2, device=device)
    assert res.ran, res
    assert res.method == ("wallclock" if device == "cpu" else "cupti") and res.sandbox is not None
    assert res.order == [["B", "A"], ["A", "B"], ["B", "A"], ["A", "B"]] or res.order == [
        ["A", "B"], ["B", "A"], ["A", "B"], ["B", "A"]]  # fmt: skip
    assert [len(x) for x in res.samples["A"]] == [5] * 4 and len(res.samples["B"]) == 4
    assert res.b_over_a == pytest.approx(res.p50_us["B"] / res.p50_us["A"])
    assert res.candidates == {"A": "v0_naive", "B": "v1_block_reduce"}


def test_ab_timing_of_a_tampering_candidate_is_its_integrity_violation():
    """B changes the process environment (the exploit library's `set_env`): the timing is that violation,
    not a latency, as it is in the benchmark stage."""
    card = ROOT / "tests" / "exploits" / "task_card" / "exploits.yaml"
    a = _profiled(ROOT / "tasks" / "vector_add.yaml", "v0_naive", "n1000-float32")
    b = _profiled(card, "set_env", "n1000-float32")
    a.task = b.task  # compare() has refused profiles of two tasks: both of the exploit card here
    res = ab.run_ab(a, b, repeats=2, samples=3, warmup=1, device="cpu")
    assert res.ran is False and res.error and res.integrity == "HARNESS_TAMPERED", res


def test_ab_refuses_a_changed_library(pair, tmp_path, monkeypatch):
    a, b = load_pair(str(pair[0]), str(pair[1]), Path("/nonexistent"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # reach the library check on CPU
    Path(a.candidate.library).write_bytes(b"rebuilt")
    res = ab.run_ab(a, b)
    assert res.ran is False and "changed since it was profiled" in res.reason
    a = dataclasses.replace(a, candidate=dataclasses.replace(a.candidate, library=str(tmp_path / "gone.so")))
    assert "not on this machine" in ab.run_ab(a, b).reason
