"""Parent side of the process boundary: start the worker child, read its events, enforce timeouts.

The parent never imports candidate code. A child that crashes or hangs is killed (whole process
group); the case it was running is recorded as RUNTIME_ERROR or TIMEOUT with the tail of its log,
and a fresh child continues with the cases after it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time

from mini_kv.proc import kill_group
from mini_kv.sandbox import ENTER_FAILED as SANDBOX_ENTER_FAILED
from mini_kv.sandbox import Sandbox, SandboxInfo
from mini_kv.sandbox import resolve as resolve_sandbox

MAX_RESTARTS = 50


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code == SANDBOX_ENTER_FAILED:
        return (f"exited with status {code}: the OS sandbox could not be set up (the worker log says why; "
                "--no-sandbox runs without it)")
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class ChildRun:
    """One child process and its event pipe.

    The child imports torch before it reads its job, so a child started early (`ChildRun(None, ...)`
    then `send(job)`) loads torch while the parent still prepares the job (e.g. builds);
    `warm_profiler` has it pay CUPTI's start-up then too."""

    def __init__(self, job: dict | None, log_path: str, env: dict | None, warm_profiler: bool = False,
                 sandbox: SandboxInfo | None = None):
        self.key = secrets.token_bytes(32)
        self.seq = 0
        read_fd, write_fd = os.pipe()
        self.log = open(log_path, "ab")
        # the OS sandbox (mini_kv.sandbox): default on where the machine allows it
        self.sandbox_info = sandbox if sandbox is not None else resolve_sandbox(True)
        self.sandbox = Sandbox(self.sandbox_info)
        cmd = [sys.executable, "-m", "mini_kv.worker.child", "--result-fd", str(write_fd),
               *(["--warm-profiler"] if warm_profiler else [])]
        self.proc = subprocess.Popen(
            self.sandbox.argv(cmd), stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,), start_new_session=True, env=self.sandbox.env(env))
        os.close(write_fd)
        self.fd = read_fd
        self.buf = b""
        self.log_path = log_path
        if job is not None:
            self.send(job)

    def send(self, job: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps({**job, "channel_key": self.key.hex()}).encode())
            self.proc.stdin.close()
        except BrokenPipeError:  # the child died early: next_event sees the end of the stream
            pass

    def next_event(self, timeout: float) -> dict | None | str:
        """An event dict, None at end of stream, or 'timeout'."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return "timeout"
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return self._authenticate(line)

    def _authenticate(self, line: bytes) -> dict:
        """Accept only events signed with this child's key and numbered in order."""
        try:
            outer = json.loads(line)
            body, mac = outer["body"], outer["mac"]
            good = hmac.compare_digest(mac, hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest())
        except (ValueError, KeyError, TypeError, AttributeError):
            good = False
        if not good:
            return {"event": "forged", "line": line[:200].decode("utf-8", "replace")}
        event = json.loads(body)
        self.seq += 1
        if event.get("seq") != self.seq:
            return {"event": "forged", "line": f"event out of sequence (got {event.get('seq')}, expected {self.seq})"}
        return event

    def close(self, kill: bool) -> int | None:
        if not self.proc.stdin.closed:  # a child that never got its job
            self.proc.stdin.close()
        if kill:
            kill_group(self.proc.pid)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(self.proc.pid)
            code = self.proc.wait()
        os.close(self.fd)
        self.log.close()
        self.sandbox.close()
        return code


