"""Job kind `build`: torch's JIT extension build, run in a worker child (mini_kv.worker.child).

The parent (compile/compiler.py) keeps the child's output as the build log and enforces the timeout.
"""

from __future__ import annotations

import os

from mini_kv.compile import nvcc_steps


def build(job) -> str:
    """The module `job` names, built (and loaded: its static initializers ran)."""
    if job.arch_list:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(job.arch_list)
    os.makedirs(job.build_dir, exist_ok=True)
    from torch.utils.cpp_extension import CUDA_HOME, load

    if CUDA_HOME:  # nvcc's host and device front ends side by side (compile/nvcc_steps.py)
        nvcc_steps.use_for_torch_builds(os.path.join(CUDA_HOME, "bin", "nvcc"))

    load(
        name=job.name,
        sources=job.sources,
        # the parent's flags hold the precompiled header's -include (compile/pch.py), if one fits
        extra_cflags=job.flags["cflags"],
        extra_cuda_cflags=job.flags["cuda_cflags"] or None,
        extra_ldflags=job.flags.get("ldflags") or None,
        extra_include_paths=job.include_dirs,
        build_directory=job.build_dir,
        # A plain library by default: loading it proves it links and registers. A torch extension
        # module (PYBIND11_MODULE) is imported instead, which proves the same for its functions.
        is_python_module=job.python_module,
        with_cuda=job.with_cuda,
        verbose=True,
    )
    return job.name
