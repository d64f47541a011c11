"""A pytest plugin that counts the static pre-check's cost over a whole test run: every
judge.static_check.check_sources call the pipeline makes in the test processes (the in-process CLI
runs; commands run in a fresh interpreter are not seen), its wall time, and how many were read afresh
rather than kept by the sources' hash. docs/measurements/integrity-overheads.md has the figures.

    PYTHONPATH=src:benchmarks python -m pytest -n auto --dist loadscope -q -p no:cacheprovider \
        -p static_check_suite
    cat /tmp/static-check-*.txt     # per test process: seconds, calls, read afresh
"""

from __future__ import annotations

import atexit
import os
import time


def pytest_configure(config) -> None:
    import mini_kv.pipeline as pipeline
    from mini_kv.judge import static_check

    real, tally = static_check.check_sources, [0.0, 0, 0]

    def counted(sources):
        t0, known = time.perf_counter(), len(static_check._ANSWERS)
        try:
            return real(sources)
        finally:
            tally[0] += time.perf_counter() - t0
            tally[1] += 1
            tally[2] += len(static_check._ANSWERS) > known

    pipeline.check_sources = counted

    def write() -> None:
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"/tmp/static-check-{name}.txt", "w") as f:
            f.write(f"{tally[0]:.2f} s, {tally[1]} calls, {tally[2]} read afresh\n")

    atexit.register(write)
