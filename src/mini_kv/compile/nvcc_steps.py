"""`nvcc -c` with its host and device front ends side by side: torch's extension builds use it as
their nvcc (PYTORCH_NVCC, set by mini_kv.compile.jit_child).

One `nvcc -c x.cu` runs its steps one after another: the host preprocessor and front end
(cudafe++), the device preprocessor and front end (cicc), ptxas and fatbinary, then the host
compiler on cudafe++'s output, which includes the fat binary. For a `.cu` that includes torch's
headers each front end parses all of them: on an H200, cudafe++ 17.4 s and cicc 15.6 s of a 58-s
compile (docs/sol-execbench.md). They need only one thing from each other, the module id file
cudafe++ writes and cicc reads; cicc writes the same id when asked to generate it itself
(`--gen_module_id_file`: the id comes from the source, not the tool). So this asks nvcc for its
exact steps (`--dryrun`), runs the host chain (preprocess, cudafe++) beside the device chain
(preprocess, cicc, ptxas, fatbinary), each with its own module id file, and checks that the two ids
are equal before the host compile. The commands are nvcc's own; the object differs from nvcc's only
in its temporary file names, as two runs of nvcc do.

Anything else is plain nvcc (exec, same arguments): a command line this does not handle (device
linking, relocatable code, preprocessing only, dependency files, kept temporaries), a dry run of
another shape, two module ids that differ, or `MINI_KV_NVCC_STEPS=off`. Each step's output is
printed in nvcc's order, as far as the first step that failed in that order (what nvcc would have
printed), and that step's exit status is the exit status.

Standalone (standard library only): ninja runs it as a script, whatever the import path.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

ENV_NVCC = "MINI_KV_NVCC"  # the nvcc to run (torch's choice), else the one on PATH
ENV_SWITCH = "MINI_KV_NVCC_STEPS"  # "off": always plain nvcc
# options after which nvcc's steps are not the one shape handled below
PLAIN_NVCC_OPTIONS = {
    "-rdc=true",
    "--relocatable-device-code=true",
    "-dc",
    "--device-c",
    "-dw",
    "--device-w",
    "-dlink",
    "--device-link",
    "-lib",
    "--lib",
    "-link",
    "--link",
    "-E",
    "--preprocess",
    "-M",
    "-MM",
    "-MD",
    "-MMD",
    "--generate-dependencies",
    "--generate-dependencies-with-compile",
    "--generate-nonsystem-dependencies",
    "--generate-nonsystem-dependencies-with-compile",
    "-keep",
    "--keep",
    "-save-temps",
    "--save-temps",
    "-dryrun",
    "--dryrun",
    "-time",
    "--time",
    "-fatbin",
    "--fatbin",
    "-cubin",
    "--cubin",
    "-ptx",
    "--ptx",
    "-cuda",
    "--cuda",
}
DEVICE_TOOLS = {"cicc", "ptxas", "fatbinary", "rm"}  # besides the device preprocessing
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Unhandled(Exception):
    """The dry run is not of the shape run here: plain nvcc instead."""


@dataclass
class NvccStep:
    order: int  # its place in nvcc's own sequence
    argv: list[str]
    rc: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass
class NvccPlan:
    host: list[NvccStep]  # preprocess, cudafe++
    device: list[NvccStep]  # preprocess, cicc, ptxas, fatbinary, rm (as nvcc lists them)
    compile: NvccStep  # the host compiler on cudafe++'s output
    module_ids: tuple[str, list[str]]  # cudafe++'s file, and each cicc's own
    env: dict = field(default_factory=dict)


def _value(text: str) -> str:
    """A dry-run assignment's value, as the shell would read it (`INCLUDES="-I..."  `)."""
    try:
        return " ".join(shlex.split(text))
    except ValueError:
        return text.strip()


def _expand(argv: list[str], env: dict) -> list[str]:
    return [_VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), a) for a in argv]


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a == name:
            return argv[i + 1]
    return None


