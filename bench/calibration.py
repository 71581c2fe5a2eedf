"""Profile and calibration on this machine (CPU, gloo): how long `gplan profile` takes, and how far
the cost model's step time is from measured `gplan launch` runs before and after `gplan calibrate`
(fitted on three plans; the others held out).

    python bench/calibration.py [--readme]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gplan.spec.training import TrainingSpec
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers: tests/helpers.py
from helpers import SMALL_LLAMA, tiny_plan

ROOT = Path(__file__).resolve().parents[1]

BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"
TRAINING = TrainingSpec(gbs=8, seq_length=128, precision="fp32")
FIT = {"dp=1 mbs=1": {}, "dp=2": dict(dp=2), "pp=2": dict(pp=2)}
HELD_OUT = {"dp=2 mbs=2": dict(dp=2, mbs=2), "dp=1 mbs=2": dict(mbs=2), "pp=2 mbs=2": dict(pp=2, mbs=2),
            "dp=2 recompute=full": dict(dp=2, recompute="full")}


def gplan(*args: str) -> str:
    return subprocess.run(["gplan", *args], check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        gplan("profile", "--backend", "torch", "--model", "tiny-llama", "--nproc", "2", "--device", "cpu",
              "--out", str(root / "profile.yaml"))
        profile_s = time.perf_counter() - start
        reports = {}
        for i, (name, degrees) in enumerate({**FIT, **HELD_OUT}.items()):
            plan = tiny_plan(root / f"plan{i}.json", SMALL_LLAMA, None, TRAINING, **degrees)
            gplan("launch", str(plan), "--run-dir", str(root / f"run{i}"), "--steps", "10", "--warmup-steps", "3",
                  "--device", "cpu")
            reports[name] = root / f"run{i}" / "run_report.json"
        held = [a for n in HELD_OUT for a in ("--held-out", str(reports[n]))]
        data = json.loads(gplan("calibrate", *[str(reports[n]) for n in FIT], *held, "--out", str(root / "cal.yaml"),
                                "--json"))["data"]
    names = {str(path): name for name, path in reports.items()}
    lines = [f"`gplan profile --backend torch --model tiny-llama --nproc 2` (3 micro-batch sizes × 2 tp widths × "
             f"3 parts, then the links from 4 KiB to 16 MiB): {profile_s:.1f} s.", "",
             "| run (small Llama, 4 layers, h=256, seq 128, gbs 8; CPU, gloo) | measured step | error before | "
             "error after | leave-one-out |", "|---|---:|---:|---:|---:|"]
    for row in data["runs"]:
        lines.append(f"| {names[row['run']]} (fitted) | {row['measured_s'] * 1e3:.1f} ms | {row['error_before']:+.1%} | "
                     f"{row['error_after']:+.1%} | {row['error_leave_one_out']:+.1%} |")
    for row in data["held_out"]:
        lines.append(f"| {names[row['run']]} (held out) | {row['measured_s'] * 1e3:.1f} ms | {row['error_before']:+.1%} | "
                     f"{row['error_after']:+.1%} | — |")
    theta = ", ".join(f"{k} {v:.3g}" for k, v in data["theta"].items())
    text = "\n".join(lines) + f"\n\nFitted: {theta}.\n"
    sys.stdout.write(text)
    if args.readme:
        from readme_section import write_section

        write_section(BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
