"""torchtitan: a config module (`gplan_torchtitan.py`) with the plan's model and stages, and a torchrun
script that selects it (`--module gplan_torchtitan --config gplan_plan`) with command-line overrides.

torchtitan builds its Llama from a config function (`config_registry`), not from command-line
dimensions, so the module builds the plan's model with torchtitan's own llama3 layer builder —
dimensions, kv heads, MLP width, vocabulary, RoPE base — and starts from the registered `llama3_8b`
trainer config for everything gplan does not plan (optimizer, data, checkpointing). It also lists
every pipeline chunk's modules (`module_fqns_per_model_part`), so uneven and interleaved splits run
exactly as planned, and sets one activation-checkpoint policy (torchtitan applies it to every block).

Mixtures of experts build with torchtitan's own MoE model code: a Qwen3-MoE shape (`expert_family`
qwen3_moe) with its qwen3 layer builder, a DeepSeek-V3 shape with its deepseek_v3 builder (latent
attention, shared experts, leading dense layers), each under its registered model spec (so torchtitan's
MoE parallelize and load-balancing hooks apply). ep maps to `expert_parallel_degree`; torchtitan's experts
are tp-sharded without ep and ep-sharded with it (`Capabilities.expert_tp` "follows_tp").

Batch: torchtitan runs `global / (local × dp)` gradient-accumulation steps of `local` sequences, and
with pipeline stages splits `local` into micro-batches of `pipeline_parallel_microbatch_size`. So
without pp, local = mbs (m accumulation steps); with pp, local = m·mbs in micro-batches of mbs.
dp maps to FSDP sharding (`data_parallel_shard_degree`) for zero ≥ 1, weights resharded after the
forward only for zero 3, and to replication (`data_parallel_replicate_degree`, DDP) for zero 0.
"""

from __future__ import annotations

from gplan.backends.exporters import Export, ExportContext, flag_lines, recompute_counts, stamp
from gplan.backends.recipes import default_nodes, script_node_variables, script_torchrun_line
from gplan.errors import InputError
from gplan.plan import Plan
from gplan.spec.parallel import StageLayout, chunk_sizes
from gplan.spec.targets import as_engine_runs, expert_family
from gplan.spec.training import TrainingSpec

VERSIONS = {
    "0.3": "torchtitan 0.3.0 (torchtitan.train, ConfigManager; checked by its own parser)",
    "main": "torchtitan main after its token-count batch options (pull requests 4121 and 4326, Aug 2026); not "
            "checked by torchtitan's parser here (only 0.3.0 installs)",
}

EXACT = (
    "the model built by torchtitan's own layer builders (llama3; its qwen3, deepseek_v3 and gpt_oss MoE models) "
    "with the plan's shape (parameters counted equal in the tests); FSDP/HSDP/DDP degrees, tp/sp, cp, pp schedule; every pipeline chunk's modules "
    "(`module_fqns_per_model_part`), so uneven and interleaved splits are exact; the batch as accumulation "
    "steps of mbs (with pp: m·mbs split into micro-batches of mbs); the loss in the plan's chunks (its trainer's "
    "ChunkedLossWrapper, or the whole CrossEntropyLoss at one); CUDA graphs off with pp")
"""What its files run exactly as the plan priced it (docs/exporting.md's table, from bench/engine_tables.py)."""
APPROXIMATED = (
    "one activation-checkpoint policy for every layer (full when any layer recomputes fully; `SelectiveAC`, "
    "its per-op policy, where the plan's selective layers recompute the module `op`; a selective plan "
    "recomputing the attention core, which torchtitan lacks, is re-priced as full); zero 1/2 run as FSDP "
    "without resharding (noted); the Llama family and those MoE shapes only (a gpt-oss whose attention its "
    "builder does not make is refused); `main` option names come from torchtitan pull requests "
    "4121/4326 and are not checked by its parser here")
"""What it runs differently (re-priced, noted) or refuses."""

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
"""gplan schedule -> torch.distributed.pipelining's schedule name (what torchtitan takes)."""

