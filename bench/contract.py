"""The plan contract, measured: over random small cases (models, CPU cluster sizes, batches, search
limits), every plan `gplan search` ranks must pass `gplan launch --validate` (the full layout built on a
fake process group: shards, recompute, FSDP, pipeline stages and schedule, optimizers), and a sample
of them must train two real steps on CPU (gloo).

    python bench/contract.py [--cases 200] [--launches 8] [--seed 0] [--readme]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gplan.backends.registry import backend
from gplan.errors import GplanError
from gplan.plan import write_plan
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers: tests/helpers.py
from helpers import random_case, ranked_plans

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- contract:begin -->", "<!-- contract:end -->"


def validate_all(cases: int, seed: int) -> tuple[list, list[str], int, float]:
    """(plans, failures, cases with no plan, seconds)."""
    rng = random.Random(seed)
    plans, failures, empty = [], [], 0
    start = time.perf_counter()
    for i in range(cases):
        case = random_case(rng)
        ranked = ranked_plans(case)
        empty += not ranked
        for plan in ranked:
            try:
                report = backend("torch").validate(plan)
                report.raise_if_failed()
            except GplanError as exc:
                failures.append(f"case {i} {plan.parallel.label()}: {exc.message}")
            plans.append(plan)
    return plans, failures, empty, time.perf_counter() - start


def launch_sample(plans: list, count: int, seed: int) -> tuple[int, list[str], float]:
    """Two real CPU steps of `count` plans of at most 4 ranks; (completed, failures, seconds)."""
    small = [p for p in plans if p.world_size <= 4]
    sample = random.Random(seed).sample(small, min(count, len(small)))
    done, failures = 0, []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, plan in enumerate(sample):
            path = Path(tmp) / f"plan{i}.json"
            write_plan(plan, path)
            proc = subprocess.run(["gplan", "launch", str(path), "--steps", "2", "--warmup-steps", "0",
                                   "--device", "cpu", "--run-dir", str(Path(tmp) / f"run{i}")],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                done += 1
            else:
                failures.append(f"{plan.parallel.label()}: {proc.stderr.strip().splitlines()[-1:]}")
    return done, failures, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--launches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readme", action="store_true")
    args = parser.parse_args(argv)
    plans, failures, empty, validate_s = validate_all(args.cases, args.seed)
    done, launch_failures, launch_s = launch_sample(plans, args.launches, args.seed)
    layouts = sorted({(p.parallel.dp, p.parallel.tp, p.parallel.pp, p.parallel.vpp, p.parallel.cp, p.parallel.zero)
                      for p in plans})
    text = "\n".join([
        "| random cases | plans ranked (top 3) | cases with no plan | pass `--validate` | sampled CPU launches (2 steps) | completed |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {args.cases} | {len(plans)} | {empty} | {len(plans) - len(failures)} ({(len(plans) - len(failures)) / max(1, len(plans)):.0%}) "
        f"| {done + len(launch_failures)} | {done} |",
        "",
        f"{len(layouts)} distinct (dp, tp, pp, vpp, cp, zero) layouts, {sum(p.parallel.cp > 1 for p in plans)} plans with cp; validation {validate_s:.0f} s, launches {launch_s:.0f} s "
        f"(seed {args.seed}).",
    ]) + "\n"
    sys.stdout.write(text)
    for line in failures + launch_failures:
        sys.stdout.write(f"FAILED {line}\n")
    if args.readme:
        from readme_section import page_of

        page = page_of(BEGIN)  # docs/search-speed.md
        body = page.read_text()
        head, _, rest = body.partition(BEGIN)
        _, _, tail = rest.partition(END)
        page.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    return 1 if failures or launch_failures else 0


if __name__ == "__main__":
    sys.exit(main())
