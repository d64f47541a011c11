"""`mini-kv profile` on CPU: every failure reason, the profile directory and its integrity checks.

ncu is replaced by tests/fixtures/ncu/fake_ncu.py, which plays back what ncu and the target leave
behind (argv, report, target.json, CSV) so the orchestration is tested without a GPU; the target
itself is tested on CPU with a real CPU build of the candidate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mini_kv.load.task_card import load_task_card
from mini_kv.profile import capture
from mini_kv.profile.capture import ProfileOptions, profile_candidate
from mini_kv.profile.reasons import PROFILE_REASONS
from mini_kv.profile.store import ProfileUnusable, read_profile
from mini_kv.worker.channel import KEY_ENV, read_file
from mini_kv.worker.jobs import ProfileTargetJob

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "ncu"
RMSNORM = ROOT / "tasks" / "rmsnorm.yaml"


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """An executable `ncu` that runs fake_ncu.py; its argv log; CUDA reported as present."""
    return _fake_ncu(tmp_path, monkeypatch)


def _fake_ncu(tmp_path: Path, monkeypatch) -> dict:
    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {FIX / "fake_ncu.py"} "$@"\n')
    exe.chmod(0o755)
    log = tmp_path / "ncu-argv.jsonl"
    monkeypatch.setenv("MINI_KV_NCU", str(exe))
    monkeypatch.setenv("FAKE_NCU_ARGV_LOG", str(log))
    # the fake plays ncu from FAKE_NCU_* and writes its log outside any jail: these tests are about the
    # capture's records, and the jail around ncu is tested on the GPU (test_security.py, -m gpu)
    monkeypatch.setenv("MINI_KV_SANDBOX", "off")
    monkeypatch.setattr(capture, "cuda_available", lambda: True)
    lib = tmp_path / "libcandidate.so"
    lib.write_bytes(b"\x7fELF not really a library")
    return {"exe": exe, "log": log, "lib": lib, "artifacts": tmp_path / "artifacts"}


def run_profile(fake, monkeypatch, cand="v0_naive", mode="ok", csv=None, card_path=RMSNORM, **kw):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    monkeypatch.setenv("FAKE_NCU_CSV", str(csv or FIX / f"rmsnorm-{cand}.raw.csv"))
    card = load_task_card(card_path)
    kw.setdefault("prebuilt", str(fake["lib"]))
    return profile_candidate(
        card, card.candidate(cand), ProfileOptions(artifacts=str(fake["artifacts"]), **kw)
    )


def argv_log(fake) -> list[list[str]]:
    return [json.loads(line) for line in fake["log"].read_text().splitlines()]


# ---------------------------------------------------------------------------- success


def test_successful_profile_binds_everything_and_reads_back(fake_ncu, monkeypatch):
    res = run_profile(fake_ncu, monkeypatch)
    assert res.status == "ok" and res.exit_code == 0 and res.reason is None
    path = Path(res.path)
    assert path.parent == fake_ncu["artifacts"] / "profiles" and not path.name.endswith(".partial")
    for f in (
        "profile.json",
        "task_card.json",
        "candidate_manifest.json",
        "environment.json",
        "job.json",
        "target.json",
        "report.ncu-rep",
        "raw.csv",
        "metrics.json",
        "logs/ncu-profile.log",
        "logs/ncu-import.log",
    ):
        assert (path / f).is_file(), f
    doc = read_profile(path)
    assert doc.summary.grid_size == 32 and doc.summary.block_size == 128
    assert doc.case.id == "bench_4096x8192-float16" and doc.case.input_sha256
    assert doc.candidate.library_sha256 and doc.candidate.sources
    assert doc.task.suite_hash == load_task_card(RMSNORM).suite_hash()
    assert doc.ncu.version == "Version 2099.1.0.0 (fake)"
    assert [c.name for c in doc.ncu.commands] == ["profile", "import"]
    listed = {f["path"] for f in doc.files}
    assert "raw.csv" in listed and "report.ncu-rep" in listed and "profile.json" not in listed
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics["metrics"]["launch__grid_size"]["value"] == 32


def test_ncu_command_line(fake_ncu, monkeypatch):
    res = run_profile(fake_ncu, monkeypatch, warmup=7)
    profile_argv, import_argv = argv_log(fake_ncu)[-2:]
    doc = read_profile(Path(res.path))
    pairs = list(zip(profile_argv, profile_argv[1:], strict=False))
    assert ("--clock-control", "none") in pairs
    assert {b for a, b in pairs if a == "--section"} == {
        "SpeedOfLight",
        "MemoryWorkloadAnalysis",
        "Occupancy",
        "WarpStateStats",
        "LaunchStats",
    }
    assert ("--kernel-name", f"regex:{doc.ncu.kernel_filter}") in pairs
    assert "rmsnorm_row_kernel" in doc.ncu.kernel_filter
    assert ("--launch-skip", "7") in pairs and ("--launch-count", "1") in pairs
    assert "--force-overwrite" in profile_argv
    export = profile_argv[profile_argv.index("--export") + 1]
    # ncu writes into the jail's private dir; mini_kv copies the report into the profile afterwards
    assert Path(export).name == "report" and Path(export).parent.name.startswith("mini-kv-ncu-")
    tail = profile_argv[profile_argv.index("--force-overwrite") + 1 :]
    assert tail[:3] == [sys.executable, "-m", "mini_kv.worker.child"] and tail[3] == "--job"
    assert tail[5] == "--result-file"
    # re-imported from a copy in a scratch dir of its own: not from the attempt's private dir (which a
    # jail of its own uid cannot reach), nor from the box the profiled target wrote
    assert import_argv[0] == "--import" and Path(import_argv[1]).name == "report.ncu-rep"
    assert Path(import_argv[1]).parent.name.startswith("mini-kv-ncu-import-")
    assert ("--page", "raw") in zip(import_argv, import_argv[1:], strict=False) and "--csv" in import_argv
    job = json.loads((Path(res.path) / "job.json").read_text())
    assert job["warmup"] == 7 and job["calls"] == 1 and job["seed"] == doc.case.seed


def test_seed_is_fixed_by_default_and_salt_changes_it(fake_ncu, monkeypatch):
    a = read_profile(Path(run_profile(fake_ncu, monkeypatch).path))
    b = read_profile(Path(run_profile(fake_ncu, monkeypatch, cand="v1_block_reduce").path))
    c = read_profile(Path(run_profile(fake_ncu, monkeypatch, seed_salt="other").path))
    assert a.case.seed == b.case.seed != c.case.seed


# ----------------------------------------------------------------------- failure reasons


@pytest.mark.parametrize(
    "mode,code",
    [
        ("perm", "PERMISSION_DENIED"),
        ("crash", "NCU_FAILED"),
        ("target_fail", "TARGET_FAILED"),
        ("wrong_output", "WRONG_OUTPUT"),
        ("no_kernel", "NO_MATCHING_KERNEL"),
        ("import_fail", "REIMPORT_FAILED"),
        ("import_empty", "REIMPORT_FAILED"),
    ],
)
def test_ncu_failures_are_recorded_with_their_reason(fake_ncu, monkeypatch, mode, code):
    res = run_profile(fake_ncu, monkeypatch, mode=mode)
    assert res.status == "failed" and res.reason.code == code
    assert res.exit_code == PROFILE_REASONS[code][0]
    doc = read_profile(Path(res.path))  # a failed profile is still a sealed, verifiable directory
    assert doc.reason.code == code and doc.summary is None
    assert (Path(res.path) / "logs" / "ncu-profile.log").is_file()
    if mode == "crash":
        assert doc.reason.details["returncode"] == 9 and "error occurred" in doc.reason.details["log_tail"]


def test_ncu_timeout_is_ncu_failed(fake_ncu, monkeypatch):
    res = run_profile(fake_ncu, monkeypatch, mode="hang", timeout=2)
    assert res.reason.code == "NCU_FAILED" and "did not finish" in res.reason.message


def edited_csv(tmp_path, cand, fn) -> Path:
    lines = (FIX / f"rmsnorm-{cand}.raw.csv").read_text().splitlines()
    out = tmp_path / f"edited-{cand}.csv"
    out.write_text("\n".join(fn(lines)) + "\n")
    return out


@pytest.mark.parametrize(
    "edit,code",
    [
        (lambda ls: ls + ['"1"' + ls[2][3:]], "MULTIPLE_MATCHING_KERNELS"),
        (lambda ls: ls[:2], "NO_MATCHING_KERNEL"),
        (
            lambda ls: [ls[0].replace("dram__bytes.sum.per_second", "dram__bytes.sum.per_minute")] + ls[1:],
            "MISSING_METRICS",
        ),
        (lambda ls: ["this is not", "a CSV export"], "CSV_UNPARSABLE"),
    ],
)
def test_csv_failures_keep_the_csv(fake_ncu, monkeypatch, tmp_path, edit, code):
    res = run_profile(fake_ncu, monkeypatch, csv=edited_csv(tmp_path, "v0_naive", edit))
    assert res.reason.code == code
    assert (Path(res.path) / "raw.csv").is_file()  # the evidence of why stays with the verdict


def test_other_candidates_kernel_is_no_matching_kernel(fake_ncu, monkeypatch):
    res = run_profile(fake_ncu, monkeypatch, cand="v0_naive", csv=FIX / "rmsnorm-v1_block_reduce.raw.csv")
    assert res.reason.code == "NO_MATCHING_KERNEL"
    assert (
        res.reason.details["kernels"] == ["rmsnorm_block_kernel"]
        or "rmsnorm_block_kernel" in res.reason.details["kernels"][0]
    )


def tmp_project(tmp_path) -> Path:
    """A copy of the rmsnorm card and its candidates, to break on purpose."""
    proj = tmp_path / "proj"
    (proj / "tasks").mkdir(parents=True)
    (proj / ".mini-kv-project").write_text("")
    shutil.copy(RMSNORM, proj / "tasks" / "rmsnorm.yaml")
    shutil.copytree(ROOT / "candidates" / "rmsnorm", proj / "candidates" / "rmsnorm")
    return proj


def test_no_kernel_names(fake_ncu, monkeypatch, tmp_path):
    proj = tmp_project(tmp_path)
    (proj / "candidates/rmsnorm/v0_naive/kernel.cu").write_text("// the kernels moved elsewhere\n")
    res = run_profile(fake_ncu, monkeypatch, card_path=proj / "tasks" / "rmsnorm.yaml")
    assert res.reason.code == "NO_KERNEL_NAMES" and res.exit_code == 2


@pytest.mark.slow
def test_compile_failure(fake_ncu, monkeypatch, tmp_path):
    proj = tmp_project(tmp_path)
    (proj / "candidates/rmsnorm/v0_naive/op.cpp").write_text("this is not C++\n")
    res = run_profile(fake_ncu, monkeypatch, card_path=proj / "tasks" / "rmsnorm.yaml", prebuilt=None)
    assert res.reason.code == "COMPILE_FAILED" and res.exit_code == 3
    assert (Path(res.path) / "compile.json").is_file()
    assert not argv_log(fake_ncu)[1:]  # only `ncu --version`: ncu never ran the target


def test_unknown_kernel_and_case_are_config_errors(fake_ncu, monkeypatch):
    from mini_kv.errors import ConfigError

    with pytest.raises(ConfigError, match="not a __global__ kernel"):
        run_profile(fake_ncu, monkeypatch, kernel="no_such_kernel")
    with pytest.raises(ConfigError, match="not a CUDA case"):
        run_profile(fake_ncu, monkeypatch, case="weight_wrong_length-float32")  # illegal cases raise
    assert not (fake_ncu["artifacts"] / "profiles").exists() or not list(
        (fake_ncu["artifacts"] / "profiles").iterdir()
    )


def cli(*args, env=None, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "mini_kv", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_cli_ncu_not_found(tmp_path):
    env = {"PATH": str(tmp_path), "MINI_KV_NCU": "", "CUDA_HOME": str(tmp_path)}
    r = cli(
        "profile",
        "--task",
        str(RMSNORM),
        "--candidate",
        "v0_naive",
        "--artifacts",
        str(tmp_path / "a"),
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert "NCU_NOT_FOUND" in r.stderr
    (path,) = (tmp_path / "a" / "profiles").iterdir()
    assert read_profile(path).reason.code == "NCU_NOT_FOUND"


@pytest.mark.skipif(capture.cuda_available(), reason="needs a machine where torch sees no GPU")
def test_cli_no_cuda(fake_ncu, tmp_path):
    r = cli(
        "profile",
        "--task",
        str(RMSNORM),
        "--candidate",
        "v1_block_reduce",
        "--artifacts",
        str(tmp_path / "a"),
        "--json",
        env={"MINI_KV_NCU": str(fake_ncu["exe"])},
    )
    assert r.returncode == 2, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["reason"]["code"] == "NO_CUDA" and out["candidate"] == "v1_block_reduce"


# ---------------------------------------------------------------------- store integrity


@pytest.fixture(scope="module")
def sealed_profile(tmp_path_factory) -> Path:
    """One good profile, captured once for the module; each integrity test damages its own copy."""
    with pytest.MonkeyPatch.context() as mp:
        return Path(run_profile(_fake_ncu(tmp_path_factory.mktemp("profile"), mp), mp).path)


@pytest.fixture
def good_profile(sealed_profile, tmp_path) -> Path:
    dest = tmp_path / "profiles" / sealed_profile.name
    shutil.copytree(sealed_profile, dest, symlinks=True)
    return dest


def unusable(path: Path) -> str:
    with pytest.raises(ProfileUnusable) as exc:
        read_profile(path)
    return exc.value.code


def test_changed_csv_is_tampered(good_profile):
    p = good_profile / "raw.csv"
    p.write_text(p.read_text().replace("rmsnorm_row_kernel", "rmsnorm_row_kerneX"))
    assert unusable(good_profile) == "PROFILE_TAMPERED"


def test_deleted_file_is_tampered(good_profile):
    (good_profile / "report.ncu-rep").unlink()
    assert unusable(good_profile) == "PROFILE_TAMPERED"


def test_edited_summary_in_profile_json_is_tampered(good_profile):
    meta = good_profile / "profile.json"
    doc = json.loads(meta.read_text())
    doc["summary"]["achieved_occupancy_pct"] *= 2  # a better-looking number, no file hash changed
    meta.write_text(json.dumps(doc))
    assert unusable(good_profile) == "PROFILE_TAMPERED"


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: "not json{",
        lambda d: json.dumps({**d, "schema_version": 2}),
        lambda d: json.dumps({**d, "status": "great"}),
        lambda d: json.dumps({k: v for k, v in d.items() if k != "case"}),
    ],
)
def test_invalid_profile_json(good_profile, damage):
    meta = good_profile / "profile.json"
    meta.write_text(damage(json.loads(meta.read_text())))
    assert unusable(good_profile) == "PROFILE_INVALID"


def test_partial_and_missing_are_invalid(good_profile, tmp_path):
    partial = good_profile.with_name(good_profile.name + ".partial")
    good_profile.rename(partial)
    assert unusable(partial) == "PROFILE_INVALID"
    assert unusable(tmp_path / "nowhere") == "PROFILE_INVALID"


# ---------------------------------------------------------------------------- the target


def test_target_on_cpu_uses_the_factory_and_seed(tmp_path):
    """The profiled process builds the same inputs as `verify` and checks the output."""
    import torch

    from mini_kv.compile.compiler import compile_candidate
    from mini_kv.profile.target import input_digest
    from mini_kv.worker.inputs import import_path, make_case_inputs

    card = load_task_card(RMSNORM)
    cand = card.candidate("v1_block_reduce")
    comp = compile_candidate(ROOT, cand, with_cuda=False)
    assert comp.status == "ok", comp
    params, seed = {"rows": 7, "hidden": 129}, 12345
    job = ProfileTargetJob(
        library=comp.library,
        op=cand.op,
        inputs=card.operator["inputs"],
        reference=card.operator["reference"],
        params=params,
        dtype="float32",
        device="cpu",
        seed=seed,
        warmup=3,
        calls=1,
        tolerance=card.tolerances["float32"],
    )
    r, events = run_target(job, tmp_path)
    assert r.returncode == 0, r.stderr
    assert [e["event"] for e in events] == ["result"]
    res = events[0]["result"]
    expected = input_digest(
        make_case_inputs(import_path(card.operator["inputs"]), params, "float32", "cpu", seed)
    )
    assert res["ok"] and res["calls"] == 4 and res["output_check"]["ok"]
    assert res["input_sha256"] == expected
    other = make_case_inputs(import_path(card.operator["inputs"]), params, "float32", "cpu", seed + 1)
    assert input_digest(other) != expected
    assert input_digest((torch.zeros(2, 3),)) != input_digest((torch.zeros(3, 2),))  # shape is part of it


def run_target(job, tmp_path):
    """The worker child as capture.py has ncu start it: job file in, signed events to a file."""
    key = os.urandom(32)
    (tmp_path / "job.json").write_text(json.dumps(job.to_dict()))
    events = tmp_path / "target.events"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mini_kv.worker.child",
            "--job",
            str(tmp_path / "job.json"),
            "--result-file",
            str(events),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, KEY_ENV: key.hex()},
    )
    return r, read_file(events, key)


def test_target_failure_is_reported_not_raised(tmp_path):
    job = ProfileTargetJob(
        library=str(tmp_path / "missing.so"),
        op="x::y",
        inputs="",
        reference="",
        params={},
        dtype="float32",
        device="cpu",
        seed=1,
        warmup=1,
        calls=1,
        tolerance={},
    )
    r, events = run_target(job, tmp_path)
    assert r.returncode == 3
    assert [e["event"] for e in events] == ["fatal"] and events[0]["reason"]
    assert read_file(tmp_path / "target.events", os.urandom(32))[0]["event"] == "forged"  # not the run's key


# --------------------------------------------------------------------------------- doctor


def rows_by_name(rows):
    return {r["name"]: r for r in rows}


def test_doctor_reports_missing_ncu(tmp_path, monkeypatch):
    from mini_kv.profile.ncu import doctor_rows

    monkeypatch.setenv("MINI_KV_NCU", str(tmp_path / "no-ncu-here"))
    rows = rows_by_name(doctor_rows(gpu_visible=True))
    assert rows["ncu"]["ok"] is False and rows["ncu"]["value"] == "not found"
    assert rows["ncu counters"]["ok"] is False and "ncu not found" in rows["ncu counters"]["value"]


def test_doctor_without_gpu_does_not_probe(fake_ncu):
    from mini_kv.profile.ncu import doctor_rows

    rows = rows_by_name(doctor_rows(gpu_visible=False))
    assert rows["ncu"]["ok"] and "2099.1.0.0" in rows["ncu"]["value"]
    assert rows["ncu counters"]["ok"] is False
    assert rows["ncu counters"]["value"] in (
        "not checked: no GPU visible",
        "no: the driver restricts counters to admin users (RmProfilingAdminOnly=1)",
    )
    assert all("--metrics" not in a for a in argv_log(fake_ncu))  # no probe was run


@pytest.mark.parametrize(
    "mode,ok,words",
    [("ok", True, "yes"), ("perm", False, "ERR_NVGPUCTRPERM"), ("crash", False, "probe exited")],
)
def test_doctor_counter_probe(fake_ncu, monkeypatch, mode, ok, words):
    from mini_kv.profile.ncu import probe_counters

    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    if mode == "crash":  # an ncu that fails before printing the metric
        fake_ncu["exe"].write_text("#!/bin/sh\necho '==ERROR== cannot start'; exit 7\n")
    got_ok, text = probe_counters(str(fake_ncu["exe"]))
    assert got_ok is ok and words in text
    if mode != "crash":
        (probe,) = argv_log(fake_ncu)
        assert probe[:2] == ["--clock-control", "none"] and "gpu__time_duration.sum" in probe


def test_doctor_command_lists_the_ncu_rows():
    r = cli("doctor", "--json")
    assert r.returncode in (0, 2), r.stderr
    names = [row["name"] for row in json.loads(r.stdout)]
    assert "ncu" in names and "ncu counters" in names
