"""DeepSpeed: a JSON config (ZeRO stage, micro-batch, gradient accumulation, precision, activation
checkpointing) and the tp/pp degrees for Megatron-DeepSpeed.

DeepSpeed's batch rule is train_batch_size = micro_batch × accumulation × data-parallel ranks, the
plan's gbs = mbs × m × dp. ZeRO 3 with pp > 1 is refused (DeepSpeed's pipeline engine supports
ZeRO ≤ 1).
"""

from __future__ import annotations

import json

from gplan.backends.exporters import Export, recompute_counts, stamp
from gplan.plan import Plan


def export(plan: Plan) -> Export:
    c = plan.parallel
    notes: list[str] = []
    config = ds_config(plan, notes)
    megatron_ds = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp),
                   "--micro-batch-size", str(c.mbs), "--global-batch-size", str(plan.training.gbs)]
    if c.pp == 1:
        megatron_ds.append("--no-pipeline-parallel")
    if c.sp and c.tp > 1:
        megatron_ds.append("--sequence-parallel")
    readme = "\n".join([stamp(plan), "# Megatron-DeepSpeed arguments (with --deepspeed --deepspeed_config ds_config.json):",
                        " ".join(megatron_ds), *[f"# note: {n}" for n in notes]]) + "\n"
    return Export({"ds_config.json": json.dumps(config, indent=2) + "\n", "megatron_deepspeed_args.txt": readme}, notes)


def ds_config(plan: Plan, notes: list[str]) -> dict:
    c, t = plan.parallel, plan.training
    config: dict = {
        "_comment": stamp(plan, comment="").strip(),
        "train_batch_size": t.gbs,
        "train_micro_batch_size_per_gpu": c.mbs,
        "gradient_accumulation_steps": plan.parallel.num_microbatches,
        "zero_optimization": {"stage": c.zero},
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16"},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
    }
    full = recompute_counts(plan, "full")
    if any(full) or any(recompute_counts(plan, "selective")):
        config["activation_checkpointing"] = {"partition_activations": c.tp > 1, "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
        if any(recompute_counts(plan, "selective")) and not any(full):
            notes.append("DeepSpeed checkpoints whole layers: the plan's selective recomputation becomes full")
    return config
