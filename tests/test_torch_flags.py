"""The C++ standard (and nvcc defines) follow the installed torch: C++17 up to torch 2.14, C++20 from
2.15, whose headers stop with `#error C++20 or later compatible compiler is required to use ATen`."""

from pathlib import Path

import pytest
import torch

from mini_kv import torch_flags
from mini_kv.cluster.prebuild import build_card_candidate
from mini_kv.compile import compiler
from mini_kv.model import Candidate

ROOT = Path(__file__).resolve().parents[1]

# the guards as torch 2.13 and torch 2.15 ship them in ATen/ATen.h
ATEN_2_13 = (
    "#pragma once\n\n#if !defined(_MSC_VER) && __cplusplus < 201703L\n"
    "#error C++17 or later compatible compiler is required to use ATen.\n#endif\n"
)
ATEN_2_15 = (
    "#pragma once\n#if (defined(_MSVC_LANG) && _MSVC_LANG < 202002L) || \\\n"
    "    (!defined(_MSVC_LANG) && __cplusplus < 202002L)\n"
    "#error C++20 or later compatible compiler is required to use ATen.\n#endif\n"
)


@pytest.mark.parametrize(
    ("version", "standard"),
    [
        ("2.4.0", 17),
        ("2.11.0+cu130", 17),
        ("2.13.0+cpu", 17),
        ("2.14.1", 17),
        ("2.15.0", 20),
        ("2.15.0+cu132", 20),
        ("2.16.0.dev20270101", 20),
        ("3.0", 20),
    ],
)
def test_version_to_standard(version, standard):
    assert torch_flags.version_standard(version) == standard
    assert torch_flags.std_flag(standard) == f"-std=c++{standard}"


def test_version_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="not a torch version"):
        torch_flags.version_tuple("nightly")


@pytest.mark.parametrize(("text", "standard"), [(ATEN_2_13, 17), (ATEN_2_15, 20), ("#pragma once\n", None)])
def test_standard_read_from_header(text, standard):
    assert torch_flags.header_standard(text) == standard


def _fake_torch(tmp_path: Path, aten: str | None) -> Path:
    if aten is not None:
        (tmp_path / "include" / "ATen").mkdir(parents=True)
        (tmp_path / "include" / "ATen" / "ATen.h").write_text(aten)
    return tmp_path


def test_header_wins_over_version_table(tmp_path):
    # a torch that raised the bar before the table knows of it is still followed
    standard, source = torch_flags.torch_standard(_fake_torch(tmp_path, ATEN_2_15), "2.14.0")
    assert standard == 20 and source.endswith("ATen.h")


def test_without_headers_the_version_decides(tmp_path):
    assert torch_flags.torch_standard(_fake_torch(tmp_path, None), "2.15.0")[0] == 20
    assert torch_flags.torch_standard(_fake_torch(tmp_path, None), "2.13.0")[0] == 17


def test_installed_torch_standard_is_what_its_headers_need():
    torch_dir = Path(torch.__file__).parent
    text = (torch_dir / "include" / "ATen" / "ATen.h").read_text()
    assert torch_flags.installed_standard() == torch_flags.header_standard(text)
    assert torch_flags.installed_standard() == torch_flags.version_standard(torch.__version__)


def _candidate() -> Candidate:
    return Candidate(
        id="v0_naive",
        path="candidates/vector_add/v0_naive",
        op="ns::vector_add",
        cpu_sources=("op.cpp",),
        cuda_sources=("kernel.cu", "op_cuda.cpp"),
    )


def test_build_flags_and_key_follow_the_standard(monkeypatch):
    monkeypatch.setattr(torch_flags, "installed_standard", lambda: 17)
    plan17 = compiler.build_plan(ROOT, _candidate(), with_cuda=False)
    monkeypatch.setattr(torch_flags, "installed_standard", lambda: 20)
    plan20 = compiler.build_plan(ROOT, _candidate(), with_cuda=True)
    assert "-std=c++17" in plan17.flags["cflags"]
    assert "-std=c++20" in plan20.flags["cflags"] and "-std=c++20" in plan20.flags["cuda_cflags"]
    assert not any(f == "-std=c++17" for f in plan20.flags["cflags"] + plan20.flags["cuda_cflags"])
    plan20_cpu = compiler.build_plan(ROOT, _candidate(), with_cuda=False)
    assert plan17.key != plan20_cpu.key  # a build for one standard is never reused for the other


