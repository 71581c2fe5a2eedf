"""`gplan export --to nemo-automodel`: the plan as a NeMo AutoModel recipe YAML and the script that runs it
on every node (AutoModel's CLI module under torchrun, `torchrun … -m nemo_automodel.cli.app recipe.yaml`, the
launch line every gplan export script shares). The `distributed` section is what
`parse_distributed_section` (recipes/_dist_utils.py) reads; the batch is the step scheduler's
(global_batch_size, and local_batch_size per data-parallel rank: one micro-batch, or with pipeline stages
every micro-batch of the step, cut into pp_microbatch_size pieces). Checked by nemo_automodel's own parser
and mesh builder where it is installed (tests/engines/test_nemo_automodel.py)."""

from __future__ import annotations

import yaml

from gplan.backends.exporters import Export, ExportContext, stamp
from gplan.backends.recipes import default_nodes, script_node_variables, script_torchrun_line
from gplan.engines.nemo_automodel import HF_MODELS
from gplan.plan import Plan
from gplan.spec.targets import layers_per_stage_cut

VERSIONS = {"0.7": "NeMo AutoModel 0.7.0 (nemo_automodel recipes: parse_distributed_section, StepScheduler)"}

EXACT = (
    "a recipe YAML and the script that runs it on every node (`torchrun … -m nemo_automodel.cli.app`): FSDP2 "
    "over dp (zero 3, or 2: `reshard_after_forward` true or false), the model's dtype (`torch_dtype`: float32, or "
    "bfloat16 for full-bf16 training), the gradients' reduce dtype (and, where a plan asks for it, `defer_fsdp_grad_sync: false`), the attention backend (`attn`), the loss on 16-bit logits (`fp32_upcast`), tp with sp, cp, ep borrowed from dp·cp·tp, "
    "pipeline schedule and its virtual stages (`layers_per_stage`, rounded to a multiple of pp where they differ "
    "by a layer, as AutoModel cuts them), the batch as `global_batch_size` and "
    "`local_batch_size`, activation checkpointing on or off, torch's AdamW (its states in the model's dtype); "
    "checked by its own `parse_distributed_section`, FSDP2 mesh builder (on a fake process group of the plan's "
    "size), step scheduler and optimizer builder")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "zero 1 runs as zero 2 (noted); one checkpointing switch for every layer; the dataset is its mock dataset"
    " at the plan's sequence, the model loads its Hugging Face weights and the optimizer's hyperparameters are "
    "placeholders (noted: put your own)")
"""What it runs differently (re-priced, noted) or refuses."""
OPTIMIZER = {"_target_": "torch.optim.AdamW", "lr": 3.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}
"""The recipe's `optimizer`: torch's AdamW, whose moments follow the parameters' dtype — the states gplan prices
for AutoModel (its recipe builds `cfg.optimizer` and has no default); the hyperparameters are placeholders."""
SCHEDULE_NAMES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved_1f1b": "interleaved1f1b"}
"""gplan's schedules as PipelineConfig.pp_schedule names them."""


def export(plan: Plan, context: ExportContext) -> Export:
    name = f"automodel_{plan.model.name}.yaml"
    nnodes, per_node = default_nodes(plan)
    run = ["#!/bin/bash", stamp(plan, context.version),
           "# The same command on every node (NNODES, NODE_RANK, MASTER_ADDR set there); AutoModel's CLI entry",
           "# point run under torchrun, as `automodel RECIPE` runs it on one node.",
           *[f"# note: {n}" for n in context.notes + notes(plan)],
           "set -euo pipefail", *script_node_variables(nnodes),
           'HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)',
           script_torchrun_line(per_node, ["-m", "nemo_automodel.cli.app", f"$HERE/{name}"])]
    return Export({name: stamp(plan, context.version) + "\n" + yaml.safe_dump(recipe(plan, context), sort_keys=False),
                   "run_automodel.sh": "\n".join(run) + "\n"}, notes(plan))


EXPORTED_DISPATCHERS = {"allgather": "torch", "flex": "deepep"}
"""TrainingSpec.moe_dispatcher -> AutoModel's `model.backend.dispatcher` (its torch dispatcher is the all-gather)."""