COMM_BACKENDS = {"alltoall": "standard", "flex": "deepep", "symmetric_memory": "minimal_async_ep"}
"""TrainingSpec.moe_dispatcher -> torchtitan's `moe_comm_backend` (0.3.0 models/common/config_utils.py
make_token_dispatcher_config: "standard" is its all-to-all, "deepep" DeepEP's kernels, "minimal_async_ep" its
symmetric-memory exchange); the flex dispatcher with a capacity is HybridEP's non-blocking one ("hybridep")."""


def disables_cuda_graphs(plan: Plan) -> bool:
    """Whether the export turns torchtitan 0.3's CUDA graphs off: where the plan is priced without them (as torchtitan
    runs it: `as_engine_runs`) and they would run — with pipeline stages, or an MoE model's host-waiting layers."""
    return (as_engine_runs(plan.training, "torchtitan", plan.parallel).cuda_graphs == "none"
            and (plan.parallel.pp > 1 or plan.model.is_moe))


def comm_constants(training: TrainingSpec) -> str:
    """The config module's token exchange: its `moe_comm_backend` and HybridEP's non-blocking capacity (None:
    blocking, or another backend, which ignores it)."""
    capacity = training.moe_dispatch_capacity
    backend = "hybridep" if capacity is not None else COMM_BACKENDS[training.moe_dispatcher]
    return f"MOE_COMM_BACKEND = {backend!r}\nNON_BLOCKING_CAPACITY_FACTOR = {capacity!r}\n"

CONFIG_MODULE = "gplan_torchtitan"
CONFIG_FUNCTION_NAME = "gplan_plan"


GPT_OSS_BUILDS = {"num_attention_heads": 64, "num_kv_heads": 8, "head_dim": 64, "sliding_window": 128,
                  "full_attention_every": 2, "glu_clamp": 7.0, "bias": True}
"""What torchtitan 0.3.0's gpt_oss builder makes whatever the flavor (models/gpt_oss/__init__.py:
`_make_gptoss_attn_config`'s 64 heads of 64 and 8 kv heads, a 128-token window on the even layers,
biases throughout; moe.py: `GptOssGroupedExperts.Config.swiglu_limit` 7.0)."""


def export(plan: Plan, context: ExportContext) -> Export:
    if not plan.model.is_moe and plan.model.head_dim:
        raise InputError("torchtitan's llama3 layers derive the head width from dim / n_heads; the model sets "
                         f"head_dim {plan.model.head_dim}", hint="export to megatron")
    if plan.model.is_moe and expert_family(plan.model) == "gpt_oss":
        differs = {k: getattr(plan.model, k) for k, v in GPT_OSS_BUILDS.items() if getattr(plan.model, k) != v}
        if differs:
            raise InputError(f"torchtitan's gpt_oss builder makes {GPT_OSS_BUILDS}; {plan.model.name} has {differs}",
                             hint="export to megatron")
    main = context.version.startswith("torchtitan main")
    args, notes = overrides(plan, main)
    nnodes, per_node = default_nodes(plan)
    lines = [
        "#!/bin/bash",
        stamp(plan, context.version),
        "# Run from a torchtitan install, the same command on every node; gplan_torchtitan.py (beside this",
        "# script) holds the model and the pipeline chunks.",
        *[f"# note: {n}" for n in context.notes + notes],
        "set -euo pipefail",
        *script_node_variables(nnodes),
        'HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)',
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
        "OVERRIDES=(",
        *[f"  {line}" for line in flag_lines(args)],
        ")",
        script_torchrun_line(per_node, ["-m", "torchtitan.train", "--module", CONFIG_MODULE, "--config",
                                        CONFIG_FUNCTION_NAME, "${OVERRIDES[@]}", "$@"]),
    ]
    files = {"torchtitan_train.sh": "\n".join(lines) + "\n",
             f"{CONFIG_MODULE}.py": config_module(plan, context, ac_policy(context.layouts))}
    return Export(files, notes)




