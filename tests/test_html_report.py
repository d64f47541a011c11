"""`mini-kv report`: the HTML page from a store of sealed attempts, checked in headless Chromium.

The store is built with AttemptWriter from synthetic records shaped like verify's and bench's (no
compiler, so the tests stay quick); docs/report.md shows the page built from real attempts.
"""

from __future__ import annotations

import datetime as dt
import html.parser
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from mini_kv.cli import main
from mini_kv.codec import from_json, to_json
from mini_kv.environment import environment_key
from mini_kv.html_report.build import ReportOptions, build_report
from mini_kv.model import WorkerResults
from mini_kv.store.attempts import AttemptWriter
from mini_kv.store.headline import card_headline
from mini_kv.worker.inputs import case_seed

SUITE = "b" * 64
SALT = "report-test-salt"
ENV = {
    "schema_version": 1,
    "key": "env-cpu-0001",
    "python": "3.11.7",
    "platform": "Linux-test",
    "cpu_count": 2,
    "torch": "2.13.0+cpu",
    "torch_cuda": None,
    "device_kind": "cpu",
    "gpu": None,
    "driver": None,
    "nvcc": "release 13.0",
    "cxx": "c++ 12.2.0",
    "tag": None,
    "copy_bandwidth_Bps": 20e9,
}
ENV["key"] = environment_key(ENV)  # the store recomputes it: a made-up key reads as a forgery
SECTIONS = (
    "leaderboard",
    "attempts",
    "latency",
    "roofline",
    "correctness",
    "history",
    "profiles",
    "environment",
    "skipped",
)


def _samples(p50: float, seed: int, drift: float = 0.0) -> list[list[float]]:
    """5 repeats of 60 samples around p50; `drift` moves each repeat's level (an unstable measurement)."""
    rng = np.random.default_rng(seed)
    levels = p50 * (1 + drift * np.arange(5))[:, None]
    return np.clip(rng.normal(levels, p50 * 0.005, size=(5, 60)), p50 * 0.5, None).round(4).tolist()


def _bench_case(case_id: str, p50: float, ref_p50: float, seed: int, stable: bool = True) -> dict:
    from mini_kv import stats

    cand, ref = _samples(p50, seed, drift=0.0 if stable else 0.2), _samples(ref_p50, seed + 1)
    cs, rs = stats.summarize_repeats(cand), stats.summarize_repeats(ref)
    nbytes, flops = 3 * 4 * 65536.0, 65536.0
    return {
        "id": case_id,
        "dtype": "float32",
        "params": {"n": 65536},
        "seed": 1,
        "method": "wallclock",
        "timer": "host wall clock (perf_counter)",
        "l2": "n/a",
        "unit": "us",
        "candidate": {"samples": cand, "summary": to_json(cs)},
        "reference": {"samples": ref, "summary": to_json(rs)},
        "speedup": stats.speedup(rs.overall.p50, cs.overall.p50),
        "stability": {
            "stable": stable,
            "reasons": [] if stable else ["candidate p50_robust_cv 0.2 exceeds max_cv"],
        },
        "post_check": {"ok": True, "reason": None},
        "bytes": nbytes,
        "flops": flops,
        "roofline": {
            "gbps": nbytes / (p50 * 1e-6) / 1e9,
            "tflops": flops / (p50 * 1e-6) / 1e12,
            "peak_share": None,
        },
        "peak_bw_Bps": 20e9,
    }


def _corr_cases(fail: str | None) -> list[dict]:
    out = []
    for base in ("n31", "n1025", "empty"):
        for dtype in ("float32", "float16"):
            cid = f"{base}-{dtype}"
            bad = cid == fail
            out.append(
                {
                    "id": cid,
                    "kind": "core",
                    "dtype": dtype,
                    "params": {},
                    "status": "INCORRECT" if bad else "PASSED",
                    "max_abs_err": 0.5 if bad else 1e-7,
                    "max_rel_err": 0.1 if bad else 1e-7,
                    **({"reason": "3 of 31 elements outside atol"} if bad else {}),
                }
            )
    out.append(
        {
            "id": "dev-float32",
            "kind": "illegal",
            "dtype": "float32",
            "params": {},
            "status": "SKIPPED",
            "reason": "not applicable on device 'cpu'",
        }
    )
    return out


