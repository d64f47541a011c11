"""nvcc's host and device front ends side by side (mini_kv.compile.nvcc_steps): the dry run read into
two chains, command lines it must leave to nvcc, and, where nvcc is installed, objects and errors
the same as nvcc's own."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mini_kv.compile import nvcc_steps
from mini_kv.compile.nvcc_steps import Unhandled, parse_dry_run

SCRIPT = Path(nvcc_steps.__file__).resolve()
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

# the shape of `nvcc --dryrun -c k.cu -o k.o -gencode=arch=compute_90a,code=sm_90a` (nvcc 13.0)
DRY_RUN = """\
#$ _SPACE_=
#$ CICC_PATH=/cuda/bin/../nvvm/bin
#$ PATH=/cuda/bin/../nvvm/bin:/cuda/bin:/usr/bin
#$ INCLUDES="-I/cuda/include"
#$ gcc -D__CUDA_ARCH_LIST__=900 -E -x c++ -D__CUDACC__ "k.cu" -o "/t/x-5_k.cpp4.ii"
#$ cudafe++ --c++17 --gen_c_file_name "/t/x-6_k.cudafe1.cpp" --stub_file_name "x-6_k.cudafe1.stub.c" \
--gen_module_id_file --module_id_file_name "/t/x-4_k.module_id" "/t/x-5_k.cpp4.ii"
#$ gcc -D__CUDA_ARCH__=900 -E -x c++ -D__CUDACC__ "k.cu" -o "/t/x-7_k.cpp1.ii"
#$ "$CICC_PATH/cicc" --c++17 -arch compute_90a --include_file_name "x-3_k.fatbin.c" -tused \
--module_id_file_name "/t/x-4_k.module_id" --gen_c_file_name "/t/x-6_k.cudafe1.c" "/t/x-7_k.cpp1.ii" -o "/t/x-6_k.ptx"
#$ ptxas -arch=sm_90a -m64  "/t/x-6_k.ptx"  -o "/t/x-8_k.cubin"
#$ fatbinary -64 "--image3=kind=elf,sm=90a,file=/t/x-8_k.cubin" --embedded-fatbin="/t/x-3_k.fatbin.c"
#$ rm /t/x-3_k.fatbin
#$ gcc -c -x c++ -m64 "/t/x-6_k.cudafe1.cpp" -o "k.o"
"""


def one_line(text: str) -> str:
    return text.replace("\\\n", "")


def test_the_dry_run_becomes_a_host_chain_a_device_chain_and_the_compile():
    plan = parse_dry_run(one_line(DRY_RUN), {})
    assert [nvcc_steps._tool(s.argv) for s in plan.host] == ["gcc", "cudafe++"]
    assert [nvcc_steps._tool(s.argv) for s in plan.device] == ["gcc", "cicc", "ptxas", "fatbinary", "rm"]
    assert plan.compile.argv[-3:] == ["/t/x-6_k.cudafe1.cpp", "-o", "k.o"]
    cicc = plan.device[1]
    assert cicc.argv[0] == "/cuda/bin/../nvvm/bin/cicc"  # the dry run's variables, expanded
    # cicc writes its own module id, which must match cudafe++'s before the host compile
    own = plan.module_ids[1][0]
    assert plan.module_ids[0] == "/t/x-4_k.module_id" and own == "/t/x-4_k.module_id.cicc0"
    i = cicc.argv.index("--module_id_file_name")
    assert cicc.argv[i + 1 : i + 3] == [own, "--gen_module_id_file"]
    assert plan.env["PATH"].startswith("/cuda/bin/../nvvm/bin") and plan.env["INCLUDES"] == "-I/cuda/include"
    assert [s.order for s in (*plan.host, *plan.device, plan.compile)] == [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda t: t.replace("#$ rm ", "#$ -- Filter Dependencies -- > k.d\n#$ rm "), "internal step"),
        (lambda t: t.replace("--gen_module_id_file ", ""), "does not write the module id"),
        (lambda t: t.replace("#$ ptxas", "#$ nvlink -o x\n#$ ptxas"), "unknown device step"),
        (
            lambda t: t.replace('"/t/x-6_k.cudafe1.cpp" -o "k.o"', '"/t/other.cpp" -o "k.o"'),
            "compile its output",
        ),
        (
            lambda t: t.replace('"/t/x-4_k.module_id" --gen_c_file_name', '"/t/other" --gen_c_file_name'),
            "cicc step",
        ),
    ],
)
def test_a_dry_run_of_another_shape_is_left_to_nvcc(edit, why):
    with pytest.raises(Unhandled, match=why):
        parse_dry_run(edit(one_line(DRY_RUN)), {})


@pytest.mark.parametrize(
    "args, ok",
    [
        (["-c", "k.cu", "-o", "k.o"], True),
        (["k.cu", "-o", "k"], False),  # a link
        (["-MD", "-MF", "k.d", "-c", "k.cu", "-o", "k.o"], False),  # a dependency file: an internal step
        (["-rdc=true", "-c", "k.cu", "-o", "k.o"], False),
        (["-E", "-c", "k.cu"], False),
        (["--keep", "-c", "k.cu", "-o", "k.o"], False),
    ],
)
def test_command_lines_it_does_not_handle_go_to_nvcc(args, ok):
    assert nvcc_steps.handled(args) is ok


def test_it_is_switched_off_or_gives_way_to_the_users_own_nvcc():
    env = {}
    assert nvcc_steps.use_for_torch_builds("/cuda/bin/nvcc", env)
    assert env["MINI_KV_NVCC"] == "/cuda/bin/nvcc" and str(SCRIPT) in env["PYTORCH_NVCC"]
    assert env["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    users = {"PYTORCH_NVCC": "ccache nvcc"}
    assert not nvcc_steps.use_for_torch_builds("/cuda/bin/nvcc", users)
    assert users == {"PYTORCH_NVCC": "ccache nvcc"}
    off = {"MINI_KV_NVCC_STEPS": "off"}
    assert not nvcc_steps.use_for_torch_builds("/cuda/bin/nvcc", off) and "PYTORCH_NVCC" not in off


KERNEL = """\
#include <cstdio>
template <int N> __device__ float scale(float v) { return v * N; }
__global__ void twice(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = scale<2>(x[i]);
}
void launch(float* x, int n) { twice<<<(n + 255) / 256, 256>>>(x, n); }
"""
FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-O3", "--use_fast_math", "-Xcompiler", "-fPIC"]


def compile_both(tmp_path: Path, source: str, flags=FLAGS):
    src = tmp_path / "k.cu"
    src.write_text(source)
    runs = {}
    for who, cmd in (("nvcc", [NVCC]), ("steps", [sys.executable, str(SCRIPT)])):
        out = tmp_path / f"{who}.o"
        env = {**os.environ, "MINI_KV_NVCC": NVCC}
        runs[who] = (
            subprocess.run(
                [*cmd, "-c", str(src), "-o", str(out), *flags],
                env=env,
                capture_output=True,
                text=True,
                cwd=tmp_path,
            ),
            out,
        )
    return runs


def strings(path: Path) -> list[str]:
    """The object's printable strings, less the temporary file name nvcc varies from run to run."""
    text = subprocess.run(["strings", "-a", str(path)], capture_output=True, text=True, check=True).stdout
    return [s for s in text.splitlines() if "tmpxft_" not in s]


