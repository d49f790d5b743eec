"""The project's own errors and the exit codes the CLI maps them to.

Stdlib only. Library code raises these; only ``cli`` turns them into a red line and an exit code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CASE_FAILED = 1  # a case ended error/crashed/timeout/incorrect (or compare found a regression)
EXIT_BAD_INPUT = 2
EXIT_NOT_COMPARABLE = 3
EXIT_NO_BASELINE = 4
EXIT_INCONCLUSIVE = 5  # selfcheck: no op disagreed, but the rounds could not tell some from the tolerance
EXIT_UNCLEAR = 6  # ab: no case slower, but some case's paired interval straddled the threshold
# A file of a run folder could not be written (disk full, quota, read-only file system, I/O error, permission).
# sysexits.h's EX_IOERR: an outside failure, neither a bad input (2) nor a verdict (1, 3, 4); finished rows are kept.
EXIT_WRITE_FAILED = 74
# Interrupted sweeps exit with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), the shell convention.

# What each code means: the exit-code reference of the docs is generated from this table.
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success, cases recorded as oom, unsupported or too_slow_for_budget included",
    EXIT_CASE_FAILED: "a case ended error, crashed, timeout or incorrect (its output off its family's reference); "
    "compare found a regression; history --fail-on-step found a new step that made things worse; ab found a case "
    "slower; selfcheck disagreed (an interval beyond the tolerance); or a submit task failed or left cases missing "
    "(--resume reruns them)",
    EXIT_BAD_INPUT: "bad input (a config, flag or file; a refused resume or merge; a missing submitit; an sbatch that "
    "refuses): one 'error:' line naming file, key or flag, and a 'hint:'",
    EXIT_NOT_COMPARABLE: "compare or merge refused runs that are not comparable; each difference is listed",
    EXIT_NO_BASELINE: "compare found no baseline run",
    EXIT_INCONCLUSIVE: "selfcheck inconclusive: no op disagreed, but some op's interval straddled the tolerance",
    EXIT_UNCLEAR: "ab unclear: no case was slower, but some case's interval of paired ratios straddled the threshold "
    "(neither a pass nor a failure; more --rounds narrow it)",
    EXIT_WRITE_FAILED: "a file of the run folder could not be written (disk full, read-only file system, I/O error); "
    "finished cases are saved: free space and resume",
}
EXIT_SIGNAL = "128 + the signal: 130 for SIGINT (Ctrl-C), 143 for SIGTERM; finished cases are saved"


class AttnbenchError(Exception):
    """A failure a user can act on: what went wrong and a hint for what to do."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(AttnbenchError):
    """Bad experiment configuration. ``where`` is ``file[:line]`` and ``key`` a dotted key path."""

    def __init__(self, message: str, *, where: str = "", key: str = "", hint: str = "") -> None:
        location = ", ".join(part for part in (where, f"key '{key}'" if key else "") if part)
        if not hint:
            hint = (
                "every key is explained in the commented configs/default.yaml; "
                "'attnbench validate FILE' re-checks a config without running it"
            )
        super().__init__(f"{location}: {message}" if location else message, hint)
        self.where = where
        self.key = key
        self.problem = message  # what was wrong, without where


class ResultsError(AttnbenchError):
    """A results folder or file that is missing, corrupt or of a foreign schema."""


class StorageError(ResultsError):
    """A file attnbench had to write could not be written: the disk is full, the file system read-only, ...

    The message names the file; the rows written before it are intact, so the hint says how to go on."""

    exit_code = EXIT_WRITE_FAILED


class DeviceError(AttnbenchError):
    """A device was asked for that this machine does not have."""
