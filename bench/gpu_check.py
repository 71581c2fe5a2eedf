"""The GPU check: gplan's predictions against one NVIDIA GPU box, in one prepared script.

1. `gplan profile` measures llama3-8b's layers (forward, backward, recompute, saved bytes per micro-batch)
   on this GPU, and its links when the box has more than one GPU.
2. `gplan search` plans a ~1.7B GPT (the bundled gpt-1.7b) on one GPU of this kind from the catalogue,
   and `gplan launch` trains that plan for 20 steps; its run report's step time and peak memory are
   set against the plan's prediction.
3. The same model in FP8 (torchao's tensorwise float8, real kernels, no emulation) where the GPU has
   FP8 tensor cores (Hopper and later): searched with `--precision fp8 --target torch`, trained for the
   same steps, predicted vs measured, and its speedup over the BF16 run beside gplan's predicted one.
4. Everything is written to OUT (default ./gpu-check): the profile, the plans, the run reports, and
   `gpu_check.json` / `gpu_check.md` with predicted vs measured — the table the README shows once it
   has run on a GPU.

    python bench/gpu_check.py [--out DIR] [--steps 20]

Needs torch with CUDA (`pip install -e '.[torch]'` on the GPU machine). Nothing here runs in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: CUDA device names -> the bundled cluster of that GPU (its hardware and fabric).
CLUSTERS = {"H200": "dgx-h200", "H100": "dgx-h100", "A100-SXM4-80GB": "dgx-a100-80g", "A100-SXM4-40GB": "dgx-a100-40g",
            "A100 80GB": "dgx-a100-80g", "V100": "dgx-v100"}


def gplan(*args: str, log: Path) -> subprocess.CompletedProcess:
    """Run the gplan CLI; its output goes to `log` and the call's outcome is returned."""
    done = subprocess.run([sys.executable, "-m", "gplan.cli", *args], capture_output=True, text=True)
    log.write_text(f"$ gplan {' '.join(args)}\nexit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done


def cluster_of(device_name: str) -> str:
    for key, cluster in CLUSTERS.items():
        if key in device_name:
            return cluster
    raise SystemExit(f"error: no bundled cluster for {device_name!r} (known: {', '.join(CLUSTERS)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check")))
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.stderr.write("error: no CUDA device (this check needs an NVIDIA GPU)\n")
        return 5
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    name, gpus = torch.cuda.get_device_name(0), torch.cuda.device_count()
    cluster = cluster_of(name)
    result: dict = {"device": name, "gpus": gpus, "cluster": cluster, "torch": torch.__version__}

    start = time.perf_counter()
    profile = gplan("profile", "--model", "llama3-8b", "--out", str(out / "profile.yaml"), "--backend", "torch",
                    "--device", "cuda", "--mbs", "1,2", "--tp", "1", "--seq-length", "4096", "--nproc", str(gpus),
                    log=out / "profile.log")
    result["profile"] = {"exit": profile.returncode, "seconds": round(time.perf_counter() - start, 1)}

    result["run"] = train(out, "", cluster, args.steps, [])
    if result["run"] and torch.cuda.get_device_capability(0) >= (8, 9):  # float8 tensor cores (Ada, Hopper, later)
        result["run_fp8"] = train(out, "-fp8", cluster, args.steps, ["--precision", "fp8", "--target", "torch"])
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))
    sys.stdout.write(markdown(result))
    return 0 if result.get("run") else 5


def train(out: Path, tag: str, cluster: str, steps: int, extra: list[str]) -> dict | None:
    """Search the ~1.7B GPT on one GPU (with `extra` options), train it `steps` steps; predicted vs measured."""
    plan = out / f"plan{tag}.json"
    search = gplan("search", "gpt-1.7b", "--cluster", cluster, "--devices", "1", "--gbs", "16", "--seq-length", "2048",
                   *extra, "--out", str(plan), "--json", log=out / f"search{tag}.log")
    if search.returncode:
        return None
    gplan("launch", str(plan), "--steps", str(steps), "--warmup-steps", "3", "--device", "cuda",
          "--run-dir", str(out / f"run{tag}"), log=out / f"launch{tag}.log")
    report_path = out / f"run{tag}" / "run_report.json"
    if not report_path.is_file():
        return None
    report = json.loads(report_path.read_text())
    predicted_mem = max(report["predicted_memory_bytes_per_stage"])
    measured_mem = max(r["peak_memory_bytes"] for r in report["ranks"])
    return {"plan": report["parallel"], "compute_dtype": report["compute_dtype"], "recipe": report.get("gemm_recipe"),
            "step_time_s": {"predicted": report["predicted_step_time_s"], "measured": report["step_time_s"],
                            "error": report["predicted_step_time_s"] / report["step_time_s"] - 1},
            "peak_memory_GiB": {"predicted": predicted_mem / 2**30, "measured": measured_mem / 2**30,
                                "error": predicted_mem / measured_mem - 1},
            "mfu_measured": report["mfu"], "losses": report["losses"]}


def markdown(result: dict) -> str:
    lines = [f"GPU check on {result['gpus']} × {result['device']} (cluster {result['cluster']}, torch {result['torch']}):",
             "", f"- profile of llama3-8b's layers: exit {result['profile']['exit']} in {result['profile']['seconds']} s"]
    if not result.get("run"):
        lines.append("- search/launch did not complete: see search.log and launch.log")
        return "\n".join(lines) + "\n"
    for run in (result["run"], result.get("run_fp8")):
        if not run:
            continue
        st, mem = run["step_time_s"], run["peak_memory_GiB"]
        lines += ["", f"| {run['plan']} ({run['compute_dtype']}{', ' + run['recipe'] if run['recipe'] else ''}) "
                      "| predicted | measured | error |", "|---|---:|---:|---:|",
                  f"| step time | {st['predicted']:.3f} s | {st['measured']:.3f} s | {st['error']:+.1%} |",
                  f"| peak memory | {mem['predicted']:.1f} GiB | {mem['measured']:.1f} GiB | {mem['error']:+.1%} |",
                  f"| MFU (measured) | | {run['mfu_measured']:.1%} | |"]
    if result.get("run_fp8"):
        bf16, fp8 = result["run"]["step_time_s"], result["run_fp8"]["step_time_s"]
        lines += ["", f"FP8 speedup over BF16: predicted {bf16['predicted'] / fp8['predicted']:.3f}×, "
                      f"measured {bf16['measured'] / fp8['measured']:.3f}×"]
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    sys.exit(main())
