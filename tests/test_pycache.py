"""mini_kv keeps bytecode in a directory of its own where the environment keeps none (pycache.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from mini_kv import pycache


@pytest.fixture
def no_bytecode(monkeypatch):
    """This process as the H200 image starts one: PYTHONDONTWRITEBYTECODE set, no prefix; restored
    afterwards (monkeypatch undoes what redirect changes in os.environ and sys)."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "placeholder")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.delenv(pycache.ENV, raising=False)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)


def test_without_bytecode_a_command_keeps_it_in_its_own_directory(no_bytecode, monkeypatch, tmp_path):
    monkeypatch.setenv(pycache.ENV, str(tmp_path / "pyc"))
    assert pycache.redirect() == tmp_path / "pyc"
    assert sys.pycache_prefix == str(tmp_path / "pyc") and not sys.dont_write_bytecode
    # the processes it starts inherit both: the prefix set, the variable that forbade writing gone
    assert os.environ["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pyc")
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ
    child = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.split() == [str(tmp_path / "pyc"), "False"]
    assert pycache.describe() == (f"kept in {tmp_path / 'pyc'}", True)


def test_the_default_directory_is_the_users_cache(no_bytecode, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert pycache.redirect() == tmp_path / "mini-kv" / "pycache"
    assert (tmp_path / "mini-kv" / "pycache").is_dir()


@pytest.mark.parametrize("case", ["off", "writes already", "own prefix", "unwritable"])
def test_the_environments_own_choice_stands(no_bytecode, monkeypatch, tmp_path, case):
    if case == "off":
        monkeypatch.setenv(pycache.ENV, "off")
    elif case == "writes already":
        monkeypatch.setattr(sys, "dont_write_bytecode", False)
    elif case == "own prefix":
        monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "theirs"))
    else:  # a directory that cannot be made: imports compile as before, nothing fails
        (tmp_path / "file").write_text("")
        monkeypatch.setenv(pycache.ENV, str(tmp_path / "file" / "pyc"))
    before = (sys.pycache_prefix, sys.dont_write_bytecode, os.environ.get("PYTHONDONTWRITEBYTECODE"))
    assert pycache.redirect() is None
    assert (sys.pycache_prefix, sys.dont_write_bytecode, os.environ.get("PYTHONDONTWRITEBYTECODE")) == before


def _cli(monkeypatch, setting, *args):
    """`python -m mini_kv ARGS` as the H200 image starts it: no bytecode, no prefix of its own."""
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    return run_cli(*args, env={"PYTHONDONTWRITEBYTECODE": "1", pycache.ENV: setting})


def test_the_command_line_writes_bytecode_there_and_doctor_says_where(no_bytecode, monkeypatch, tmp_path):
    pyc = tmp_path / "pyc"
    # a fresh interpreter, as the H200 image starts one; `--help` imports no torch, whose thousands of
    # modules would take 20 s to compile into a new directory (doctor's would)
    res = _cli(monkeypatch, str(pyc), "--help")
    assert res.returncode == 0, res.stderr
    # the mirror of the source tree: the command's own modules, imported after the redirect
    mirrored = pyc / Path(pycache.__file__).resolve().parent.relative_to("/")
    assert list(mirrored.glob("cli_new.cpython-*.pyc")), sorted(p.name for p in mirrored.glob("*"))
    # doctor's row, in this process after the same redirect
    monkeypatch.setenv(pycache.ENV, str(pyc))
    assert pycache.redirect() == pyc
    res = run_cli("doctor", "--json")
    assert res.returncode == 0, res.stderr
    row = next(r for r in json.loads(res.stdout) if r["name"] == "bytecode")
    assert row == {**row, "value": f"kept in {pyc}", "ok": True}


def test_off_keeps_none_and_doctor_says_so(monkeypatch):
    res = _cli(monkeypatch, "off", "doctor", "--json")
    assert res.returncode == 0, res.stderr
    row = next(r for r in json.loads(res.stdout) if r["name"] == "bytecode")
    assert not row["ok"] and row["value"].startswith("not kept")


