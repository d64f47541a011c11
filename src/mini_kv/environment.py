"""Facts about the machine and toolchain: used by `doctor`, the build key and environment.json."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from mini_kv import torch_flags
from mini_kv.codec import to_json
from mini_kv.errors import UserError
from mini_kv.model import canonical_json, sha256_text
from mini_kv.settings import BUILD_MEMORY_VAR


@dataclass(frozen=True)
class Tool:
    """A program of the toolchain: where it is, and the line that says its version (None: not found)."""

    path: str | None
    version: str | None


@dataclass(frozen=True)
class Gpu:
    """One visible GPU, as environment.json's `gpu` records it."""

    index: int
    name: str
    capability: str  # "9.0"
    sm_count: int
    memory_bytes: int
    l2_bytes: int | None


@dataclass(frozen=True)
class SourceRevision:
    commit: str
    dirty: bool  # the work tree differed from the commit


@dataclass(frozen=True)
class TorchInfo:
    version: str
    cuda: str | None  # the CUDA torch was built with; None: a CPU build
    cuda_available: bool
    devices: tuple[Gpu, ...]


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


@functools.cache
def nvcc_info() -> Tool:
    path = shutil.which("nvcc")
    if path is None:
        cuda_home = cuda_home_dir()
        cand = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
        path = cand if cand and os.path.isfile(cand) else None
    if path is None:
        return Tool(None, None)
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    release = next((ln.strip() for ln in out.splitlines() if "release" in ln), None)
    return Tool(path, release)


def cuda_home_dir() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


@functools.cache
def cxx_info() -> Tool:
    cxx = os.environ.get("CXX", "c++")
    return Tool(shutil.which(cxx), _first_line([cxx, "--version"]))


@functools.cache
def ninja_info() -> Tool:
    return Tool(shutil.which("ninja"), _first_line(["ninja", "--version"]))


def torch_info() -> TorchInfo:
    built = torch_flags.torch_installation()
    if built.cuda is None:
        # a CPU build has no device to ask about: its version is read from its version.py, and this
        # process need not import torch (over a second of a command's CPU on a 2-core machine, while
        # the worker's judge and subject import it too)
        return TorchInfo(built.version, None, False, ())
    import torch

    available = bool(torch.cuda.is_available())
    devices = []
    for i in range(torch.cuda.device_count() if available else 0):
        p = torch.cuda.get_device_properties(i)
        l2 = getattr(p, "L2_cache_size", None)
        devices.append(Gpu(i, p.name, f"{p.major}.{p.minor}", p.multi_processor_count, p.total_memory, l2))
    return TorchInfo(torch.__version__, torch.version.cuda, available, tuple(devices))


@functools.cache
def driver_version() -> str | None:
    line = _first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return line.strip() if line else None


