"""What a worker child (`python -m mini_kv.worker.child`) is asked to do: one frozen, versioned,
JSON-serialisable record per job kind, naming everything the child needs (paths, seeds, settings)
and nothing of the parent's process, so it can run in a local child or on another machine.
`Job.from_dict()` refuses a kind or version this mini_kv does not know. Fields are attributes
(`job.cases`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar

from mini_kv.codec import from_json, to_json
from mini_kv.settings import RunSettings


class Event(StrEnum):
    """What the child sends on its signed channel (mini_kv.worker.channel), one JSON line each."""

    READY = "ready"  # the harness started (torch imported, job read); no candidate code loaded yet
    MODULES = "modules"  # a card judge's import of the card's modules, before its job (or why it failed)
    BEGIN = "begin"  # a stage of one case starts: a crash or hang is pinned on it
    LOAD = "load"  # the candidate (or solution) loaded, or why not
    CASE = "case"  # one correctness case's (or SOL workload's) record
    CONTRACT = "contract"  # one contract check's record
    BENCH = "bench"  # one benchmark case's record
    TIMING = "timing"  # a timing starts (`on`: true) or ends: workers started ahead stop meanwhile
    FATAL = "fatal"  # the job failed outside any case
    DONE = "done"  # every stage finished
    LOST = "lost"  # a judge's subject is gone (`code`: SUBJECT_LOST or SUBJECT_DROPPED); the judge waits
    # for the job's remaining cases, with a fresh subject
    RESULT = "result"  # the one answer of a one-shot kind (bandwidth, the profiled targets, build)
    FORGED = "forged"  # parent side: a line not signed with the run's key, or out of sequence


class JobError(ValueError):
    """A job record this mini_kv cannot run (unknown kind or version, missing or unknown fields)."""


JOB_KINDS: dict[str, type[Job]] = {}
# the kinds that run candidate code: the child that gets the job is the judge, and the candidate runs in
# a subject process beside it (worker/subject.py), the two linked by a socket the parent makes
SUBJECT_KINDS = frozenset({"card", "sol"})
# Event.LOST's code: the judge's subject is gone (the parent says how it ended), or the judge stopped
# asking a subject that broke the protocol (the case says how)
SUBJECT_LOST = 5
SUBJECT_DROPPED = 6
# the events after which a judge waits for its next job (a batch's next candidate, or the cases left of
# this one after its subject was lost), each with a fresh subject
BETWEEN_JOBS = frozenset({Event.DONE, Event.LOST})


class Job:
    KIND: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    RECORDS: ClassVar[dict[str, type]] = {}  # fields that hold a typed record: from_dict builds it

    def to_dict(self) -> dict:
        return {
            "kind": self.KIND,
            "schema_version": self.SCHEMA_VERSION,
            **{f.name: to_json(getattr(self, f.name)) for f in dataclasses.fields(self)},
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Job:
        data = dict(data)
        kind, version = data.pop("kind", None), data.pop("schema_version", None)
        target = JOB_KINDS.get(kind) if isinstance(kind, str) else None
        if target is None or not issubclass(target, cls):
            raise JobError(f"unknown job kind {kind!r} (this mini_kv runs: {', '.join(sorted(JOB_KINDS))})")
        if version != target.SCHEMA_VERSION:
            raise JobError(
                f"job kind {kind!r}: unknown schema_version {version!r} (this mini_kv reads "
                f"version {target.SCHEMA_VERSION})"
            )
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(target)})
        if unknown:
            raise JobError(f"job kind {kind!r}: unknown field(s) {', '.join(unknown)}")
        try:
            for name, record in target.RECORDS.items():
                if isinstance(data.get(name), Mapping):
                    data[name] = from_json(record, data[name])
            return target(**data)
        except TypeError as exc:
            raise JobError(f"job kind {kind!r}: {exc}") from None

    def replace(self, **changes) -> Job:
        """A copy with `changes` to the fields this kind has (the others are ignored)."""
        return dataclasses.replace(
            self, **{k: v for k, v in changes.items() if k in self.__dataclass_fields__}
        )


def _kind(name: str, kind: str, doc: str, fields: str, records=None, **defaults) -> type[Job]:
    """A frozen dataclass job kind with these fields (space-separated; `defaults` come last; `records`:
    the fields that hold a typed record, by field name)."""
    spec = [*fields.split(), *((k, object, dataclasses.field(default=v)) for k, v in defaults.items())]
    JOB_KINDS[kind] = cls = dataclasses.make_dataclass(
        name,
        spec,
        bases=(Job,),
        frozen=True,
        namespace={"KIND": kind, "RECORDS": records or {}, "__doc__": doc, "__module__": __name__},
    )
    return cls


# `baseline`: the regression gate's same-run comparison, {library, op}; `watch_paths`: files of the
# suite the parent watches while the worker runs; `project_root`: where the card's modules import from;
# `reference_timings`: in a batch, the parent's full reference measurements by case id
# (worker.reference.CachedReference as JSON) for the judge to re-check instead of timing again; None:
# not in a batch
CardJob = _kind(
    "CardJob",
    "card",
    "A task card's candidate: correctness, contract checks, benchmark.",
    "task_id op library device salt project_root reference inputs tolerances cases all_cases "
    "bench_cases benchmark contract backward exprs peak_bw watch_paths memory_limit_bytes",
    records={"benchmark": RunSettings},
    baseline=None,
    reference_timings=None,
)
SolJob = _kind(
    "SolJob",
    "sol",
    "A SOL-ExecBench solution on its problem's workloads (worker/formats.SolEvaluator).",
    "device salt settings definition_name reference solution cases memory_limit_bytes",
    records={"settings": RunSettings},
    baseline=None,
    reference_timings=None,
)
BandwidthJob = _kind(
    "BandwidthJob",
    "bandwidth",
    "The device's copy bandwidth (worker/bandwidth.measure).",
    "device nbytes iterations",
)
ProfileTargetJob = _kind(
    "ProfileTargetJob",
    "profile_target",
    "The process ncu profiles (profile/target.run).",
    "library op inputs reference params dtype device seed warmup calls tolerance",
)
SolProfileTargetJob = _kind(
    "SolProfileTargetJob",
    "sol_profile_target",
    "The process ncu profiles for a SOL-ExecBench solution (profile/sol.run_target).",
    "device reference seed warmup calls solution case",
)
BuildJob = _kind(
    "BuildJob",
    "build",
    "torch's JIT extension build (compile/jit_child.build).",
    "name build_dir sources include_dirs flags arch_list python_module with_cuda",
)
