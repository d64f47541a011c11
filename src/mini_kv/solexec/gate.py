"""`bench`'s regression gate: a SOL attempt against baselines/<definition>.json with verify's verdict
(judge.regression.check_baseline). A suspected slowdown is decided in the same run: the baseline's own
solution (build.baseline.stage_sol_baseline) takes the reference's place in the timing (the SOL job's
`baseline` key), interleaved with the candidate in one worker.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from mini_kv.errors import ExitCode
from mini_kv.judge.regression import check_baseline, exit_code_for, find_baseline


def sol_gate(opts, root: Path | None, ident: dict, job: dict | None, outcomes: dict[str, dict], code: ExitCode,
             staging: Path) -> tuple[dict | None, ExitCode]:
    """(verdict or None, exit code) of one bench run (`ident`: run.sol_identity; `job`: its worker job);
    judged only when every workload PASSED (so every one was timed) and the project has a baseline."""
    path = find_baseline(root, ident["task_id"])[0] if root is not None else None
    if path is None or code != ExitCode.OK or job is None:
        return None, code
    artifacts = Path(opts.artifacts) if opts.artifacts else root / "artifacts"
    cases = [{"id": uuid, **o["bench"]} for uuid, o in outcomes.items()]
    verdict = check_baseline(path, "definition", root, ident, cases, _confirmation(job, opts, root, artifacts, staging),
                             artifacts=artifacts)
    return verdict, exit_code_for(verdict)


def _confirmation(job: dict, opts, root: Path, artifacts: Path, staging: Path):
    """confirm(baseline, case_id) for check_baseline: fresh inputs, the card gate's interleaved settings."""
    from mini_kv.build.baseline import stage_sol_baseline
    from mini_kv.pipeline import _interleaved_settings
    from mini_kv.runner import run_worker
    from mini_kv.sandbox import resolve as resolve_sandbox

    built: dict = {}

    def confirm(baseline: dict, case_id: str) -> dict:
        if "entry" not in built:  # once per bench, however many workloads need it
            built["entry"] = stage_sol_baseline(baseline, root, artifacts, staging / "baseline",
                                                job["definition_name"], opts.compile_timeout)
        rerun = {**job, "cases": [c for c in job["cases"] if c["id"] == case_id], "salt": secrets.token_hex(16),
                 "baseline": built["entry"], "settings": {**_interleaved_settings(job["settings"]), "rounds": 1}}
        res = run_worker(rerun, case_timeout=opts.timeout, stage_timeout=2 * opts.timeout,
                         sandbox=resolve_sandbox(opts.sandbox))
        rec = next((r for r in res["cases"] if r.get("id") == case_id), {})
        if not rec.get("bench"):
            why = rec.get("log") or rec.get("reason") or (res.get("load") or {}).get("reason")
            raise RuntimeError(f"the same-run comparison of {case_id} produced no timing" + (f": {why}" if why else ""))
        return {"candidate": rec["bench"]["candidate"]["samples"], "baseline": rec["bench"]["reference"]["samples"],
                "order": None, "build": built["entry"]}
    return confirm
