"""A job never outlives `gplan launch`: SIGTERM, SIGINT or SIGHUP stops the launcher and every process
it started within 30 s, and gplan exits non-zero saying what it stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import requires_engine

# A launcher stand-in that starts a worker and then both wait silently (a slow step prints nothing).
LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(str(worker.pid))
    time.sleep(600)
""")

HARNESS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from gplan.backends.supervisor import run_job
    from gplan.errors import BackendError
    try:
        run_job([sys.executable, "-c", sys.argv[1], sys.argv[2]], {}, Path(sys.argv[3]))
    except BackendError as exc:
        print(exc.message, flush=True)
        sys.exit(5)
""")


def alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_stops_the_launcher_and_its_workers(tmp_path, signum):
    pid_file = tmp_path / "worker.pid"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, LAUNCHER, str(pid_file), str(tmp_path / "job.log")],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    assert alive(worker)
    start = time.monotonic()
    harness.send_signal(signum)
    out, _ = harness.communicate(timeout=30)
    assert time.monotonic() - start < 30
    assert harness.returncode == 5
    assert f"stopped by {signal.Signals(signum).name}" in out and "every worker it started were ended" in out
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker)


def test_a_finished_job_leaves_no_process_behind(tmp_path):
    from gplan.backends.supervisor import run_job

    pid_file = tmp_path / "worker.pid"
    leaver = "import subprocess, sys; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
             "open(sys.argv[1], 'w').write(str(w.pid))"
    assert run_job([sys.executable, "-c", leaver, str(pid_file)], dict(os.environ), tmp_path / "job.log") == 0
    time.sleep(0.2)
    assert not alive(int(pid_file.read_text()))


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace") and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
@requires_engine("torch", "torch")
def test_sigterm_to_gplan_launch_ends_torchrun_and_every_worker(tmp_path):
    from helpers import TINY_LLAMA, tiny_plan

    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, None, dp=2)
    run_dir = tmp_path / "run"
    gplan = Path(sys.executable).with_name("gplan")
    proc = subprocess.Popen([str(gplan), "launch", str(plan), "--steps", "1000000", "--device", "cpu",
                             "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    logs = run_dir / "logs"
    # each rank opens its own log when it starts: rank 1's may come first (read rank 0's only once it exists)
    while not ((logs / "rank1.log").exists() and (logs / "rank0.log").exists()
               and "step 2/" in (logs / "rank0.log").read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the job never got going"
        time.sleep(0.5)
    assert len(processes_mentioning(str(run_dir))) >= 3  # torchrun and two workers
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - start < 30
    assert proc.returncode == 5 and "stopped by SIGTERM" in err
    deadline = time.monotonic() + 5
    while processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(run_dir)) == []
