"""What an engine is (spec.engines): its capabilities, how it keeps memory, what hands a plan to it.

The fields are data, each with its source; the rules that read them live with their users
(spec.targets: what an engine refuses; cost_models.memory: what it costs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Recompute = Literal["per_layer", "per_stage", "block", "every_layer"]
ExpertTp = Literal["none", "etp", "etp1", "follows_tp", "any"]


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
    """per_layer: any mix on any stage; per_stage: one count per option per stage (MindFormers' lists);
    block: Megatron's `--recompute-method block` — the first N layers of every model chunk recompute
    fully, or every layer selectively; every_layer: one policy for all layers (torchtitan)."""
    uneven_split: bool
    """Stages with different numbers of layers."""
    zero: frozenset[int]
    zero_with_pp: frozenset[int]
    """Optimizer/gradient/weight sharding levels allowed together with pipeline stages."""
    encoder_decoder: bool
    llama_family_only: bool = False
    """Only swiglu, RMSNorm and RoPE (the MindSpore worker's and torchtitan's llama3 model)."""
    tied_embeddings: bool = False
    """With llama_family_only: whether its model may tie the head to the embedding (torchtitan's
    `enable_weight_tying`)."""
    precisions: frozenset[str] = frozenset({"bf16", "fp16", "fp32"})
    """Training precisions it runs (FP8 recipes need Transformer Engine or torchao's kernels)."""
    low_precision_experts: bool = False
    """Whether its routed experts' grouped GEMMs run the low-precision recipe too (Transformer Engine's
    grouped FP8 GEMMs in Megatron-core); where not, it refuses an FP8 plan with experts rather than train
    them in BF16 under a price that assumed FP8."""
    mtp: bool = False
    """Multi-token prediction depths on the last stage (Megatron's `--mtp-num-layers`, MindFormers'
    `num_nextn_predict_layers`); the others build no MTP module."""
    low_precision_tp: bool = True
    """Whether its low-precision layers run sharded by tensor parallelism (torchao's float8 linear
    layers take DTensor weights; its MXFP8Linear does not, so gplan's worker runs MXFP8 at tp = 1)."""
    sliding_window: bool = False
    """Sliding-window attention (Megatron's --window-size, with a full layer every N:
    --window-attn-skip-freq); gplan's workers run full attention."""
    attention_sinks: bool = False
    """A learned softmax sink per head (Megatron's --softmax-type learnable, for gpt-oss)."""
    clamped_glu: bool = False
    """gpt-oss's clamped gated unit (Megatron's --quick-geglu --glu-linear-offset 1.0
    --activation-func-clamp-value)."""
    selective: bool = True
    """Whether it recomputes the attention core alone (Megatron's selective recompute, the default module
    set); torchtitan's selective AC is per-operator (`op`), not that, so a plan recomputing the attention
    core runs fully there (`spec.targets.runs_selective`)."""
    recompute_modules: frozenset[str] = frozenset({"core_attn"})
    """The modules its selective recompute can name (spec.parallel.RECOMPUTE_MODULES): Megatron-core's
    `--recompute-modules` every one; torchtitan its per-operator policy `op`; the others the attention core
    alone, or nothing selectively."""
    experts: bool = False
    """Mixture-of-experts layers and ep (Megatron-core's MoE layer; gplan's torch worker's MoE, with the
    limits below); the other exports and the MindSpore worker build dense models today."""
    latent_attention: bool = False
    """Multi-head latent attention (Megatron-core's MLA; the torch worker's at tp = cp = 1)."""
    latent_attention_split: bool = False
    """MLA with tp or cp > 1."""
    expert_tp: ExpertTp = "none"
    """How experts meet tensor parallelism. none: tp = etp = 1; etp: tp = 1, etp a free degree (the torch
    worker: its etp ranks gather their tokens, backends/torch/moe.py); etp1: any tp, experts never
    tp-sharded (MindFormers: its grouped experts keep the whole width and ep folds into dp·tp,
    `parallel_core/training_graph/transformer/moe/ffn.py`); follows_tp: tp-sharded at ep 1 and
    ep-sharded alone with ep, so etp = tp at ep 1, else 1 (torchtitan 0.3's
    `models/common/moe_sharding.py`, `_routed_experts_sharding_configs`); any: etp a free degree
    (Megatron's --expert-tensor-parallel-size)."""
    expert_zero: frozenset[int] = frozenset({0, 1})
    """Optimizer sharding with experts (the worker: 0, its experts outside FSDP)."""
    ep_within_fsdp: bool = False
    """The ep group folds into the FSDP-sharded, cp and tp ranks only (torchtitan's `ParallelDims`:
    efsdp = dp_shard·cp·tp/ep, dp_replicate outside it); zero 0 replicates dp, so ep must divide cp·tp."""
    experts_with_pp: bool = True
    """MoE layers inside pipeline stages (Megatron-DeepSpeed's MoE examples: "we don't support PP for
    MoE", examples_deepspeed/MoE/ds_pretrain_gpt_*_MoE*.sh)."""
    token_dropping: bool = False
    """Expert capacity (a model's capacity_factor: tokens over it dropped); the others run dropless."""
    expert_families: frozenset[str] | None = None
    """The mixture-of-experts shapes its model code builds (`expert_family`); None: any."""
    family_features: frozenset[str] = frozenset()
    """Expert families it builds with their own attention and gated unit — sliding window, sinks, clamped unit,
    biases — though its other models have none of them (`sliding_window`, `attention_sinks`, `clamped_glu` and
    `llama_family_only` say what the rest may have): torchtitan's gpt_oss model."""
    interleaved_by_layers_per_stage: bool = False
    """Its interleaved chunks are cut from one layers-per-stage count n: ceil(L / n) virtual stages, rounded down or
    up to a multiple of pp, the first L mod stages one layer longer (NeMo AutoModel's calculate_virtual_stages and
    generate_hf_model_fqn_per_model_part) — so every rank holds an even share of L, and only the pp·vpp a count
    n reaches run (`spec.targets.layers_per_stage_cut`)."""
    uneven_interleaved: bool = False
    """Interleaved chunks of different sizes (Megatron's `--pipeline-model-parallel-layout`), so that
    pp·vpp need not divide the layers."""
    tp_comm_overlap: frozenset[str] = frozenset()
    """Precisions at which it overlaps sequence parallelism's all-gathers and reduce-scatters with the
    GEMMs beside them (Megatron-LM's `--tp-comm-overlap`: Transformer Engine's userbuffers, inside an
    NVLink domain; `overlaps_tp_comm`). Megatron-Bridge's performance recipes run it wherever tp > 1
    except NVFP4 (`scripts/performance/configs/llama/llama3_llm_pretrain.py`: `tp_comm_overlap = False
    if precision == "nvfp4"`)."""
    no_param_gather_overlap: frozenset[str] = frozenset()
    """Precisions at which the distributed optimizer's parameter all-gather is not overlapped with the
    next forward (Megatron-Bridge turns `overlap_param_gather` off for MXFP8 — "keeping this enabled
    causes NaN grad norm", the same file — so gplan's export does too)."""
    sharded_dp_overlaps: bool = False
    """Its sharded data parallel overlaps the gradient reduction (zero 2) and the parameter gather too (zero 3)
    whatever the run's overlap switches say (Megatron-LM's validate_args turns --overlap-grad-reduce on for
    Megatron-FSDP's optim_grads, and --overlap-param-gather too for optim_grads_params: `spec.targets.dp_overlaps`)."""
    grad_reduce_in_bf16: bool = False
    """Main gradients kept and reduced in 16 bits (Megatron-LM's --grad-reduce-in-bf16)."""
    pure_bf16: bool = False
    """Parameters, gradients and optimizer states in bf16 without an fp32 master copy (torchtitan's
    `training.dtype = "bfloat16"`)."""
    legacy_grouped_gemm: bool = False
    """The experts' GEMMs as one grouped kernel (Megatron's legacy GroupedMLP)."""
    bf16_loss: bool = False
    """The loss on the 16-bit logits, no fp32 upcast (NeMo AutoModel's `loss_fn.fp32_upcast: false`)."""
    fsdp_offload: bool = False
    """FSDP2's CPU offload: sharded parameters, gradients and optimizer on the host (torchtitan's
    `training.enable_cpu_offload`)."""
    compiled_loss: bool = False
    """The loss compiled by torch.compile, its fp32 upcast fused away (torchtitan's `compile.components`)."""
    async_tp: bool = False
    """torch's asynchronous tensor parallelism over a compiled model (torchtitan's
    `compile.enable_async_tensor_parallel`): tp's collectives pipelined with the matmuls beside them."""
    loss_chunks: bool = False
    """Its loss run over the sequence in a chosen number of chunks (torchtitan 0.3's ChunkedLossWrapper
    `num_chunks`); the others run it whole."""
    grad_sync_each_microbatch: bool = False
    """Its deferred gradient sync switched off: every micro-batch reduce-scatters (NeMo AutoModel's
    `distributed.defer_fsdp_grad_sync: false`)."""
    attention_kernel: frozenset[str] = frozenset()
    """Attention kernels a run can name beside its own (TrainingSpec.attention_kernel: NeMo AutoModel's
    `model.backend.attn`)."""
    optimizer_in_backward: bool = False
    """The optimizer stepped per parameter in the backward, its gradient freed (torchtitan ≤ 0.2's
    `optimizer.early_step_in_backward`)."""
    activation_offload: bool = False
    """Layers' activations offloaded to host memory between forward and backward (Megatron-core's
    `cpu_offloading`, `cpu_offloading_num_layers`)."""
    fp8_param_gather: bool = False
    """Layer weights kept only quantised (Megatron-LM's --fp8-param-gather)."""
    precision_aware_optimizer: bool = False
    """Adam's states as Transformer Engine's FusedAdam keeps them (Megatron-LM's --use-precision-aware-optimizer)."""
    adam_moments: bool = False
    """Adam's moments in another dtype than fp32 (Megatron-LM's --exp-avg-dtype, --exp-avg-sq-dtype)."""
    master_weights: bool = False
    """Master weights in fp16 (Megatron-LM's --main-params-dtype)."""
    moe_pad_to_capacity: bool = False
    """Every expert's input padded to its capacity (Megatron-core's --moe-pad-expert-input-to-capacity)."""
    moe_shared_expert_overlap: bool = False
    """The shared experts beside the token exchange (Megatron-core's --moe-shared-expert-overlap)."""
    optimizer_offload: bool = False
    """The optimizer's states kept and stepped on the host (Megatron-LM's --optimizer-cpu-offload)."""
    optimizer_offload_overlap: bool = False
    """The offloaded optimizer's copies overlapped with its host step (--overlap-cpu-optimizer-d2h-h2d)."""
    moe_a2a_overlap: bool = False
    """The MoE all-to-all overlapped with another micro-batch's compute (Megatron-LM's
    --overlap-moe-expert-parallel-comm)."""
    cuda_graphs: bool | frozenset[str] = False
    """CUDA-graph capture of the MoE router and permutation, or of the whole step (Megatron-LM's
    --cuda-graph-impl, --cuda-graph-scope): all of TrainingSpec.cuda_graphs, or the captures it runs (torchtitan
    0.3: the whole forward and backward, `wrap_with_cuda_graph`)."""
    cuda_graphs_host_free: bool = False
    """Its CUDA graphs capture a step only where nothing in it waits on the host: no pipeline stages and no expert
    parallel exchange that reads its splits back (torchtitan 0.3's Trainer.Config._validate_cuda_graphs)."""
    moe_dispatcher: frozenset[str] = frozenset({"alltoall"})
    """The MoE token dispatchers it runs (TrainingSpec.moe_dispatcher): every engine with experts runs an
    all-to-all; Megatron-core also its all-gather and flex (DeepEP) dispatchers."""
    moe_dispatch_capacity: bool = False
    """Its flex dispatcher sized for a fixed capacity without a host sync (TrainingSpec.moe_dispatch_capacity:
    torchtitan 0.3's HybridEP `non_blocking_capacity_factor`)."""
    kernel_dispatch_needs_ep: bool = False
    """Its kernel dispatchers (flex, symmetric_memory) run only over an expert-parallel group: torchtitan 0.3's
    update_ep_token_dispatcher_config refuses DeepEP, HybridEP and MinimalAsyncEP at expert_parallel_degree 1."""
    per_expert_launches: bool = True
    """Its grouped GEMM launches each local expert's GEMMs as kernels of their own (Transformer Engine's
    GroupedLinear under Megatron, gplan's torch worker's loop over experts, DeepSpeed-MoE's): a host cost
    per local expert (cost_models.experts.EXPERT_LAUNCH_S). torchtitan's `torch._grouped_mm` runs the group
    as one kernel (torchtitan/models/moe: `_run_experts_grouped_mm`)."""
    tensor_parallel: bool = True
    """Tensor (and sequence) parallelism; FSDP-only stacks (llm-foundry) shard data parallel alone."""
    pipeline: bool = True
    """Pipeline stages."""


LAYOUT_DEGREES = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "zero")
"""What a new layout may change; `split` (the layers per stage) besides."""


@dataclass(frozen=True)
class Resharding:
    """What a checkpoint the engine wrote can be loaded into (`gplan replan` keeps the rest as it was)."""

    format: str
    """The checkpoint format, as the engine names it."""
    free: frozenset[str]
    """Degrees (LAYOUT_DEGREES, and `split`) that may change on load."""
    source: str
    optimizer_pins: frozenset[str] = frozenset()
    """Degrees its optimizer state's default format cannot change (the weights can) ..."""
    unpinned_by: str = ""
    """... unless the run saved with this option."""
    dense_only: bool = False
    """Models with routed experts cannot be converted: every degree stays."""
    conversion: str = ""
    """The engine's own conversion step before loading under another layout, if it needs one."""


#: A torch.distributed.checkpoint (DCP) checkpoint: every tensor saved with its global shape and its shard's
#: offsets, resharded on load (torch.distributed.checkpoint's docs: "load-time resharding").
DCP_RESHARDS = frozenset(LAYOUT_DEGREES) | {"split"}


ALL_SCHEDULES = frozenset({"gpipe", "1f1b", "interleaved_1f1b"})
ALL_ZERO = frozenset({0, 1, 2, 3})


StateRule = Literal["mixed_precision", "fsdp", "zero_optimizers"]
LossGrad = Literal["in_place", "fp32_grad", "fused"]
AttentionKernel = Literal["fused", "fa2"]
ExpertKernel = Literal["grouped", "torch_grouped_mm"]


@dataclass(frozen=True)
class MemoryAccounting:
    """How an engine keeps a run's bytes where engines differ (cost_models.memory prices each rule)."""

    states: StateRule = "mixed_precision"
    """Weights, gradients and optimizer states per parameter (`state_bytes_per_param`): mixed_precision:
    16-bit weights, fp32 main gradients, fp32 master and Adam (Megatron-LM's distributed optimizer,
    MindSpore's optimizer parallel); fsdp: fp32 weights under autocast, FSDP2 sharding them (torch,
    torchtitan, llm-foundry); zero_optimizers: DeepSpeed's ZeRO optimizers (16-bit weights and gradients)."""
    fp32_logits: bool = True
    """Whether the loss keeps an fp32 copy of the logits beside the 16-bit ones (`head_activation_bytes`);
    a fused cross-entropy keeps none."""
    loss_grad: LossGrad = "in_place"
    """The loss backward's bytes per logit (`loss_working_bytes`): in_place: Megatron's vocab-parallel
    cross-entropy writes into its softmax buffer (e); fp32_grad: PyTorch's `F.cross_entropy` on fp32
    logits allocates the fp32 gradient and its 16-bit copy (4 + e); fused: in place, nothing."""
    quantized_gemm_inputs: bool = True
    """Whether, under an FP8 or MXFP8 recipe, a linear layer keeps its input for the weight gradient in the
    quantised form it ran in (Transformer Engine's Linear, LayerNormLinear and GroupedLinear save the
    quantised input, pytorch/module/linear.py `_Linear.forward`), not in 16 bits; torchao's Float8Linear
    keeps the 16-bit input and casts again in the backward."""
    reduce_bucket_elements: float = 0.0
    """A gradient bucket it reduces from with zero 1/2, in elements (DeepSpeed's `reduce_bucket_size`)."""
    zero3_live_params: float = 0.0
    """With zero 3, the most parameters it keeps gathered at once and reduces its gradients through its
    16-bit reduce bucket (DeepSpeed's `stage3_max_live_parameters`: it gathers submodule by submodule);
    0: whole units (FSDP's layers), the two largest gathered and one's fp32 gradients."""
    fragmentation: float = 0.0
    """Allocator reserve beyond the allocated bytes where its measured peaks show more than the device's
    default (a fraction of the allocated bytes)."""
    zero3_fragmentation: float | None = None
    """With zero 3, where the engine runs another allocation pattern than the runs `fragmentation` was
    fitted on (DeepSpeed's ZeRO-3 never runs in the pipeline engine its BLOOM peaks measure); None: as
    `fragmentation`."""
    unfused_swiglu: bool = False
    """Whether its SwiGLU runs as separate SiLU and product ops (torchtitan's FeedForward and grouped experts:
    `F.silu(w1(x)) * w3(x)`), so that autograd keeps the SiLU's output beside its input — one more `f` per
    token, and per routed pair, than a fused SwiGLU's gate and up in, product out (`memory.mlp_intermediate_bytes`)."""
    fp32_routing_weights: bool = False
    """Whether its MoE scales the routed tokens by the router's weights as an op of their own in fp32
    (torchtitan's MoE: `routed_input.to(torch.float32) * top_scores`, or the experts' output when the scores
    apply after them), so that autograd keeps the fp32 operand: `4·h` bytes per routed pair
    (`experts.routed_activation_bytes`) — where Megatron-core applies them in its fused unpermute."""


UNKNOWN_RESHARDING = Resharding("none", frozenset(), "not known: every degree kept")
"""An engine (or a plan naming none) whose checkpoints' loading gplan does not know: nothing reshards."""


@dataclass(frozen=True)
class EngineProfile:
    """One engine, in one place: adding an engine is a file in engines with its ENGINE, and its tests. Its speed
    is not here: it is the hardware catalogue's `engine_efficiency[name]`, fitted per hardware on its runs
    (prior 1: the compute efficiencies are Megatron-LM's)."""

    name: str
    """What `--target`, plans and profiles call it."""
    title: str
    """How its users call it."""
    order: int
    """Its place in lists (help text, tables)."""
    capabilities: Capabilities
    """What it runs exactly as priced (spec.targets reads them)."""
    memory: MemoryAccounting
    runs_in_short: str = ""
    """What it runs, in a line (docs/design.md's engine table, written from here by
    bench/engine_tables.py)"""
    memory_in_short: str = ""
    """How it keeps memory, in a line (the same table)."""
    launches: bool = False
    """Whether `gplan launch --backend NAME` runs it (gplan's own workers)."""
    resharding: Resharding = UNKNOWN_RESHARDING
    """What its checkpoints can be loaded into (`gplan replan`, `gplan launch --resume-from`)."""
    attention_kernel: AttentionKernel = "fused"
    """The fused attention it runs on GPUs: "fused", the newest the device has (Transformer Engine picks cuDNN's,
    FlashAttention-3-class on Hopper), or "fa2", FlashAttention-2's class (flash-attn 2, torch SDPA's default
    flash backend, Triton's), which runs Hopper at `DeviceSpec.fa2_attention_ratio` of the former."""
    expert_kernel: ExpertKernel = "grouped"
    """The kernel its routed experts' BF16 GEMMs run on: "grouped", the grouped GEMMs the catalogue's MoE constants
    were fitted on (Transformer Engine's in Megatron-core), or "torch_grouped_mm", `torch._grouped_mm` (torchtitan's
    GroupedExperts), priced at `DeviceSpec.torch_grouped_mm_ratio` of the former."""
    moe_host_s: float | None = None
    """Exposed host seconds per MoE layer and pass (forward, backward, a replayed forward) where nothing captures the
    step in CUDA graphs, measured on the engine's own runs; None: Megatron-core's, fitted on Megatron-Bridge's rows
    (`cost_models.experts.HOST_SYNC_S`). An eager PyTorch MoE layer launches its router, permutation, token exchange
    and grouped GEMMs op by op from Python, and its exchange reads the tokens per expert back to the host, so the
    device waits on the host in every pass whatever its speed."""
    speed_reference: bool = False
    """Whether the hardware catalogue's compute efficiencies are fitted on its runs (`DeviceSpec.efficiency`:
    Megatron-LM's), so that it needs no factor of its own on a device (`DeviceSpec.engine_efficiency`)."""
    loss_chunks: int = 1
    """The chunks its loss runs in by default: 1, the whole sequence's logits at once; torchtitan 0.3's trainer
    configs wrap the loss in ChunkedLossWrapper (components/loss.py, num_chunks 8): each chunk's logits made, lost
    and differentiated in the forward, one chunk at a time (`memory.head_activation_bytes`)."""
    zero3_comm_efficiency: float = 1.0
    """Achieved over modelled speed of its fully sharded data parallel's per-unit all-gathers and
    reduce-scatters (StepModel.zero3_exposed_s): 1 — the ring collective at the link's speed, the shared
    default — unless fitted on the engine's own ZeRO-3 / FSDP runs at scale (`bench/accuracy.py --fit`)."""
    zero3_overlap: float = 1.0
    """The share of a unit's compute behind which its neighbour's collectives run: 1 — FSDP2's one-unit
    implicit prefetch, the shared default — unless fitted as above."""
    zero3_gathers_per_tensor: bool = False
    """Whether it all-gathers each parameter tensor by a call of its own, waiting for each (DeepSpeed's ZeRO-3 up
    to 0.4: `_allgather_params` per parameter, every call followed by `torch.cuda.synchronize()` — DeepSpeed
    issue #1069, PR #1188 — coalesced since), instead of one collective per unit: each call pays the ring's latency,
    `zero3_gather_host_s`, and, through the list form of `all_gather`, one copy kernel per rank
    (`zero3_copy_launch_s`; ProcessGroupNCCL::allgather copies every rank's piece out of its flat buffer)."""
    zero3_gather_host_s: float = 0.0
    """Host time of one such all-gather call (DeepSpeed #1069, on p4d: about 130 µs to prepare it, 250 µs to
    launch it)."""
    zero3_copy_launch_s: float = 0.0
    """Time per rank of one list all-gather's copies out of its flat buffer: a kernel launch each."""
    pipeline_reduce_after_backward: bool = False
    """With pipeline stages and sharded data parallel (zero 1/2), whether a stage reduces its gradients only once
    its last micro-batch's backward is done, the compute after it waiting for the reduction: torch's pipelining
    runs FSDP's post-backward by hand in its REDUCE_GRAD action, scheduled after a stage's last backward, and then
    joins the reduce-scatter stream to the compute stream (`_root_post_backward_final_callback`; torch 2.13,
    torch/distributed/pipelining/stage.py `perform_reduce_grad`, schedules.py `_add_reduce_grad`) — so the
    reduce-scatter is exposed, not overlapped with that backward, once per schedule run. Engines that pipeline
    with torch.distributed.pipelining and FSDP2 (torchtitan, NeMo AutoModel, gplan's torch worker)."""
    reduces_every_microbatch: bool = False
    """Without pipeline stages and with sharded data parallel (zero 1/2), whether each micro-batch's backward
    reduce-scatters its gradients (and reshards, so the next forward gathers again) rather than once a step:
    FSDP2's default, which torchtitan's train loop and gplan's worker keep (neither lifts gradient sync only on
    the last micro-batch) — m reductions a step, each behind its own micro-batch's backward."""
    defers_grad_sync: bool = False
    """Without pipeline stages and with sharded data parallel, whether the train loop lifts gradient sync only on
    a step's last micro-batch (FSDP2's `set_requires_gradient_sync(is_optim_step)`): every gradient accumulates
    whole, in the reduce dtype, through the step's micro-batches, and is reduce-scattered once, behind the last
    backward. NeMo AutoModel's `distributed.defer_fsdp_grad_sync`, true by default (0.7,
    components/distributed/utils.py `get_sync_ctx`; config.py: "saves comm, can increase peak memory")."""
    zero3_backward_prefetch: bool = True
    """Whether its fully sharded backward issues the next unit's all-gather before the current unit's
    gradient computation, so that the two overlap (FSDP2's explicit backward prefetch; FSDP1's
    BACKWARD_PRE), or only after it (FSDP1's BACKWARD_POST: the all-gather is exposed and only the
    reduce-scatter overlaps the next unit's computation — `torch.distributed.fsdp.BackwardPrefetch`)."""


NO_ENGINE = EngineProfile(
    name="", title="no engine (as published: Megatron's accounting)", order=-1,
    capabilities=Capabilities("", ALL_SCHEDULES, microbatches_at_least_stages=False, cp=True,
                              tied_embeddings_across_stages=True, recompute="per_layer", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=True),
    memory=MemoryAccounting())
"""The profile of a run priced for no engine (a TrainingSpec without `engine`: plans written before engines,
inputs built by hand): every field at its default — Megatron's accounting, the fused attention, FSDP's shared
ring collectives — so that the cost model always reads a profile. It is in no registry: spec.targets finds
no target for it and refuses nothing."""