def make_task_attempt(
    art: Path,
    task: str,
    cand: str,
    when: int,
    p50: float,
    *,
    fail: str | None = None,
    stable: bool = True,
    verdict: str | None = None,
) -> Path:
    bench = [_bench_case("bench_64k-float32", p50, 20.0, when * 10 + len(cand), stable)]
    if cand == "r0":  # a bench case that timed out: a status and a reason, no samples
        bench.append(
            {
                "id": "bench_huge-float16",
                "status": "TIMEOUT",
                "reason": "no result within 120 s; process group killed",
                "log_tail": "",
            }
        )
    for c in bench:  # the store checks each timed case's seed against the run's salt
        if "candidate" in c:
            c["seed"] = case_seed(task, c["id"], SALT)
    # the summaries come from the records, as the writers derive them (the store recomputes them)
    corr = {
        "schema_version": 2,
        "format": "task-card",
        "device": "cpu",
        "load": {"ok": True, "kernels": {"CPU": True, "Meta": True}},
        "cases": _corr_cases(fail),
        "contract": {},
        "incidents": [],
        "seed_salt": SALT,
    }
    head = card_headline("ok", from_json(WorkerResults, corr), bench, False, "cpu")
    corr["summary"], bsum = to_json(head.correctness), head.benchmark
    w = AttemptWriter(art, task, cand)
    card = {
        "id": task,
        "tolerances": {"float32": {"atol": 1e-6, "rtol": 1e-6}, "float16": {"atol": 1e-3, "rtol": 1e-3}},
    }
    w.json("task_card.json", {"path": f"tasks/{task}.yaml", "card": card, "suite_hash": SUITE})
    w.json("environment.json", ENV)
    w.json("correctness.json", corr)
    w.json(
        "benchmark.json",
        {
            "schema_version": 2,
            "format": "task-card",
            "device": "cpu",
            "settings": None,
            "cases": bench,
            "summary": bsum,
        },
    )
    if verdict:
        w.json(
            "regression.json",
            {
                "schema_version": 1,
                "verdict": verdict,
                "reasons": [],
                "thresholds": {
                    "p50_threshold": 0.05,
                    "p95_threshold": 0.1,
                    "alpha": 0.01,
                    "n_boot": 2000,
                    "seed": 0,
                },
                "keys": [],
                "baseline": {"attempt_id": "base-attempt"},
                "cases": [
                    {
                        "id": "bench_64k-float32",
                        "verdict": verdict,
                        "reasons": [],
                        "first_batch": None,
                        "confirmation": None,
                        "baseline": {"p50": 10.0, "p95": 11.0, "n": 300},
                    }
                ],
            },
        )
    w.text("logs/worker.log", "synthetic\n")
    header = {
        "task_id": task,
        "task_version": "1.0.0",
        "operator": {"name": task, "version": "1.0.0"},
        "candidate": cand,
        "op": f"ns_{cand}::{task}",
        "created_at": (dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(days=when)).isoformat(),
        "suite_hash": SUITE,
        "environment_key": ENV["key"],
        "build_key": None,
        "status": head.status,
        "exit_code": 0 if head.status == "PASSED" else 4,
        "device": "cpu",
        "correctness": to_json(head.correctness),
        "benchmark": bsum,
        "duration_s": 1.0,
    }
    return w.commit(header)


@pytest.fixture(scope="module")
def sol_attempt(tmp_path_factory) -> Path:
    """One real SOL attempt (the test problem `scale_mul`, good_dps solution, benchmarked briefly on the
    CPU): the store recomputes a SOL attempt's headline and ids from its files, so it is not synthesized."""
    from test_sol_bench import run_bench

    result = run_bench(tmp_path_factory.mktemp("sol"), "good_dps")
    assert result.exit_code == 0, result
    return Path(result.attempt)


def copy_sol_attempt(sol_attempt: Path, art: Path) -> Path:
    dest = art / sol_attempt.parent.name / sol_attempt.name
    shutil.copytree(sol_attempt, dest, symlinks=True)
    return dest


@pytest.fixture
def store(tmp_path, sol_attempt) -> dict:
    art = tmp_path / "artifacts"
    a = {
        "v0_old": make_task_attempt(art, "vector_add", "v0", 1, 11.0, verdict="PASS"),
        "v0": make_task_attempt(art, "vector_add", "v0", 2, 13.0, verdict="FAIL"),
        "v1": make_task_attempt(art, "vector_add", "v1", 2, 8.0, fail="n31-float16"),
        "r0": make_task_attempt(art, "rmsnorm", "r0", 3, 30.0, stable=False),
        "sol": copy_sol_attempt(sol_attempt, art),
    }
    # a corrupted attempt: benchmark.json edited after sealing (its SHA-256 no longer matches)
    bad = make_task_attempt(art, "vector_add", "v2", 4, 9.0)
    (bad / "benchmark.json").write_text("{}")
    a["bad"] = bad
    return {"art": art, **a}


