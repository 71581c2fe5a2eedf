"""MindFormers' layout keys as gplan reads them: read, no effect (why), or refused away from their default (why). A key at its default is never refused."""

from __future__ import annotations

from typing import Any


#: The layout keys of a MindFormers training YAML beside the ones its reader reads: MindFormers 2.1's
#: `TransformerOpParallelConfig` and `TransformerRecomputeConfig` arguments and the `parallel` section
#: MindSpore's auto-parallel context takes — key -> (why it has no effect, or None: refused away from the
#: default; its default).
MF_KEYS: dict[str, tuple[str | None, Any]] = {
    "parallel_config.gradient_aggregation_group": ("gradient fusion grouping", 4),
    "parallel_config.vocab_emb_dp": ("the embedding's data-parallel layout (MindFormers sets it under pipelines)", True),
    "parallel_config.mem_coeff": ("the sequence pipeline's memory coefficient", 0.1),
    "parallel_config.optimizer_shard": (None, None), "parallel_config.seq_split_num": (None, 1),
    "parallel_config.context_parallel_algo": (None, "colossalai_cp"), "parallel_config.ulysses_degree_in_cp": (None, 1),
    "parallel_config.swap": (None, None), "parallel_config.recompute": ("recompute_config is read", None),
    "recompute_config.parallel_optimizer_comm_recompute": ("the optimizer gathers' recompute", False),
    "recompute_config.mp_comm_recompute": ("tp collectives' recompute", True),
    "recompute_config.recompute_slice_activation": ("recompute's saved-input slicing", False),
    "recompute_config.select_comm_recompute": ("communication ops' recompute", False),
    "recompute_config.select_recompute_exclude": ("operators left out of select_recompute", False),
    "recompute_config.select_comm_recompute_exclude": ("operators left out of select_comm_recompute", False),
    "parallel.parallel_mode": (None, 1), "parallel.gradients_mean": ("the gradients' mean or sum", False),
    "parallel.full_batch": ("how the batch is handed to the ranks", True), "parallel.search_mode": ("the strategy "
    "search (semi-auto: the configured one)", "sharding_propagation"), "parallel.strategy_ckpt_save_file":
    ("checkpointing", None), "parallel.strategy_ckpt_config": ("checkpointing", None), "parallel.enable_alltoall":
    ("the expert all-to-all (read with expert_parallel)", False), "parallel.dataset_strategy": ("data loading", None),
    "parallel.parallel_optimizer_config.parallel_optimizer_threshold": ("small parameters left unsharded", 64),
    "parallel.parallel_optimizer_config.optimizer_weight_shard_size": (None, -1),
    # MindSpore's pipeline schedulers (mindspore/parallel/auto_parallel.py): seqpipe splits sequences only with
    # parallel_config.seq_split_num above 1 (mindformers/modules/layers.py), refused apart; gpipe is read
    "parallel.pipeline_config.pipeline_scheduler": (None, "1f1b"),
}
PIPELINE_SCHEDULERS = {"1f1b": "1F1B, interleaved with pp_interleave_num",
                       "seqpipe": "without sequence splitting (seq_split_num 1) MindSpore's seqpipe schedules whole "
                                  "micro-batches as 1F1B, interleaved with pp_interleave_num",
                       "gpipe": "read as the GPipe schedule",
                       # seqpipe with chunks, which order them to hold less (MindSpore 2.6's release notes); MindSpore's
                       # own memory evaluator counts their micro-batches in flight as 1F1B's where nothing is split
                       # and a rank holds one chunk (hyper_parallel sapp_nd EvalUtils.pp_seq1f1b_micro_factor:
                       # p − stage at vp 1, n_s_split 1); with chunks their order is refused apart (launch.py)
                       **dict.fromkeys(("seqvpp", "seqsmartvpp"), "without sequence splitting and with one chunk a "
                                                                  "rank (pp_interleave_num 1), 1F1B")}
CHUNKED_SCHEDULERS = ("seqvpp", "seqsmartvpp")
"""MindSpore's seqpipe schedules with chunks: read at pp_interleave_num 1 only (their chunk order is not priced)."""
MF_READ = {"parallel_config.data_parallel", "parallel_config.model_parallel", "parallel_config.pipeline_stage",
           "parallel_config.context_parallel", "parallel_config.use_seq_parallel", "parallel_config.micro_batch_num",
           "parallel_config.expert_parallel", "recompute_config.recompute", "recompute_config.select_recompute",
           "parallel.enable_parallel_optimizer", "parallel.parallel_optimizer_config.gradient_accumulation_shard",
           "parallel.pipeline_config.pipeline_interleave"}


def mindformers_class(key: str, value: Any) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a MindFormers layout key its reader does not read."""
    if key not in MF_KEYS:
        # a sub-key of a section that has no effect as a whole (parallel.strategy_ckpt_config.save_file)
        parent = next((MF_KEYS[p] for p in parent_keys(key) if p in MF_KEYS and MF_KEYS[p][0]), None)
        return ("no effect", parent[0]) if parent else ("refused", "a layout key gplan does not read")
    if key == "parallel.pipeline_config.pipeline_scheduler":
        return (("no effect", PIPELINE_SCHEDULERS[value]) if value in PIPELINE_SCHEDULERS
                else ("refused", f"MindSpore's {value} pipeline schedule"))
    return by_default(*MF_KEYS[key], value)


def by_default(why: str | None, default: Any, value: Any, empty: tuple = (None, False, {}, "")) -> tuple[str, str]:
    """A key's class from its table entry (why it has no effect, or None; its default): at its default (an unset
    value where the default is None) no effect; else `why`, or refused where there is none."""
    if value == default or (default is None and value in empty):
        return "no effect", "at MindFormers' default"
    return ("no effect", why) if why else ("refused", "a layout setting gplan does not price")


def parent_keys(key: str) -> list[str]:
    """`a.b.c` -> [`a.b`, `a`]: the sections a flattened key sits in, innermost first."""
    parts = key.split(".")
    return [".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1)]
