"""TrainingSpec: the options of one training run that change costs but not the model."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gplan.io import drop_defaults
from gplan.engines import ENGINE_NAMES, profile_of
from gplan.engines.profile import EngineProfile
from gplan.spec.names import Precision


LOW_PRECISION = ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")
LOW_PRECISION_RECIPES = {"fp8": "tensorwise", "fp8-rowwise": "rowwise", "mxfp8": "mxfp8"}
"""The torchao recipe each precision runs in PyTorch (torchao.float8's recipe names; MXFP8Linear)."""
TENSOR_CORE_FORMAT = {"fp8-rowwise": "fp8"}
"""A recipe's tensor-core format where its name is not one (the peak it runs at: the hardware's fp8)."""


def tensor_core_format(precision: str) -> str:
    return TENSOR_CORE_FORMAT.get(precision, precision)


CudaGraphs = Literal["none", "moe_router", "full_iteration"]
"""What CUDA graphs capture (TrainingSpec.cuda_graphs)."""
MoeDispatcher = Literal["alltoall", "allgather", "flex", "symmetric_memory"]
"""Megatron-core's MoE token dispatchers, and torchtitan 0.3's MinimalAsyncEP (TrainingSpec.moe_dispatcher)."""
OptimizerStateDtype = Literal["fp32", "bf16", "fp16", "fp8"]
"""The dtypes Megatron-LM keeps Adam's moments in under its precision-aware optimizer (--exp-avg-dtype)."""
MasterWeightsDtype = Literal["fp32", "fp16"]
"""The dtypes of its master weights there (--main-params-dtype)."""
STATE_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes of one optimizer-state element (Megatron-LM's validate_args maps fp8 to torch.uint8)."""
AttentionKernelChoice = Literal["fused", "fa2"]
"""The attention kernels a run can name (TrainingSpec.attention_kernel; engines.profile.AttentionKernel)."""
Engine = Literal[ENGINE_NAMES]  # type: ignore[valid-type]
"""The engines of spec.engines: gplan's workers, the export targets, and llm-foundry (MosaicML's FSDP
stack), which gplan prices but neither launches nor exports to."""

#: Bytes of one activation or weight element in each training precision.
ELEMENT_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 2, "fp8-rowwise": 2, "mxfp8": 2, "nvfp4": 2}


class TrainingSpec(BaseModel):
    """Batch, sequence, precision and memory policy of a run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gbs: int = Field(gt=0)
    """Global batch size in sequences per optimizer step."""
    seq_length: int = Field(gt=0)
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Mixed precision with fp32 master weights for bf16/fp16; plain fp32 otherwise."""
    optimizer: Literal["adam"] = "adam"
    memory_headroom: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Fraction of each device's memory kept free (fragmentation, spikes)."""
    flash_attention: bool = True
    """Fused attention: no s×s score matrix is stored, and causal masking halves its FLOPs."""
    engine: Engine | None = None
    """The software that trains it (a search's --target): what it keeps per parameter and its own
    buffers (cost_models.memory). None — plans written before engines were priced — is Megatron-LM's
    accounting."""

    @property
    def profile(self) -> EngineProfile:
        """The engine's profile, which the cost model reads (`engines.profile.NO_ENGINE` for a run priced
        for none: `engine` None stops at the inputs)."""
        return profile_of(self.engine)

    expert_imbalance: float = Field(default=1.0, ge=1.0)
    """Mixture of experts: the busiest device's routed tokens over the balanced share (its expert GEMMs,
    all-to-all and expert activations scale with it). 1.0 is balanced routing — the limit the published
    Megatron-Bridge runs force (`moe_router_force_load_balancing`); real routing with an auxiliary loss
    or DeepSeek's bias balancing runs above it: set it from your own routing statistics. It applies where experts
    are spread over devices (ep > 1): at ep 1 each device routes its own tokens to its own experts, balanced."""

    tp_comm_overlap: bool = True
    """Whether the engine overlaps tp's sequence-parallel collectives with its GEMMs where it can
    (`spec.targets.overlaps_tp_comm`: Megatron-LM's --tp-comm-overlap, which its export then passes).
    False prices and exports them exposed — runs without Transformer Engine's userbuffers, as before
    2023."""

    grad_reduce_overlap: bool = True
    """Whether zero 0–2 reduce the gradients behind the backward (bucket by bucket as they are made: Megatron-LM's
    --overlap-grad-reduce, which its export passes; DDP's and FSDP's own hooks), or after it, exposed — Megatron-LM's
    default, read from a launch without the flag."""
    param_gather_overlap: bool = True
    """Whether the distributed optimizer's parameter all-gather runs behind the next forward (Megatron-LM's
    --overlap-param-gather, which needs --overlap-grad-reduce) or before it, exposed — Megatron-LM's default. Its
    precision rule (`spec.targets.overlaps_param_gather`) still applies."""

    grad_reduce_in_bf16: bool = False
    """Main gradients kept and reduced in 16 bits, not fp32 (Megatron-LM's --grad-reduce-in-bf16; every
    Megatron-Bridge performance recipe sets `grad_reduce_in_fp32 = False`, scripts/performance/configs):
    2 bytes per parameter instead of 4, and half the gradient traffic. Megatron-LM, and torchtitan's FSDP
    (`training.mixed_precision_reduce = "bfloat16"`: the reduce-scatter in bf16, the sharded gradients still fp32)."""
    pure_bf16: bool = False
    """Parameters, gradients and optimizer states all kept in bf16, no fp32 master copy (torchtitan's
    `training.dtype = "bfloat16"`, "full bf16 training": torchtitan/config/configs.py TrainingConfig.dtype):
    8 bytes of states per parameter, not 16. torchtitan only."""
    optimizer_in_backward: bool = False
    """The optimizer steps each parameter as soon as its gradient is reduced, and frees that gradient (torchtitan
    ≤ 0.2's `optimizer.early_step_in_backward`: OptimizersInBackwardContainer, a post-accumulate-grad hook per
    parameter; gone from 0.3.0): no gradient is kept across the backward. It steps in every backward, so it
    runs without gradient accumulation, pipeline stages or expert parallel (torchtitan's build_optimizers
    refuses the last two). torchtitan only."""
    legacy_grouped_gemm: bool = False
    """Mixture of experts: the routed experts' GEMMs run as one grouped kernel per matrix (Megatron-core's legacy
    GroupedMLP, `grouped_gemm`'s gmm: `--moe-use-legacy-grouped-gemm`, or `--transformer-impl local` with
    `--moe-grouped-gemm`), not Transformer Engine's grouped linear that launches each local expert's GEMMs
    (experts.EXPERT_LAUNCH_S): no launch per local expert, the dispatcher's sync kept. Megatron-LM only."""
    fp8_param_gather: bool = False
    """Low-precision recipes: the layers' weights kept only in their quantised form, all-gathered in it by the
    distributed optimizer — no 16-bit copy beside it (Megatron-LM's --fp8-param-gather; Megatron-Bridge's
    `bf16_with_mxfp8_mixed` and FP8 recipes set it, training/mixed_precision.py). Megatron-LM only."""

    moe_a2a_overlap: bool = False
    """Mixture of experts: each micro-batch's dispatch and combine all-to-alls run beside another
    micro-batch's attention and MLP (Megatron-core's --overlap-moe-expert-parallel-comm, its combined 1F1B
    schedule; it needs ep > 1, vpp with pp > 1, and no full or `moe` recompute). Megatron-LM only."""
    cuda_graphs: CudaGraphs = "none"
    """What CUDA graphs capture, which decides the host time an MoE layer exposes (experts.host_time_s):
    `moe_router` — Transformer Engine graphs of the attention, router and permutation
    (`--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess`);
    `full_iteration` — the whole step (`--cuda-graph-impl local --cuda-graph-scope full_iteration`).
    Megatron-LM only."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """Mixture of experts: Megatron-core's token dispatcher (--moe-token-dispatcher-type), which decides the
    buffers an MoE layer holds (experts.dispatch_buffer_bytes, experts.flex_buffer_bytes) and its traffic:
    `alltoall` permutes the tokens into a send buffer and all-to-alls them over ep; `allgather` gathers every
    token of the ep × etp group to each rank; `flex` is DeepEP's fused dispatch and combine (--moe-enable-deepep),
    which sends from the tokens in place through buffers it allocates once per process; `symmetric_memory` is
    torchtitan 0.3's MinimalAsyncEP (`moe_comm_backend = "minimal_async_ep"`), which writes each routed copy
    straight into its expert rank's receive buffer in symmetric memory — the all-to-all's bytes, no host sync —
    through two receive buffers allocated once (`experts.symmetric_buffer_bytes`), the experts' input sized for
    the worst case (`moe_rows_capacity` 1). Megatron-core's own default is allgather; gplan's, and Megatron's
    recommendation with ep, alltoall."""
    moe_dispatch_capacity: float | None = Field(default=None, gt=0.0, le=1.0)
    """Mixture of experts under the flex dispatcher: its permuted output sized for this share of the worst case
    on the device, so it never reads the tokens per expert back to the host (torchtitan 0.3's HybridEP
    `non_blocking_capacity_factor`; hybridep.py `_num_permuted_tokens_for_non_blocking`): each micro-batch the
    experts' input is `tokens·ep·min(E/ep, k)·capacity` rows whatever the router sends — the rows their
    activations and gradients hold (`experts.allocated_load`) — while the grouped GEMMs compute the routed ones;
    tokens past it are dropped, and CUDA graphs capture a step with ep > 1. None: sized on the host after a sync,
    dropless. torchtitan only."""

    bf16_loss: bool = False
    """The cross-entropy on the 16-bit logits, not upcast to fp32 first (NeMo AutoModel's `loss_fn.fp32_upcast:
    false`, which its benchmark recipes set): the softmax it keeps and its gradient in 16 bits
    (`memory.head_activation_bytes`, `memory.loss_working_bytes`), and 16-bit reads in its time
    (`compute.cross_entropy_bytes_per_logit`)."""
    async_tp: bool = False
    """torch's asynchronous tensor parallelism (torchtitan's `compile.enable_async_tensor_parallel`, which needs the
    model compiled: Inductor's micro-pipeline TP pass, torch/_inductor/fx_passes/micro_pipeline_tp.py, splits each
    all-gather before a matmul and each reduce-scatter after one into chunks run beside the matmul's, over symmetric
    memory inside an NVLink domain): priced as Megatron's userbuffers overlap (`spec.targets.overlaps_tp_comm`), each
    pass exposing what tp's collectives take beyond the GEMMs beside them. What compiling the model changes besides
    is not priced."""
    compiled_loss: bool = False
    """The loss compiled by torch.compile (torchtitan's `compile.components` holding "loss" with `compile.enable`;
    ≤ 0.2's `training.compile`): Inductor fuses the fp32 upcast into the cross-entropy's reductions and replays it in
    the backward, which writes the 16-bit gradient at once — no fp32 copy of the logits is kept and no fp32 gradient
    allocated (`memory.head_activation_bytes`, `memory.loss_working_bytes`), the logits read in 16 bits
    (`compute.cross_entropy_bytes_per_logit`). What compiling the model itself changes is not priced."""
    grad_sync_each_microbatch: bool = False
    """Sharded data parallel without stages reduce-scatters every micro-batch's gradients, where the engine's own
    default defers the reduction to a step's last micro-batch (`EngineProfile.defers_grad_sync`; NeMo AutoModel's
    `distributed.defer_fsdp_grad_sync: false`, which its 70B benchmark recipe sets to avoid holding every gradient
    whole): m reductions a step, and no whole gradients held."""
    precision_aware_optimizer: bool = False
    """Adam's states as Transformer Engine's FusedAdam keeps them (Megatron-LM's --use-precision-aware-optimizer,
    which runs on the distributed optimizer only): the fp32 master weights stored as the 16 bits the bf16 weight
    lacks (FusedAdam's `store_param_remainders`, on by default) — 2 bytes, not 4 — unless an FP8 recipe runs, under
    which Megatron-core keeps whole fp32 master shards itself (OptimizerConfig's
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`); the moments in `adam_moments`, the master weights in
    `master_weights` (`memory.adam_state_bytes`). Megatron-LM only."""
    adam_moments: OptimizerStateDtype = "fp32"
    """Adam's first and second moments' dtype (Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype, which need
    the precision-aware optimizer; fp8 is kept as one byte)."""
    master_weights: MasterWeightsDtype = "fp32"
    """The master weights' dtype (Megatron-LM's --main-params-dtype, which needs the precision-aware optimizer):
    fp16 is 2 bytes, FP8 recipe or not."""
    moe_pad_to_capacity: bool = False
    """Mixture of experts with an expert capacity (ModelSpec.capacity_factor): every expert's input padded to its
    capacity, so each computes and exchanges exactly capacity_factor × the balanced share (Megatron-core's
    --moe-pad-expert-input-to-capacity; experts.routed_load). Megatron-LM only."""
    moe_shared_expert_overlap: bool = False
    """Mixture of experts: the shared experts run on a stream of their own beside the token exchange — their first
    GEMM and activation while the dispatch all-to-all runs, their second while the combine runs, in every pass
    (Megatron-core's --moe-shared-expert-overlap, SharedExpertMLP's stream; the all-to-all dispatcher only, not
    with --overlap-moe-expert-parallel-comm nor the shared_experts recompute module). Megatron-LM only."""
    optimizer_offload: float = Field(default=0.0, ge=0.0, le=1.0)
    """The share of the optimizer's states kept and stepped on the host (Megatron-LM's --optimizer-cpu-offload with
    --optimizer-offload-fraction, 1.0 by default; it needs the precision-aware optimizer): off the device's
    memory, their step run by the host CPUs at `DeviceSpec.host_memory_GBps`, the gradients copied to the host and
    the updated weights back at `host_link_GBps` (`StepModel.offloaded_optimizer_s`). 0: none. Megatron-LM only."""
    fsdp_offload: bool = False
    """FSDP2's CPU offload (its CPUOffloadPolicy; torchtitan's `training.enable_cpu_offload`): the sharded parameters,
    their gradients and Adam's states live in host memory — on the device only the units gathered for compute — and
    the optimizer steps on the host. Each unit's shard is copied to the device before its all-gather and each reduced
    gradient shard back after its reduce-scatter, at the host link (`DeviceSpec.host_link_GBps`), in the
    collective's stream (`StepModel.offload_copy_s`); the host's Adam runs after the backward at the device's share of
    the host memory bandwidth (`host_memory_GBps`) — an assumption no measured run checks. Host memory is not
    checked. Priced with zero 3 (`spec.parallel._fsdp_offload`)."""
    optimizer_offload_overlap: bool = False
    """The offloaded optimizer's copies overlapped with its host step, group by group (Megatron-LM's
    --overlap-cpu-optimizer-d2h-h2d); without it they run one after the other."""
    loss_chunks: int | None = Field(default=None, ge=1)
    """The loss over the sequence in this many chunks, each chunk's logits made, lost and differentiated in the
    forward before the next (torchtitan 0.3's ChunkedLossWrapper): only one chunk's logits and their gradient
    exist at a time, beside an fp32 gradient of the hidden states (`memory.head_activation_bytes`,
    `memory.loss_working_bytes`). None: the engine's own (`EngineProfile.loss_chunks`: 8 for torchtitan, else 1)."""
    attention_kernel: AttentionKernelChoice | None = None
    """The attention kernel, where the engine runs more than one (NeMo AutoModel's `model.backend.attn`: te is the
    fused cuDNN kernel, sdpa and flex — torch SDPA's flash backend and FlexAttention's Triton kernel — are
    FlashAttention-2's class): "fused" or "fa2", priced at `DeviceSpec.fa2_attention_ratio` of the fused one where
    the device has a faster kernel. None: the engine's own (`EngineProfile.attention_kernel`)."""

    #: Fields added after schema v1 plans were first written, left out of the digest at their default.
    DIGEST_OPTIONAL: ClassVar[dict[str, object]] = {"engine": None, "expert_imbalance": 1.0, "tp_comm_overlap": True,
                                                    "grad_reduce_overlap": True, "param_gather_overlap": True,
                                                    "grad_reduce_in_bf16": False, "fp8_param_gather": False, "pure_bf16": False,
                                                    "optimizer_in_backward": False, "legacy_grouped_gemm": False,
                                                    "moe_a2a_overlap": False, "cuda_graphs": "none",
                                                    "moe_dispatcher": "alltoall", "moe_dispatch_capacity": None,
                                                    "attention_kernel": None,
                                                    "bf16_loss": False, "compiled_loss": False, "async_tp": False, "grad_sync_each_microbatch": False,
                                                    "precision_aware_optimizer": False, "adam_moments": "fp32",
                                                    "master_weights": "fp32", "moe_pad_to_capacity": False,
                                                    "moe_shared_expert_overlap": False, "optimizer_offload": 0.0,
                                                    "optimizer_offload_overlap": False, "fsdp_offload": False,
                                                    "loss_chunks": None}

    @model_validator(mode="before")
    @classmethod
    def _own_kernel_is_no_choice(cls, data):
        """Naming the engine's own attention kernel (or loss chunks) chooses nothing: kept as None, so that every
        engine takes its own."""
        if not isinstance(data, dict):
            return data
        own = profile_of(data.get("engine"))
        return {**data, **{field: None for field in ("attention_kernel", "loss_chunks")
                           if data.get(field) is not None and data[field] == getattr(own, field)}}

    @property
    def loss_chunks_run(self) -> int:
        """The chunks the run's loss is priced in: the ones it names, else its engine's."""
        return self.loss_chunks or self.profile.loss_chunks

    @property
    def attention_kernel_run(self) -> str:
        """The attention kernel the run prices: the one it names, else its engine's."""
        return self.attention_kernel or self.profile.attention_kernel

    @property
    def moe_rows_capacity(self) -> float | None:
        """The share of the worst case the experts' input is allocated for where the exchange sizes it without the
        host (MinimalAsyncEP: all of it; HybridEP non-blocking: its capacity); None where it is sized to the
        routed tokens after a host sync."""
        return 1.0 if self.moe_dispatcher == "symmetric_memory" else self.moe_dispatch_capacity

    @property
    def grad_bytes(self) -> int:
        """Bytes of one main gradient: fp32 unless reduced in 16 bits."""
        return 2 if self.grad_reduce_in_bf16 else 4

    def digest_dump(self) -> dict:
        return drop_defaults(self.model_dump(mode="json"), self.DIGEST_OPTIONAL)

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.precision]

    @property
    def base_precision(self) -> str:
        """The precision of everything but the layers' GEMMs (attention, the head, element-wise work) —
        and the peak MFU is reported against (the convention of the published tables)."""
        return "bf16" if self.precision in LOW_PRECISION else self.precision

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq_length