@pytest.fixture
def shared_cache(monkeypatch):
    """A bytecode cache this process keeps, readable by a jail that runs under a uid of its own (as
    root's default under /var/cache is), warmed for one small module instead of torch's thousands."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="mini-kv-pyc-", dir="/var/tmp"))
    where.chmod(0o755)
    monkeypatch.setattr(sys, "pycache_prefix", str(where))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(pycache, "CHILD_MODULES", ("json.tool",))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def test_the_children_modules_are_warmed_once(shared_cache, monkeypatch):
    assert pycache.warm_for_children.__wrapped__()
    cached = list(shared_cache.rglob("tool.cpython-*.pyc"))
    assert cached and "json" in str(cached[0]), sorted(shared_cache.rglob("*"))
    assert list(shared_cache.glob("mini-kv-children-*"))

    def no_second_run(*a, **k):
        raise AssertionError("warmed again")

    monkeypatch.setattr(pycache.subprocess, "run", no_second_run)
    assert pycache.warm_for_children.__wrapped__()


ATTACK = """
import json.tool, os, sys
print(json.dumps({"prefix": sys.pycache_prefix, "cached": json.tool.__cached__,
                  "found": os.path.exists(json.tool.__cached__)}))
for how in ("plant", "replace"):
    try:
        if how == "plant":  # bytecode for a module the next run imports
            open(os.path.join(sys.pycache_prefix, "planted.pyc"), "wb").write(b"x")
        else:  # the warmed bytecode itself, which a judge would execute
            open(json.tool.__cached__, "r+b").write(b"x")
        print(how, "WROTE")
    except OSError as exc:
        print(how, "refused", type(exc).__name__)
"""


def test_a_jailed_child_reads_the_cache_and_cannot_write_it(shared_cache):
    """A candidate's process (root in its namespaces) tries to plant bytecode in the cache and to
    overwrite what the trusted warm-up wrote: both refused, while its imports use the cache."""
    from mini_kv import jail

    info = jail.resolve("auto")
    if not info.enabled:
        pytest.skip(f"no jail here: {info.reason}")
    assert pycache.warm_for_children.__wrapped__()
    before = {p: p.read_bytes() for p in shared_cache.rglob("*.pyc")}
    res = jail.run([sys.executable, "-c", ATTACK], jail.JailSpec(), info, timeout=120)
    assert res.returncode == 0, res.output
    seen, *tries = res.stdout.strip().splitlines()
    seen = json.loads(seen)
    assert seen["prefix"] == str(shared_cache) and seen["found"], seen
    assert seen["cached"].startswith(str(shared_cache)), seen
    assert [t.split()[:2] for t in tries] == [["plant", "refused"], ["replace", "refused"]], tries
    assert {p: p.read_bytes() for p in shared_cache.rglob("*.pyc")} == before
    assert not (shared_cache / "planted.pyc").exists()


def test_with_the_jail_off_a_child_reads_the_cache_and_writes_none(shared_cache):
    """`--sandbox off`: a candidate's process would otherwise leave its modules' bytecode (or anything
    compiled on its path) in the cache that later judges import from."""
    import subprocess as sp

    from mini_kv import jail

    code = "import sys, os; print(sys.pycache_prefix, sys.dont_write_bytecode)"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(shared_cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a command leaves it after pycache.redirect
    proc = jail.popen(
        [sys.executable, "-c", code], jail.JailSpec(), jail.off("test"), env=env, stdout=sp.PIPE
    )
    out, _ = proc.communicate(timeout=60)
    assert out.decode().split() == [str(shared_cache), "True"]


def test_the_warm_up_is_not_repeated_for_another_working_directory(monkeypatch):
    """`python -m mini_kv` puts the working directory first on sys.path: a stamp keyed by it warmed
    the cache again (20 s of compiling on a 2-core machine) in every project."""
    before = pycache._environment_digest()
    monkeypatch.setattr(sys, "path", ["/some/other/project", *sys.path])
    monkeypatch.chdir("/")
    assert pycache._environment_digest() == before


def test_an_edited_source_warms_the_cache_again(tmp_path):
    """The stamp covers mini_kv's own sources: after an edit (same version, new size or time) the
    children's bytecode is written again instead of being compiled, stale, by every jailed child."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    before = pycache.sources_state(pkg)
    assert pycache.sources_state(pkg) == before
    os.utime(pkg / "sub" / "b.py", ns=(1, 1))
    touched = pycache.sources_state(pkg)
    assert touched != before
    (pkg / "a.py").write_text("x = 10\n")
    assert pycache.sources_state(pkg) not in (before, touched)


def test_the_stamp_changes_with_mini_kvs_sources(monkeypatch):
    before = pycache._environment_digest()
    monkeypatch.setattr(pycache, "sources_state", lambda package: "edited")
    assert pycache._environment_digest() != before
