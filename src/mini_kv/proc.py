"""Run a command in its own process group, with a timeout that kills the whole group."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass


@dataclass
class ProcResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_with_timeout(cmd: list[str], timeout: float, env: dict | None = None, cwd: str | None = None,
                     input_text: str | None = None) -> ProcResult:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
        return ProcResult(proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        return ProcResult(proc.returncode if proc.returncode is not None else -9, out, err, True)


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
