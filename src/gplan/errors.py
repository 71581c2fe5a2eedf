"""Typed errors with the exit codes of the CLI contract (docs/design.md, "CLI contract").

Every error a user can cause carries a one-line message (what and where) and a hint (how to fix).
The CLI prints `error: <message>` and `hint: <hint>` and exits with `code`; a traceback only with
GPLAN_DEBUG=1.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_INFEASIBLE = 4
EXIT_BACKEND = 5
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as shells report it), after one line saying what stopped."""


class GplanError(Exception):
    """Base of every error gplan reports to a user."""

    code: int = EXIT_INTERNAL

    def __init__(self, message: str, hint: str = "", data: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.data = data
        """What the failing command found, for its `--json` document (a validation report)."""

    def __str__(self) -> str:
        return self.message


class UsageError(GplanError):
    """Flags that contradict each other or are missing."""

    code = EXIT_USAGE


class InputError(GplanError):
    """A model, cluster, training or plan input is malformed or inconsistent."""

    code = EXIT_BAD_INPUT


class InfeasibleError(GplanError):
    """No configuration fits the devices and memory given."""

    code = EXIT_INFEASIBLE


class BackendError(GplanError):
    """A launch or a backend run failed."""

    code = EXIT_BACKEND