@needs_nvcc
def test_the_object_is_nvccs_but_for_its_temporary_names(tmp_path):
    runs = compile_both(tmp_path, KERNEL)
    (nv, nv_o), (st, st_o) = runs["nvcc"], runs["steps"]
    assert nv.returncode == st.returncode == 0, st.stderr
    assert nv_o.stat().st_size == st_o.stat().st_size
    assert strings(nv_o) == strings(st_o)
    differing = subprocess.run(["cmp", "-l", str(nv_o), str(st_o)], capture_output=True, text=True).stdout
    assert len(differing.splitlines()) <= 8  # the temporary name's digits, nothing else
    assert not list(tmp_path.glob("tmpxft_*"))  # no temporaries left behind


@needs_nvcc
def test_a_compile_error_reads_as_nvccs_once_with_its_status(tmp_path):
    runs = compile_both(tmp_path, KERNEL.replace("x[i] = scale<2>(x[i]);", "x[i] = scale<2>(x[i])"))
    (nv, _), (st, _) = runs["nvcc"], runs["steps"]
    assert nv.returncode != 0 and st.returncode == nv.returncode
    assert st.stderr.count("error") == nv.stderr.count("error") >= 1
    assert st.stderr.replace(str(tmp_path), "") == nv.stderr.replace(str(tmp_path), "")