def _tool(argv: list[str]) -> str:
    return os.path.basename(argv[0]) if argv else ""


def parse_dry_run(text: str, base_env: dict) -> NvccPlan:
    """nvcc's steps (`#$ ` lines of `nvcc --dryrun`) as a host chain, a device chain and the compile."""
    env = dict(base_env)
    steps: list[NvccStep] = []
    for line in text.splitlines():
        if not line.startswith("#$ "):
            continue
        body = line[3:]
        if _ASSIGNMENT.match(body):
            name, _, rest = body.partition("=")
            env[name] = _value(rest)
            continue
        if body.startswith("--"):  # an internal step of nvcc's (a dependency filter): not a command
            raise Unhandled(f"internal step {body.strip()!r}")
        try:
            argv = shlex.split(body)
        except ValueError as exc:
            raise Unhandled(f"unparsable step {body!r}: {exc}") from None
        steps.append(NvccStep(len(steps), _expand(argv, env)))
    return _chains(steps, env)


def _host_front_end(steps: list[NvccStep]) -> tuple[NvccStep, str]:
    """cudafe++'s step and the module id file it writes."""
    cudafe = [s for s in steps if _tool(s.argv) == "cudafe++"]
    if len(cudafe) != 1:
        raise Unhandled(f"{len(cudafe)} cudafe++ steps")
    module_id = _option(cudafe[0].argv, "--module_id_file_name")
    if module_id is None or "--gen_module_id_file" not in cudafe[0].argv:
        raise Unhandled("cudafe++ does not write the module id")
    return cudafe[0], module_id


def _own_module_ids(cicc: list[NvccStep], module_id: str) -> list[str]:
    """Each cicc step made to write its own module id file instead of reading cudafe++'s."""
    if not cicc:
        raise Unhandled("no cicc step")
    own_ids = []
    for k, s in enumerate(cicc):
        if _option(s.argv, "--module_id_file_name") != module_id or "--gen_module_id_file" in s.argv:
            raise Unhandled("a cicc step does not read cudafe++'s module id")
        own = f"{module_id}.cicc{k}"
        i = s.argv.index("--module_id_file_name")
        s.argv[i + 1 : i + 2] = [own, "--gen_module_id_file"]
        own_ids.append(own)
    return own_ids


def _chains(steps: list[NvccStep], env: dict) -> NvccPlan:
    fe, module_id = _host_front_end(steps)
    host_pp = [s for s in steps if "-E" in s.argv and _option(s.argv, "-o") == fe.argv[-1]]
    generated = _option(fe.argv, "--gen_c_file_name")
    last = steps[-1]
    if len(host_pp) != 1 or generated is None or generated not in last.argv or "-c" not in last.argv:
        raise Unhandled("no host preprocessing for cudafe++, or the last step does not compile its output")
    host = [host_pp[0], fe]
    device = [s for s in steps if s not in host and s is not last]
    unknown = [_tool(s.argv) for s in device if _tool(s.argv) not in DEVICE_TOOLS and "-E" not in s.argv]
    if unknown:
        raise Unhandled(f"unknown device step {unknown[0]!r}")
    own_ids = _own_module_ids([s for s in device if _tool(s.argv) == "cicc"], module_id)
    return NvccPlan(host=host, device=device, compile=last, module_ids=(module_id, own_ids), env=env)


def _run(step: NvccStep, env: dict) -> bool:
    if _tool(step.argv) == "rm":  # nvcc removes a temporary the fat binary's C file replaced
        for path in step.argv[1:]:
            if not path.startswith("-"):
                Path(path).unlink(missing_ok=True)
        step.rc = 0
        return True
    try:
        done = subprocess.run(step.argv, env=env, capture_output=True, check=False)
    except OSError as exc:
        step.rc, step.stderr = 127, f"{step.argv[0]}: {exc}\n".encode()
        return False
    step.rc, step.stdout, step.stderr = done.returncode, done.stdout, done.stderr
    return done.returncode == 0


