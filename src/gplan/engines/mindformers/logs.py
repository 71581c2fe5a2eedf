"""A MindFormers training log as a calibration run, with the training YAML it ran beside it.

MindFormers' step lines (mindformers 2.1, `core/callback/callback.py`, `MFLossMonitor.print_output_info`):
`{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: … per_step_time: %dms, lr: …, overflow cond: %s, loss_scale: …`.
The log does not print its whole configuration, so the run's YAML must sit beside it (`run.log` and
`run.yaml`): its parallel, recompute and model sections are read as `--from` reads a MindFormers launch
(planner.launch_files), the model from its `model_config` (a Llama-family shape). The steady step is the
median `per_step_time` after the first `warmup` steps, leaving out steps whose loss scale overflowed
(skipped updates).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from gplan.errors import InputError
from gplan.spec.model import ModelSpec

STEP = re.compile(r"step:\[\s*(\d+)/\s*(\d+)\],.*?per_step_time:\s*(\d+)ms,.*?overflow cond:\s*(\w+)")
WARMUP_STEPS = 2


def steady_step_s(path: Path, warmup: int = WARMUP_STEPS) -> float:
    text = path.read_text(errors="replace")
    if any("Traceback (most recent call last)" in line for line in text.rstrip().splitlines()[-40:]):
        raise InputError(f"{path}: the run crashed (a traceback ends the log)",
                         hint="calibrate on runs that completed their steps")
    steps = [(int(m.group(1)), int(m.group(3)), m.group(4) == "True") for m in STEP.finditer(text)]
    steady = [ms for _, ms, overflow in steps[warmup:] if not overflow]
    if not steady:
        raise InputError(f"{path}: {len(steps)} step line(s), none after the first {warmup} (warm-up) without an "
                         "overflow", hint="train more steps")
    return statistics.median(steady) / 1000.0


def config_beside(path: Path) -> Path:
    yaml_path = path.with_suffix(".yaml")
    if not yaml_path.is_file():
        raise InputError(f"{path}: a MindFormers log does not print its whole configuration",
                         hint=f"put the run's training YAML beside it as {yaml_path.name}")
    return yaml_path


def model_of(yaml_path: Path) -> ModelSpec:
    """The Llama-family model of the YAML's `model_config` (MindFormers' LlamaConfig names)."""
    import yaml

    mc = ((yaml.safe_load(yaml_path.read_text()) or {}).get("model") or {}).get("model_config") or {}
    missing = [k for k in ("num_layers", "hidden_size", "num_heads", "vocab_size") if k not in mc]
    if missing:
        raise InputError(f"{yaml_path}: model_config has no {', '.join(missing)}",
                         hint="the model must be complete to be priced; gplan does not guess it")
    fields = {"name": yaml_path.stem, "num_layers": mc["num_layers"], "hidden_size": mc["hidden_size"],
              "num_attention_heads": mc["num_heads"], "num_kv_heads": mc.get("n_kv_heads"),
              "ffn_hidden_size": mc.get("intermediate_size") or llama_ffn_width(mc), "vocab_size": mc["vocab_size"],
              "seq_length": mc.get("seq_length", 4096), "ffn_kind": "swiglu", "norm": "rmsnorm",
              "position_embedding": "rope", "rope_theta": float(mc.get("theta", 10000.0))}
    return ModelSpec.model_validate({k: v for k, v in fields.items() if v is not None})


def llama_ffn_width(mc: dict) -> int:
    """The SwiGLU width MindFormers' LlamaFeedForward builds where the config gives no intermediate_size
    (mindformers 2.1, `models/llama/llama_layer.py`): 4h, times (ffn_dim_multiplier + 0.01) when set, two
    thirds of it, rounded up to a multiple of `multiple_of` (256) — 13824 for Llama 2 13B's 5120."""
    width = 4 * int(mc["hidden_size"])
    if mc.get("ffn_dim_multiplier") is not None:
        width = int((float(mc["ffn_dim_multiplier"]) + 0.01) * width)
    width = int(2 * width / 3)
    multiple = int(mc.get("multiple_of", 256))
    return multiple * ((width + multiple - 1) // multiple)


def is_log(text: str) -> bool:
    """Its per-step lines."""
    return "per_step_time:" in text