def test_nvcc_check_uses_torch_standard_and_defines(monkeypatch, tmp_path):
    """The plain nvcc check of .cu files (no CUDA torch) compiles with the standard and defines of torch."""
    seen = []

    class Done:
        returncode, timed_out, output = 0, False, ""

    monkeypatch.setattr(torch_flags, "installed_standard", lambda: 20)
    monkeypatch.setattr(
        compiler.environment, "nvcc_info", lambda: compiler.environment.Tool("/usr/bin/nvcc", "x")
    )
    # the check runs jailed (jail.run); record what it would run instead
    monkeypatch.setattr(
        compiler.jail,
        "run",
        lambda cmd, spec, info, timeout, env=None, **kw: seen.append((cmd, env)) or Done(),
    )
    plan = compiler.build_plan(ROOT, _candidate(), with_cuda=False)
    assert compiler._cuda_compile_check(plan, tmp_path, timeout=5, sandbox=None).status == "ok"
    ((cmd, env),) = seen
    # through nvcc's front ends side by side (compile/nvcc_steps.py), running that nvcc
    assert cmd[1].endswith("nvcc_steps.py") and env["MINI_KV_NVCC"] == "/usr/bin/nvcc"
    assert "-std=c++20" in cmd and "-std=c++17" not in cmd
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    assert all(flag in cmd for flag in COMMON_NVCC_FLAGS)


def test_environment_build_flags_name_the_standard():
    from mini_kv import environment

    assert torch_flags.installed_std_flag() in environment.collect().build_flags.cflags


@pytest.mark.parametrize(("arch_list", "with_cuda"), [([], False), (["9.0"], True)])
def test_cuda_torch_without_a_gpu_compile_checks_instead_of_building(monkeypatch, arch_list, with_cuda):
    """PyPI's torch is a CUDA build: on a machine without a GPU (and no TORCH_CUDA_ARCH_LIST) there is no
    arch to build for, and torch's builder fails on the empty list; the sources are compile-checked."""
    monkeypatch.setattr(compiler.environment, "torch_has_cuda_build", lambda: True)
    monkeypatch.setattr(compiler.environment, "cuda_arch_list", lambda: arch_list)
    plan = compiler.build_plan(ROOT, _candidate())
    assert plan.toolchain.with_cuda is with_cuda
    assert plan.cuda_sources_skipped == ([] if with_cuda else ["kernel.cu", "op_cuda.cpp"])
    module = compiler.build_plan(ROOT, _candidate_module())
    assert module.check_only is (not with_cuda)


def _candidate_module():
    from types import SimpleNamespace

    return SimpleNamespace(
        id="sol",
        path="candidates/vector_add/v0_naive",
        cpu_sources=(),
        cuda_sources=("kernel.cu",),
        cflags=(),
        cuda_cflags=(),
        python_module=True,
    )


# torch's generated version.py, as a CUDA build (2.11, the GPU machines') and a CPU build write it
VERSION_PY_CUDA = (
    "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
    "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
    "git_version = '0123abc'\nhip: Optional[str] = None\n"
)


def test_the_installed_torch_is_read_from_its_version_py_as_torch_reports_it():
    """What the front door records about torch, read from its files without importing it, is what the
    imported torch says (this machine's build), and a CUDA build's version.py reads as one."""
    found = torch_flags.installed_torch()
    assert found is not None
    assert (found.version, found.cuda, found.dir) == (
        torch.__version__,
        torch.version.cuda,
        Path(torch.__file__).parent,
    )
    assert torch_flags.read_version_py(VERSION_PY_CUDA) == ("2.11.0+cu130", "13.0")
    assert torch_flags.read_version_py(VERSION_PY_CUDA.replace("'13.0'", "None")) == ("2.11.0+cu130", None)
    assert torch_flags.read_version_py("__version__ = get_version()\n") is None  # not torch's: import it


@pytest.mark.parametrize(
    "command",
    [
        ["bench", "problems/sol-execbench/custom_inputs_matmul", "--solution",
         "solutions/custom_inputs_matmul/pytorch/solution.json"],
        ["verify", "--task", "tasks/vector_add.yaml", "--candidate", "v0_naive", "--skip-benchmark"],
    ],
    ids=["bench", "verify"],
)  # fmt: skip
def test_a_cpu_front_door_does_not_import_torch(tmp_path, command):
    """On a CPU build of torch the front door asks nothing of a device: `bench` of a PyTorch solution
    and `verify` of a card whose build is cached (its modules imported by its judge) leave the import to
    the worker's judge and subject (on two cores a third import of torch beside theirs cost `bench` about
    0.8 s). The card's build comes first: a cold build's precompiled header is keyed by torch, imported;
    the suite from a fresh clone has no build cached."""
    import subprocess
    import sys

    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of torch: the front door asks it for the devices")
    if command[0] == "verify":  # a cached build: a cold one precompiles torch's headers, keyed by torch
        build_card_candidate(str(ROOT / command[2]), command[4], "cpu", 600)
    probe = (
        "import sys\n"
        "from mini_kv.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('TORCH-IMPORTED' if 'torch' in sys.modules else 'TORCH-NOT-IMPORTED')\n"
        "sys.exit(code)\n"
    )
    res = subprocess.run(
        [
            sys.executable, "-c", probe, *command, "--device", "cpu", "--artifacts", str(tmp_path / "a"),
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "TORCH-NOT-IMPORTED" in res.stdout, res.stdout + res.stderr
