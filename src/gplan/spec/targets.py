"""What each backend and export target runs exactly as priced — capabilities as data.

`gplan search --target T` searches only plans T runs as priced; `gplan launch` refuses, before any
process starts, a plan its backend cannot run, naming the capability and the search option that
avoids it. The rules are the engines' own (cited per field) or the limits of gplan's workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, StageLayout

Recompute = Literal["per_layer", "per_stage", "uniform"]


@dataclass(frozen=True)
class Capabilities:
    name: str
    schedules: frozenset[str]
    """Pipeline schedules it runs."""
    microbatches_at_least_stages: bool
    """1F1B needs m ≥ pp (torch.distributed.pipelining's Schedule1F1B refuses fewer)."""
    cp: bool
    """Context parallelism."""
    tied_embeddings_across_stages: bool
    """A tied embedding and head on different pipeline stages (their gradients all-reduced)."""
    recompute: Recompute
    """per_layer: any mix on any stage; per_stage: one count per option per stage; uniform: every stage
    recomputes the same number of layers with the same option."""
    uneven_split: bool
    """Stages with different numbers of layers."""
    zero: frozenset[int]
    zero_with_pp: frozenset[int]
    """Optimizer/gradient/weight sharding levels allowed together with pipeline stages."""
    encoder_decoder: bool
    llama_family_only: bool = False
    """Only swiglu, RMSNorm, RoPE and an untied head (the MindSpore worker's model)."""


ALL_SCHEDULES = frozenset({"gpipe", "1f1b", "interleaved_1f1b"})
ALL_ZERO = frozenset({0, 1, 2, 3})

TARGETS: dict[str, Capabilities] = {
    # gplan's torch worker (backends/torch): cp with its own ring attention (apply_cp.py).
    "torch": Capabilities("torch", ALL_SCHEDULES, microbatches_at_least_stages=True, cp=True,
                          tied_embeddings_across_stages=True, recompute="per_layer", uneven_split=True,
                          zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False),
    # gplan's MindSpore worker (backends/mindspore): the Llama family; MindSpore's Pipeline cell runs 1F1B.
    "mindspore": Capabilities("mindspore", frozenset({"1f1b", "interleaved_1f1b"}), microbatches_at_least_stages=True,
                              cp=False, tied_embeddings_across_stages=False, recompute="per_layer", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False, llama_family_only=True),
    # Megatron-LM: one --recompute-num-layers for every stage (arguments.py, --recompute-method block).
    "megatron": Capabilities("megatron", frozenset({"1f1b", "interleaved_1f1b"}), microbatches_at_least_stages=False,
                             cp=True, tied_embeddings_across_stages=True, recompute="uniform", uneven_split=True,
                             zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False),
    # torchtitan: one activation-checkpoint policy for all layers; FSDP2 has no optimizer-only sharding,
    # so zero 1 runs as zero 2 there (the export says so).
    "torchtitan": Capabilities("torchtitan", ALL_SCHEDULES, microbatches_at_least_stages=True, cp=True,
                               tied_embeddings_across_stages=False, recompute="uniform", uneven_split=True,
                               zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False),
    # Megatron-DeepSpeed: its pipeline engine takes ZeRO ≤ 1; its partition method splits evenly.
    "deepspeed": Capabilities("deepspeed", frozenset({"1f1b"}), microbatches_at_least_stages=False, cp=False,
                              tied_embeddings_across_stages=True, recompute="uniform", uneven_split=False,
                              zero=ALL_ZERO, zero_with_pp=frozenset({0, 1}), encoder_decoder=False),
    # MindFormers: per-stage recompute counts (recompute_config lists), offsets for uneven splits.
    "mindformers": Capabilities("mindformers", frozenset({"1f1b", "interleaved_1f1b"}),
                                microbatches_at_least_stages=True, cp=False, tied_embeddings_across_stages=False,
                                recompute="per_stage", uneven_split=True, zero=ALL_ZERO, zero_with_pp=ALL_ZERO,
                                encoder_decoder=False, llama_family_only=True),
}


@dataclass(frozen=True)
class Refusal:
    capability: str
    detail: str
    avoid: str
    """The search option that avoids it."""

    def hint(self, target: str) -> str:
        """What to do: search for this target, or use the option that avoids the capability."""
        also = f" (or {self.avoid})" if self.avoid != f"--target {target}" else ""
        return f"search again with --target {target}{also}"


def default_target(hardware_kind: str) -> str:
    """The backend of the cluster's hardware: MindSpore on Ascend NPUs, torch elsewhere."""
    return "mindspore" if hardware_kind == "npu" else "torch"


def config_refusals(target: Capabilities, model: ModelSpec, config: ParallelConfig,
                    num_microbatches: int) -> list[Refusal]:
    """What `target` cannot run in a configuration, before any stage split."""
    t, c, found = target.name, config, []
    if c.pp > 1 and c.schedule not in target.schedules:
        found.append(Refusal("schedule", f"{t} runs {', '.join(sorted(target.schedules))}, not {c.schedule}",
                             f"--target {t}"))
    if c.pp > 1 and target.microbatches_at_least_stages and num_microbatches < c.pp:
        found.append(Refusal("microbatches", f"{t}'s pipeline schedule needs at least pp={c.pp} micro-batches, the "
                             f"plan has {num_microbatches}", "a larger --gbs or smaller --mbs, or --target " + t))
    if c.cp > 1 and not target.cp:
        found.append(Refusal("cp", f"{t} does not run context parallelism (cp={c.cp})", "--cp 1"))
    if c.ep > 1:
        found.append(Refusal("ep", f"{t} does not run expert parallelism here (ep={c.ep})", "--ep 1"))
    if model.tie_embeddings and c.pp > 1 and not target.tied_embeddings_across_stages:
        found.append(Refusal("tied_embeddings", f"{t} does not tie the embedding and head across pipeline stages",
                             "--pp 1, or untie the embeddings (tie_embeddings: false)"))
    if c.zero not in (target.zero_with_pp if c.pp > 1 else target.zero):
        allowed = sorted(target.zero_with_pp if c.pp > 1 else target.zero)
        found.append(Refusal("zero", f"{t} runs zero {allowed}{' with pipeline stages' if c.pp > 1 else ''}, "
                             f"not zero {c.zero}", "--zero " + ",".join(map(str, allowed))))
    if model.num_encoder_layers and not target.encoder_decoder:
        found.append(Refusal("encoder_decoder", f"{t} runs decoder-only models", "--target megatron (export)"))
    if target.llama_family_only and (model.ffn_kind, model.norm, model.position_embedding, model.tie_embeddings) != \
            ("swiglu", "rmsnorm", "rope", False):
        found.append(Refusal("model", f"{t} runs the Llama family (swiglu, RMSNorm, RoPE, untied head)",
                             "--target torch"))
    return found


def split_refusals(target: Capabilities, layouts: list[StageLayout]) -> list[Refusal]:
    """What `target` cannot run in a stage split (uneven layers, its recompute granularity)."""
    t, found = target.name, []
    sizes = [s.num_layers for s in layouts]
    if not target.uneven_split and len(set(sizes)) > 1:
        found.append(Refusal("uneven_split", f"{t} splits layers evenly; the plan has {'/'.join(map(str, sizes))}",
                             "--target " + t))
    if target.recompute == "uniform":
        mixes = {tuple(sorted((c.recompute, c.count) for c in s.layers if c.recompute != "none")) for s in layouts}
        options = {c.recompute for s in layouts for c in s.layers if c.recompute != "none"}
        if len(mixes) > 1 or len(options) > 1:
            found.append(Refusal("recompute", f"{t} recomputes the same layers on every stage with one option",
                                 "--target " + t))
    return found


def refusals(target: Capabilities, model: ModelSpec, config: ParallelConfig, num_microbatches: int,
             layouts: list[StageLayout]) -> list[Refusal]:
    return config_refusals(target, model, config, num_microbatches) + split_refusals(target, layouts)
