"""The one user-facing error type and the exit-code table.

Candidate failures are data (statuses inside results), never exceptions; exceptions are
for bad user input and for the tool's own bugs. `cli.main` maps them to exit codes once.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    CONFIG = 2  # bad task card, schema, path, argument, or unreadable store file
    COMPILE = 3  # a candidate failed to build
    CORRECTNESS = 4  # a case, contract check, opcheck or gradcheck failed
    BENCHMARK = 5  # the benchmark could not run or its result is unstable
    REGRESSION = 6  # slower than the promoted baseline, confirmed and significant
    WORKER_LOST = 7  # a batch item got no result: every cluster worker that ran it died (docs/distributed.md)
    REGRESSION_UNCONFIRMED = 8  # a suspected slowdown the same-run comparisons could not decide (noise)
    INTERNAL = 10  # a bug in mini_kv itself
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): stopped cleanly, what was stored is whole
    TERMINATED = 143  # SIGTERM (128 + SIGTERM: kill, timeout, a CI runner's cancel): stopped as on Ctrl-C


class UserError(Exception):
    """An error the user can fix; carries the exit code it maps to."""

    exit_code = ExitCode.CONFIG

    def __init__(self, message: str, exit_code: ExitCode | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BaselineTampered(UserError):
    """A baseline (or the attempt it was promoted from) no longer matches its recorded hashes."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}", ExitCode.CONFIG)
        self.path = path


class ConfigError(UserError):
    """A file or argument does not match its contract.

    The message names the file, the field path inside it and what was expected.
    """

    def __init__(self, file: str, field: str, expected: str):
        self.file, self.field, self.expected = file, field, expected
        where = f"{file}: {field}" if field else file
        super().__init__(f"{where}: {expected}", ExitCode.CONFIG)
