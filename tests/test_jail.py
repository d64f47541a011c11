"""mini_kv.jail: the layers of the jail itself, on plain commands (the red-team suite, tests/redteam/,
attacks it through real candidates)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mini_kv import jail
from mini_kv.codec import to_json

INFO = jail.probe()
needs_jail = pytest.mark.skipif(not INFO.enabled, reason=f"no jail here: {INFO.reason}")


def _run(
    code: str, spec: jail.JailSpec | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    proc = jail.popen(
        [sys.executable, "-c", code],
        spec or jail.JailSpec(),
        INFO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=60)
    proc.cleanup()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@needs_jail
def test_the_probe_records_tool_namespaces_seccomp_hash_and_layers():
    rec = to_json(INFO.record())  # as the attempt keeps it
    assert rec["tool"].startswith("bwrap ") and rec["seccomp_sha256"] and len(rec["seccomp_sha256"]) == 64
    assert set(rec["layers"]) == set(jail.LAYERS)
    assert {"pid", "mount", "network", "ipc", "uts"} <= set(rec["namespaces"])
    assert rec["missing"] == [n for n, s in rec["layers"].items() if s != "active"]


@needs_jail
def test_environment_is_an_allow_list(monkeypatch):
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "s3cr3t", "GITHUB_TOKEN": "t0k3n", "LANG": "C.UTF-8"}
    res = _run("import os, json; print(json.dumps(dict(os.environ)))", env=env)
    assert res.returncode == 0, res.stderr
    inside = __import__("json").loads(res.stdout)
    assert "AWS_SECRET_ACCESS_KEY" not in inside and "GITHUB_TOKEN" not in inside
    assert inside["LANG"] == "C.UTF-8" and inside["HOME"] == "/tmp"


@needs_jail
def test_only_the_spec_paths_are_visible_and_staged_dirs_show_only_staged_files(tmp_path):
    project = tmp_path / "proj"
    (project / ".build" / "a").mkdir(parents=True)
    (project / ".build" / "b").mkdir(parents=True)
    (project / ".build" / "a" / "lib.so").write_text("A")
    (project / ".build" / "b" / "lib.so").write_text("B")
    (project / "card.yaml").write_text("card")
    (project / "artifacts").mkdir()
    (project / "artifacts" / "x").write_text("secret")
    out = tmp_path / "out"
    out.mkdir()
    spec = jail.JailSpec(
        read_only=(str(project),),
        writable=(str(out),),
        staged=(str(project / ".build"),),
        hidden=(str(project / "artifacts"),),
    )
    code = f"""
import os, time
for _ in range(100):
    if os.path.exists({str(project / ".build/a/lib.so")!r}): break
    time.sleep(0.05)
print(open({str(project / "card.yaml")!r}).read())
print(open({str(project / ".build/a/lib.so")!r}).read())
print(os.path.exists({str(project / ".build/b/lib.so")!r}), os.listdir({str(project / "artifacts")!r}))
open({str(out / "w")!r}, "w").write("ok")
for p in [{str(project / "card.yaml")!r}, {str(project / ".build/a/lib.so")!r}, "/etc/passwd"]:
    try:
        open(p, "a")
        print("WROTE", p)
    except OSError:
        pass
"""
    proc = jail.popen(
        [sys.executable, "-c", code], spec, INFO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stage(str(project / ".build" / "a" / "lib.so"))
    assert not proc.stage(str(project / "card.yaml"))  # not in a staged dir
    stdout, stderr = proc.communicate(timeout=60)
    proc.cleanup()
    assert proc.returncode == 0, stderr
    assert stdout.split("\n")[:3] == ["card", "A", "False []"] and "WROTE" not in stdout
    assert (out / "w").read_text() == "ok"


@needs_jail
def test_seccomp_refuses_namespace_and_tracing_calls_and_perf_unless_profiling():
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
out = []
for name, nr, args in [("unshare", 272, (0x10000000,)), ("setns", 308, (0, 0)), ("ptrace", 101, (16, 1, 0, 0)),
                       ("perf_event_open", 298, (0, 0, -1, -1, 0)), ("bpf", 321, (0, 0, 0)),
                       ("keyctl", 250, (0, 0, 0)), ("mount", 165, (0, 0, 0, 0, 0))]:
    r = libc.syscall(nr, *args)
    out.append(f"{name}={ctypes.get_errno() if r != 0 else 0}")
print(" ".join(out))
"""
    res = _run(code)
    assert res.returncode == 0, res.stderr
    got = dict(kv.split("=") for kv in res.stdout.split())
    assert all(v == "1" for v in got.values()), got  # EPERM, each
    perf = _run(code, jail.JailSpec(profiler=True))
    assert dict(kv.split("=") for kv in perf.stdout.split())["perf_event_open"] != "1"


