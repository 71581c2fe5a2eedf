"""A MindFormers training YAML rewritten: its layout keys (`parallel_config`, the optimizer-parallel
switches, `recompute_config`'s counts, the `offset` split, `runner_config`'s batch), line by line so
comments and every other key stay.
"""

from __future__ import annotations

from pathlib import Path

from gplan.launch_text import rewrite_yaml
from gplan.plan import Plan


WRITES_BACK = (
    "the YAML's layout keys, line by line (comments and every other key kept)")
"""What `--out-launch` writes (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""


def write_back(plan: Plan, source: Path, target: Path, text: str) -> dict[Path, str]:
    return {target: rewrite_yaml(text, mindformers_values(plan, text))}


MF_OWNED = {"parallel_config": ("data_parallel", "model_parallel", "pipeline_stage", "context_parallel",
                                "use_seq_parallel", "micro_batch_num", "vocab_emb_dp", "expert_parallel"),
            "parallel": ("enable_parallel_optimizer",), "parallel.parallel_optimizer_config": ("gradient_accumulation_shard",),
            "parallel.pipeline_config": ("pipeline_interleave", "pipeline_scheduler"),
            "recompute_config": ("recompute", "select_recompute"),
            "model.model_config": ("offset", "pp_interleave_num"),
            "runner_config": ("batch_size", "gradient_accumulation_steps")}
"""The keys of a MindFormers YAML's layout (the export's sections), by section."""



def mindformers_values(plan: Plan, text: str) -> dict[str, object]:
    """The layout keys of the plan as MindFormers' export writes them; an optimizer shard size of the
    user's set to -1 (every data-parallel rank: the sharding gplan prices)."""
    import yaml

    from gplan.engines.mindformers.export import sections

    written, values = sections(plan), {}
    for section, keys in MF_OWNED.items():
        node = written
        for part in section.split("."):
            node = node.get(part) or {}
        values |= {f"{section}.{key}": node[key] for key in keys if key in node}
    options = ((yaml.safe_load(text) or {}).get("parallel") or {}).get("parallel_optimizer_config") or {}
    if options.get("optimizer_weight_shard_size", -1) != -1:
        values["parallel.parallel_optimizer_config.optimizer_weight_shard_size"] = -1
    return values
