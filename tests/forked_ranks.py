"""A test-only way to start the torch worker's ranks: forked from a server that imported torch once.

`gplan launch` starts its ranks with torchrun, and every rank is a fresh Python that imports torch, DTensor and
the worker — 3–4 s each on two CPU cores, so a 4-rank layout spends ~10 s starting before it trains 0.2 s.
The layout tests compare losses, not launchers: within `launches_forked()` only the torch backend's `run` is
replaced — the CLI, the plan it renders and checks, the worker's argv and environment and the run report are
all what `gplan launch` does — and each rank is forked from a server that preloaded the worker (multiprocessing's
forkserver: the server never ran a torch op, so no thread pool is forked into a rank). Each rank is a real
process on a real gloo group. torchrun itself stays tested: tests/backends/test_lifecycle.py (failures,
signals, restarts), the killed-rank, two-node and `--elastic` runs, and the dp2 and ep2 layouts of
test_torch_runs.py, whose losses equal the forked runs'.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
import warnings
from contextlib import contextmanager
from multiprocessing import connection
from pathlib import Path

import pytest

from gplan.backends.torch.launcher import WORKER_MODULE, _failure

_context = None


def forkserver():
    """The forkserver context, its server preloading the worker (started once a session)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([WORKER_MODULE, "torchao.float8"])  # torchao: absent, skipped
    return _context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, env: dict[str, str], argv: list[str], log: str) -> None:
    """One rank: torchrun's environment variables, its output to the job's log, one thread per rank as the
    launch's environment asks on CPU, then the worker."""
    import torch

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    from gplan.backends.torch import worker

    code = worker.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown in a forked child


GRACE_S = 2.0
"""After the first rank fails, how long the others may take to end on their own (and log why) before they are
stopped — torchrun's agent notices a failure only at its next look (`--monitor-interval`, 0.5 s in gplan's launch),
and a rank whose own error closed a connection must not be stopped by its peer's quicker report of the loss."""


def run_forked(spec, options, echo) -> None:
    """The torch launcher's `run` (same arguments, same BackendError naming the failed rank), its ranks forked:
    when one fails the others are stopped, as torchrun stops them. A job one of whose ranks a signal killed (not a
    rank that raised: that is the worker's error) is printed and run once more, unless it writes checkpoints."""
    argv = spec.nodes[options.node_rank].argv
    worker_argv = argv[argv.index(WORKER_MODULE) + 1:]
    options.run_dir.mkdir(parents=True, exist_ok=True)
    log = options.run_dir / "torchrun.log"
    for attempt in (1, 2):
        ended = _run_ranks(spec, worker_argv, log)
        output = log.read_text()
        for line in output.splitlines():
            echo(line)
        failed = [(rank, code) for rank, code in ended if code]
        if failed:
            echo(f"forked ranks ended in order (rank, exit code): {ended}")
        killed = [(rank, code) for rank, code in failed if code < 0 and -code != signal.SIGTERM]
        if not killed or attempt == 2 or "--checkpoint-dir" in worker_argv:
            break
        retry = f"forked ranks: rank {killed[0][0]} was killed by signal {-killed[0][1]}; the job runs once more"
        echo(retry)
        last = " | ".join(output.splitlines()[-3:])
        warnings.warn(f"{retry}; its last lines: {last}", RuntimeWarning, stacklevel=2)  # in pytest's summary
        shutil.rmtree(options.run_dir / "logs", ignore_errors=True)
    if failed:
        listing = "".join(f"rank : {rank}\n exitcode : {code}\n" for rank, code in failed)  # torchrun's form
        raise _failure(failed[0][1], listing + output, Path(options.run_dir))


def _run_ranks(spec, worker_argv: list[str], log: Path) -> list[tuple[int, int]]:
    """Fork the job's ranks, wait for them; (rank, exit code) in the order they ended, the first failure first."""
    log.write_text("")
    ctx, port = forkserver(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, spec.world_size, port, dict(spec.env), worker_argv, str(log)))
             for rank in range(spec.world_size)]
    for p in procs:
        p.start()
    ended, running = [], {p.sentinel: rank for rank, p in enumerate(procs)}
    deadline = None
    while running and (deadline is None or time.monotonic() < deadline):
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        for sentinel in connection.wait(list(running), timeout):
            rank = running.pop(sentinel)
            procs[rank].join()
            ended.append((rank, procs[rank].exitcode))
        if deadline is None and any(code for _, code in ended):
            deadline = time.monotonic() + GRACE_S
    for rank in running.values():
        procs[rank].terminate()
        procs[rank].join()
        ended.append((rank, procs[rank].exitcode))
    return ended


def ranks_tail(run_dir: Path, count: int = 6) -> str:
    """Every rank's last lines: what a failed launch's assertion shows, since the error names one rank."""
    logs = sorted(Path(run_dir, "logs").glob("rank*.log"), key=lambda p: int(p.stem.removeprefix("rank")))
    return "\n".join(f"--- {path.stem}\n" + "\n".join(path.read_text().splitlines()[-count:]) for path in logs)


@contextmanager
def launches_forked():
    """Within it, `gplan launch` on the torch backend starts its ranks with `run_forked`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("gplan.backends.torch.launcher.run", run_forked)
        yield
