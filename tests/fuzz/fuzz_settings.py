"""Settings every fuzz test shares (tests/fuzz/test_fuzz_*.py); every fuzz test module imports this, which loads them.

A new fuzz test imports what it needs from here: `from fuzz_settings import examples, within`.

Example counts are small by default, so the whole fuzz suite stays under a minute in CI; a longer
hunt sets MINI_KV_FUZZ_EXAMPLES (examples per test), e.g.

    MINI_KV_FUZZ_EXAMPLES=5000 python -m pytest tests/fuzz -q

Each test scales its count from the profile with `examples(share)`, so a cheap in-process test can
run many examples while one that starts a process runs a few. `within(seconds)` is the hang guard:
a loader that takes longer fails the example (hypothesis's own deadline only complains after an
example returns, and a hang never returns).
"""

from __future__ import annotations

import contextlib
import os
import signal
from datetime import timedelta

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 30
EXAMPLES = int(os.environ.get("MINI_KV_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
HANG_S = float(os.environ.get("MINI_KV_FUZZ_HANG_S", 20))

settings.register_profile(
    "mini_kv_fuzz",
    max_examples=EXAMPLES,
    # generous: the machine may be shared; a real hang is caught by `within`
    deadline=timedelta(seconds=HANG_S),
    derandomize=EXAMPLES == DEFAULT_EXAMPLES,  # CI: the same examples every run; long hunts explore
    database=None,  # no .hypothesis/ directory in the repository
    print_blob=True,  # a failure prints the @reproduce_failure line
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
settings.load_profile("mini_kv_fuzz")


def examples(share: float = 1.0, cap: int | None = None) -> settings:
    """The profile with `share` of its examples (at least 1, at most `cap`): @examples(0.05, cap=10) on a
    test that starts a process, so a long hunt spends its time where examples are cheap."""
    n = max(1, int(EXAMPLES * share))
    return settings(settings.get_profile("mini_kv_fuzz"), max_examples=min(n, cap) if cap else n)


class Hang(Exception):
    pass


@contextlib.contextmanager
def within(seconds: float = HANG_S, what: str = "the call"):
    """Fail with Hang when the block runs past `seconds` (SIGALRM; main thread only)."""

    def on_alarm(signum, frame):
        raise Hang(f"{what} ran past {seconds:g} s (a hang)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