@needs_jail
def test_a_jailed_tree_dies_with_its_first_process():
    # a duration of this test's own: another test's sleep, or the same test in the unprivileged run beside
    # it (its pgrep's command line held "sleep 300" too), is not this one's daemon
    marker = f"301.{os.getpid()}"
    code = (
        "import os, subprocess, sys\n"
        f"p = subprocess.Popen(['sh', '-c', 'setsid sleep {marker} & echo $!'], stdout=subprocess.PIPE)\n"
        "print(p.stdout.readline().decode().strip(), flush=True)\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stderr

    def argv(pid: str) -> list[bytes]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().split(b"\0")[:-1]
        except OSError:  # ended meanwhile
            return []

    sleeping = subprocess.run(["pgrep", "-x", "sleep"], capture_output=True, text=True).stdout.split()
    assert not [p for p in sleeping if argv(p) == [b"sleep", marker.encode()]], "the daemon outlived its jail"


def test_modes_and_the_record_when_off(monkeypatch):
    monkeypatch.delenv(jail.MODE_ENV, raising=False)
    assert jail.mode_from(None) == "auto" and jail.mode_from(None, "required") == "required"
    monkeypatch.setenv(jail.MODE_ENV, "off")
    assert jail.mode_from(None, "required") == "off" and jail.mode_from("auto") == "auto"
    monkeypatch.setenv(jail.MODE_ENV, "bogus")
    with pytest.raises(jail.UserError):
        jail.mode_from(None)
    rec = jail.resolve("off").record()
    assert rec.enabled is False and rec.mode == "off" and "--sandbox off" in rec.reason and rec.network
    assert rec.missing == jail.LAYERS


def test_required_refuses_when_a_layer_is_missing(monkeypatch):
    broken = jail.JailInfo(mode="auto", enabled=True, tool="bwrap x", layers=(("landlock", "no Landlock"),))
    monkeypatch.setattr(jail, "probe", lambda: broken)
    with pytest.raises(jail.JailUnavailable, match="landlock"):
        jail.resolve("required")
    assert jail.resolve("auto").missing == ("landlock",)


@needs_jail
def test_a_compiler_installed_outside_the_system_dirs_is_visible_and_its_neighbours_are_not(
    tmp_path, monkeypatch
):
    # an image that keeps its compilers under /opt/gcc (the H200 machines do): the build and Triton's
    # JIT must find them inside, while the rest of that disk stays hidden
    prefix = tmp_path / "opt" / "gcc"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "gcc").symlink_to("/bin/true")
    (tmp_path / "opt" / "secret").write_text("x")
    monkeypatch.setenv("PATH", f"{prefix / 'bin'}:{os.environ['PATH']}")
    assert str(prefix) in jail.tool_prefixes()
    res = _run(
        f"import os; print(os.path.exists({str(prefix / 'bin' / 'gcc')!r}), "
        f"os.path.exists({str(tmp_path / 'opt' / 'secret')!r}))"
    )
    assert res.stdout.split() == ["True", "False"], res.stderr


@needs_jail
def test_a_self_restricting_entry_applies_the_landlock_rules_itself():
    """The worker child gets no prelude interpreter: it applies $MINI_KV_JAIL_LANDLOCK first thing."""
    code = (
        "from mini_kv._jail_prelude import restrict_from_env\n"
        "import os\n"
        "before = len(os.listdir('/'))\n"
        "restrict_from_env()\n"
        "try:\n"
        "    os.listdir('/')\n"
        "    print('listed', before)\n"
        "except PermissionError:\n"
        "    print('refused', before, 'MINI_KV_JAIL_LANDLOCK' in os.environ)\n"
    )
    proc = jail.popen(
        [sys.executable, "-c", code],
        jail.JailSpec(),
        INFO,
        self_landlock=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=60)
    proc.cleanup()
    landlock = dict(INFO.layers).get("landlock") == "active"
    assert out.split()[0] == ("refused" if landlock else "listed"), out
    if landlock:  # and the rules are gone from the environment candidate code will see
        assert out.split()[-1] == "False", out