def batch_args(plan: Plan, main: bool) -> list[str]:
    """The batch in sequences (0.3) or in tokens (main): see the module docstring."""
    c, t = plan.parallel, plan.training
    local = c.mbs * (c.num_microbatches if c.pp > 1 else 1)
    if main:
        seq = t.seq_length
        return ["--training.max_context_length", str(seq), "--training.num_tokens_per_train_step", str(t.gbs * seq),
                "--training.num_tokens_per_dp_rank", str(local * seq),
                "--training.num_tokens_per_microbatch_per_dp_rank", str(c.mbs * seq)]
    args = ["--training.local_batch_size", str(local), "--training.global_batch_size", str(t.gbs),
            "--training.seq_len", str(t.seq_length)]
    return args + (["--parallelism.pipeline_parallel_microbatch_size", str(c.mbs)] if c.pp > 1 else [])


def overrides(plan: Plan, main: bool = False) -> tuple[list[str], list[str]]:
    c, t = plan.parallel, plan.training
    notes: list[str] = []
    replicate, shard = (c.dp, 1) if c.zero == 0 else (1, c.dp)
    args = batch_args(plan, main) + [
        "--training.steps", "100",
        "--training.mixed_precision_param", "float32" if t.precision == "fp32" else "bfloat16",
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.fsdp_reshard_after_forward", "always" if c.zero == 3 else "never",
        "--parallelism.tensor_parallel_degree", str(c.tp),
        "--parallelism.enable_sequence_parallel" if c.sp else "--parallelism.no-enable_sequence_parallel",
        "--parallelism.context_parallel_degree", str(c.cp),
        "--parallelism.pipeline_parallel_degree", str(c.pp),
    ]
    if t.optimizer_in_backward:
        raise InputError("torchtitan 0.3.0 has no optimizer in the backward (≤ 0.2's optimizer.early_step_in_backward "
                         "is gone); the plan frees each gradient at its step", hint="plan without --optimizer-in-backward, "
                         "or keep your torchtitan ≤ 0.2 TOML and rewrite it with gplan search --from TOML --out-launch")
    if t.grad_reduce_in_bf16 and not main:
        raise InputError("torchtitan 0.3.0 reduces FSDP's gradients in float32 only (its TrainingConfig's "
                         "mixed_precision_reduce takes \"float32\"); the plan reduces them in bf16",
                         hint="export for torchtitan main (--target-version main), or plan without --grad-reduce-in-bf16")
    if t.grad_reduce_in_bf16:
        args += ["--training.mixed_precision_reduce", "bfloat16"]
    if t.pure_bf16:  # full-bf16 training (0.3.0's TrainingConfig.dtype)
        args += ["--training.dtype", "bfloat16"]
    if t.fsdp_offload:  # FSDP2's CPUOffloadPolicy (apply_fsdp)
        args += ["--training.enable_cpu_offload"]
    if t.async_tp:  # torch's micro-pipelined tp runs in a compiled model only (CompileConfig.__post_init__)
        args += ["--compile.enable", "--compile.components", "model,loss" if t.compiled_loss else "model",
                 "--compile.enable_async_tensor_parallel"]  # ConfigManager's list[str]: comma-separated
        notes.append("async tp compiles the model (torch.compile), whose other speed-ups gplan does not price")
    elif t.compiled_loss:  # the loss alone: compiling the model is not what the plan priced
        args += ["--compile.enable", "--compile.components", "loss"]
    if t.precision == "fp8":
        notes.append("torchtitan 0.3's float8 converter scales rowwise (its only float8 recipes): the plan's fp8 "
                     "(tensorwise) runs as fp8-rowwise here")
    if plan.model.is_moe:
        args += ["--parallelism.expert_parallel_degree", str(c.ep)]
        if expert_family(plan.model) == "gpt_oss":  # its builder's router, with its 20b flavor's YaRN RoPE
            notes.append("the router and RoPE are torchtitan's gpt_oss builder's (softmax top-k with biases, its 20b "
                         "flavor's YaRN scaling): set them in gplan_torchtitan.py if your run needs others")
        else:
            notes.append("routing details gplan does not model take torchtitan's defaults (no expert groups, route "
                         "scale 1, plain RoPE without YaRN): set them in gplan_torchtitan.py if your run needs them")
    if t.precision == "fp16":
        raise InputError("torchtitan trains in bf16 or fp32, not fp16", hint="plan with --precision bf16")
    if c.pp > 1:
        args += ["--parallelism.pipeline_parallel_schedule", SCHEDULES[c.schedule]]
    if disables_cuda_graphs(plan):
        # torchtitan 0.3 captures CUDA graphs by default and refuses them (Trainer.Config._validate_cuda_graphs)
        # with pipeline stages, and with expert parallel unless its token exchange never syncs with the host
        # (neither its all-to-all nor DeepEP does; MinimalAsyncEP and HybridEP's non-blocking capacity do not);
        # an MoE plan priced without them (the host time of its layers,
        # cost_models.experts.host_time_s) runs without them; one priced with them keeps 0.3's default
        args += ["--training.disable_cuda_graphs"]
    if c.zero in (1, 2) and c.dp > 1:
        notes.append(f"zero {c.zero} runs as FSDP without resharding after the forward (weights stay gathered "
                     "for the backward; optimizer state and gradients sharded" +
                     ("; with pipeline stages each gradient is held whole until the stage's last backward of a "
                      "run, as torch's pipelining reduces it, and priced so)" if c.pp > 1 else ")"))
    return args, notes