def cuda_arch_list(devices: tuple[Gpu, ...] | None = None) -> list[str]:
    """The archs a CUDA build targets: TORCH_CUDA_ARCH_LIST if set, else the visible GPUs' (`devices`:
    torch_info()'s, when the caller already has them)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return sorted(set(env.replace(";", " ").split()))
    return sorted({d.capability for d in (torch_info().devices if devices is None else devices)})


def torch_has_cuda_build() -> bool:
    return torch_flags.torch_installation().cuda is not None and cuda_home_dir() is not None


def pick_device(requested: str | None) -> str:
    if requested and not requested.startswith("cuda"):
        return requested  # the CPU (or a device torch checks when used): no torch import for it
    if not requested and torch_flags.torch_installation().cuda is None:
        return "cpu"  # a CPU build of torch has no other device: no import for it either
    import torch

    if requested:
        if requested.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"--device {requested}: this torch ({torch.__version__}) sees no CUDA device")
        index = int(requested.partition(":")[2] or 0)
        if requested.startswith("cuda") and index >= torch.cuda.device_count():
            raise UserError(
                f"--device {requested}: torch sees {torch.cuda.device_count()} CUDA device(s), "
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
        return "cuda:0" if requested == "cuda" else requested
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def cpu_memory_limit(gb: float | None = None) -> int:
    """A worker process's memory cap (proc.cap_memory): `gb` GiB, else half the machine, so a runaway op
    fails alone."""
    if gb:
        return int(gb * 2**30)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


def build_memory_limit() -> int:
    """Address-space cap of each process of a build that loads no CUDA: $MINI_KV_BUILD_MEMORY_GB GiB,
    else half the machine (cpu_memory_limit)."""
    raw = os.environ.get(BUILD_MEMORY_VAR, "")
    try:
        gb = float(raw) if raw else None
    except ValueError:
        raise UserError(f"${BUILD_MEMORY_VAR}={raw!r}: expected a number of GiB") from None
    if gb is not None and not (gb > 0 and math.isfinite(gb)):
        raise UserError(f"${BUILD_MEMORY_VAR}={raw!r}: expected a positive number of GiB")
    return cpu_memory_limit(gb)


ENV_TAG_VAR = "MINI_KV_ENV_TAG"


@dataclass(frozen=True)
class BuildFlags:
    """The flags every candidate build starts from: a change to them changes every binary."""

    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    arch_list: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Environment:
    """environment.json (collect): the machine and toolchain a result was measured on. `key` hashes
    what must match for two timings to be comparable (environment_key)."""

    schema_version: int = 1
    python: str
    platform: str
    machine: str
    cpu_count: int | None
    torch: str
    torch_cuda: str | None
    device_kind: str  # cpu | cuda
    gpu: Gpu | None
    driver: str | None
    nvcc: str | None
    cxx: str | None
    executable: str
    build_flags: BuildFlags
    tag: str | None
    key: str = ""
    # the roofline's memory ceiling (worker.bandwidth: measured once per environment) and how it was measured
    copy_bandwidth_Bps: float | None = None
    copy_bandwidth: dict | None = None

    def measured(self, bw) -> Environment:
        """This environment with its copy bandwidth (a worker.bandwidth record; None: not measured)."""
        return dataclasses.replace(
            self, copy_bandwidth_Bps=bw and bw.copy_bandwidth_Bps, copy_bandwidth=to_json(bw)
        )


def collect(gpu_index: int | None = None, tag: str | None = None) -> Environment:
    """The environment record stored with every attempt (environment.json). `tag` (or $MINI_KV_ENV_TAG)
    names what mini_kv cannot see but that changes timings (a power cap, a clock setting, a container
    image): runs with different tags are never compared."""
    t = torch_info()
    device = t.devices[gpu_index or 0] if t.devices else None
    env = Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        machine=platform.machine(),
        cpu_count=os.cpu_count(),
        torch=t.version,
        torch_cuda=t.cuda,
        device_kind="cuda" if device else "cpu",
        gpu=device,
        driver=driver_version() if device else None,
        nvcc=nvcc_info().version,
        cxx=cxx_info().version,
        executable=sys.executable,
        build_flags=BuildFlags(
            torch_flags.base_cflags(),
            torch_flags.base_cuda_cflags(),
            tuple(cuda_arch_list(t.devices) if t.devices else ()),
        ),
        tag=tag if tag is not None else (os.environ.get(ENV_TAG_VAR) or None),
    )
    return dataclasses.replace(env, key=environment_key(to_json(env)))


def environment_key(env: dict) -> str:
    """What must match for two timings to be comparable: device, driver, CUDA, torch, compilers,
    base build flags and the user's environment tag (`env`: environment.json's data, collected or stored)."""
    gpu = env.get("gpu") or {}
    parts = {
        "device": gpu.get("name") or f"cpu:{env.get('machine')}:{env.get('cpu_count')}",
        "capability": gpu.get("capability"),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "torch_cuda": env.get("torch_cuda"),
        "nvcc": env.get("nvcc"),
        "cxx": env.get("cxx"),
        "build_flags": env.get("build_flags"),
        "tag": env.get("tag"),
    }
    return sha256_text(canonical_json(parts))[:16]


def source_revision(path: str | os.PathLike | None) -> SourceRevision | None:
    """The git commit of the repository holding `path` (a candidate's or solution's directory) and whether
    its work tree differed from that commit (a tracked file changed, or a file git does not ignore is
    new): which code an attempt measured, beside the sources it archives. None outside a git work tree,
    without git, or for in-memory sources (`path` None)."""
    if path is None or shutil.which("git") is None:
        return None
    where = os.fspath(path)
    where = where if os.path.isdir(where) else os.path.dirname(where) or "."

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", "-C", where, *args], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout if res.returncode == 0 else None

    commit = (git("rev-parse", "--verify", "-q", "HEAD") or "").strip()
    status = git("status", "--porcelain")
    if not commit or status is None:
        return None
    return SourceRevision(commit, bool(status.strip()))
