"""docs/candidates.md "A new operator from scratch", followed literally in an empty directory: every
`file=PATH` block is written, every `bash` block's commands are run in order and must succeed. The
page is the test's input, so the tutorial cannot drift from what mini_kv accepts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from build_helpers import share_build_cache

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "candidates.md"
SECTION = "## A new operator from scratch"
BLOCK = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.M | re.S)


def tutorial_steps(text: str) -> list[tuple[str, str]]:
    """("file", path + body) and ("bash", command) steps, in the order of the page."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    steps: list[tuple[str, str]] = []
    for m in BLOCK.finditer(section):
        info = m.group("info").split()
        target = next((w[len("file=") :] for w in info if w.startswith("file=")), None)
        if target:
            steps.append(("file", target + "\n" + m.group("body")))
        elif info and info[0] == "bash":
            steps.extend(
                ("bash", ln.strip())
                for ln in m.group("body").splitlines()
                if ln.strip() and not ln.strip().startswith("#")
            )
    return steps


def test_the_tutorial_has_the_steps_it_promises():
    steps = tutorial_steps(DOC.read_text())
    files = [s[1].split("\n", 1)[0] for s in steps if s[0] == "file"]
    commands = [s[1] for s in steps if s[0] == "bash"]
    assert files == ["scaled_add_ref.py", "tasks/scaled_add.yaml", "candidates/scaled_add/v0/op.cpp"]
    verbs = [c.split()[3] for c in commands if c.startswith("python -m mini_kv")]
    assert verbs == ["validate-task", "verify", "promote-baseline", "verify", "leaderboard"]


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
    }
    # the checkout's build cache: the tutorial's candidate is built once per cache, not once per run
    share_build_cache(tmp_path)
    outputs, last_verify = [], ""
    for kind, payload in tutorial_steps(DOC.read_text()):
        if kind == "file":
            rel, body = payload.split("\n", 1)
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(body)
            continue
        cmd = (
            payload.replace("python -m", f"{sys.executable} -m", 1)
            if payload.startswith("python ")
            else payload
        )

        def run(c: str, more_env=None):
            return subprocess.run(
                ["bash", "-c", c],
                cwd=tmp_path,
                env={**env, **(more_env or {})},
                capture_output=True,
                text=True,
                timeout=900,
            )

        r = run(cmd)
        # on a busy machine (parallel tests) a CPU benchmark may come out unstable: promote-baseline
        # refuses it and says to verify again, which is what a reader of the tutorial would do. The
        # suite's machine is never quiet (three test workers on two cores), so the verify again is held
        # to a looser stability limit (settings' environment overrides): the limits are tested elsewhere
        for _ in range(2):
            if " promote-baseline " not in cmd or "not stable" not in r.stderr:
                break
            run(last_verify, {"MINI_KV_MAX_CV": "0.5", "MINI_KV_MAX_P95_CV": "2.0"})
            r = run(cmd)
        if " verify " in cmd:
            last_verify = cmd
        # the second verify is judged against the baseline: on a busy machine the gate may be too noisy
        # to decide (UNCONFIRMED, exit 8), which is neither a pass nor a failure of the tutorial
        ok = (0, 8) if " verify " in cmd and last_verify and "regression vs" in r.stdout else (0,)
        assert r.returncode in ok, f"{payload}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
        outputs.append((payload, r.stdout))
    verify_1, verify_2 = [out for cmd, out in outputs if " verify " in cmd]
    assert (
        "PASSED v0: 6 passed, 0 failed, 0 skipped, 0 not run of 6 cases (core 4/4, edge/illegal 2/2), opcheck 1/1"
        in " ".join(verify_1.split())
    )
    assert (tmp_path / "baselines" / "scaled_add.json").is_file()
    assert "regression vs baselines/scaled_add.json" in verify_2
    board = outputs[-1][1]
    assert "scaled_add" in board and "v0" in board
