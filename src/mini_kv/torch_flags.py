"""Build flags that depend on the installed torch: the C++ standard its headers need, and the nvcc
defines its extension builder passes.

The standard is read from the installed torch's own headers (ATen/ATen.h refuses to compile below
it: `#error C++20 or later compatible compiler is required to use ATen`), so a torch that raises the
bar is followed without a release of mini_kv. Only where the header cannot be read (a stripped
install) does the table of torch versions below decide.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

# __cplusplus values of the standards, as ATen.h compares against them
STANDARD_OF_CPLUSPLUS = {201703: 17, 202002: 20, 202302: 23}
# (first torch version, standard): torch 2.15 is the first whose headers need C++20
STANDARD_SINCE = ((2, 15), 20)
OLDEST_STANDARD = 17
GUARD_HEADERS = ("ATen/ATen.h", "torch/csrc/api/include/torch/all.h")
# torch.utils.cpp_extension.COMMON_NVCC_FLAGS of torch 2.4 to 2.15, for a torch that lacks the name
DEFAULT_NVCC_DEFINES = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)

# the non-MSVC branch of the guard: `__cplusplus < 202002L`
_GUARD = re.compile(r"__cplusplus\s*<\s*(\d{6})L")


def header_standard(text: str) -> int | None:
    """The C++ standard a torch header insists on (the highest `__cplusplus < N` guard), or None."""
    found = [STANDARD_OF_CPLUSPLUS[int(v)] for v in _GUARD.findall(text) if int(v) in STANDARD_OF_CPLUSPLUS]
    return max(found) if found else None


def version_tuple(version: str) -> tuple[int, int]:
    """`2.15.0+cu132` -> (2, 15); a version that does not start with two numbers is an error."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def version_standard(version: str) -> int:
    """The C++ standard torch `version`'s headers need (the fallback when they cannot be read)."""
    since, standard = STANDARD_SINCE
    return standard if version_tuple(version) >= since else OLDEST_STANDARD


def std_flag(standard: int) -> str:
    return f"-std=c++{standard}"


def torch_standard(torch_dir: Path, version: str) -> tuple[int, str]:
    """(standard, where it was read) for the torch installed in `torch_dir`."""
    for rel in GUARD_HEADERS:
        path = torch_dir / "include" / rel
        try:
            found = header_standard(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if found is not None:
            return found, str(path)
    return version_standard(version), f"torch {version} (no readable {GUARD_HEADERS[0]})"


@dataclass(frozen=True)
class InstalledTorch:
    """Where torch is installed and what it was built as, read from its files."""

    dir: Path
    version: str
    cuda: str | None  # the CUDA it was built with; None: a CPU build


@functools.cache
def installed_torch() -> InstalledTorch | None:
    """The installed torch, found and read from its `version.py` without importing it (a second and
    more of CPU: the front door need not pay it where it asks nothing of a device); None where torch
    is missing or its version.py does not read as torch writes it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(spec.submodule_search_locations[0])
    try:
        text = (where / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    built = read_version_py(text)
    return None if built is None else InstalledTorch(where, *built)


def read_version_py(text: str) -> tuple[str, str | None] | None:
    """(version, CUDA version or None) from the text of torch's generated `version.py`
    (`__version__ = '2.11.0+cu130'`, `cuda: Optional[str] = '13.0'`); None where it does not read so."""
    version = re.search(r"^__version__\s*=\s*'([^']+)'\s*$", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:None|'([^']*)')\s*$", text, re.M)
    if version is None or cuda is None:
        return None
    return version.group(1), cuda.group(1)


def torch_installation() -> InstalledTorch:
    """The installed torch: read from its files (installed_torch), or, where they do not read as torch
    writes them, from torch itself, imported."""
    found = installed_torch()
    if found is not None:
        return found
    import torch

    return InstalledTorch(Path(torch.__file__).parent, torch.__version__, torch.version.cuda)


@functools.cache
def installed_standard() -> int:
    found = torch_installation()
    return torch_standard(found.dir, found.version)[0]


def installed_std_flag() -> str:
    """`-std=c++NN` for the installed torch: what its headers need."""
    return std_flag(installed_standard())


def base_cflags() -> tuple[str, ...]:
    """The flags every C++ build starts from. The standard is the installed torch's (C++17 up to
    torch 2.14, C++20 from 2.15), so it is part of `flags` and so of the build key."""
    return ("-O3", installed_std_flag())


def base_cuda_cflags() -> tuple[str, ...]:
    return ("-O3", installed_std_flag(), "--use_fast_math")


@functools.cache
def nvcc_defines() -> tuple[str, ...]:
    """The defines torch's extension builder gives nvcc, so a .cu file checked with them also builds
    inside a CUDA torch extension."""
    try:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
    except ImportError:
        return DEFAULT_NVCC_DEFINES
    return tuple(COMMON_NVCC_FLAGS)