def test_summary_lines_name_the_missing_layers():
    from sol_helpers import bench_result

    from mini_kv.report import jail_note
    from mini_kv.solexec.table import bench_summary_line

    assert jail_note(jail.resolve("off").record()) == "jail off: turned off (--sandbox off)"
    partial = jail.JailInfo(
        mode="auto", enabled=True, layers=(("landlock", "no Landlock"), ("seccomp", "active"))
    )
    assert jail_note(partial.record()) == "jail missing landlock"
    whole = jail.JailInfo(mode="auto", enabled=True, layers=(("seccomp", "active"),))
    assert jail_note(whole.record()) is None
    line = bench_summary_line(bench_result(counts={"PASSED": 1}, sandbox=partial.record()))
    assert line.endswith(", jail missing landlock"), line


def test_a_gpu_jail_tells_triton_where_libcuda_is(tmp_path, monkeypatch):
    """Triton looks libcuda up with `ldconfig -p`, which fails inside where the jail's uid cannot read
    /etc/ld.so.cache; a GPU jail names the driver's dir instead (one the jail shows)."""
    lib = tmp_path / "driver"
    lib.mkdir()
    (lib / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib))
    monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
    jail.libcuda_dir.cache_clear()
    try:
        assert jail.environment(None, jail.JailSpec(gpu=True))["TRITON_LIBCUDA_PATH"] == str(lib)
        assert "TRITON_LIBCUDA_PATH" not in jail.environment(None, jail.JailSpec())
        monkeypatch.setenv("TRITON_LIBCUDA_PATH", "/elsewhere")  # the user's own setting wins
        assert jail.environment(None, jail.JailSpec(gpu=True))["TRITON_LIBCUDA_PATH"] == "/elsewhere"
    finally:
        jail.libcuda_dir.cache_clear()


def test_a_fresh_projects_build_cache_and_store_are_masked_from_the_start(tmp_path):
    """A worker starts before the build and the attempt create .build/ and artifacts/: the spec makes
    them, so that they are masked even then (not the host's cache, other candidates' libraries in it)."""
    from mini_kv.pipeline import worker_spec

    info = jail.probe()
    if not info.enabled:
        pytest.skip(f"no jail here: {info.reason}")
    project = tmp_path / "project"
    project.mkdir()
    spec = worker_spec([project], project, project / "artifacts")
    (project / ".build" / "other").mkdir()
    (project / ".build" / "other" / "lib.so").write_bytes(b"another candidate's library")
    (project / "artifacts" / "attempt.json").write_text("{}")
    res = jail.run(["sh", "-c", f"ls -A {project}/.build {project}/artifacts"], spec, info, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "other" not in res.stdout and "attempt.json" not in res.stdout, res.stdout


def test_mini_kvs_own_temp_dirs_are_opened_to_the_jails_uid(tmp_path, monkeypatch):
    """Where the jail runs as a uid of its own, what mini_kv staged for it in 0700 temp dirs (a profile's
    target inside one, a baseline's renamed sources in .build/) is made readable; other dirs are not."""
    import tempfile

    monkeypatch.setattr(jail, "run_as", lambda: 65534)
    staging = Path(tempfile.mkdtemp(prefix="mini-kv-test-"))
    build = tmp_path / ".build"
    build.mkdir()
    baseline = Path(tempfile.mkdtemp(prefix="baseline-src-", dir=build))
    private = Path(tempfile.mkdtemp(prefix="users-own-", dir=tmp_path))
    old_umask = os.umask(
        0o077
    )  # what mini_kv writes comes out 0600/0700 (a root shell's umask on some hosts)
    try:
        (staging / "target" / "solution").mkdir(parents=True)
        (staging / "target" / "solution" / "kernel.py").write_text("")
        (staging / "target" / "reference.py").write_text("")
        (private / "secret").write_text("")
        spec = jail.JailSpec(
            read_only=(
                str(staging / "target"),
                str(staging / "target" / "reference.py"),
                str(baseline),
                str(private),
            )
        )
        jail._hand_over(spec, {}, 65534)
        assert staging.stat().st_mode & 0o777 == 0o755 and baseline.stat().st_mode & 0o777 == 0o755
        for p in ("target", "target/solution"):
            assert (staging / p).stat().st_mode & 0o005 == 0o005, p
        for p in ("target/reference.py", "target/solution/kernel.py"):
            assert (staging / p).stat().st_mode & 0o004, p
        assert private.stat().st_mode & 0o777 == 0o700
        assert (private / "secret").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old_umask)
        shutil.rmtree(staging)