@needs_nvcc
def test_module_ids_that_differ_fall_back_to_nvcc(tmp_path, monkeypatch, capfd):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    monkeypatch.setenv("MINI_KV_NVCC", NVCC)
    monkeypatch.setattr(nvcc_steps, "_same_module_ids", lambda plan: False)
    ran = []
    real = subprocess.run

    def spy(argv, *a, **kw):
        ran.append(list(argv))
        return real(argv, *a, **kw)

    monkeypatch.setattr(nvcc_steps.subprocess, "run", spy)
    out = tmp_path / "k.o"
    assert nvcc_steps.main(["-c", str(src), "-o", str(out), *FLAGS]) == 0
    assert out.is_file()
    assert ran[-1][:1] == [NVCC] and "--dryrun" not in ran[-1]  # nvcc itself, as asked


def test_mini_kvs_own_nvcc_commands_start_through_it_unless_switched_off():
    start, env = nvcc_steps.launcher("/cuda/bin/nvcc", {"PATH": "/bin"})
    assert start == [sys.executable, str(SCRIPT)] and env == {
        "PATH": "/bin",
        "MINI_KV_NVCC": "/cuda/bin/nvcc",
    }
    assert nvcc_steps.launcher("/cuda/bin/nvcc", {"MINI_KV_NVCC_STEPS": "off"}) == (["/cuda/bin/nvcc"], None)


@pytest.mark.parametrize("users_nvcc", [None, "ccache nvcc"])
def test_a_torch_extension_build_runs_through_it_unless_the_user_set_an_nvcc(
    monkeypatch, tmp_path, users_nvcc
):
    import torch.utils.cpp_extension as ext

    from mini_kv.compile import jit_child
    from mini_kv.worker.jobs import BuildJob

    for name in (
        "PYTORCH_NVCC",
        "MINI_KV_NVCC",
        "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES",
        "MINI_KV_NVCC_STEPS",
    ):
        monkeypatch.setenv(name, "")  # recorded, so the test's changes are undone
        monkeypatch.delenv(name)
    if users_nvcc:
        monkeypatch.setenv("PYTORCH_NVCC", users_nvcc)
    seen = {}
    monkeypatch.setattr(ext, "CUDA_HOME", "/cuda")
    monkeypatch.setattr(ext, "load", lambda **kw: seen.update(os.environ))
    job = BuildJob(
        name="m",
        build_dir=str(tmp_path),
        sources=[],
        include_dirs=[],
        flags={"cflags": [], "cuda_cflags": []},
        arch_list=[],
        python_module=False,
        with_cuda=None,
    )
    jit_child.build(job)
    if users_nvcc:
        assert seen["PYTORCH_NVCC"] == users_nvcc and "MINI_KV_NVCC" not in seen
    else:
        assert str(SCRIPT) in seen["PYTORCH_NVCC"] and seen["MINI_KV_NVCC"] == "/cuda/bin/nvcc"
        assert seen["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
