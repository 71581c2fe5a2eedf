"""A torchtitan training log as a calibration run: the configuration from the job config it prints, the
steady-state step from its step lines.

Formats, from torchtitan 0.3.0's own logging:
  - `trainer.py`, `Trainer.Config.maybe_log`: with `--debug.print_config`, `Running with configs: ` and the
    job config as indented JSON (`parallelism`, `training`, `activation_checkpoint`, `model_spec` with its
    `name` and `flavor`, …);
  - `components/metrics.py`, `MetricsProcessor.log`: `step: {step:2}  loss: …  grad_norm: …  memory:
    {GiB:5.2f}GiB({pct:.2f}%)  tps: {tokens/s per device:,}  tflops: …  mfu: …%`, colour codes around the
    fields; with several ranks logging (`LOG_RANK=0,1,2,3`), each line is prefixed `[rankN]:`;
  - `distributed/parallel_dims.py`, `ParallelDims.build_mesh`: `Building device mesh with parallelism: pp=…,
    dp_replicate=…, dp_shard=…, cp=…, tp=…, ep=…` (0.3), before it `Building {n}-D device mesh with
    [names], [sizes]` (torchtitan 0.1–0.2: `dp`, `dp_replicate`, `dp_shard`, `cp`, `tp`, `pp`).
A log that does not print its job config (the default) is read with the launch that ran it beside it,
under the log's name (`run.log` with `run.toml` or `run.sh`), as `--from` reads that launch.
tps is per device (tokens a data-parallel rank processed, over the step time and its tp·pp·cp devices),
so a step takes gbs·seq / (tps · world size). The steady step is the median of the logged steps numbered
after `warmup` (compilation, allocator warm-up), each step's tps the median over the ranks that logged it. The model is the bundled one of the config's
`model_spec` (name and flavor); a log whose configuration is not printed, or names a model gplan has no
shape for, is refused — never guessed.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from gplan.errors import InputError

CONFIG_MARK = "Running with configs:"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MESH = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), cp=(\d+), "
                  r"tp=(\d+), ep=(\d+)")
"""distributed/parallel_dims.py, `ParallelDims.build_mesh`: the degrees as resolved (dp_shard -1 filled)."""
OLD_MESH = re.compile(r"Building \d-D device mesh with \[([^\]]*)\], \[([\d, ]*)\]")
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([-\d.naninf]+).*?memory:\s*([\d.]+)GiB\(([\d.]+)%\)\s+tps:\s*([\d,]+)")
#: torchtitan's (model name, flavor) -> gplan's bundled model of that shape.
BUNDLED = {("llama3", "1B"): "llama3.2-1b", ("llama3", "3B"): "llama3.2-3b", ("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b",
           ("qwen3", "0.6B"): "qwen3-0.6b", ("qwen3", "1.7B"): "qwen3-1.7b", ("qwen3", "4B"): "qwen3-4b",
           ("qwen3", "8B"): "qwen3-8b", ("qwen3", "14B"): "qwen3-14b", ("qwen3", "32B"): "qwen3-32b",
           ("qwen3", "30B-A3B"): "qwen3-30b-a3b", ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
           ("deepseek_v3", "16B"): "deepseek-v3-16b", ("deepseek_v3", "236B"): "deepseek-v2-236b",
           ("deepseek_v3", "671B"): "deepseek-v3",
           ("gpt_oss", "20b"): "gpt-oss-20b", ("gpt_oss", "120b"): "gpt-oss-120b"}
"""torchtitan's (model.name, flavor) -> gplan's bundled model of that shape (torchtitan 0.3.0's
`qwen3_configs`, `deepseekv3_configs`, `llama3_configs`, `gptoss_configs`; profiles/data/models.yaml)."""
WARMUP_STEPS = 2
"""Steps left out at the start (by number): the first compiles and warms the allocator up."""
FLAVOR_VARIANTS = re.compile(r"_(flex_attn|varlen|varlen_attn)$")
"""Flavors of the same shape with another attention kernel (torchtitan's `8B_flex_attn`)."""


@dataclass(frozen=True)
class TorchtitanConfig:
    config: dict
    """The job config as printed, the degrees as the mesh line resolved them."""
    model: str
    """The bundled model of the config's model_spec."""


def read_torchtitan_config(path: Path, text: str) -> TorchtitanConfig:
    """The job config a torchtitan log printed, complete, or refused with what is missing."""
    text = ANSI.sub("", text)
    at = text.find(CONFIG_MARK)
    if at < 0:
        raise InputError(f"{path}: a torchtitan log without its job config (no `{CONFIG_MARK}`)",
                         hint="run with --debug.print_config, so that the log says what it ran")
    try:
        config, _ = json.JSONDecoder().raw_decode(text[text.index("{", at):])
    except ValueError as exc:
        raise InputError(f"{path}: the job config after `{CONFIG_MARK}` is cut short ({exc.msg})",
                         hint="pass the whole log from its start") from None
    # the degrees as torchtitan resolved them (a dp_shard of -1 filled in)
    config.setdefault("parallelism", {}).update(mesh_degrees(text) or {})
    if int((config.get("parallelism") or {}).get("data_parallel_shard_degree", -1)) < 0:
        raise InputError(f"{path}: data_parallel_shard_degree -1 and no `Building device mesh` line: the log does "
                         "not say how many devices ran", hint="pass the log from its start (torchtitan logs the mesh)")
    spec = config.get("model_spec") or {}
    key = (spec.get("name"), spec.get("flavor"))
    if bundled(*key) is None:
        raise InputError(f"{path}: model_spec {key[0]}/{key[1]} has no bundled model of its shape",
                         hint="the bundled torchtitan shapes: " + ", ".join(f"{n}/{f}" for n, f in BUNDLED))
    return TorchtitanConfig(config, bundled(*key))


def read_steps(path: Path, text: str, warmup: int = WARMUP_STEPS) -> tuple[float, int, float]:
    """(median tokens/s per device of the steady steps, how many, the largest memory logged in bytes)."""
    text = ANSI.sub("", text)
    if any("Traceback (most recent call last)" in line for line in text.rstrip().splitlines()[-40:]):
        raise InputError(f"{path}: the run crashed (a traceback ends the log)",
                         hint="calibrate on runs that completed their steps")
    per_step: dict[int, list[float]] = {}
    peak = 0.0
    for m in STEP.finditer(text):
        per_step.setdefault(int(m.group(1)), []).append(float(m.group(5).replace(",", "")))
        peak = max(peak, float(m.group(3)))
    steady = [statistics.median(tps) for step, tps in sorted(per_step.items()) if step > warmup]
    if not steady:
        raise InputError(f"{path}: {len(per_step)} step(s) logged, none after step {warmup} (warm-up)",
                         hint="train more steps (the first ones compile and warm the allocator up)")
    return statistics.median(steady), len(steady), peak * 2**30


def mesh_degrees(text: str) -> dict[str, int] | None:
    """The degrees the log's mesh line states, in the job config's names; None without one."""
    found = MESH.search(text)
    if found:
        return dict(zip(("pipeline_parallel_degree", "data_parallel_replicate_degree", "data_parallel_shard_degree",
                         "context_parallel_degree", "tensor_parallel_degree", "expert_parallel_degree"),
                        map(int, found.groups())))
    old = OLD_MESH.search(text)
    if not old:
        return None
    names = [n.strip().strip("'\"") for n in old.group(1).split(",")]
    sizes = [int(v) for v in old.group(2).split(",")]
    key = {"dp": "data_parallel_shard_degree", "dp_shard": "data_parallel_shard_degree",
           "dp_replicate": "data_parallel_replicate_degree", "cp": "context_parallel_degree",
           "tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree"}
    return {key[n]: size for n, size in zip(names, sizes) if n in key}


def flavor_spelled_otherwise(name: str | None, flavor: str | None) -> str | None:
    """The flavor of `name` that `flavor` spells with other capitals (a TOML's "20B" for gpt_oss's "20b"): torchtitan
    looks flavors up by their exact name, so such a config does not start as written."""
    wanted = FLAVOR_VARIANTS.sub("", str(flavor)).lower()
    return next((f for n, f in BUNDLED if n == name and f.lower() == wanted and f != flavor), None)


def bundled(name: str | None, flavor: str | None) -> str | None:
    """gplan's bundled model of a torchtitan (name, flavor), attention-kernel variants included."""
    return BUNDLED.get((name, FLAVOR_VARIANTS.sub("", str(flavor))))


def flat_values(config: dict) -> dict:
    """The config as the `section.key` values a torchtitan TOML gives (planner.launch_files reads them)."""
    values = {}
    for section in ("parallelism", "training", "activation_checkpoint"):
        for key, item in (config.get(section) or {}).items():
            if not isinstance(item, dict):
                values[f"{section}.{key}"] = item
    checkpoint = config.get("activation_checkpoint")
    if isinstance(checkpoint, dict) and checkpoint and "mode" not in checkpoint:
        # 0.3's FullAC.Config or SelectiveAC.Config (the per-op policy), printed by their fields
        per_op = "force_recompute_mm_shapes_by_fqns" in checkpoint
        values["activation_checkpoint.mode"] = "selective" if per_op else "full"
        if per_op:  # 0.3's SelectiveAC is the per-op policy (a ≤ 0.2 job config's default option is "2")
            values["activation_checkpoint.selective_ac_option"] = "op"
    return values


def world_size(config: dict) -> int:
    p = config["parallelism"]
    return (int(p.get("pipeline_parallel_degree", 1)) * int(p.get("data_parallel_replicate_degree", 1))
            * int(p["data_parallel_shard_degree"]) * int(p.get("context_parallel_degree", 1))
            * int(p.get("tensor_parallel_degree", 1)))


def is_log(text: str) -> bool:
    """Its printed job config, or its step lines."""
    plain = ANSI.sub("", text)
    return CONFIG_MARK in plain or bool(STEP.search(plain))