def test_a_file_readable_by_others_is_bound_into_a_jail_of_its_own_uid(monkeypatch):
    """A 0644 file (a profile target's reference.py) is shown to a jail running as another uid; it needs
    no execute bit (one was asked for, and the profiler's target found no reference.py on the H200).
    A 0600 file and a file in a dir others cannot search stay out."""
    import tempfile

    monkeypatch.setattr(jail, "run_as", lambda: 65534)
    top = Path(tempfile.mkdtemp())  # pytest's tmp_path sits in a dir only its owner can search
    try:
        top.chmod(0o755)
        shown, private, hidden_dir = top / "ref.py", top / "secret", top / "closed"
        shown.write_text("")
        shown.chmod(0o644)
        private.write_text("")
        private.chmod(0o600)
        hidden_dir.mkdir(mode=0o700)
        (hidden_dir / "f").write_text("")
        (hidden_dir / "f").chmod(0o644)
        assert jail._others_can_read(str(shown)) and jail._others_can_read(str(top))
        assert not jail._others_can_read(str(private)) and not jail._others_can_read(str(hidden_dir / "f"))
        spec = jail.JailSpec(read_only=(str(shown), str(private), str(hidden_dir / "f")))
        assert jail._view_args(list(spec.read_only), spec, {}) == ["--ro-bind", str(shown), str(shown)]
    finally:
        shutil.rmtree(top)


def test_jails_side_by_side_run_as_uids_of_their_own(monkeypatch):
    """As root without a pids cgroup the cap is RLIMIT_NPROC, which counts every process of the jail's
    real uid on the machine: jails sharing one uid shared one cap (on an H200, eight side by side
    failed to start threads and CUDA), and a candidate forking to its cap starved the others. Each
    jail runs as a uid of its own, not root's, not the caller's."""
    if os.geteuid() != 0:
        pytest.skip("the uid of its own is for a root caller")
    monkeypatch.setattr(jail, "_pids_cgroup_root", lambda: None)
    jail.run_as.cache_clear()
    try:
        if jail.run_as() is None:
            pytest.skip("the Python environment is not readable by another uid here")
        info = jail.probe()
        if not info.enabled:
            pytest.skip(f"no jail here: {info.reason}")
        procs = [jail.popen(["sleep", "30"], jail.JailSpec(), info) for _ in range(2)]
        try:
            time.sleep(1)
            uids = [int(Path(f"/proc/{p.pid}/status").read_text().split("Uid:")[1].split()[0]) for p in procs]
        finally:
            for p in procs:
                p.kill_tree()
                p.wait()
                p.cleanup()
        assert len(set(uids)) == 2 and 0 not in uids, uids
    finally:
        jail.run_as.cache_clear()