def ac_policy(layouts: list[StageLayout]) -> str:
    """torchtitan applies one policy to every block; the split arrives as torchtitan runs it (`runs_as`), so a
    selective layer left in it is one recomputing the per-op policy (`SelectiveAC`)."""
    if any(recompute_counts(layouts, "full")):
        return "full"
    return "selective" if any(recompute_counts(layouts, "selective")) else "none"


def module_fqns(plan: Plan, layouts: list[StageLayout]) -> list[list[str]]:
    """Module names of every pipeline chunk in virtual-stage order (chunk s on pp rank s mod pp, as
    torchtitan's looped schedules place them), torchtitan's naming (tok_embeddings, layers.i, norm,
    lm_head)."""
    c = plan.parallel
    sizes = [stage.num_layers for stage in layouts]
    # virtual stage j is chunk j // pp of rank j % pp, its layers following stage j − 1's: each rank's
    # layers dealt over its chunks as Megatron's layout deals them (the plan's split, even or not)
    chunks = [chunk_sizes(n, c.vpp, first=r == 0, last=r == c.pp - 1) for r, n in enumerate(sizes)]
    bounds, start = [], 0
    for j in range(c.pp * c.vpp):
        count = chunks[j % c.pp][j // c.pp]
        bounds.append((start, start + count))
        start += count
    last = len(bounds) - 1
    return [(["tok_embeddings"] if i == 0 else []) + [f"layers.{j}" for j in range(a, b)]
            + (["norm", "lm_head"] if i == last else []) for i, (a, b) in enumerate(bounds)]


def model_shape(plan: Plan) -> dict:
    m = plan.model
    return {"dim": m.hidden_size, "n_layers": m.num_layers, "n_heads": m.num_attention_heads,
            "n_kv_heads": m.kv_heads, "hidden_dim": m.ffn_size, "vocab_size": m.vocab_size,
            "rope_theta": m.rope_theta, "max_seq_len": max(plan.training.seq_length, m.seq_length),
            "tie_embeddings": m.tie_embeddings}


MODULE_HEAD = '''{stamp}
"""The plan's model and pipeline chunks as a torchtitan config function: `--module {module} --config
{function}`. {built}"""

import dataclasses

from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
{imports}
SHAPE = {shape}
MODULE_FQNS_PER_MODEL_PART = {fqns}
ACTIVATION_CHECKPOINT = {ac!r}
LOSS_CHUNKS = {chunks}
DISABLE_CUDA_GRAPHS = {graphs}
{comm}
'''
"""What every family's config module starts with: the stamp, what it builds, its constants."""

LLAMA3_BUILT = ("Built from torchtitan's public config classes (its llama3 block, GQA and FFN config helpers),\n"
                "initialised as its llama3 builder does, so the model is torchtitan's Llama with the plan's shape.")
LLAMA3_IMPORTS = '''from functools import partial

import torch.nn as nn
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.common.param_init import depth_scaled_std
from torchtitan.models.llama3 import Llama3Model, model_registry
from torchtitan.models.llama3.config_registry import llama3_8b
from torchtitan.models.llama3.model import Llama3TransformerBlock
'''
LLAMA3_MODEL = '''

def init(std: float) -> dict:
    """Truncated-normal weights and zero biases: torchtitan's llama3 initialisation."""
    return {"weight": partial(nn.init.trunc_normal_, std=std), "bias": nn.init.zeros_}


def layer(layer_id: int, rope) -> Llama3TransformerBlock.Config:
    s = SHAPE
    dim, depth = s["dim"], init(depth_scaled_std(0.02, layer_id))  # outputs scaled by depth, as torchtitan's
    return Llama3TransformerBlock.Config(
        attention_norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        attention=make_gqa_config(dim=dim, n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"], wqkv_param_init=init(0.02),
                                  wo_param_init=depth, inner_attention=get_attention_config("flex"), fuse_qkv=True,
                                  rope=rope),
        feed_forward=make_ffn_config(dim=dim, hidden_dim=s["hidden_dim"], w1_param_init=init(0.02),
                                     w2w3_param_init=depth),
    )


def model_config() -> Llama3Model.Config:
    s = SHAPE
    dim, vocab = s["dim"], s["vocab_size"]
    rope = ComplexRoPE.Config(dim=dim // s["n_heads"], max_seq_len=s["max_seq_len"], theta=s["rope_theta"])
    output_std = dim ** -0.5
    return Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=s["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=dim, param_init={"weight": nn.init.ones_}),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init={
            "weight": partial(nn.init.trunc_normal_, std=output_std, a=-3 * output_std, b=3 * output_std),
            "bias": nn.init.zeros_}),
        layers=[layer(i, rope) for i in range(s["n_layers"])],
    )

'''

PINNED_GUARD = '''
import torchtitan

# The {family} layers are built with torchtitan's own builder, which it does not export (a name with a
# leading underscore): this module is written for torchtitan {pinned} and refuses any other version.
if torchtitan.__version__ != "{pinned}":
    raise ImportError(f"{module}.py builds {family} layers with torchtitan {pinned}'s private builder; this is "
                      f"torchtitan {{torchtitan.__version__}}: pip install torchtitan=={pinned}, or export again")
'''
"""The version check of a family whose layer builder is private in torchtitan."""

PINNED = "0.3.0"
"""The torchtitan release whose private MoE layer builders the qwen3_moe, deepseek_v3 and gpt_oss modules call."""

QWEN3_MOE_BUILT = "Built with torchtitan's own Qwen3 MoE layer builder under its qwen3 model spec."
QWEN3_MOE_IMPORTS = '''from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.qwen3 import (_EMBEDDING_INIT, _LINEAR_INIT, Qwen3Model, _build_qwen3_moe_layers, _qwen3_norm,
                                     model_registry)
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b
'''
QWEN3_MOE_MODEL = '''
def model_config() -> Qwen3Model.Config:
    s = SHAPE
    dim, vocab, head_dim = s["dim"], s["vocab_size"], s["head_dim"]
    rope = CosSinRoPE.Config(dim=head_dim, max_seq_len=s["max_seq_len"], theta=s["rope_theta"])
    return Qwen3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=s["tie_embeddings"], norm=_qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),
        layers=_build_qwen3_moe_layers(n_layers=s["n_layers"], dim=dim, n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"],
                                       head_dim=head_dim, moe_hidden_dim=s["moe_hidden_dim"],
                                       num_experts=s["num_experts"], top_k=s["top_k"], attn_backend="flex",
                                       moe_comm_backend=MOE_COMM_BACKEND,
                                       non_blocking_capacity_factor=NON_BLOCKING_CAPACITY_FACTOR, rope=rope),
    )

'''

DEEPSEEK_V3_BUILT = "Built with torchtitan's own DeepSeek-V3 layer builder (latent attention, shared and routed\nexperts, leading dense layers) under its deepseek_v3 model spec."
DEEPSEEK_V3_IMPORTS = '''from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.deepseek_v3 import (_EMBEDDING_INIT, _NORM_INIT, DeepSeekV3Model, _build_dsv3_layers,
                                           _output_linear_init, model_registry)
from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_671b
'''
DEEPSEEK_V3_MODEL = '''
def model_config() -> DeepSeekV3Model.Config:
    s = SHAPE
    dim, vocab = s["dim"], s["vocab_size"]
    rope = ComplexRoPE.Config(dim=s["qk_rope_head_dim"], max_seq_len=s["max_seq_len"], theta=s["rope_theta"])
    layers = _build_dsv3_layers(
        n_layers=s["n_layers"], n_dense_layers=s["n_dense_layers"], dim=dim, n_heads=s["n_heads"],
        q_lora_rank=s["q_lora_rank"], kv_lora_rank=s["kv_lora_rank"], qk_nope_head_dim=s["qk_nope_head_dim"],
        qk_rope_head_dim=s["qk_rope_head_dim"], v_head_dim=s["v_head_dim"], mscale=1.0,
        dense_hidden_dim=s["dense_hidden_dim"], moe_hidden_dim=s["moe_hidden_dim"], num_experts=s["num_experts"],
        num_shared_experts=s["num_shared_experts"], router_top_k=s["top_k"], router_score_func=s["router"],
        router_route_norm=s["router"] == "sigmoid", attn_backend="flex", moe_comm_backend=MOE_COMM_BACKEND,
        non_blocking_capacity_factor=NON_BLOCKING_CAPACITY_FACTOR, rope=rope)
    return DeepSeekV3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying=s["tie_embeddings"],
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=layers,
    )

'''

GPT_OSS_BUILT = ("Built with torchtitan's own gpt-oss layer builder (a 128-token window on the even layers, a sink\n"
                 "per head, biases, the clamped gated unit) under its gpt_oss model spec, with its 20b flavor's YaRN RoPE.")
GPT_OSS_IMPORTS = '''from torchtitan.models.common import Embedding, Linear, RMSNorm
from torchtitan.models.gpt_oss import (_EMBEDDING_INIT, _NORM_INIT, GptOssModel, _build_gptoss_layers, _output_linear_init,
                                       gptoss_configs, model_registry)
from torchtitan.models.gpt_oss.config_registry import gpt_oss_20b
'''
GPT_OSS_MODEL = '''
def model_config() -> GptOssModel.Config:
    s = SHAPE
    dim, vocab = s["dim"], s["vocab_size"]
    yarn = gptoss_configs["20b"](moe_comm_backend=MOE_COMM_BACKEND).layers[0].attention.rope  # its scaled RoPE
    rope = dataclasses.replace(yarn, theta=s["rope_theta"], max_seq_len=s["max_seq_len"])
    return GptOssModel.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_output_linear_init(dim)),
        layers=_build_gptoss_layers(fuse_qkv=True, dim=dim, n_layers=s["n_layers"], hidden_dim=s["moe_hidden_dim"],
                                    num_experts=s["num_experts"], top_k=s["top_k"], load_balance_coeff=1e-3,
                                    moe_comm_backend=MOE_COMM_BACKEND,
                                    non_blocking_capacity_factor=NON_BLOCKING_CAPACITY_FACTOR, rope=rope),
    )

'''


CONFIG_FUNCTION = '''

def {function}():
    config = {trainer}()
    model = model_config()
    for converter in converters():  # as model_registry(converters=...) applies them
        model = converter.build().convert(model)
    config.model_spec = dataclasses.replace(model_registry({flavor}), flavor="gplan", model=model)
    config.loss.loss_fn.global_vocab_size = SHAPE["vocab_size"]
    if LOSS_CHUNKS > 1:  # the trainer's ChunkedLossWrapper, at the plan's chunks
        config.loss.num_chunks = LOSS_CHUNKS
    else:  # the loss over the whole sequence, as the plan priced it
        config.loss = config.loss.loss_fn
    if DISABLE_CUDA_GRAPHS is not None:  # as priced, whatever the family's registered trainer config says
        config.training.disable_cuda_graphs = DISABLE_CUDA_GRAPHS
    policy = {{"full": FullAC, "selective": SelectiveAC}}.get(ACTIVATION_CHECKPOINT)
    config.activation_checkpoint = policy.Config() if policy else None
    if MODULE_FQNS_PER_MODEL_PART:
        config.parallelism.module_fqns_per_model_part = MODULE_FQNS_PER_MODEL_PART
    return config
'''
"""Every family's config function: torchtitan's registered trainer config of that family (optimizer,
data, checkpointing), its model spec (parallelize and hooks) carrying the plan's model."""


def expert_shape(plan: Plan) -> dict:
    """The MoE fields torchtitan's builders take, beside the dense shape."""
    m = plan.model
    shape = {**model_shape(plan), "moe_hidden_dim": m.expert_ffn_size, "num_experts": m.num_experts, "top_k": m.top_k}
    if expert_family(m) == "qwen3_moe":
        return {**shape, "head_dim": m.kv_channels}
    if expert_family(m) == "gpt_oss":  # its builder fixes the attention (GPT_OSS_BUILDS)
        return shape
    return {**shape, "n_dense_layers": m.first_dense_layers, "dense_hidden_dim": m.ffn_size,
            "num_shared_experts": m.num_shared_experts, "router": m.router, "q_lora_rank": m.q_lora_rank or 0,
            "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.kv_channels, "qk_rope_head_dim": m.qk_rope_head_dim,
            "v_head_dim": m.v_head_dim or m.kv_channels}


CONVERTERS = {
    "fp8": ("Float8LinearConverter", 'Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])',
            "Float8GroupedExpertsConverter"),
    "fp8-rowwise": ("Float8LinearConverter",
                    'Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])',
                    "Float8GroupedExpertsConverter"),
    "mxfp8": ("MXFP8LinearConverter", 'MXFP8LinearConverter.Config(fqns=["layers."])', "MXFP8GroupedExpertsConverter"),
}
"""The plan's low-precision recipe as torchtitan's own converters (0.3.0: components/quantization): (the linear
converter, its config, the grouped-experts converter a mixture of experts adds). The layers' linear projections
converted, the output head (`lm_head`) kept in BF16 as the cost model prices it; the routed experts' grouped GEMMs
in the recipe, as it prices them. torchtitan 0.3's float8 recipes are rowwise only (`recipe_name: rowwise |
rowwise_with_gw_hp`); a tensorwise `fp8` plan is refused before export (spec.targets)."""


def converters_text(plan: Plan) -> str:
    """The module's `converters()`: the recipe's converter, or none."""
    found = CONVERTERS.get(plan.training.precision)
    if found is None:
        return "\n\n\ndef converters() -> list:\n    return []\n"
    linear, config, grouped = found
    names, configs = [linear], [config]
    if plan.model.is_moe:  # the routed experts' grouped GEMMs in the recipe too, as priced
        names, configs = names + [grouped], configs + [f"{grouped}.Config()"]
    return (f"\n\n\nfrom torchtitan.components.quantization import {', '.join(names)}\n\n\ndef converters() -> list:\n"
            f"    \"\"\"The plan's {plan.training.precision} recipe: torchtitan checks the GPU when it builds it.\"\"\"\n"
            f"    return [{', '.join(configs)}]\n")


def config_module(plan: Plan, context: ExportContext, ac: str) -> str:
    fqns = module_fqns(plan, context.layouts) if plan.parallel.pp > 1 else None
    # a MoE plan reaches here only in a family torchtitan builds (its capability, checked before export)
    family, shape = (expert_family(plan.model), expert_shape(plan)) if plan.model.is_moe else ("llama3", model_shape(plan))
    built, imports, model, trainer, flavor = TEMPLATES[family]
    if family != "llama3":
        imports = PINNED_GUARD.format(family=family, pinned=PINNED, module=CONFIG_MODULE) + imports
    head = MODULE_HEAD.format(stamp=stamp(plan, context.version), module=CONFIG_MODULE, function=CONFIG_FUNCTION_NAME,
                              built=built, imports=imports, shape=repr(shape), fqns=repr(fqns), ac=ac,
                              # a plan priced for another engine runs torchtitan's own chunks, as it is re-priced
                              chunks=as_engine_runs(plan.training, "torchtitan").loss_chunks_run,
                              comm=comm_constants(plan.training) if plan.model.is_moe else "",
                              # an MoE plan's graphs as priced (torchtitan's deepseek_v3_671b trainer turns them off);
                              # a dense plan's as its trainer config leaves them, unless the script turns them off
                              graphs=disables_cuda_graphs(plan) if plan.model.is_moe else None)
    return (head + model.rstrip("\n") + converters_text(plan)
            + CONFIG_FUNCTION.format(function=CONFIG_FUNCTION_NAME, trainer=trainer, flavor=repr(flavor)))


TEMPLATES = {"llama3": (LLAMA3_BUILT, LLAMA3_IMPORTS, LLAMA3_MODEL, "llama3_8b", "8B"),
             "qwen3_moe": (QWEN3_MOE_BUILT, QWEN3_MOE_IMPORTS, QWEN3_MOE_MODEL, "qwen3_30b_a3b", "30B-A3B"),
             "deepseek_v3": (DEEPSEEK_V3_BUILT, DEEPSEEK_V3_IMPORTS, DEEPSEEK_V3_MODEL, "deepseek_v3_671b", "671B"),
             "gpt_oss": (GPT_OSS_BUILT, GPT_OSS_IMPORTS, GPT_OSS_MODEL, "gpt_oss_20b", "20b")}
"""Family -> (what it builds, its imports, its model_config(), torchtitan trainer config, registry flavor)."""


def layout_values(plan: Plan, layouts: list[StageLayout]) -> dict[str, object]:
    """The plan's layout as torchtitan job-config values (`section.key` -> value), the ones its export's
    overrides set and the activation-checkpoint mode: what `gplan search --from … --out-launch` writes into a
    user's TOML or override script. A split of unequal stages lives in a config module (its chunks'
    modules), not in a job config: refused here, with the export as the way to run it."""
    sizes = [s.num_layers for s in layouts]
    if plan.parallel.pp > 1 and len(set(sizes)) > 1:
        raise InputError(f"the best plan splits the stages unevenly ({'/'.join(map(str, sizes))}), which a torchtitan "
                         "job config cannot say (its chunks' modules are listed in a config module)",
                         hint="gplan export PLAN --to torchtitan writes the module; or search with --target torchtitan "
                              "and an even --pp")
    args, _ = overrides(plan)
    values: dict[str, object] = {}
    for i, token in enumerate(args):
        if not token.startswith("--"):
            continue
        key = token[2:]
        following = args[i + 1] if i + 1 < len(args) else "--"
        if ".no-" in key:
            values[key.replace(".no-", ".")] = False
        elif following.startswith("--"):
            values[key] = True
        else:
            values[key] = int(following) if following.lstrip("-").isdigit() else following
    values.pop("training.steps", None)  # the schedule is the user's
    values["activation_checkpoint.mode"] = ac_policy(layouts)
    if values["activation_checkpoint.mode"] == "selective":  # the per-op policy; a job config's default is "2"
        values["activation_checkpoint.selective_ac_option"] = "op"
    return values
