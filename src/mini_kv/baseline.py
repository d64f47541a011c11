"""Build a baseline's own sources so the regression gate can time them beside the candidate.

A stored baseline is only timings from another day; the regression gate confirms a suspected
slowdown by timing the baseline's code and the candidate in one worker, interleaved. The code is
the `sources/` of the attempt the baseline was promoted from, checked against that attempt's
manifest, whose own SHA-256 the baseline records.

Both libraries must load into one process, and two libraries that define the same dispatcher
namespace (TORCH_LIBRARY(ns, m)) abort it. So the baseline's sources are rebuilt with their
namespace token renamed to `<ns>__baseline_<sources hash>`; the build goes through the normal
content-addressed compiler, so the second and later runs are cache hits, and so is a baseline promoted
again from other attempts of the same sources (the new name depends on the code, not on the attempt).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path

from mini_kv.codec import from_json
from mini_kv.compile.compiler import SOURCE_SUFFIXES, compile_candidate
from mini_kv.model import Candidate, CandidateManifest, canonical_json, sha256_text
from mini_kv.status import BuildStatus
from mini_kv.store.baseline import BaselineBuildError, checked_source_attempt, find_source_attempt

NAMESPACE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class BaselineBuild:
    library: str
    op: str  # "<renamed ns>::<op>"
    namespace: str
    attempt: str  # the attempt directory the sources came from
    build_key: str
    cache_hit: bool


def rename_namespace(text: str, old: str, new: str) -> tuple[str, int]:
    """Every whole-token `old` replaced by `new` (so `ns_launch` and `other_ns` stay as they are)."""
    return re.subn(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])", new, text)


def source_candidate(attempt_dir: Path, baseline: dict) -> tuple[Candidate, str]:
    """The candidate record the attempt was verified with, after checking the attempt is the one
    the baseline names (store.baseline.checked_source_attempt), and a digest of its sources: of the
    paths and SHA-256s the attempt's manifest lists under sources/, which that check has verified."""
    header = checked_source_attempt(attempt_dir, baseline).header
    if "candidate_manifest.json" not in {f["path"] for f in header["files"]}:
        raise BaselineBuildError(f"{attempt_dir}: no candidate_manifest.json (not a candidate's attempt)")
    manifest = json.loads((attempt_dir / "candidate_manifest.json").read_text())
    sources = sorted([f["path"], f["sha256"]] for f in header["files"] if f["path"].startswith("sources/"))
    try:
        cand = from_json(CandidateManifest, manifest).candidate(str(attempt_dir / "sources"))
    except (TypeError, AttributeError) as exc:  # a field missing, or not a record at all
        raise BaselineBuildError(f"{attempt_dir / 'candidate_manifest.json'}: missing field {exc}") from None
    return cand, sha256_text(canonical_json(sources))


def build_baseline(
    baseline: dict, project_root: Path, artifacts: Path, with_cuda: bool | None, timeout: float
) -> BaselineBuild:
    """Build the baseline's sources under a namespace of their own; raises BaselineBuildError or
    BaselineTampered."""
    attempt_dir = find_source_attempt(baseline, artifacts)
    cand, sources_digest = source_candidate(attempt_dir, baseline)
    old_ns, _, op_name = cand.op.partition("::")
    if not NAMESPACE_RE.match(old_ns):
        raise BaselineBuildError(f"op {cand.op!r}: namespace is not an identifier")
    new_ns = f"{old_ns}__baseline_{sources_digest[:12]}"
    build_root = Path(project_root) / ".build"
    build_root.mkdir(parents=True, exist_ok=True)
    # a private copy: the key hashes file contents and relative paths, not where they lie, so the
    # same baseline is a cache hit next time although this directory is gone by then
    with tempfile.TemporaryDirectory(prefix="baseline-src-", dir=build_root) as tmp:  # jail.OWN_TEMP_PREFIXES
        renamed = 0
        src_root = attempt_dir / "sources"
        for f in sorted(p for p in src_root.rglob("*") if p.is_file()):
            dest = Path(tmp) / f.relative_to(src_root)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if f.suffix in SOURCE_SUFFIXES:
                text, n = rename_namespace(
                    f.read_text(encoding="utf-8", errors="surrogateescape"), old_ns, new_ns
                )
                dest.write_text(text, encoding="utf-8", errors="surrogateescape")
                renamed += n
            else:
                shutil.copyfile(f, dest)
        if renamed == 0:
            raise BaselineBuildError(
                f"the baseline's sources never spell the namespace {old_ns!r} as a token, "
                "so they cannot be rebuilt under a namespace of their own"
            )
        renamed_cand = dataclasses.replace(
            cand, id=f"{cand.id}__baseline", path=tmp, op=f"{new_ns}::{op_name}"
        )
        rec = compile_candidate(Path(project_root), renamed_cand, timeout=timeout, with_cuda=with_cuda)
    if rec.status != BuildStatus.OK or not rec.library:
        raise BaselineBuildError(
            f"the baseline's sources did not build ({rec.status}); see {rec.failed_build_dir or rec.build_dir}"
        )
    return BaselineBuild(
        library=rec.library,
        op=renamed_cand.op,
        namespace=new_ns,
        attempt=str(attempt_dir),
        build_key=rec.key,
        cache_hit=bool(rec.cache_hit),
    )