@needs_jail
def test_a_script_run_from_the_hosts_tmp_shows_the_jail_neither_that_tmp_nor_a_read_only_scratch(
    monkeypatch,
):
    """`python /tmp/loop.py` puts /tmp first on sys.path, and the Python environment is bound into the
    jail: /tmp itself must not be, or the host's /tmp (other runs' files) is laid, read-only, over the
    jail's scratch (opcheck then failed writing its inductor cache: a false FAILED)."""
    import tempfile

    host_tmp = os.path.realpath(tempfile.gettempdir())
    marker = Path(tempfile.mkdtemp(prefix="mini-kv-host-tmp-")) / "host-secret"
    marker.write_text("not for candidates")
    marker.chmod(0o644)
    marker.parent.chmod(0o755)
    monkeypatch.setattr(sys, "path", [host_tmp, "/tmp", *sys.path])
    assert host_tmp not in jail.python_paths() and "/tmp" not in jail.python_paths()
    res = _run(
        "import os, pathlib; p = pathlib.Path('/tmp/inductor'); p.mkdir(); (p / 'x').write_text('y'); "
        f"print('seen' if os.path.exists({str(marker)!r}) else 'hidden')"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "hidden", res.stdout
    shutil.rmtree(marker.parent)


# a process touching every page of N MiB it holds, then saying so
TOUCH = "b = bytearray({n} << 20); b[::4096] = b'x' * len(b[::4096]); print('held', {n}, flush=True)"


def _forked_hog(hold_s: float) -> str:
    """The parent holds 150 MiB and its forked child another 150 for `hold_s`: each alone fits a 256-MiB
    cap, the tree does not. It prints 'child 0' only if the child lived to its end."""
    return (
        "import os, time\n" + TOUCH.format(n=150) + "\npid = os.fork()\nif pid == 0:\n    "
        + TOUCH.format(n=150) + f"\n    time.sleep({hold_s})\n    os._exit(0)\n"
        + "_, st = os.waitpid(pid, 0); print('child', st)\n"
    )  # fmt: skip


@needs_jail
def test_a_jailed_tree_past_its_memory_cap_is_killed_and_one_within_it_is_not():
    """The memory cgroup caps the whole tree, a forked child's memory included (an address-space cap
    per process binds neither a fork nor CUDA); where there is no writable memory cgroup the layer says
    so, and the same run is not capped."""
    if dict(INFO.layers).get("memory_cap") != "active":
        pytest.skip(f"no memory cgroup here: {dict(INFO.layers).get('memory_cap')}")
    spec = jail.JailSpec(limits=jail.Limits(memory_bytes=256 << 20))
    hog = _forked_hog(5)
    res = _run(hog, spec)
    assert "held 150" in res.stdout and "child 0" not in res.stdout, (res.stdout, res.stderr)
    small = _run(TOUCH.format(n=64), spec)
    assert small.returncode == 0 and "held 64" in small.stdout, small.stderr
    # a tool run through jail.run (a build's compiler) has it said after its own output
    tool = jail.run([sys.executable, "-c", hog], spec, INFO, timeout=60)
    assert "out of memory" in tool.stderr and "memory cap of 0.25 GiB" in tool.stderr, tool.stderr
    assert not list(jail._cgroup_roots().memory.glob(f"mini_kv-{os.getpid()}-*"))  # groups removed


@needs_jail
def test_without_a_memory_cgroup_a_watch_from_outside_kills_a_tree_past_its_cap(no_memory_cgroup):
    """Where no memory cgroup can be made (a GPU machine's container), jail.MemoryWatch caps the tree
    from outside it: the same forked hog is killed as a whole, told as out of memory, and a tree within
    its cap runs to its end. Run here with the memory cgroup taken away, whatever this machine has."""
    spec = jail.JailSpec(limits=jail.Limits(memory_bytes=256 << 20))
    t0 = time.monotonic()
    tool = jail.run([sys.executable, "-c", _forked_hog(10)], spec, INFO, timeout=60)
    assert time.monotonic() - t0 < 8, "the tree was not killed within its child's 10 s"
    assert "child 0" not in tool.stdout and tool.returncode != 0, (tool.stdout, tool.stderr)
    assert "out of memory" in tool.stderr and "memory cap of 0.25 GiB" in tool.stderr, tool.stderr
    small = _run(TOUCH.format(n=64) + "\nimport time; time.sleep(0.5)", spec)
    assert small.returncode == 0 and "held 64" in small.stdout, small.stderr
    # eight forks of a parent holding 100 MiB share its pages: 900 MiB counted page by page, 100 by share
    forks = (
        "import os, time\n" + TOUCH.format(n=100) + "\nkids = []\n"
        "for _ in range(8):\n    kids.append(os.fork())\n    if kids[-1] == 0:\n        time.sleep(2)\n"
        "        os._exit(0)\n"
        "print('done', sorted(os.waitpid(k, 0)[1] for k in kids))\n"
    )  # fmt: skip
    shared = _run(forks, spec)
    assert shared.returncode == 0 and "done [0, 0, 0, 0, 0, 0, 0, 0]" in shared.stdout, shared
    # the watch's one thread ends once no tree is left to watch
    deadline = time.monotonic() + 2
    while [t for t in threading.enumerate() if t.name == "mini_kv-memory-watch"]:
        assert time.monotonic() < deadline, "the memory watch's thread outlived every tree it watched"
        time.sleep(0.05)


def test_the_cpu_meter_counts_the_whole_tree_and_the_tree_cannot_set_it_back():
    """The judge's count of its subject's CPU time (remote.CpuMeter on jail.Jailed.cpu_meter): a forked
    child's work is in it, time asleep is not, and the jailed tree, root in its namespace, can neither
    reset the counter (cgroup v1 takes a write of 0 as a reset) nor leave its group."""
    from mini_kv.worker.remote import CpuMeter

    if not INFO.enabled or jail._cgroup_roots().cpu is None:
        pytest.skip("no jail or no writable cgroup here: the gap check has only the judge's clock")
    attack = (
        "import os, time\n"
        "def spin(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    spin(0.6)\n    os._exit(0)\n"
        "spin(0.4); os.waitpid(pid, 0)\n"
        "tried = []\n"
        "for line in open('/proc/self/cgroup').read().splitlines():\n"
        "    _, ctl, path = line.split(':', 2)\n"
        "    for d in ('/sys/fs/cgroup/cpuacct', '/sys/fs/cgroup/cpu,cpuacct', '/sys/fs/cgroup'):\n"
        "        for f in ('cpuacct.usage', 'cgroup.procs', 'cpu.stat'):\n"
        "            p = d + path + '/' + f\n"
        "            try:\n"
        "                with open(p, 'w') as fh: fh.write('0')\n"
        "                tried.append('WROTE ' + p)\n"
        "            except OSError as e:\n"
        "                tried.append(type(e).__name__)\n"
        "print(tried, flush=True)\n"
        "time.sleep(1.0)\n"
    )
    proc = jail.popen(
        [sys.executable, "-c", attack], jail.JailSpec(), INFO, stdout=subprocess.PIPE, text=True
    )
    meter = CpuMeter(proc.cpu_meter())
    try:
        out, _ = proc.communicate(timeout=60)
        used = meter.seconds()
    finally:
        meter.close()
        proc.cleanup()
    assert proc.returncode == 0 and "Error" in out and "WROTE" not in out, out
    assert 1.0 <= used < 1.0 + 0.8, used  # 1 s of work by two processes; the second asleep is not in it


def test_scratch_dirs_left_by_a_killed_run_are_swept_and_live_or_recent_ones_are_not(tmp_path):
    """A run killed outright (SIGKILL) leaves its scratch dirs (a run's log dir, an outbox, a solution's
    staging, the inboxes staged for its jails) in the temp dir: a later process removes those whose
    maker's pid is gone and that are older than SCRATCH_STALE_S, and keeps a live process's, a recent
    one's (another PID namespace may share the dir) and what is not a scratch dir of this user's."""
    import tempfile

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()  # a pid that is gone (reaped)
    old = time.time() - jail.SCRATCH_STALE_S - 60

    def left(kind: str, pid: int, age: float | None = old) -> Path:
        d = Path(tempfile.mkdtemp(prefix=f"mini-kv-{kind}-pid{pid}-", dir=tmp_path))
        (d / "lib.so").write_bytes(b"staged")
        if age is not None:
            os.utime(d, (age, age))
        return d

    swept = [left(kind, dead.pid) for kind in ("inbox", "run", "outbox", "sol", "sol-profile")]
    live = left("run", os.getpid())
    recent = left("sol", dead.pid, age=None)
    # an older version's names: no pid (swept after a day), or an inbox's pid without "pid"
    week = time.time() - 7 * 86400
    for name, age in [("mini-kv-run-ab_1cd2e", week), ("mini-kv-sol-profile-x9y8z7w6", week),
                      (f"mini-kv-inbox-{dead.pid}-q1w2e3r4", old)]:  # fmt: skip
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (age, age))
        swept.append(tmp_path / name)
    others = [tmp_path / "mini-kv-inbox-notapid", tmp_path / f"mini-kv-build-{dead.pid}-x",
              tmp_path / "mini-kv-checkout", tmp_path / "mini-kv-outbox-abcd1234"]  # fmt: skip
    for other in others:
        other.mkdir()
        os.utime(other, (old, old))  # the legacy outbox: not a day old yet
    os.utime(others[2], (week, week))  # a user's own dir of that prefix: never touched
    assert jail.sweep_scratch.__wrapped__(str(tmp_path)) == len(swept)
    assert not any(d.exists() for d in swept) and live.exists() and recent.exists()
    assert all(other.exists() for other in others)
    # what mini_kv makes is named so: its maker's pid after the kind
    made = jail.scratch_dir("run")
    try:
        assert made.name.startswith(f"mini-kv-run-pid{os.getpid()}-") and jail._SCRATCH_NAME.match(made.name)
    finally:
        made.rmdir()


