"""The run supervisor: one node's launcher (torchrun, msrun) run in its own process group, its output
copied to a log, and the whole group ended with gplan — a job never outlives the command that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

from gplan.errors import BackendError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_S = 10.0
"""After SIGTERM, how long the launcher and its workers get before SIGKILL (stop within 30 s)."""


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_job(argv: list[str], env: dict[str, str], log_path: Path, echo=None) -> int:
    """Run a launcher (torchrun, msrun) in its own process group, copying its output to `log_path`
    (and `echo`); return its exit code. Whatever it leaves is killed when it ends. SIGTERM, SIGINT or
    SIGHUP to gplan stops the whole job — SIGTERM to the group, SIGKILL after GRACE_S — and raises a
    BackendError naming what was stopped: a job never outlives the command that started it."""
    handlers = _install(_raise_stop)
    proc = None
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            # When the launcher exits, whatever it left holding the output pipe is ended, so reading
            # the pipe ends too.
            threading.Thread(target=_end_group_after, args=(proc,), daemon=True).start()
            for line in proc.stdout:
                log.write(line)
                if echo:
                    echo(line.rstrip("\n"))
            return proc.wait()
    except _Stop as stop:
        name = signal.Signals(stop.signum).name
        _stop_group(proc, graceful=True)
        raise BackendError(f"stopped by {name}: {Path(argv[0]).name} (pid {proc.pid if proc else '-'}) and every "
                           "worker it started were ended", hint=f"partial logs are in {log_path.parent}") from None
    finally:
        _stop_group(proc, graceful=False)
        _restore(handlers)


def _end_group_after(proc: subprocess.Popen) -> None:
    proc.wait()
    _signal_group(proc, signal.SIGKILL)


def _raise_stop(signum: int, frame) -> None:
    raise _Stop(signum)


def _install(handler) -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS}


def _restore(handlers: dict) -> None:
    for s, previous in handlers.items():
        signal.signal(s, previous)


def _stop_group(proc: subprocess.Popen | None, graceful: bool) -> None:
    """End the launcher's process group: SIGTERM and a grace period when asked, then SIGKILL."""
    if proc is None:
        return
    if graceful:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
