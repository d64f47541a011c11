"""Precompiled torch headers for host files (mini_kv.compile.pch): which header a file begins with,
when one is worth making, and where it is looked up."""

from __future__ import annotations

from pathlib import Path

import pytest

from mini_kv.compile import pch


def _src(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_first_include_skips_comments_blank_lines_and_pragma_once(tmp_path):
    text = "// op\n/* a\n   block */\n\n#pragma once\n#include <ATen/ATen.h>\n#include <vector>\n"
    assert pch.first_include(Path(_src(tmp_path, "a.cpp", text))) == "ATen/ATen.h"
    assert pch.first_include(Path(_src(tmp_path, "b.cpp", '#include "torch/extension.h"\n'))) == (
        "torch/extension.h"
    )


def test_no_first_include_when_code_or_a_define_comes_first(tmp_path):
    # GCC uses a precompiled header only before the first token of code: nothing to offer then
    assert pch.first_include(Path(_src(tmp_path, "a.cpp", "int x;\n#include <ATen/ATen.h>\n"))) is None
    assert pch.first_include(Path(_src(tmp_path, "b.cpp", "#define X 1\n#include <ATen/ATen.h>\n"))) is None
    assert pch.first_include(tmp_path / "missing.cpp") is None


def test_a_header_fits_a_build_only_when_every_host_file_begins_with_it(tmp_path):
    aten = "#include <ATen/ATen.h>\n"
    two = [_src(tmp_path, "op.cpp", aten), _src(tmp_path, "op_cuda.cpp", aten)]
    assert pch.common_header(two) == "ATen/ATen.h"
    # `-include` puts it first in every host file: one that begins otherwise rules it out
    assert pch.common_header([*two, _src(tmp_path, "x.cpp", "#include <vector>\n")]) is None
    assert pch.common_header([_src(tmp_path, "y.cpp", "#include <vector>\n")]) is None


def test_nothing_for_builds_without_host_files_or_a_pch_root(tmp_path):
    cu = [_src(tmp_path, "k.cu", "#include <torch/extension.h>\n")]
    assert pch.pch_cflags(str(tmp_path / "pch"), cu, ["-O3"]) == []
    host = [_src(tmp_path, "op.cpp", "#include <ATen/ATen.h>\n")]
    assert pch.pch_cflags(None, host, ["-O3"]) == []
    # one host file beside a .cu: making the header first would hold up nvcc for one file's gain
    assert pch.pch_cflags(str(tmp_path / "pch"), [*host, *cu], ["-O3"]) == []
    assert not (tmp_path / "pch").exists()


def test_flags_leave_out_the_candidates_macros_and_include_dirs():
    flags = pch._pch_flags(["-O3", "-std=c++17", "-DNS=mine", "-UX", "-Ifoo", "-fno-math-errno"])
    assert flags[0] == "-DTORCH_API_INCLUDE_EXTENSION_H" and "-fPIC" in flags
    assert flags[-3:] == ["-O3", "-std=c++17", "-fno-math-errno"]
    assert not any(f.startswith(("-DNS", "-UX", "-Ifoo")) for f in flags)


def test_an_existing_header_is_used_without_rebuilding(tmp_path, monkeypatch):
    host = [_src(tmp_path, "op.cpp", '// op\n#include <ATen/ATen.h>\n#include "checks.h"\n')]
    root = tmp_path / "pch"
    final = root / pch._key(pch._compiler(), pch._pch_flags(["-O3"]), "ATen/ATen.h")[:32]
    stub = final / "mini_kv_pch_ATen_ATen_h.h"
    final.mkdir(parents=True)
    Path(f"{stub}.gch").write_bytes(b"")
    stub.write_text("#include <ATen/ATen.h>\n")
    # as an earlier mini_kv left it (mkdtemp's 0700, files 0600): opened to the jail's own uid, whose
    # build otherwise failed on a missing `-include`
    for p, mode in ((final, 0o700), (stub, 0o600), (Path(f"{stub}.gch"), 0o600)):
        p.chmod(mode)
    monkeypatch.setattr(pch, "_make", lambda *a: (_ for _ in ()).throw(AssertionError("rebuilt")))
    assert pch.pch_cflags(str(root), [*host, "k.cu"], ["-O3"]) == ["-include", str(stub)]
    assert final.stat().st_mode & 0o005 == 0o005
    assert all(p.stat().st_mode & 0o004 for p in (stub, Path(f"{stub}.gch")))


def test_a_failed_or_killed_header_build_leaves_no_dirs_behind(tmp_path):
    final = tmp_path / "pch" / "k"
    final.parent.mkdir(parents=True)
    stale = final.parent / f"tmp-{final.name}-killed"  # a build killed by its timeout while making it
    stale.mkdir()
    logged = []
    from mini_kv import jail

    assert pch._make("false", [], "ATen/ATen.h", final, logged.append, jail.probe()) is False
    assert not stale.exists() and not final.exists() and list(final.parent.iterdir()) == []
    assert "failed" in logged[-1]


def test_a_made_header_is_readable_by_the_jails_own_uid(tmp_path):
    """Where no pids cgroup caps a jail, builds run as an unprivileged uid of their own: a header dir
    left 0700 (mkdtemp's mode) was silently missing from every build's view."""
    import shutil

    from mini_kv import jail

    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    final = tmp_path / "pch" / "k"
    final.parent.mkdir(parents=True)
    assert pch._make(compiler, [], "stddef.h", final, print, jail.probe()) is True
    for p in (final, *final.iterdir()):
        assert p.stat().st_mode & 0o005 == 0o005 if p.is_dir() else p.stat().st_mode & 0o004, oct(
            p.stat().st_mode
        )


def test_one_header_serves_every_project(tmp_path, monkeypatch):
    """The header lives in mini_kv's machine-wide cache (settings.cache_dir), not in a project's .build/:
    a second project's build uses the one the first project's build made."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert pch.root() == (tmp_path / "cache" / "mini-kv" / "pch").resolve()
    made = []

    def make(compiler, flags, header, final, log, sandbox):
        stub = final / pch._stub_name(header)
        final.mkdir(parents=True)
        stub.write_text(f"#include <{header}>\n")
        Path(f"{stub}.gch").write_bytes(b"")
        made.append(final)
        return True

    monkeypatch.setattr(pch, "_make", make)
    got = []
    for project in ("one", "two"):
        (tmp_path / project).mkdir()
        host = [_src(tmp_path / project, f"{n}.cpp", "#include <torch/extension.h>\n") for n in ("op", "x")]
        got.append(pch.pch_cflags(str(pch.root()), host, ["-O3"]))
    assert len(made) == 1 and made[0].parent == pch.root()
    assert got[0] == got[1] == ["-include", str(made[0] / "mini_kv_pch_torch_extension_h.h")]