def test_cgroups_left_by_a_killed_maker_are_swept_and_live_busy_or_recent_ones_are_not():
    """A maker killed outright (SIGKILL) leaves its jails' cgroups: a later process removes the empty ones
    whose maker's pid is gone and that are older than GROUP_STALE_S, and keeps a live maker's, a recent
    one's and one that still holds a process (rmdir only: the kernel refuses it)."""
    root = jail._cgroup_roots().pids
    if root is None:
        pytest.skip("no writable pids cgroup here (root and a writable cgroup file system)")
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()  # a pid that is gone (reaped)
    made = {kind: root / f"mini_kv-{pid}-{n:08x}" for n, (kind, pid) in
            enumerate([("stale", dead.pid), ("live", os.getpid()), ("busy", dead.pid)], start=0xC0FFEE00)}  # fmt: skip
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for d in made.values():
            d.mkdir()
        (made["busy"] / "cgroup.procs").write_text(str(sleeper.pid))
        jail._sweep_groups(root)  # all of them minutes younger than GROUP_STALE_S: every one stays
        assert all(d.exists() for d in made.values())
        jail._sweep_groups(root, stale_s=0)
        assert not made["stale"].exists() and made["live"].exists() and made["busy"].exists()
        sleeper.kill()
        sleeper.wait()
        jail._sweep_groups(root, stale_s=0)
        assert not made["busy"].exists() and made["live"].exists()
    finally:
        sleeper.kill()
        for d in made.values():
            if d.exists():
                d.rmdir()
    # what mini_kv makes is named so: its maker's pid, then 8 hex digits
    group = jail._Group(root, {})
    try:
        assert jail._GROUP_NAME.match(group.dir.name) and group.dir.name.startswith(f"mini_kv-{os.getpid()}-")
    finally:
        group.remove()


