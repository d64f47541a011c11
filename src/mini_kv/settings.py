"""Every default in one place: the timing, stability and sampling settings, the timeouts and the budgets.

A run's settings are these defaults overridden, in this order, each later one winning:
the task card (`benchmark:` and `timeouts:`), the command line (`--max-cv`, `--budget`, ...), and the
environment (`MINI_KV_MAX_CV`, ...: `ENV_KEYS`), which lets a gate or a cluster job pin a setting for
every run it starts. benchmark.json records the values a run used (its `settings`), so a stored
attempt says what it was held to whatever the defaults are later. docs/benchmarking.md lists them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mini_kv.codec import optional
from mini_kv.errors import UserError

# a SOL workload's tolerance: upstream's defaults, in upstream's field order (a trace repeats them so)
DEFAULT_TOLERANCE = {
    "max_atol": 1e-2,
    "max_rtol": 1e-2,
    "required_matched_ratio": 0.99,
    "max_error_cap": None,
    "allow_negative_inf": False,
}


@dataclass(frozen=True)
class Sampling:
    """Adaptive sampling on one kind of device: sample until the median's 95% CI half-width is within
    `target_rel_ci` of it, taking at least `min_samples` and at most `max_samples`, in `budget_s`."""

    target_rel_ci: float
    min_samples: int
    max_samples: int
    budget_s: float


@dataclass(frozen=True)
class Settings:
    # timing: a card's `benchmark:` section
    method: str = "auto"
    l2: str = "hot"
    warmup: int = 20
    repeats: int = 5
    samples: int | str = "auto"  # "auto": adaptive (Sampling); an integer: a fixed count per repeat
    graph_launches: int = 20
    cases: str = "bench"
    # the engine's input sets (worker/engine.py, both formats): in cold-L2 mode at most this many per
    # side, no more than span this many L2 sizes, and at most these bytes of them or this share of the
    # free device memory, at least two
    max_input_sets: int = 20
    input_set_l2_span: int = 4
    input_set_bytes: int = 8 * 2**30
    input_set_free_share: float = 0.25
    # the stability gate: the robust CV of the P50s (and of the candidate's P95s) across repeats
    max_cv: float = 0.03
    max_p95_cv: float = 0.15
    # a repeat samples until its median's interval is within this share of max_cv (timing.repeat_target)
    repeat_ci_of_max_cv: float = 2 / 3
    warmup_share: float = 0.1  # of a case's timing budget, at most, for the warm-up
    # timeouts, seconds: a card's `timeouts:` section
    compile_s: float = 600.0
    case_s: float = 120.0
    stage_s: float = 1800.0
    # After this many TIMEOUTs in a row (no case finishing in between) the candidate is taken to hang on
    # everything: the cases still pending are recorded NOT_RUN, saying why, instead of costing a timeout
    # each (14 workloads x 600 s was 2 h 20 min for one hanging solution). --give-up-after changes it.
    give_up_after: int = 2
    # A worker child's start-up before its `ready` event: the harness only (Python, torch, CUPTI), so a
    # limit for a broken machine, never a candidate's time (its per-case timeout starts at `ready`).
    startup_s: float = 300.0
    # A worker child's first contract check (opcheck, gradcheck) imports torch's compiler stack
    # (torch._dynamo, the AOT tests: 6 s of CPU on a 2-core machine at load 2): torch's time, not the
    # candidate's, so that check gets this much on top of the per-case timeout.
    contract_import_s: float = 60.0
    # A child's load stage runs harness code beside the candidate's: the judge imports the card's
    # reference and input factory, the subject loads the build under its Guard (seconds on a loaded
    # 2-core host), so loading gets this much on top of the per-case timeout. A load that hangs costs both.
    load_s: float = 30.0
    bandwidth_timeout_s: float = 300.0  # the copy-bandwidth probe, once per environment
    ncu_timeout_s: float = 600.0  # `profile`: the Nsight Compute run (and again for its import)
    profile_warmup: int = 5  # `profile`: candidate calls before the profiled one (ncu --launch-skip)
    profile_salt: str = "mini_kv-profile"  # `profile`: what the profiled inputs' seed derives from
    # `compare-profiles`: the A/B timing of two profiled candidates (profile/ab.py, pipeline.time_beside)
    ab_repeats: int = 6
    ab_samples: int = 50
    ab_warmup: int = 10
    # The stopping rule's defaults by device kind (docs/benchmarking.md, "Adaptive sampling"). GPU:
    # nvbench's 0.5 % noise target and 10-sample minimum. CPU: host wall-clock timing on a shared machine
    # has per-call noise of several percent, so a 0.5 % interval would mostly end on the budget; 2 % is
    # inside the stability gate's 3 % limit on the repeats' medians and converges in a few dozen samples.
    # The budgets (per case, warm-up and every timed sample of both sides) keep the per-case timeout for
    # hangs: a case is given at most half of it (resolve).
    cuda: Sampling = Sampling(target_rel_ci=0.005, min_samples=10, max_samples=1000, budget_s=20.0)
    cpu: Sampling = Sampling(target_rel_ci=0.02, min_samples=5, max_samples=200, budget_s=3.0)
    # A SOL workload's budget also covers its correctness rounds (half of it at most), so it is larger.
    sol_budget_factor: float = 3.0
    # `bench` (SOL-ExecBench problems): upstream's shape, one profiler session per side
    sol_timeout_s: float = 600.0  # per workload, correctness rounds and timing together
    sol_rounds: int = 10  # correctness rounds per workload
    # a task card's case: the candidate before the reference on one input set, then after it on a second
    card_rounds: int = 2
    sol_warmup: int = 10
    sol_repeats: int = 1
    # `bench --extra-workloads N`: unseen workloads drawn from the definition's var axes with this seed
    extra_workloads: int = 0
    extra_workloads_seed: int = 0
    # `--require-own-kernels`: refuse a candidate whose calls ran only library kernels (LIBRARY_DELEGATION)
    require_own_kernels: bool = False
    # In a batch (several solutions of one problem) the reference of each case is timed in full once per
    # device and timing settings, and every later solution re-checks it with this share of its samples
    # (at least min_samples) instead of timing it again (worker/reference.py); a re-check whose median
    # is off the full measurement's by more than the band (the larger of max_cv and this floor, in
    # ratio) times the reference in full again.
    reference_recheck_share: float = 0.1
    reference_drift_floor: float = 0.02
    # `--interleave-reference`, $MINI_KV_INTERLEAVE_REFERENCE: time the reference beside every solution of
    # a batch, interleaved, as a single solution's run does (no reuse)
    interleave_reference: bool = False


DEFAULTS = Settings()

METHODS = ("events", "graph", "cupti", "wallclock")
CUDA_METHODS = ("events", "graph", "cupti")
# `auto` on CUDA: CUPTI first. On an H200 its per-iteration span matched the CUPTI per-kernel
# duration on every fidelity row, while graph replay of back-to-back launches ran 7-9% under it for
# some memory-bound kernels (docs/benchmarking.md). When the profiler cannot run (another profiler
# is active, CUPTI is unavailable) graph replay is next, then per-launch events; an op that graph
# capture refuses (it syncs, or allocates in a way capture forbids) skips to events.
AUTO_CHAIN = ("cupti", "graph", "events")
L2_MODES = ("hot", "cold")


def cache_dir(name: str) -> Path:
    """Where mini_kv keeps a machine-wide cache (`pycache`: bytecode; `pch`: precompiled torch headers):
    `$XDG_CACHE_HOME/mini-kv/NAME`, else `~/.cache/mini-kv/NAME`; as root without XDG_CACHE_HOME
    `/var/cache/mini-kv/NAME` (root's home is closed to a jail that runs under a uid of its own, and the
    jails read these caches). Jails see them read-only: no candidate writes what another run reads."""
    if os.geteuid() == 0 and not os.environ.get("XDG_CACHE_HOME"):
        return Path("/var/cache/mini-kv") / name
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mini-kv" / name


def check_options(method: str, l2: str, device: str) -> None:
    """Raise ValueError when the timing method or L2 mode cannot run on `device`, before any work
    starts (here, not in the timing module, so a front door checks them without importing torch)."""
    if method != "auto" and method not in METHODS:
        raise ValueError(f"unknown timing method {method!r}; choose auto, {', '.join(METHODS)}")
    if l2 not in L2_MODES:
        raise ValueError(f"unknown L2 mode {l2!r}; choose hot or cold")
    if device.split(":", 1)[0] != "cuda":
        if method in CUDA_METHODS:
            raise ValueError(
                f"timing method {method!r} needs a CUDA device; on {device} use wallclock or auto"
            )
        if l2 == "cold":
            raise ValueError(f"l2 'cold' flushes a GPU's L2 cache; on {device} use l2 'hot'")


# The timing settings the environment may override (after the card and the command line): variable ->
# (benchmark settings key, parser).
ENV_KEYS = {
    "MINI_KV_MAX_CV": ("max_cv", float),
    "MINI_KV_MAX_P95_CV": ("max_p95_cv", float),
    "MINI_KV_SAMPLES": ("samples", int),
    "MINI_KV_BUDGET": ("budget_s", float),
    "MINI_KV_TARGET_REL_CI": ("target_rel_ci", float),
}


# The GiB a build's jail may hold (its memory cgroup, and the address space of each process of a build
# that loads no CUDA): environment.build_memory_limit reads it; default half the machine.
BUILD_MEMORY_VAR = "MINI_KV_BUILD_MEMORY_GB"

# The run options the environment may switch on or off: variable -> option field.
ENV_SWITCHES = {"MINI_KV_INTERLEAVE_REFERENCE": "interleave_reference"}
SWITCH_WORDS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def switch_from_environment(field: str, given: bool, environ: Mapping[str, str] | None = None) -> bool:
    """An on/off option (ENV_SWITCHES) as the environment sets it, else `given` (the command line's or
    the option record's); a value that is not 1/0, true/false or yes/no is the user's error."""
    environ = os.environ if environ is None else environ
    var = next(v for v, f in ENV_SWITCHES.items() if f == field)
    raw = environ.get(var)
    if raw is None or raw == "":
        return given
    if raw.strip().lower() not in SWITCH_WORDS:
        raise UserError(f"{var}={raw!r}: expected 1 or 0 (true/false, yes/no)")
    return SWITCH_WORDS[raw.strip().lower()]


def _from_environment(environ: Mapping[str, str]) -> Iterator[tuple[str, float | int]]:
    """The timing settings the environment sets (ENV_KEYS); a value that is not a positive, finite
    number is the user's error, named by its variable (checked here: the run's own checks name flags)."""
    for var, (key, parse) in ENV_KEYS.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            value = parse(raw)
        except ValueError:
            raise UserError(f"{var}={raw!r}: expected {parse.__name__}") from None
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{var}={raw!r}: must be positive")
        yield key, value


@dataclass(frozen=True)
class ExtraWorkloads:
    """`bench --extra-workloads N --extra-workloads-seed S`: unseen workloads drawn from the definition."""

    count: int
    seed: int


@dataclass(frozen=True)
class RunSettings:
    """The timing settings one run is held to, resolved for its device (`resolve`). benchmark.json keeps
    it as `settings` and a SOL problem's suite hash hashes it, so its JSON form (codec.to_json) is what
    attempts hold: a key only one front door has is left out for the other (`optional`), and so are
    `require_own_kernels` and `extra_workloads` unless asked for (attempts without stay comparable)."""

    method: str
    l2: str
    warmup: int
    repeats: int
    samples: int | str  # "auto": adaptive sampling; an integer: a fixed count per repeat
    max_cv: float | None  # None: DEFAULTS.max_cv (a SOL run given no --max-cv records null)
    max_p95_cv: float | None
    target_rel_ci: float
    min_samples: int
    max_samples: int
    budget_s: float | None  # a case's seconds of timing (a SOL workload's: its rounds too); None: none
    graph_launches: int | None = optional()  # a task card's
    cases: str | None = optional()  # a task card's: which cases are timed
    rounds: int | None = optional()  # a SOL workload's correctness rounds
    require_own_kernels: bool | None = optional()
    extra_workloads: ExtraWorkloads | None = optional()

    @property
    def cv_limits(self) -> tuple[float, float]:
        """The stability gate's limits (max_cv, max_p95_cv): DEFAULTS' where the run set none."""
        return self.max_cv or DEFAULTS.max_cv, self.max_p95_cv or DEFAULTS.max_p95_cv

    @property
    def fixed_count(self) -> int | None:
        """The fixed sample count per repeat, or None: adaptive sampling."""
        return None if self.samples in (None, "auto") else int(self.samples)

    def interleaved(self) -> RunSettings:
        """The same sample budget in twice as many, shorter repeats (a regression confirmation: the
        worker alternates candidate and baseline every repeat, so a burst of load hits both alike).
        Adaptive sampling stays adaptive (each shorter repeat stops by the same rule, in the same budget)."""
        finer = max(2 * self.repeats, 10)
        if self.fixed_count is None:
            return replace(self, repeats=finer)
        return replace(self, repeats=finer, samples=max(10, -(-self.repeats * self.fixed_count // finer)))


SAMPLING_KEYS = ("target_rel_ci", "min_samples", "max_samples", "budget_s")  # defaults: by device
TIMING_KEYS = ("method", "l2", "warmup", "repeats")  # defaults: DEFAULTS (a SOL run passes its own)


def resolve(
    given: Mapping[str, Any],
    device: str,
    case_timeout: float | None,
    *,
    with_correctness: bool = False,
    environ: Mapping[str, str] | None = None,
) -> RunSettings:
    """The run's settings: `given` (a card's `benchmark:` section with the command line's values over
    it, or a SOL run's command line; None: unset) overridden by the environment (ENV_KEYS), the sampling
    keys the device's defaults where unset, `samples` "auto" unless a count is given, and the budget held
    to half the per-case timeout. `with_correctness`: the budget covers a SOL workload's correctness
    rounds too (sol_budget_factor times the timing default)."""
    merged = {**given, **dict(_from_environment(os.environ if environ is None else environ))}
    base = DEFAULTS.cuda if device.startswith("cuda") else DEFAULTS.cpu
    if with_correctness:
        base = replace(base, budget_s=base.budget_s * DEFAULTS.sol_budget_factor)
    sampling = {k: merged[k] if merged.get(k) is not None else getattr(base, k) for k in SAMPLING_KEYS}
    if case_timeout is not None:
        sampling["budget_s"] = min(float(sampling["budget_s"]), case_timeout / 2.0)
    samples = merged.get("samples")
    timing = {k: merged[k] if merged.get(k) is not None else getattr(DEFAULTS, k) for k in TIMING_KEYS}
    return RunSettings(
        **timing,
        max_cv=merged.get("max_cv"),
        max_p95_cv=merged.get("max_p95_cv"),
        samples="auto" if samples in (None, "auto") else samples,
        **sampling,
        **{k: merged.get(k) for k in ("graph_launches", "cases", "rounds")},
        require_own_kernels=True if merged.get("require_own_kernels") else None,
        extra_workloads=merged.get("extra_workloads"),
    )