def _chain(steps: list[NvccStep], env: dict) -> None:
    for s in steps:
        if not _run(s, env):
            return


def _same_module_ids(plan: NvccPlan) -> bool:
    try:
        ids = {Path(p).read_bytes() for p in (plan.module_ids[0], *plan.module_ids[1])}
    except OSError:
        return False
    return len(ids) == 1


def _report(steps: list[NvccStep]) -> int:
    """Print each step's output in nvcc's order, up to the first that failed; its status, or 0."""
    for s in sorted(steps, key=lambda s: s.order):
        if s.rc is None:  # not run: an earlier step of its chain failed
            continue
        sys.stdout.buffer.write(s.stdout)
        sys.stderr.buffer.write(s.stderr)
        if s.rc != 0:
            return s.rc
    return 0


def run_plan(plan: NvccPlan) -> int | None:
    """Both chains side by side, then the compile. None: the module ids differ (run plain nvcc)."""
    device = threading.Thread(target=_chain, args=(plan.device, plan.env))
    device.start()
    _chain(plan.host, plan.env)
    device.join()
    steps = [*plan.host, *plan.device]
    if any(s.rc != 0 for s in steps):
        return _report(steps)
    if not _same_module_ids(plan):
        return None
    _run(plan.compile, plan.env)
    return _report([*steps, plan.compile])


def switched_off(environ=os.environ) -> bool:
    return environ.get(ENV_SWITCH, "").lower() in ("off", "0", "no")


def enabled(environ=os.environ) -> bool:
    """Whether torch's extension builds get this as their nvcc: not switched off, and no nvcc of the
    user's own (PYTORCH_NVCC, e.g. a ccache wrapper) to respect."""
    return not switched_off(environ) and "PYTORCH_NVCC" not in environ


def use_for_torch_builds(nvcc: str, environ=os.environ) -> bool:
    """Point torch's extension builder at this script (PYTORCH_NVCC), running `nvcc`. Its nvcc
    dependency files (-MD) go: a build dir of mini_kv's is built once, never rebuilt in place."""
    if not enabled(environ):
        return False
    environ["PYTORCH_NVCC"] = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))}"
    environ[ENV_NVCC] = nvcc
    environ["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] = "1"
    return True


def launcher(nvcc: str, environ=os.environ) -> tuple[list[str], dict | None]:
    """How mini_kv's own nvcc commands start (the compile checks): this script running `nvcc`, with
    the environment that says so, or `nvcc` itself where switched off."""
    if switched_off(environ):
        return [nvcc], None
    return [sys.executable, str(Path(__file__).resolve())], {**environ, ENV_NVCC: nvcc}


def handled(args: list[str]) -> bool:
    """Whether this command line is one `-c` compile of one .cu that the chains can run."""
    if switched_off() or ("-c" not in args and "--compile" not in args):
        return False
    return not any(a in PLAIN_NVCC_OPTIONS or a.startswith(("-MF", "--dependency-output")) for a in args)


def main(args: list[str]) -> int:
    nvcc = os.environ.get(ENV_NVCC) or shutil.which("nvcc") or "nvcc"
    if not handled(args):
        os.execv(nvcc, [nvcc, *args])
    tmp = tempfile.mkdtemp(prefix="mini-kv-nvcc-")
    env = {**os.environ, "TMPDIR": tmp}  # nvcc names its temporaries after TMPDIR: ours alone
    try:
        dry = subprocess.run([nvcc, "--dryrun", *args], env=env, capture_output=True, text=True, check=False)
        rc = None
        if dry.returncode == 0:
            try:
                rc = run_plan(parse_dry_run(dry.stderr, env))
            except Unhandled:
                rc = None
        if rc is None:  # not this shape, or ids that differ: nvcc itself, as asked (nothing printed yet)
            rc = subprocess.run([nvcc, *args], check=False).returncode
        return rc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
