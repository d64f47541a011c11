"""Frozen records passed between stages. Plain data only, so they cross process boundaries as JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_BENCHMARK = {
    "method": "auto",
    "l2": "hot",
    "warmup": 20,
    "repeats": 5,
    "samples": "auto",  # adaptive (worker.timing.SAMPLING_DEFAULTS); an integer is a fixed count
    "graph_launches": 20,
    "max_cv": 0.03,
    "max_p95_cv": 0.15,
    "cases": "bench",
}

DEFAULT_TIMEOUTS = {"compile_s": 600.0, "case_s": 120.0, "stage_s": 1800.0}


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


@dataclass(frozen=True)
class Case:
    """One (case, dtype) pair after expanding a card's case entry."""

    id: str  # "<case id>-<dtype>", unique within the task
    base_id: str
    kind: str  # core | extra | edge | illegal | bench
    params: dict
    dtype: str
    devices: tuple[str, ...] = ("cpu", "cuda")

    def runs_on(self, device: str) -> bool:
        return device.split(":")[0] in self.devices

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Candidate:
    id: str
    path: str  # relative to the project root
    op: str  # dispatcher qualname "ns::op"
    cpu_sources: tuple[str, ...]  # relative to the candidate dir
    cuda_sources: tuple[str, ...]
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    backward: bool = False

    @property
    def namespace(self) -> str:
        return self.op.split("::")[0]

    @property
    def op_name(self) -> str:
        return self.op.split("::")[1].split(".")[0]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TaskCard:
    path: str  # the card file, relative to the project root
    project_root: str  # absolute
    raw: dict = field(repr=False)  # the card as read (after validation)
    id: str = ""
    version: str = ""
    operator: dict = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    default_candidate: str = ""
    tolerances: dict = field(default_factory=dict)
    cases: tuple[Case, ...] = ()
    benchmark: dict = field(default_factory=dict)
    timeouts: dict = field(default_factory=dict)
    baseline: str | None = None

    def candidate(self, cid: str) -> Candidate:
        for cand in self.candidates:
            if cand.id == cid:
                return cand
        raise KeyError(cid)

    def suite_hash(self) -> str:
        """Identity of what is measured: the cases and the benchmark settings."""
        return sha256_text(
            canonical_json(
                {
                    "cases": [c.to_dict() for c in self.cases],
                    "benchmark": self.benchmark,
                    "tolerances": self.tolerances,
                }
            )
        )
