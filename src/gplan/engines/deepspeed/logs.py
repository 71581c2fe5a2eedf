"""What a DeepSpeed engine prints of its configuration and its steps (DeepSpeed 0.19.8, the version gplan's
DeepSpeed export is checked with):

  - `runtime/config.py`, `DeepSpeedConfig.print` (called by `DeepSpeedEngine._configure_with_arguments`
    as `print("DeepSpeedEngine configuration")`): one `  {name} {dots} {value}` line per attribute, then
    `print_user_config`: `  json = ` and the config as it was given, as indented JSON;
  - `runtime/engine.py`, `_report_progress`: `step={step}, skipped={skipped_steps}, lr=…, mom=…`, every
    `steps_per_print` steps (fp16 overflows skip a step's update and count here);
  - `utils/timer.py`, `ThroughputTimer.stop`, every `steps_per_print` steps: `epoch=…/micro_step=…/
    global_step=…, RunningAvgSamplesPerSec=…, CurrSamplesPerSec=…, MemAllocated=…GB, MaxMemAllocated=…GB`.

The JSON is the configuration the engine ran — batch, micro-batch, ZeRO stage, precision — so where a
Megatron-DeepSpeed log carries it, it decides over the arguments block (whose `zero_stage` is only what
the script passed to write the JSON). A DeepSpeed log alone does not say which model it trained."""

from __future__ import annotations

import json
import re

from gplan.errors import InputError

CONFIG_MARK = re.compile(r"DeepSpeedEngine configuration:")
SIGNATURE = re.compile(r"samples/sec|DeepSpeed ?Engine|RunningAvgSamplesPerSec")
"""What only a DeepSpeed engine's log prints (the configuration block, the throughput lines)."""
JSON_MARK = re.compile(r"json = ")
PROGRESS = re.compile(r"\bstep=(\d+), skipped=(\d+), lr=")
"""runtime/engine.py, `DeepSpeedEngine._report_progress`: `step={step}, skipped={skipped_steps}, lr=…`."""
MAX_ALLOCATED = re.compile(r"RunningAvgSamplesPerSec=[\d.eE+-]+, CurrSamplesPerSec=[\d.eE+-]+, MemAllocated=[\d.]+GB, "
                           r"MaxMemAllocated=([\d.]+)GB")


def engine_config(text: str, source: str) -> dict | None:
    """The configuration JSON the DeepSpeed engine printed; None when the log has none."""
    mark = CONFIG_MARK.search(text)
    if mark is None:
        return None
    found = JSON_MARK.search(text, mark.end())
    if found is None:
        raise InputError(f"{source}: the DeepSpeedEngine configuration is cut short (no `json = `)",
                         hint="pass the whole log from its start")
    try:
        config, _ = json.JSONDecoder().raw_decode(text, found.end())
    except ValueError as exc:
        raise InputError(f"{source}: the DeepSpeed config JSON is cut short ({exc.msg})",
                         hint="pass the whole log from its start") from None
    return config


def skipped_steps(text: str) -> set[int]:
    """The steps the engine skipped (an fp16 overflow: no update), where its progress lines say: step N was
    skipped when its `skipped` count is above step N − 1's (both logged)."""
    counts = {int(m.group(1)): int(m.group(2)) for m in PROGRESS.finditer(text)}
    return {step for step, count in counts.items() if step - 1 in counts and count > counts[step - 1]}


def max_allocated_bytes(text: str) -> float | None:
    """The largest `MaxMemAllocated` the throughput lines report (GB there is 2^30 bytes: timer.py divides
    by 1024**3)."""
    peaks = [float(m.group(1)) for m in MAX_ALLOCATED.finditer(text)]
    return max(peaks) * 2**30 if peaks else None


def overrides(config: dict) -> dict:
    """The layout the JSON sets, in the arguments block's names (Megatron-DeepSpeed asserts its own
    batch flags equal these)."""
    found: dict = {}
    zero = config.get("zero_optimization") or {}
    if "stage" in zero:
        found["zero_stage"] = int(zero["stage"])
    if "train_micro_batch_size_per_gpu" in config:
        found["micro_batch_size"] = int(config["train_micro_batch_size_per_gpu"])
    if "train_batch_size" in config:
        found["global_batch_size"] = int(config["train_batch_size"])
    for precision in ("bf16", "fp16"):
        if (config.get(precision) or {}).get("enabled") is not None:
            found[precision] = bool(config[precision]["enabled"])
    return found
