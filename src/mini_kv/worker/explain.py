"""What a candidate did, in words: the messages a user reads when a candidate ends, returns or runs
otherwise than the contract says. One place for their text, so that the judge (the worker) and the
parent (mini_kv.runner) say the same thing the same way, and never in the words of mini_kv's own
failures (its exit codes, its frames)."""

from __future__ import annotations

import os
import re

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mini_kv's own source tree
_FRAME = re.compile(r'^  File "([^"]+)", line \d+')


def exception_message(exc: BaseException) -> str:
    """str(exc), even for an exception whose __str__ raises (then its args stand in, saying so)."""
    try:
        return str(exc)
    except BaseException as inner:  # noqa: BLE001 - a candidate's __str__ may raise anything
        try:
            args = repr(exc.args)[:2000]
        except BaseException:  # noqa: BLE001
            args = "(unprintable)"
        return f"(its __str__ raised {type(inner).__name__}; its args: {args})"


def exception_text(exc: BaseException) -> str:
    """`Type: message`, as a traceback's last line says it."""
    text = exception_message(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# what torch's host allocator says when the process's cap refuses it (a RuntimeError, not a MemoryError)
_HOST_ALLOCATOR_REFUSED = "can't allocate memory"


def out_of_memory(exc: BaseException) -> str | None:
    """A candidate's host allocation refused in a process under its memory cap (proc.cap_memory): a
    MemoryError (whose own message is empty) or torch's allocator failing, said with the cap and the
    option that sets it. None for any other exception, or where this process has no cap."""
    # any other exception's message is not read here: Raised.of reads it, once
    if not isinstance(exc, (MemoryError, RuntimeError)):
        return None
    said = exception_message(exc)
    if not (isinstance(exc, MemoryError) or _HOST_ALLOCATOR_REFUSED in said):
        return None
    import resource

    for name, what in (("RLIMIT_DATA", "data"), ("RLIMIT_AS", "address space")):
        cap = resource.getrlimit(getattr(resource, name))[0]
        if cap != resource.RLIM_INFINITY:
            raised = f"{type(exc).__name__}: {said[:500]}" if said else type(exc).__name__
            return (
                f"the solution ran out of memory ({raised}) under its process's cap of {cap / 2**30:.3g} "
                f"GiB of {what} ({name}; --memory-limit sets it)"
            )
    return None


def system_exit(exc: SystemExit) -> str:
    """A candidate's SystemExit, caught before it ends the process running it."""
    code = exc.code
    return (
        f"the solution called sys.exit({code!r}) (a SystemExit{' with status 0' if code in (None, 0) else ''} "
        "raised by its code: a candidate must return or raise, never end the process)"
    )


def process_ended(how: str) -> str:
    """The candidate's own process ended during a call; `how` is 'exited with status 3' or 'killed by
    signal SIGKILL' (mini_kv.runner._describe_exit)."""
    if how.startswith("exited with status"):
        return (
            f"the candidate's process {how} during its call: its own code ended the process (os._exit, "
            "exit() in C or C++), so the status is the candidate's, not one of mini_kv's exit codes"
        )
    return f"the candidate's process was {how} during its call"


def describe_value(value) -> str:
    """What a solution returned, for a message: its type, and for a sequence how many values of which type."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        kinds = ", ".join(_type_name(v) for v in value[:8]) + (", ..." if len(value) > 8 else "")
        return f"a {type(value).__name__} of {len(value)} value(s) ({kinds})"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))[:8]}"
    return f"an object of type {_type_name(value)}"


def _type_name(value) -> str:
    name = getattr(value, "type_name", None)  # a value that crossed from the subject by its type's name
    if isinstance(name, str):
        return name
    cls = type(value)
    return cls.__name__ if cls.__module__ in ("builtins", "torch") else f"{cls.__module__}.{cls.__name__}"


def expected_outputs(names: list[str]) -> str:
    if len(names) == 1:
        return f"one torch.Tensor (output {names[0]!r}), a tuple of one or a dict {{{names[0]!r}: tensor}}"
    return f"{len(names)} torch.Tensors: a tuple or list in the order {names}, or a dict by those names"


class WrongReturn(Exception):
    """A call returned something that is not the definition's outputs: said without a traceback, whose
    frames would all be mini_kv's (the return is the candidate's only part in it)."""


def wrong_return(value, names: list[str], who: str = "the solution") -> str:
    return f"{who} returned {describe_value(value)}; expected {expected_outputs(names)}"


def output_not_tensor(name: str, value, names: list[str], who: str = "the solution") -> str:
    return (
        f"{who} returned {describe_value(value)} as output {name!r}; expected a torch.Tensor "
        f"(the outputs: {names})"
    )


def candidate_frames(tb: str) -> str:
    """A formatted traceback without mini_kv's frames (and the interpreter's own); '' when no frame is
    left, as when only mini_kv's code was on the stack."""
    lines = tb.rstrip("\n").splitlines()
    kept, skipping = [], False
    for line in lines:
        m = _FRAME.match(line)
        if m:
            path = m.group(1)
            skipping = path.startswith(_PACKAGE) or path.startswith("<frozen")
        elif not line.startswith("  "):
            skipping = False  # the header or the exception line
        if not skipping:
            kept.append(line)
    has_frame = any(_FRAME.match(line) for line in kept)
    return "\n".join(kept) if has_frame else ""


def never_written(name: str, returned: str | None) -> str:
    """A destination-passing solution left output `name` as mini_kv filled it; `returned` describes what
    its call returned instead (describe_value), if anything."""
    got = "" if returned is None else f", and the call returned {returned} instead"
    return (
        f"output {name!r} was never written: it still holds the fill mini_kv put in it before the call{got} "
        "(destination-passing style: the solution must write its results into the output tensors it is "
        "given, after the inputs)"
    )


def slow_solution(device: str, call_s: float, reference_s: float, rounds: int, budget: float) -> str:
    """A workload not judged because the solution's own calls, not the workload's size, outrun the budget."""
    return (
        f"the solution is too slow on {device} for the budget: one call took {call_s:.3g} s (the "
        f"reference's on the same inputs {reference_s:.3g} s); {rounds} correctness rounds and the timing "
        f"would not fit in the workload's budget of {budget:.3g} s (--budget)"
    )


def slow_solution_earlier(
    device: str, call_s: float, reference_s: float, workload: str, budget: float
) -> str:
    """A larger workload not run because the solution's own calls were too slow on a smaller one."""
    return (
        f"not run: the solution is too slow on {device} for the budget: one call took {call_s:.3g} s on "
        f"workload {workload!r} (the reference's on the same inputs {reference_s:.3g} s), and this workload "
        f"is larger; its budget is {budget:.3g} s (--budget)"
    )