def run_worker(job: dict, case_timeout: float, stage_timeout: float, log_path: str | None = None,
               env: dict | None = None, on_event=None, first_child: ChildRun | None = None,
               sandbox: SandboxInfo | None = None) -> dict:
    """Run every stage of `job` in child processes; returns plain-data results.

    `on_event`, if given, sees every event the child sends (e.g. to show progress). `first_child`:
    a child started earlier without a job (same `env`, logging to `log_path`); it runs the first batch.
    `sandbox`: how children are sandboxed (default: mini_kv.sandbox's choice for this machine);
    recorded in the results.
    """
    log_path = log_path or (first_child.log_path if first_child else
                            tempfile.mkstemp(prefix="mini-kv-worker-", suffix=".log")[1])
    if sandbox is None:
        sandbox = first_child.sandbox_info if first_child is not None else resolve_sandbox(True)
    results = {"load": None, "cases": [], "contract": {}, "bench": [], "incidents": [], "log": log_path,
               "sandbox": sandbox.to_dict()}
    pending_cases = list(job["cases"])
    pending_bench = list(job.get("bench_cases", []))
    contract_pending = list(job.get("contract", []))
    started = time.monotonic()
    from mini_kv.worker.integrity import files_changed, harness_files

    # the verifier's own files (and the suite's), checked from here where the candidate cannot reach
    watch = job.get("watch_paths", [])
    files_before = harness_files(watch)
    for _ in range(MAX_RESTARTS):
        sub = {**job, "cases": pending_cases, "bench_cases": pending_bench, "contract": contract_pending}
        if first_child is not None:
            child, first_child = first_child, None
            child.send(sub)
        else:
            child = ChildRun(sub, log_path, env, sandbox=sandbox)
        current = None
        outcome = "eof"
        while True:
            budget = min(case_timeout, max(0.0, stage_timeout - (time.monotonic() - started)))
            ev = child.next_event(budget)
            if ev == "timeout":
                outcome = "timeout"
                break
            if ev is None:
                break
            kind = ev.get("event")
            if on_event is not None:
                on_event(ev)
            if kind == "begin":
                current = (ev["stage"], ev["case"])
            elif kind == "load":
                results["load"] = ev
                current = None
                if not ev["ok"]:
                    break
            elif kind == "case":
                if ev["record"].get("id") not in {c["id"] for c in pending_cases}:
                    results["incidents"].append(_forged(current, f"a result for {ev['record'].get('id')!r}, "
                                                        "which was not pending (a second or unknown record)"))
                    continue
                results["cases"].append(ev["record"])
                pending_cases = [c for c in pending_cases if c["id"] != ev["record"]["id"]]
                current = None
            elif kind == "contract":
                results["contract"][ev["name"]] = ev["record"]
                contract_pending = [n for n in contract_pending if n != ev["name"]]
                current = None
            elif kind == "bench":
                results["bench"].append(ev["record"])
                pending_bench = [c for c in pending_bench if c["id"] != ev["record"]["id"]]
                current = None
            elif kind == "fatal":
                results["incidents"].append({"stage": "worker", "reason": ev["reason"]})
                if results["load"] is None:
                    results["load"] = {"ok": False, "reason": ev["reason"], "traceback": ev.get("traceback")}
            elif kind == "done":
                left = len(pending_cases) + len(pending_bench) + len(contract_pending)
                if left:  # signed with the key (read from this process's memory) but not the harness's
                    results["incidents"].append(_forged(current, f"'done' with {left} result(s) still pending"))
                outcome = "done"
                break
            elif kind == "forged":  # bytes on the pipe that the harness did not sign
                results["incidents"].append({"stage": "channel", "integrity": "FORGED_RESULT_CHANNEL",
                                             "case": current[1] if current else None,
                                             "reason": f"unsigned data on the result channel: {ev['line']}"})
            else:
                results["incidents"].append({"stage": "channel", "reason": f"unexpected event {ev!r}"[:500]})
        code = child.close(kill=outcome != "done")
        if outcome == "done" or (results["load"] is not None and not results["load"]["ok"]):
            break
        if results["load"] is None:
            results["load"] = {"ok": False, "reason": f"worker {_describe_exit(code)} before loading the op",
                               "timed_out": outcome == "timeout", "log_tail": _tail(log_path),
                               "stage": current[0] if current else None}  # what it was loading
            break
        status = "TIMEOUT" if outcome == "timeout" else "RUNTIME_ERROR"
        reason = (f"no result within {budget:.0f} s; process group killed" if outcome == "timeout"
                  else f"worker {_describe_exit(code)}")
        if current is None:
            results["incidents"].append({"stage": "worker", "status": status, "reason": reason,
                                         "log_tail": _tail(log_path)})
            if not (pending_cases or pending_bench or contract_pending):
                break
            continue
        stage, case_id = current
        failure = {"id": case_id, "status": status, "reason": reason, "log_tail": _tail(log_path)}
        if stage in ("correctness", "inputs"):
            case = next(c for c in pending_cases if c["id"] == case_id)
            if stage == "inputs":  # the card's input factory, before any candidate call: the card's fault
                failure.update(status="INVALID_CASE", reason=f"{reason} while the card's input factory made the "
                               f"inputs for params {case['params']}")
            results["cases"].append({**failure, "kind": case["kind"], "dtype": case["dtype"],
                                     "params": case["params"]})
            pending_cases = [c for c in pending_cases if c["id"] != case_id]
        elif stage == "contract":
            results["contract"][case_id] = {**failure}
            contract_pending = [n for n in contract_pending if n != case_id]
        else:
            results["bench"].append(failure)
            pending_bench = [c for c in pending_bench if c["id"] != case_id]
        if time.monotonic() - started >= stage_timeout:
            results["incidents"].append({"stage": "worker", "status": "TIMEOUT",
                                         "reason": f"stage budget of {stage_timeout:.0f} s spent"})
            break
        if not (pending_cases or pending_bench or contract_pending):
            break
    touched = files_changed(files_before, harness_files(watch))
    if touched:
        results["incidents"].append({"stage": "worker", "integrity": "HARNESS_TAMPERED", "case": None,
                                     "reason": "files of the verifier changed while the worker ran: "
                                               + ", ".join(touched[:10])})
    return results


def _forged(current, what: str) -> dict:
    return {"stage": "channel", "integrity": "FORGED_RESULT_CHANNEL", "case": current[1] if current else None,
            "reason": f"the result channel carried {what}"}
