"""Frozen records passed between stages. Plain data only, so they cross process boundaries as JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from mini_kv.codec import to_json
from mini_kv.settings import DEFAULTS, RunSettings

# a card's `benchmark:` and `timeouts:` sections when they set nothing
_BENCHMARK_KEYS = "method l2 warmup repeats samples graph_launches max_cv max_p95_cv cases".split()
DEFAULT_BENCHMARK = {k: getattr(DEFAULTS, k) for k in _BENCHMARK_KEYS}
DEFAULT_TIMEOUTS = {k: getattr(DEFAULTS, k) for k in ("compile_s", "case_s", "stage_s")}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def case_seed(task_id: str, case_id: str, salt: str = "") -> int:
    """Seed from sha256(task, case, salt): stable per case, secret when the salt is. Here, not in the
    worker, because the store checks a stored attempt's seeds against it without importing torch."""
    digest = hashlib.sha256(f"{task_id}\0{case_id}\0{salt}".encode()).hexdigest()
    return int(digest[:15], 16)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def safe_name(name: str) -> str:
    """A directory-safe form of a definition or solution name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "unnamed"


def sol_suite_hash(definition: dict, workloads: list[dict], settings: dict) -> str:
    """A SOL suite_hash from the stored records (definition.json, workload.jsonl, benchmark.json's settings)."""
    return sha256_text(
        canonical_json(
            {
                "format": "sol-execbench",
                "definition": definition,
                "workloads": workloads,
                "settings": settings,
            }
        )
    )


# the languages of a solution.json (SOL-ExecBench); a task card's candidate names none and is C++
PYTHON_LANGUAGES = ("pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend")
CPP_LANGUAGES = ("cuda_cpp", "cutlass", "cudnn", "cublas")


@dataclass(frozen=True)
class Case:
    """One case of a problem: a card's (case, dtype) pair after expansion, or one SOL workload."""

    id: str  # "<case id>-<dtype>" (a card's, unique within the task) or the workload's uuid
    base_id: str
    kind: str  # core | extra | edge | illegal | bench | workload
    params: dict  # a card's params, a workload's var axes
    dtype: str | None
    devices: tuple[str, ...] = ("cpu", "cuda")
    record: dict = field(default_factory=dict)  # the format's own data the worker needs (SOL: workload)

    def runs_on(self, device: str) -> bool:
        return device.split(":")[0] in self.devices

    def to_dict(self) -> dict:
        """The case as the worker job carries it (and a card's suite_hash hashes it)."""
        d = dataclasses.asdict(self)
        record = d.pop("record")  # popped first: a card's case reads (and hashes) exactly as before
        return {**d, **record}


@dataclass(frozen=True)
class SourceFile:
    path: str
    content: str


@dataclass(frozen=True)
class Candidate:
    """Code to evaluate: a card's dispatcher-op candidate, or a solution.json in any language. Its build
    spec (language, sources, flags) is what build.compiler builds; its entry point is what the worker calls."""

    id: str
    path: str  # a card's candidate dir (relative to the project root), or the solution.json
    op: str  # the entry point: a dispatcher qualname "ns::op", or a solution's "<file>::<function>"
    cpu_sources: tuple[str, ...]  # relative to the candidate dir
    cuda_sources: tuple[str, ...]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    backward: bool = False
    ldflags: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()  # none: a card's C++ candidate
    dependencies: tuple[str, ...] = ()
    dps: bool = True  # a solution writes into preallocated outputs (destination-passing style)
    sources: tuple[SourceFile, ...] = ()  # a solution's files with their content (staged before a build)
    include_dirs: tuple[str, ...] = ()  # what mini_kv adds for a language's libraries (trusted)
    extra_ldflags: tuple[str, ...] = ()
    raw: dict | None = field(default=None, repr=False, compare=False)  # solution.json as read

    def build_summary(self, with_cuda: bool) -> str:
        """What a build of this candidate compiles, for the progress line while it runs."""
        files = [*self.cpu_sources, *(self.cuda_sources if with_cuda else ())] or [
            s.path for s in self.sources
        ]
        shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
        return (
            f"{shown} (a cold C++ build of a torch extension takes a minute or more here; a cached one none)"
        )

    @property
    def namespace(self) -> str:
        return self.op.split("::")[0]

    @property
    def op_name(self) -> str:
        return self.op.split("::")[1].split(".")[0]

    @property
    def group(self) -> str:
        """`cpp` (built: a card's library, a solution's torch extension module) or `python` (imported)."""
        return "python" if any(lang in PYTHON_LANGUAGES for lang in self.languages) else "cpp"

    @property
    def python_module(self) -> bool:
        """A solution's C++ is built as an importable torch extension module named after the build key."""
        return bool(self.languages)

    @property
    def entry_file(self) -> str:
        return self.op.rpartition("::")[0]

    @property
    def entry_function(self) -> str:
        return self.op.rpartition("::")[2]

    def resolved(self) -> dict:
        """solution.json with every source's content inlined: what was actually evaluated."""
        return {**self.raw, "sources": [{"path": s.path, "content": s.content} for s in self.sources]}

    def manifest(self, **found) -> CandidateManifest:
        """A card candidate's candidate_manifest.json (`found`: its build key and files)."""
        return CandidateManifest(**{f: getattr(self, f) for f in CARD_CANDIDATE_FIELDS}, **found)


CARD_CANDIDATE_FIELDS = (
    "id",
    "path",
    "op",
    "cpu_sources",
    "cuda_sources",
    "cflags",
    "cuda_cflags",
    "backward",
)


@dataclass(frozen=True)
class CandidateManifest:
    """candidate_manifest.json of a verify: the card candidate (CARD_CANDIDATE_FIELDS), its build key, the
    files kept under the attempt's sources/ with their SHA-256, and those whose bytes changed after the
    build read them (the attempt holds what is there now)."""

    id: str
    path: str
    op: str
    cpu_sources: tuple[str, ...]
    cuda_sources: tuple[str, ...]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    backward: bool = False
    build_key: str | None = None
    files: tuple[dict, ...] = ()  # {path, sha256}
    changed_since_build: tuple[str, ...] = ()
    schema_version: int = 1

    def candidate(self, path: str) -> Candidate:
        """The candidate as verified, its sources at `path` (an attempt's sources/)."""
        return Candidate(**{f: getattr(self, f) for f in CARD_CANDIDATE_FIELDS if f != "path"}, path=path)


@dataclass(frozen=True)
class Problem:
    """What is evaluated, whichever front door loaded it: a task card (format `task-card`) or a SOL-ExecBench
    definition with its workloads (`sol-execbench`, its validated parse in `payload`), as cases, reference,
    tolerances, benchmark settings and timeouts, with the candidates to evaluate on it."""

    path: str  # the card (relative to the project root) or definition.json
    project_root: str  # absolute (SOL: the problem's directory)
    raw: dict = field(repr=False)  # the card or definition.json as read (after validation)
    id: str = ""
    version: str = ""
    operator: dict = field(default_factory=dict)  # name, version (a card's: reference, inputs, bytes, flops)
    reference: str = ""  # a card's `module:function`, or a SOL definition's reference source (its `run`)
    candidates: tuple[Candidate, ...] = ()
    default_candidate: str = ""
    tolerances: dict = field(default_factory=dict)  # per dtype (a SOL workload carries its own)
    cases: tuple[Case, ...] = ()
    benchmark: dict = field(default_factory=dict)
    timeouts: dict = field(default_factory=dict)
    baseline: str | None = None
    format: str = "task-card"
    payload: Any = field(default=None, repr=False, compare=False)  # SOL: (Definition, [Workload])

    def candidate(self, cid: str) -> Candidate:
        for cand in self.candidates:
            if cand.id == cid:
                return cand
        raise KeyError(cid)

    def suite_hash(self, settings: RunSettings | None = None) -> str:
        """Identity of what is measured: the cases and the benchmark settings (SOL: the run's settings)."""
        if self.format != "task-card":
            workloads = [to_json(wl.traced()) for wl in self.payload[1]]
            return sol_suite_hash(self.raw, workloads, to_json(settings))
        return sha256_text(
            canonical_json(
                {
                    "cases": [c.to_dict() for c in self.cases],
                    "benchmark": self.benchmark,
                    "tolerances": self.tolerances,
                }
            )
        )


@dataclass(frozen=True)
class Performance:
    """A SOL workload's `performance`, as the worker records it and its trace carries it: both sides'
    median latency and the speedup."""

    latency_ms: float
    reference_latency_ms: float
    speedup_factor: float


@dataclass(frozen=True)
class JailRecord:
    """How a run's processes were jailed, as its attempt keeps it (jail.JailInfo.record; correctness.json's
    and compile.json's `sandbox`). Every field has a default: an older attempt's record reads too."""

    enabled: bool = False
    mode: str | None = None
    tool: str | None = None
    namespaces: tuple[str, ...] = ()
    seccomp_sha256: str | None = None
    layers: dict[str, str] = field(default_factory=dict)  # layer -> "active" or why it is unavailable
    missing: tuple[str, ...] = ()
    network: bool = True  # whether jailed code can reach the host's network
    reason: str = ""


@dataclass(frozen=True)
class WorkerResults:
    """What runner.run_worker hands back, and what correctness.json keeps of it: the `load` event, the
    per-case records by stage (cases, contract checks by name, bench cases), the run's incidents (what went
    wrong outside any one case), its log and jail record. The index reads a stored one back as this."""

    log: str | None = None
    sandbox: JailRecord | None = None
    load: dict | None = None
    cases: list = field(default_factory=list)
    contract: dict = field(default_factory=dict)
    bench: list = field(default_factory=list)
    incidents: list = field(default_factory=list)
