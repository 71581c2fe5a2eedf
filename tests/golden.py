"""Golden searches: what `gplan search` picks on six instances (dense, MoE, interleaved, context
parallel, heterogeneous, Ascend) and what `gplan export` writes for the dense one, kept in
tests/data/golden/ so that a change to the cost model or the search shows as a diff of the picks.

    python tests/golden.py           # regenerate after a deliberate change; review `git diff tests/data/golden`
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "data" / "golden"
MIXED = ROOT / "bench" / "data" / "mixed-a100-v100.yaml"

INSTANCES = {
    "dense-llama3-70b-h100-64": ["llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512"],
    "moe-mixtral-8x7b-h100-64": ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"],
    "interleaved-gpt3-175b-a100-1024": ["gpt3-175b", "--cluster", "dgx-a100-80g", "--devices", "1024", "--gbs", "1536"],
    "cp-llama3-8b-h100-16-seq32k": ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--seq-length", "32768",
                                    "--gbs", "32"],
    "heterogeneous-llama3-8b-a100-v100": ["llama3-8b", "--cluster", str(MIXED), "--precision", "fp16"],
    "ascend-llama2-7b-910b-64": ["llama2-7b", "--cluster", "atlas-800-910b", "--devices", "64"],
}
"""name -> `gplan search` arguments."""
EXPORT_FROM = "dense-llama3-70b-h100-64"
EXPORT_TARGETS = ("megatron", "torchtitan", "slurm")  # deepspeed runs no cp; its exports: tests/backends


def pick(plan: dict) -> dict:
    """What a search picked, to the digits that matter: the configuration, the split with its recompute,
    the stage node groups, and the prediction rounded (step to 0.1%, memory to 0.1 GiB)."""
    p = plan["prediction"]
    return {"target": plan["training"]["engine"], "parallel": plan["parallel"],
            "stages": [{"layers": s["layer_end"] - s["layer_start"], "node_group": s["node_group"],
                        "recompute": {c["recompute"]: c["count"] for c in s["layers"] if c["count"]}}
                       for s in plan["stages"]],
            "step_time_s": float(f"{p['step_time_s']:.4g}"),
            "memory_GiB_max": round(p["memory_bytes_per_device_max"] / 2**30, 1)}


def run_search(args: list[str], out: Path) -> dict:
    from typer.testing import CliRunner

    from gplan.cli import app

    result = CliRunner().invoke(app, ["search", *args, "--out", str(out)], catch_exceptions=False)
    if result.exit_code:
        raise SystemExit(f"gplan search {' '.join(args)} failed: {result.stderr}")
    return json.loads(out.read_text())


def exports(plan_path: Path) -> dict[str, str]:
    """The exported files of the plan (as if it were /jobs/plan.json)."""
    from gplan.backends.exporters import render_export
    from gplan.plan import read_plan
    from gplan.planner.build import reprice_split

    plan, found = read_plan(plan_path), {}
    for target in EXPORT_TARGETS:
        # a fixed plan path, so that the SLURM script's reference to the plan reads the same everywhere
        for name, text in render_export(plan, target, plan_path=Path("/jobs/plan.json"),  # the files, over budget
                                        reprice=reprice_split, over_budget=True).files.items():  # or not
            found[f"{target}/{name}"] = text
    return found


def main() -> int:
    import tempfile

    FOLDER.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        for name, args in INSTANCES.items():
            out = Path(folder) / f"{name}.json"
            (FOLDER / f"{name}.json").write_text(json.dumps({"args": args[:2] + [a if a != str(MIXED) else
                                                  "bench/data/mixed-a100-v100.yaml" for a in args[2:]],
                                                  "pick": pick(run_search(args, out))}, indent=1) + "\n")
            if name == EXPORT_FROM:
                for file, text in exports(out).items():
                    path = FOLDER / "exports" / file
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
    sys.stdout.write(f"wrote {len(INSTANCES)} golden searches and {len(EXPORT_TARGETS)} exports into {FOLDER}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
