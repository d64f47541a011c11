"""Child process that runs torch's JIT extension build; the parent captures its output and enforces the timeout."""

from __future__ import annotations

import json
import os
import sys


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec["arch_list"]:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(spec["arch_list"])
    os.makedirs(spec["build_dir"], exist_ok=True)
    from torch.utils.cpp_extension import load

    load(
        name=spec["name"],
        sources=spec["sources"],
        extra_cflags=spec["flags"]["cflags"],
        extra_cuda_cflags=spec["flags"]["cuda_cflags"] or None,
        extra_ldflags=spec["flags"].get("ldflags") or None,
        extra_include_paths=spec["include_dirs"],
        build_directory=spec["build_dir"],
        # A plain library by default: loading it proves it links and registers. A torch extension
        # module (PYBIND11_MODULE) is imported instead, which proves the same for its functions.
        is_python_module=spec.get("python_module", False),
        with_cuda=spec.get("with_cuda"),
        verbose=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