# ------------------------------------------------------------------------------------------ helpers


class _Dom(html.parser.HTMLParser):
    """Sections, tables (by class), inline SVGs and links of a rendered page."""

    def __init__(self):
        super().__init__()
        self.sections, self.tables, self.hrefs, self.svgs, self.figures, self.srcs = [], [], [], 0, [], []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        at = dict(attrs)
        if tag == "section":
            self.sections.append(at.get("id"))
        elif tag == "table":
            self.tables.append(at.get("class"))
        elif tag == "a" and at.get("href"):
            self.hrefs.append(at["href"])
        elif tag == "svg":
            self.svgs += 1
        elif tag == "figure":
            self.figures.append(at.get("data-chart"))
        if "src" in at:
            self.srcs.append(at["src"])

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Dom:
    d = _Dom()
    d.feed(text)
    return d


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",  # Chromium's own flag (its sandbox needs namespaces a container may lack)
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=180,
        )


# ------------------------------------------------------------------------------------------ tests


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (`apt-get install -y chromium`; .ci/run installs it)"
)
def test_report_renders_in_headless_chromium(store, tmp_path):
    out = tmp_path / "pages" / "report.html"  # elsewhere than the store: links must be relative to here
    assert main(["report", "--artifacts", str(store["art"]), "-o", str(out)]) == 0
    dumped = _chromium("--dump-dom", out.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = _parse(dumped.stdout)
    assert [s for s in dom.sections if s in SECTIONS] == list(SECTIONS)
    for cls in (
        "leaderboard",
        "attempts",
        "latency",
        "roofline",
        "correctness",
        "history",
        "environment",
        "skipped",
    ):
        assert cls in dom.tables, f"no {cls} table in the rendered DOM"
    charts = [f for f in dom.figures if f]
    assert dom.svgs >= len(charts) >= 6
    assert any(f.startswith("latency") for f in charts) and any(f.startswith("history") for f in charts)
    text = " ".join(dom.text)
    assert (
        "UNSTABLE" in text and "not recorded" in text and "FAIL" in text and "no result within 120 s" in text
    )
    assert store["bad"].name in text and "SHA-256" in text  # the corrupted attempt is listed as skipped
    for href in dom.hrefs:
        if not href.startswith("#"):
            assert not href.startswith(("/", "file:", "http")), href
            assert (out.parent / href).exists(), f"broken link {href}"
    assert any(store["v0"].name in h for h in dom.hrefs)

    shot = tmp_path / "shot.png"
    res = _chromium(f"--screenshot={shot}", "--window-size=1280,2400", out.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"))
    colours = np.unique(img.reshape(-1, 3), axis=0)
    assert len(colours) > 50, f"screenshot looks blank ({len(colours)} distinct colours)"
    # the Okabe-Ito blue of the first series is drawn somewhere
    assert (np.abs(img.astype(int) - [0, 114, 178]).sum(axis=2) < 12).any()


def test_page_is_self_contained_and_lists_sections(store, tmp_path):
    res = build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html"))
    text = (tmp_path / "r.html").read_text()
    dom = _parse(text)
    assert [s for s in dom.sections if s in SECTIONS] == list(SECTIONS)
    assert dom.srcs == [] and "<script" not in text and "<link" not in text and "@import" not in text
    assert "url(" not in text.replace("url(#", "")  # only in-document references (SVG clip paths)
    assert res.attempts == 5 and res.charts == len(dom.figures)
    assert [Path(s.path).name for s in res.skipped] == [store["bad"].name]
    assert res.size == len(text.encode()) and res.size < 2_000_000
    assert "L2: n/a" in text and "timer: host wall clock" in text  # timing method and L2 mode on every ECDF


def test_store_without_a_writable_index_still_gets_a_page(store, tmp_path, monkeypatch):
    """The leaderboard builds the index on first use; where that cannot be written (a read-only copy of a
    store, say) the leaderboard section says why and every other section is still there."""
    import mini_kv.leaderboard as lb

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied", str(store["art"] / "index.sqlite"))

    monkeypatch.setattr(lb, "build_leaderboard", refuse)
    res = build_report(
        ReportOptions(artifacts=store["art"], output=tmp_path / "r.html", tasks=("vector_add",))
    )
    text = (tmp_path / "r.html").read_text()
    assert "leaderboard unavailable" in text and "Permission denied" in text
    assert res.charts >= 4 and 'class="attempts"' in text


def test_png_dir_writes_every_chart(store, tmp_path):
    from PIL import Image

    res = build_report(
        ReportOptions(artifacts=store["art"], output=tmp_path / "r.html", png_dir=tmp_path / "png")
    )
    assert len(res.pngs) == res.charts >= 6
    for p in res.pngs:
        img = np.asarray(Image.open(p).convert("RGB"))
        assert len(np.unique(img.reshape(-1, 3), axis=0)) > 10, p


def test_selection_by_task_problem_and_attempt(store, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "--artifacts", str(store["art"]), "--task", "rmsnorm", "-o", str(out)]) == 0
    text = out.read_text()
    assert "mini_kv report: rmsnorm" in text and "vector_add" not in text
    # a problem directory resolves to its definition's name
    prob = tmp_path / "toy"
    prob.mkdir()
    (prob / "definition.json").write_text(json.dumps({"name": "scale_mul"}))
    assert main(["report", "--artifacts", str(store["art"]), "--problem", str(prob), "-o", str(out)]) == 0
    assert "mini_kv report: scale_mul" in out.read_text()
    # explicit attempts: the store is their grandparent, only they are shown
    assert main(["report", "--attempt", str(store["v1"]), "-o", str(out)]) == 0
    text = out.read_text()
    assert store["v1"].name in text and store["v0"].name not in text


def test_selection_matching_nothing_exits_2_listing_what_exists(store, tmp_path, capsys):
    code = main(
        ["report", "--artifacts", str(store["art"]), "--task", "nope", "-o", str(tmp_path / "r.html")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "'nope'" in err and "rmsnorm" in err and "vector_add" in err and "scale_mul" in err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "only-garbage"])
def test_empty_or_missing_store_is_a_clear_error(tmp_path, capsys, kind):
    art = tmp_path / "artifacts"
    if kind != "missing":
        art.mkdir()
    if kind == "only-garbage":
        (art / "vector_add" / "x.partial").mkdir(parents=True)
    code = main(["report", "--artifacts", str(art), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    if kind == "only-garbage":  # nothing readable, but the page says what was skipped and why
        assert code == 0 and "x.partial" in (tmp_path / "r.html").read_text()
    else:
        assert code == 2 and str(art) in err and ("no artifact store" in err or "no attempt" in err)


def test_attempt_with_malformed_but_hashed_content_is_skipped(store, tmp_path):
    """Files that pass their hash check but hold the wrong shapes are skipped with the reason, not a crash."""
    w = AttemptWriter(store["art"], "vector_add", "v9")
    w.json(
        "benchmark.json",
        {
            "schema_version": 1,
            "device": "cpu",
            "summary": None,
            "cases": [{"id": "b", "candidate": {"samples": "oops"}}],
        },
    )
    w.json("environment.json", ENV)
    bad = w.commit(
        {
            "task_id": "vector_add",
            "task_version": "1",
            "operator": {"name": "x", "version": "1"},
            "candidate": "v9",
            "created_at": "2026-11-30T00:00:00+00:00",
            "suite_hash": SUITE,
            "environment_key": ENV["key"],
            "status": "PASSED",
        }
    )
    res = build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html"))
    why = {Path(s.path).name: s.reason for s in res.skipped}
    assert "benchmark.json" in why[bad.name] and "samples" in why[bad.name]
    assert bad.name in (tmp_path / "r.html").read_text()


def test_charts_use_the_okabe_ito_palette_and_keep_text(store, tmp_path):
    build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html"))
    text = (tmp_path / "r.html").read_text()
    assert "#0072b2" in text.lower() and "#e69f00" in text.lower()
    assert "fraction of samples" in text  # SVG text is text (svg.fonttype none), searchable and small


@pytest.mark.skipif(os.environ.get("CI") is None, reason="CI only: the runner installs chromium in .ci/run")
def test_ci_has_chromium():
    assert CHROMIUM is not None, ".ci/run must install chromium so the rendering test runs"


def test_profile_comparison_table_from_stored_profiles(store, tmp_path):
    """The two H200 Nsight Compute profiles shipped as a fixture appear as a comparison table."""
    import tarfile

    with tarfile.open(Path(__file__).parent / "fixtures" / "ncu" / "profiles.tgz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("artifacts/profiles/")]
        for m in members:
            m.name = m.name[len("artifacts/") :]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4 / 3.10.12
        tar.extractall(store["art"], members=members, **safe)
    res = build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html", tasks=("rmsnorm",)))
    text = (tmp_path / "r.html").read_text()
    dom = _parse(text)
    assert "profiles" in dom.tables
    assert "DRAM bandwidth GB/s" in text and "A = v0_naive" in text and "B = v1_block_reduce" in text
    assert not [s for s in res.skipped if "profiles" in s.path]


def test_non_finite_numbers_in_a_record_do_not_break_the_charts(store, tmp_path):
    """NaN and infinities are valid JSON for the store's writer (allow_nan); the charts must not choke on them."""
    a = make_task_attempt(store["art"], "nan_task", "v0", 5, 10.0)
    w = AttemptWriter(store["art"], "nan_task", "v0")
    bench = json.loads((a / "benchmark.json").read_text())
    case = bench["cases"][0]
    # values the store does not recompute (it would call a changed P50 or speedup TAMPERED and skip it)
    case["roofline"]["gbps"], case["roofline"]["tflops"], case["reference"]["summary"]["overall"]["p95"] = (
        float("inf"),
        float("nan"),
        float("nan"),
    )
    for rel in ("task_card.json", "environment.json", "correctness.json"):
        w.json(rel, json.loads((a / rel).read_text()))
    w.json("benchmark.json", bench)
    header = {
        k: v
        for k, v in json.loads((a / "attempt.json").read_text()).items()
        if k not in ("files", "attempt_id", "schema_version")
    }
    w.commit({**header, "created_at": "2026-11-29T00:00:00+00:00"})
    res = build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html", tasks=("nan_task",)))
    assert res.attempts == 2 and not res.skipped
    assert oct((tmp_path / "r.html").stat().st_mode & 0o044) == oct(
        0o044
    )  # readable by others: made to be shared


def test_heat_map_uses_the_latest_attempt_that_checked_cases(store, tmp_path):
    """A later run limited with --case to a bench case checks nothing; the heat map keeps the full run's cells."""
    newer = make_task_attempt(store["art"], "vector_add", "v1", 9, 8.0, fail="n31-float16")
    corr = json.loads((newer / "correctness.json").read_text())
    assert corr["cases"]  # the helper writes cases; rewrite this attempt as a bench-only run
    w = AttemptWriter(store["art"], "vector_add", "v1")
    for rel in ("task_card.json", "environment.json", "benchmark.json"):
        w.json(rel, json.loads((newer / rel).read_text()))
    w.json("correctness.json", {**corr, "cases": []})
    header = {
        k: v
        for k, v in json.loads((newer / "attempt.json").read_text()).items()
        if k not in ("files", "attempt_id", "schema_version")
    }
    bench_only = w.commit({**header, "created_at": "2026-11-30T00:00:00+00:00"})
    build_report(ReportOptions(artifacts=store["art"], output=tmp_path / "r.html", tasks=("vector_add",)))
    text = (tmp_path / "r.html").read_text()
    corr_html = text[text.index('id="correctness"') : text.index('id="history"')]
    assert newer.name in corr_html and bench_only.name not in corr_html
    assert "3 of 31 elements outside atol" in corr_html


@pytest.mark.parametrize("flag", ["-o", "--png"])
def test_unwritable_output_is_a_clear_error(store, tmp_path, capsys, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    args = (
        ["-o", str(blocker / "r.html")]
        if flag == "-o"
        else ["-o", str(tmp_path / "r.html"), "--png", str(blocker)]
    )
    code = main(["report", "--artifacts", str(store["art"]), "--task", "rmsnorm", *args])
    err = capsys.readouterr().err
    assert code == 2 and str(blocker) in err and flag in err and "Traceback" not in err


def test_latency_axis_ends_near_the_p95_when_outliers_lie_far_beyond():
    """A preempted CPU leaves a few samples 1000x slower; the axis must not stretch to them."""
    from mini_kv.html_report import charts
    from mini_kv.store.records import BenchCase
    from mini_kv.store.records import SideTimes as Side

    body = tuple(float(x) for x in np.linspace(20.0, 40.0, 200))
    side = Side(body + (30_000.0,), 30.0, 39.0, 0.01)
    case = BenchCase(
        "b",
        "float32",
        "wallclock",
        "host wall clock",
        "n/a",
        side,
        side,
        1.0,
        True,
        "",
        None,
        None,
        None,
        None,
        None,
        None,
        "",
    )
    svg = charts.latency("x", "b", [("v0", 0, case)], png=False).svg
    assert "slowest sample 30,000 µs" in svg and "1.5 × the largest P95" in svg
    calm = Side(body, 30.0, 39.0, 0.01)
    calm_case = BenchCase(**{**case.__dict__, "candidate": calm, "reference": calm})
    assert "slowest sample" not in charts.latency("y", "b", [("v0", 0, calm_case)], png=False).svg


def test_baseline_band_comes_from_the_newest_judged_attempt_of_any_candidate(tmp_path):
    from mini_kv.html_report.collect import read_one
    from mini_kv.html_report.page import baseline_band

    art = tmp_path / "artifacts"
    old = make_task_attempt(art, "vector_add", "zz_old", 1, 11.0, verdict="PASS")  # baseline P50 10.0
    new = make_task_attempt(art, "vector_add", "aa_new", 5, 11.0, verdict="PASS")
    reg = json.loads((new / "regression.json").read_text())
    reg["cases"][0]["baseline"]["p50"] = 20.0  # a newer baseline was promoted in between
    w = AttemptWriter(art, "vector_add", "aa_new")
    for rel in ("task_card.json", "environment.json", "correctness.json", "benchmark.json"):
        w.json(rel, json.loads((new / rel).read_text()))
    w.json("regression.json", reg)
    header = {
        k: v
        for k, v in json.loads((new / "attempt.json").read_text()).items()
        if k not in ("files", "attempt_id", "schema_version")
    }
    newer = w.commit(header)
    attempts = [read_one(old), read_one(newer)]
    assert baseline_band(attempts, "bench_64k-float32") == pytest.approx((20.0, 21.0))
    assert baseline_band(attempts[:1], "bench_64k-float32") == pytest.approx((10.0, 10.5))
    assert baseline_band(attempts, "other") is None


def test_an_attempt_that_claims_a_better_headline_than_its_records_is_skipped(store, tmp_path):
    """attempt.json is not in its own manifest: a candidate rewriting its claimed speedup and status is
    caught by the recomputation from the per-case records (store.index.check_attempt), as the
    leaderboard catches it; the report never shows the claimed figure."""
    forged = store["v1"]
    header = json.loads((forged / "attempt.json").read_text())
    header["status"] = "PASSED"
    header["benchmark"] = {**(header.get("benchmark") or {}), "geomean_speedup": 99.0, "stable": True}
    (forged / "attempt.json").write_text(json.dumps(header))
    from mini_kv.html_report.collect import load_store

    read = load_store(store["art"])
    assert forged.name not in {a.attempt_id for a in read.attempts}
    (why,) = [s.reason for s in read.skipped if Path(s.path).name == forged.name]
    assert "TAMPERED attempt.json" in why and "geomean_speedup" in why


def test_a_case_timed_on_a_throttled_gpu_says_so_in_the_latency_table():
    from types import SimpleNamespace

    from mini_kv.html_report.page import Cell, _latency_rows
    from mini_kv.store.records import BenchCase

    side = {"samples": [[10.0, 10.2]], "summary": {"overall": {"p50": 10.0, "p95": 10.2}}}
    rec = {
        "id": "big",
        "method": "cupti",
        "candidate": side,
        "reference": side,
        "speedup": 1.0,
        "stability": {"stable": True},
        "clocks": {"throttled": True, "reasons": ["sw_power_cap", "hw_slowdown"]},
    }
    hot, calm = BenchCase.of(rec), BenchCase.of({**rec, "clocks": {"throttled": False, "reasons": []}})
    assert hot.throttled == "sw_power_cap, hw_slowdown" and calm.throttled == ""
    rows = []
    for case in (hot, calm):
        _latency_rows(SimpleNamespace(bench=(case,), candidate="v0"), 0, "big", rows, [])
    assert rows[0][-1] == Cell("yes; GPU throttled (sw_power_cap, hw_slowdown)", "fail")
    assert rows[1][-1] == "yes"