def test_a_hidden_path_the_jail_does_not_show_leaves_the_view(tmp_path):
    """An artifact store inside the project is masked; one elsewhere (the host's /tmp, which the jail
    replaces with its own) is unseen anyway, so it leaves the view: two judges that see the same are
    alike whatever store their attempts go to (runner.KeptJudges)."""
    project, elsewhere = tmp_path / "project", tmp_path / "store"
    spec = jail.JailSpec(read_only=(str(project),), hidden=(str(project / "artifacts"), str(elsewhere)))
    assert spec.view(False).hidden == (str(project / "artifacts"),)
    assert spec.view(False) == replace(spec, hidden=(str(project / "artifacts"),)).view(False)


@pytest.mark.parametrize("device, limit_name", [("cpu", "RLIMIT_AS"), ("cuda:0", "RLIMIT_DATA")])
def test_a_workers_memory_cap_binds_and_cannot_be_raised_again(device, limit_name):
    """proc.cap_memory, as a worker calls it before any candidate code: on CPU the address space, on CUDA
    the data segment (the driver's reservations are not data: docs/measurements/jail.md); either way a
    2 GiB allocation under a 1 GiB cap is a MemoryError, and the process cannot lift the cap again."""
    code = (
        "import resource, sys\n"
        "from mini_kv.proc import cap_memory\n"
        f"cap_memory({device!r}, 1 << 30)\n"
        f"print(resource.getrlimit(resource.{limit_name}))\n"
        "try:\n"
        "    b = bytearray(2 << 30)\n"
        "    print('ALLOCATED')\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
        "try:\n"
        f"    resource.setrlimit(resource.{limit_name}, (4 << 30, 4 << 30))\n"
        "    print('RAISED')\n"
        "except (ValueError, OSError):\n"
        "    print('kept')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    user = [] if os.geteuid() != 0 else ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run(
        [*user, sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.split("\n")[:3] == [f"({1 << 30}, {1 << 30})", "MemoryError", "kept"], out
