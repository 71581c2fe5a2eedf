"""Start-up: the whole `gplan` process for what a person runs before anything else — the version, the
help, each command's help — the median of `RUNS` runs after one that writes the bytecode caches (as an
installed gplan runs). Python's own start-up is timed beside it (`python -c pass`), the floor under every row.

    python bench/startup.py [--readme]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import table_main  # noqa: E402

BEGIN, END = "<!-- startup:begin -->", "<!-- startup:end -->"
RUNS = 5
"""Timed runs per command: this 2-core VM's wall times drift with its host's load, so the median of five."""
GPLAN = [sys.executable, "-c", "import sys; from gplan.cli import main; sys.argv[0] = 'gplan'; main()"]


def commands() -> list[list[str]]:
    from gplan.cli import app

    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    return [["--version"], ["--help"]] + [[name, "--help"] for name in names]


def wall_s(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(argv, capture_output=True, env=env, check=True)  # the bytecode caches
    walls = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, check=True)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls)


def table() -> str:
    rows = [f"| `python -c pass` (the floor) | {wall_s([sys.executable, '-c', 'pass']):.3f} s |"]
    rows += [f"| `gplan {' '.join(argv)}` | {wall_s(GPLAN + argv):.3f} s |" for argv in commands()]
    return "\n".join(["| command | wall time (whole process, median of 5) |", "|---|---:|", *rows])


if __name__ == "__main__":
    sys.exit(table_main("gplan's start-up, command by command.", table, BEGIN, END))
