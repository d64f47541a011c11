"""The labelled corpus (benchmarks/make_corpus.py) and the throughput benchmark (benchmarks/throughput.py):
the first 8 solutions of the CPU corpus through the batch evaluator with no wrong verdict, and a mislabelled solution
reported as wrong (exit 1)."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"benchmarks_{name}"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


make_corpus, throughput = _module("make_corpus"), _module("throughput")


def _corpus(out: Path, *args: str) -> dict:
    assert make_corpus.main(["--out", str(out), *args]) == 0
    return json.loads((out / "corpus.json").read_text())


def test_the_gpu_corpus_mixes_languages_and_verdicts_with_distinct_sources(tmp_path):
    corpus = _corpus(tmp_path / "c")
    sols = corpus["solutions"]
    assert corpus["device"] == "cuda" and len(sols) >= 200
    langs = Counter(s["language"] for s in sols)
    assert all(langs[lang] >= len(sols) // 3 - 1 for lang in ("pytorch", "triton", "cuda_cpp")), langs
    kinds = {s["kind"] for s in sols}
    for kind in ("correct", "correct_shipped", "slow", "off_by_one", "wrong_dtype", "wrong_shape", "nan",
                 "compile_error", "crash_raise", "crash_exit", "crash_os_exit", "hang", "cheat_gc_reference",
                 "cheat_skip_when_timed", "cheat_set_stream"):  # fmt: skip
        assert kind in kinds
    assert {s["expect"]["status"] for s in sols} == {"PASSED", "FAILED", "REWARD_HACK", "COMPILE_ERROR"}
    # every C++ build is cold: no two solutions share their sources
    digests = {
        hashlib.sha256(
            b"".join(p.read_bytes() for p in sorted((tmp_path / "c" / s["solution"]).parent.iterdir()))
        ).hexdigest()
        for s in sols
    }
    assert len(digests) == len(sols) == len({s["name"] for s in sols})


def test_a_stratified_slice_keeps_the_mix():
    entries = [
        throughput.Entry(f"s{i}", Path("x"), Path("p"), lang, "k", {"status": status})
        for i, (lang, status) in enumerate(
            [("pytorch", "PASSED")] * 10 + [("triton", "PASSED")] * 5 + [("cuda_cpp", "FAILED")] * 5
        )
    ]
    got = throughput.stratified(entries, 6)
    langs = Counter(e.language for e in got)
    assert len(got) == 6 and langs["pytorch"] == 3 and langs["triton"] >= 1 and langs["cuda_cpp"] >= 1
    assert [e.name for e in got] == sorted((e.name for e in got), key=lambda n: int(n[1:]))  # corpus order
    assert throughput.stratified(entries, None) == entries
    # every group is represented while the limit allows, however small its share
    few = throughput.stratified(entries[:11] + entries[15:16], 3)
    assert Counter(e.language for e in few) == {"pytorch": 1, "triton": 1, "cuda_cpp": 1}
    parts = [throughput.part_of(got, f"{k}/4") for k in (1, 2, 3, 4)]
    assert sorted(e.name for p in parts for e in p) == sorted(e.name for e in got)


def test_an_empty_or_missing_corpus_is_an_error(tmp_path, capsys):
    assert throughput.main([str(tmp_path)]) == 2
    assert "corpus.json: no such file" in capsys.readouterr().err
    (tmp_path / "corpus.json").write_text(json.dumps({"schema_version": 1, "device": "cpu", "solutions": []}))
    assert throughput.main([str(tmp_path)]) == 2
    assert "no solutions" in capsys.readouterr().err


def test_a_sequential_run_cut_by_its_time_limit_reports_what_finished(tmp_path, capsys):
    """--sequential --time-limit: a call under way at the limit is stopped and left out; the figures are
    those of the solutions that finished (a run cut by a GPU machine's call limit lost all of them)."""
    corpus = _corpus(tmp_path / "c", "--device", "cpu", "--count", "1")
    (name,) = [s["name"] for s in corpus["solutions"]]
    code = throughput.main([str(tmp_path / "c"), "--sequential", "--time-limit", "600", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and rep["solutions"] == rep["right"] == 1 and rep["unfinished"] == []
    assert rep["solutions_per_hour"] > 0 and rep["wall_s"] == pytest.approx(
        rep["stages_s"]["cli call"], abs=0.01
    )
    # a limit shorter than any call (the CLI's start alone takes longer): stopped, nothing counted
    t0 = time.perf_counter()
    code = throughput.main([str(tmp_path / "c"), "--sequential", "--time-limit", "0.5", "--json"])
    out, err = capsys.readouterr()
    rep = json.loads(out.strip().splitlines()[-1])
    assert time.perf_counter() - t0 < 30 and f"{name}: stopped at the time limit" in err
    assert code == 0 and rep["solutions"] == 0 and rep["unfinished"] == [name]
    assert rep["solutions_per_hour"] is None and rep["wrong"] == []
    with pytest.raises(SystemExit) as exc:  # the batch runs in one call: no limit to cut it by
        throughput.main([str(tmp_path / "c"), "--time-limit", "5"])
    assert exc.value.code == 2 and "with --sequential" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_corpus_has_no_wrong_verdict_and_a_mislabelled_one_is_caught(tmp_path, capsys):
    corpus = _corpus(tmp_path / "c", "--device", "cpu", "--count", "8")
    assert len(corpus["solutions"]) == 8
    # the corpus's per-workload timeout (15 s) is kept: the hang costs it once (give_up_after 1), and a
    # shorter one made a cheat's workload (a fresh judge and subject after each forgery) time out on a
    # loaded CI machine
    # one more solution, a correct one, labelled as a cheat: the benchmark must call that verdict wrong
    liar = dict(next(s for s in corpus["solutions"] if s["kind"] == "correct"))
    src = (tmp_path / "c" / liar["solution"]).parent
    dst = src.with_name(src.name + "-mislabelled")
    dst.mkdir()
    (dst / "kernel.py").write_text((src / "kernel.py").read_text())
    spec = json.loads((src / "solution.json").read_text())
    (dst / "solution.json").write_text(json.dumps({**spec, "name": spec["name"] + "-mislabelled"}))
    corpus["solutions"].append(
        {**liar, "name": spec["name"] + "-mislabelled", "solution": str((dst / "solution.json").relative_to(tmp_path / "c")),
         "expect": {"status": "REWARD_HACK", "workload_status": "REWARD_HACK"}}
    )  # fmt: skip
    (tmp_path / "c" / "corpus.json").write_text(json.dumps(corpus))

    code = throughput.main([str(tmp_path / "c"), "--device", "cpu", "--json"])
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1
    said = [(w["solution"], w["got"], w["note"]) for w in rep["wrong"]]
    assert [w["solution"] for w in rep["wrong"]] == [spec["name"] + "-mislabelled"], said
    assert rep["wrong"][0]["got"] == "PASSED"
    assert rep["right"] == 8 and rep["solutions"] == 9
    assert rep["gpu_busy_fraction"] is None and rep["solutions_per_hour"] > 0
    assert rep["stages_s"]["evaluate"] > 0
    # the solutions' own stages and the wait between them make up the wall time, no more
    own = sum(v for k, v in rep["stages_s"].items() if k[0] != " " and k != "between solutions")
    assert rep["stages_s"]["between solutions"] >= 0 and own <= rep["wall_s"] + 0.5
    # when each solution ran: every one, one at a time
    spans = sorted((start, end) for _, start, end in rep["timeline"])
    assert len(spans) == 9 and all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    # and where each one's time went: its own stages, which the summed ones are the sums of
    per = rep["stages_by_solution"]
    assert sorted(per) == sorted(name for name, _, _ in rep["timeline"])
    assert abs(sum(p.get("worker start", 0) for p in per.values()) - rep["stages_s"]["worker start"]) < 0.1
    kinds = Counter(s["kind"] for s in corpus["solutions"])
    assert kinds["hang"] == 1 and kinds["cheat_forge_channel"] == 1 and kinds["crash_os_exit"] == 1
    assert kinds["compile_error"] == 1 and kinds["cheat_skip_when_timed"] == 1 and kinds["off_by_one"] == 1
