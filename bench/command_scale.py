"""Every command that reads a plan, at the largest scales: wall time of the whole `gplan` process (the
median of `RUNS`, after one run that writes the bytecode caches) for `explain`, `compare`, `export`
(Megatron-LM, SLURM, Kubernetes), `validate` and `estimate` of a Llama 3.1 405B plan on 16,384 and on
131,072 H100s. Issue 31: `explain` of the 16,384-device plan did not finish in 10 minutes (a networkx
shortest path per ring hop); the target is seconds at any scale.

    python bench/command_scale.py [--readme]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEGIN, END = "<!-- command-scale:begin -->", "<!-- command-scale:end -->"
RUNS = 3
#: (devices, gbs): seq 8192 (Llama 3.1's pre-training context), a batch of 16M and 128M tokens.
SCALES = [(16384, 2048), (131072, 16384)]
COMMANDS = {
    "explain": ["explain", "{plan}"],
    "explain --trace": ["explain", "{plan}", "--trace", "{out}.trace.json"],
    "explain --report": ["explain", "{plan}", "--report", "{out}.report.html"],
    "compare": ["compare", "{plan}", "{plan}"],
    "export megatron": ["export", "{plan}", "--to", "megatron", "-o", "{out}"],
    "export slurm": ["export", "{plan}", "--to", "slurm", "-o", "{out}"],
    "export k8s": ["export", "{plan}", "--to", "k8s", "-o", "{out}", "--image", "registry.example/gplan:1"],
    "validate": ["validate", "{plan}"],
    "estimate": ["estimate", "{plan}"],
}


def gplan(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gplan.cli", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"gplan {' '.join(args)} failed ({done.returncode}): {done.stderr[-500:]}")
    return time.perf_counter() - start


def run() -> str:
    rows = ["| command | " + " | ".join(f"{d:,} devices" for d, _ in SCALES) + " |",
            "|---|" + "---:|" * len(SCALES)]
    times: dict[str, list[str]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as folder:
        for devices, gbs in SCALES:
            plan = str(Path(folder) / f"p{devices}.json")
            gplan("search", "llama3-405b", "--cluster", "dgx-h100", "--devices", str(devices), "--seq-length", "8192",
                  "--gbs", str(gbs), "--out", plan)
            for name, template in COMMANDS.items():
                args = [a.format(plan=plan, out=str(Path(folder) / f"out{devices}")) for a in template]
                gplan(*args)  # bytecode caches written
                times[name].append(f"{statistics.median(gplan(*args) for _ in range(RUNS)):.2f} s")
    rows += [f"| `gplan {name}` | " + " | ".join(t) + " |" for name, t in times.items()]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from readme_section import table_main

    return table_main(__doc__.splitlines()[0], run, BEGIN, END, argv)

if __name__ == "__main__":
    sys.exit(main())
