"""Which solution languages can run here, and what the C++ ones need on the compiler's command line.

Every check is done in the parent without importing the package (find_spec only), so a missing or
broken package is a clear "unavailable here" reason, not a crash of the tool.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass

from mini_kv import environment

# package import name and the pip distribution that provides it
PYTHON_PACKAGES = {
    "triton": ("triton", "triton"),
    "cute_dsl": ("cutlass", "nvidia-cutlass-dsl"),
    "cutile": ("cuda.tile", "cuda-tile"),
    "cudnn_frontend": ("cudnn", "nvidia-cudnn-frontend"),
}
MIN_CAPABILITY = {"cutile": (10, 0)}  # cuTile targets Blackwell and newer


@dataclass(frozen=True)
class CppFlags:
    include_dirs: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()


def _has_package(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def _capability(env: environment.Environment) -> tuple[int, int] | None:
    if env.gpu is None or not env.gpu.capability:
        return None
    major, _, minor = env.gpu.capability.partition(".")
    return int(major), int(minor or 0)


def python_unavailable(languages: tuple[str, ...], device: str, env: environment.Environment) -> str | None:
    """Why a Python-language solution cannot run here, or None."""
    for lang in languages:
        if lang == "pytorch":
            continue
        module, dist = PYTHON_PACKAGES[lang]
        if not _has_package(module):
            return f"{lang}: the Python package `{module}` is not installed (pip install {dist})"
        if not device.startswith("cuda"):
            return f"{lang}: kernels need a CUDA device; this run is on {device}"
        need = MIN_CAPABILITY.get(lang)
        have = _capability(env)
        if need and have and have < need:
            return (
                f"{lang}: needs compute capability >= {need[0]}.{need[1]}; this GPU "
                f"({env.gpu.name}) has {have[0]}.{have[1]}"
            )
    return None


def cpp_run_unavailable(device: str) -> str | None:
    """Why a built C++ solution cannot run here (after its build or compile check), or None."""
    if not environment.torch_has_cuda_build():
        return (
            "C++ solutions are CUDA torch extensions: this torch has no CUDA (or CUDA_HOME is unset), "
            "so the sources were only compile-checked"
        )
    if not device.startswith("cuda"):
        return f"C++ solutions run on a CUDA device; this run is on {device}"
    return None


def _package_dir(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _cuda_include() -> str | None:
    home = environment.cuda_home_dir()
    return os.path.join(home, "include") if home else None


def _cutlass_include() -> str | None:
    roots = [os.environ.get(v) for v in ("CUTLASS_PATH", "CUTLASS_HOME", "CUTLASS_DIR")]
    pkg = _package_dir("cutlass_library")  # the nvidia-cutlass wheel ships the headers under source/
    if pkg:
        roots.append(os.path.join(pkg, "source"))
    for root in filter(None, roots):
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cutlass", "cutlass.h")):
            return inc
    for d in ("/usr/local/include", "/usr/include"):
        if os.path.isfile(os.path.join(d, "cutlass", "cutlass.h")):
            return d
    return None


def _wheel_dir(packages: tuple[str, ...], header: str) -> str | None:
    """The first nvidia.* package dir whose include/ holds `header` (CUDA 13 wheels share nvidia/cu13)."""
    for package in packages:
        pkg = _package_dir(package)
        if pkg and os.path.isfile(os.path.join(pkg, "include", header)):
            return pkg
    return None


def _cuda_library(header: str, libs: tuple[str, ...], packages: tuple[str, ...]) -> CppFlags | None:
    """Header and libraries of a CUDA library: from its nvidia.* wheel (what CUDA torch installs) or the toolkit."""
    pkg = _wheel_dir(packages, header)
    if pkg:
        lib = os.path.join(pkg, "lib")
        names = []
        for name in libs:  # wheels often ship only the versioned file (libcudnn.so.9)
            exact = os.path.join(lib, f"lib{name}.so")
            versioned = sorted(glob.glob(os.path.join(lib, f"lib{name}.so.*")))
            names.append(
                f"-l{name}"
                if os.path.exists(exact) or not versioned
                else f"-l:{os.path.basename(versioned[-1])}"
            )
        return CppFlags((os.path.join(pkg, "include"),), (f"-L{lib}", f"-Wl,-rpath,{lib}", *names))
    inc = _cuda_include()
    if inc and os.path.isfile(os.path.join(inc, header)):
        return CppFlags((), tuple(f"-l{name}" for name in libs))
    return None


def _cudnn_frontend_include() -> str | None:
    """include/ of the header-only cuDNN frontend: $CUDNN_FRONTEND_PATH, else the nvidia-cudnn-frontend
    wheel, whose recent releases install include/ beside the `cudnn` package (older ones inside it)."""
    roots = [os.environ.get("CUDNN_FRONTEND_PATH")]
    pkg = _package_dir("cudnn")
    if pkg:
        roots += [pkg, os.path.dirname(pkg)]
    for root in filter(None, roots):
        inc = os.path.join(root, "include")
        if os.path.isfile(os.path.join(inc, "cudnn_frontend.h")):
            return inc
    return None


def _nvrtc_include() -> list[str]:
    """The frontend's headers include nvrtc.h: from the toolkit, else CUDA torch's nvrtc wheel."""
    inc = _cuda_include()
    if inc and os.path.isfile(os.path.join(inc, "nvrtc.h")):
        return []
    pkg = _wheel_dir(("nvidia.cuda_nvrtc", "nvidia.cu13"), "nvrtc.h")
    return [os.path.join(pkg, "include")] if pkg else []


def cpp_flags(languages: tuple[str, ...], dependencies: tuple[str, ...] = ()) -> tuple[CppFlags, str | None]:
    """Extra include dirs and link flags the C++ languages need, or the reason one is unavailable.
    `dependencies` is the solution's spec.dependencies: one naming cudnn_frontend makes its headers required."""
    include_dirs: list[str] = []
    ldflags: list[str] = []
    for lang in languages:
        if lang == "cuda_cpp":
            continue
        if lang == "cutlass":
            inc = _cutlass_include()
            if inc is None:
                return CppFlags(), (
                    "cutlass: CUTLASS headers not found; set CUTLASS_PATH to a CUTLASS checkout "
                    "(its include/ holds cutlass/cutlass.h) or pip install nvidia-cutlass"
                )
            include_dirs.append(inc)
            continue
        header, libs, packages, dist = {
            "cudnn": ("cudnn.h", ("cudnn",), ("nvidia.cudnn", "nvidia.cu13"), "nvidia-cudnn-cu13"),
            "cublas": (
                "cublas_v2.h",
                ("cublas", "cublasLt"),
                ("nvidia.cublas", "nvidia.cu13"),
                "nvidia-cublas",
            ),
        }[lang]
        found = _cuda_library(header, libs, packages)
        if found is None:
            return CppFlags(), (
                f"{lang}: {header} not found in the `{packages[0]}` package or the CUDA toolkit "
                f"(pip install {dist}, or install the toolkit's {lang} component)"
            )
        if (
            lang == "cudnn"
        ):  # the header-only C++ frontend, when its wheel (nvidia-cudnn-frontend) is installed
            frontend = _cudnn_frontend_include()
            if frontend is None and "cudnn_frontend" in dependencies:
                return CppFlags(), (
                    "cudnn: the solution depends on cudnn_frontend, and cudnn_frontend.h was not "
                    "found (pip install nvidia-cudnn-frontend, or set CUDNN_FRONTEND_PATH to a "
                    "cudnn-frontend checkout)"
                )
            include_dirs.extend([frontend, *_nvrtc_include()] if frontend else [])
        include_dirs.extend(found.include_dirs)
        ldflags.extend(found.ldflags)
    return CppFlags(tuple(dict.fromkeys(include_dirs)), tuple(dict.fromkeys(ldflags))), None