def recipe(plan: Plan, context: ExportContext) -> dict:
    c, t = plan.parallel, plan.training
    microbatches = c.num_microbatches
    distributed: dict = {"strategy": "fsdp2", "dp_size": c.dp, "dp_replicate_size": 1, "tp_size": c.tp,
                         "cp_size": c.cp, "pp_size": c.pp, "ep_size": c.ep, "sequence_parallel": bool(c.sp),
                         "activation_checkpointing": all_recomputed(context)}
    # always stated: unset, it follows the layout (false with ep > 1 or pipeline stages; launch.reshards_after_forward);
    # zero 1 runs as zero 2 (FSDP2 has no optimizer-only sharding)
    distributed["reshard_after_forward"] = c.zero == 3
    if t.async_tp:  # torch's micro-pipelined tp: AutoModel compiles each block for it
        distributed["enable_async_tensor_parallel"] = True
    if t.grad_sync_each_microbatch:  # its default defers the reduce-scatter to a step's last micro-batch
        distributed["defer_fsdp_grad_sync"] = False
    if c.pp > 1:
        per_stage, rounding = layers_per_stage_cut(plan.model.total_layers, c.pp, c.vpp)  # the target check refuses None
        distributed["pipeline"] = {"pp_schedule": SCHEDULE_NAMES[c.schedule], "pp_microbatch_size": c.mbs,
                                   "layers_per_stage": per_stage}
        if rounding:
            distributed["pipeline"]["round_virtual_stages_to_pp_multiple"] = rounding
    distributed["mp_policy"] = {"param_dtype": "bfloat16" if t.precision == "bf16" else "float32",
                                "reduce_dtype": "bfloat16" if t.grad_reduce_in_bf16 else "float32"}
    repository = next((hf for hf, name in HF_MODELS.items() if name == plan.model.name), None)
    model = {"_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
             "pretrained_model_name_or_path": repository or f"<the Hugging Face repository of {plan.model.name}>",
             # the parameters' dtype, and so the optimizer's: its "auto" default is bfloat16 (no fp32 copy)
             "torch_dtype": "bfloat16" if t.pure_bf16 else "float32"}
    backend = {}
    if plan.model.is_moe and t.moe_dispatcher in EXPORTED_DISPATCHERS:  # the all-to-all: AutoModel's own choice
        backend["dispatcher"] = EXPORTED_DISPATCHERS[t.moe_dispatcher]
    if t.attention_kernel_run == "fa2":  # FlexAttention where the model has sinks or a window (its gpt-oss: no sdpa)
        backend["attn"] = "flex" if plan.model.attention_sinks or plan.model.sliding_window else "sdpa"
    if backend:
        model["backend"] = backend
    # its recipe builds `cfg.loss_fn` (no default either): its masked cross-entropy, which upcasts the logits to fp32
    # unless the plan priced the loss on the 16-bit ones
    loss = {"loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy",
                        **({"fp32_upcast": False} if t.bf16_loss else {})}}
    return {
        "recipe": "TrainFinetuneRecipeForNextTokenPrediction",
        "step_scheduler": {"global_batch_size": t.gbs,
                           "local_batch_size": c.mbs * microbatches if c.pp > 1 else c.mbs},
        "model": model,
        "distributed": distributed,
        "dataset": {"_target_": "nemo_automodel.components.datasets.llm.mock_iterable_dataset.MockIterableDataset",
                    "seq_len": t.seq_length, "vocab_size": plan.model.vocab_size},
        "optimizer": dict(OPTIMIZER),
        **loss,
    }


def all_recomputed(context: ExportContext) -> bool:
    """Its one switch: every layer checkpointed, or none (the split the engine runs says which)."""
    options = {c.recompute for s in context.layouts for c in s.layers}
    return options == {"full"}


def notes(plan: Plan) -> list[str]:
    found = ["the dataset is AutoModel's mock dataset at the plan's sequence length: put your own in its place, "
             "keeping seq_len; the model loads its Hugging Face weights (from_pretrained): use from_config to "
             "train from scratch",
             "the optimizer is torch's AdamW (its states in the model's dtype, as priced); its learning rate, betas "
             "and weight decay are placeholders: set yours"]
    if plan.parallel.zero == 1:
        found.append("zero 1 runs as zero 2 (FSDP2 has no optimizer-only sharding)")
    return found
