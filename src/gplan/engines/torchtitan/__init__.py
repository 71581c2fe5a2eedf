"""torchtitan: one activation-checkpoint policy for all layers (apply_ac over every block) — none, full, or
its per-operator selective AC (`SelectiveAC`, the recompute module `op`); its llama3
module (swiglu, RMSNorm, RoPE); FSDP2 has no optimizer-only sharding, so zero 1 runs as zero 2 there (the
export says so). Stages are exact: the export lists every chunk's modules. Experts: its qwen3,
deepseek_v3 and gpt_oss models (MoE layers with ep). Latent attention with tp and cp as 0.3.0 runs it
(models/deepseek_v3/parallelize.py: cp wraps the inner attention, `apply_cp_to_forward`; sharding.py: the
down-projections replicated, the up-projections colwise and the output rowwise over tp — Megatron's MLA split)."""

from gplan.engines.profile import ALL_SCHEDULES, ALL_ZERO, Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

MOE_HOST_S = 6.7e-3
"""Exposed host seconds per MoE layer and pass, torchtitan's step not captured in CUDA graphs: measured by turning
its graphs on and off on one run (pytorch/torchtitan PR 3616, Run 4: DeepSeek-V3 16B on 8 H100, FSDP with ep,
local batch 4 × 4096, full AC — ~12.7% MFU with the graph skipped, ~16.5% captured; at torchtitan's 17.43 GFLOP a
token and 989 TFLOP/s, 16,384 tokens in 2.274 s against 1.750 s: 0.524 s over 26 MoE layers × 3 passes). Its
graph trainer without graphs runs as its eager trainer does (issue 3816: 1.01× on B200), so the eager trainer
pays it too. Megatron-core exposes 1 ms (cost_models.experts.HOST_SYNC_S)."""

ENGINE = EngineProfile(
    name="torchtitan", title="torchtitan", order=3,
    runs_in_short="every schedule, cp, one AC policy for all layers, Llama/Qwen3/DeepSeek-V3/gpt-oss, ep inside FSDP",
    memory_in_short="fsdp states, fp32 loss gradient",
    capabilities=Capabilities("torchtitan", ALL_SCHEDULES, microbatches_at_least_stages=True, cp=True,
                              tied_embeddings_across_stages=False, recompute="every_layer", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False, llama_family_only=True,
                              tied_embeddings=True, selective=False, recompute_modules=frozenset({"op"}), experts=True,
                              per_expert_launches=False, latent_attention=True, latent_attention_split=True,
                              expert_tp="follows_tp", ep_within_fsdp=True,
                              # FSDP over the experts too, on the dp_shard·cp ranks left by ep (0.3's
                              # parallelize_*: apply_fsdp with the edp mesh for the routed experts)
                              expert_zero=ALL_ZERO,
                              expert_families=frozenset({"qwen3_moe", "deepseek_v3", "gpt_oss"}),
                              # 0.3.0's gpt_oss model (models/gpt_oss: its 128-token window on even layers, a sink
                              # per head, biases, the gated unit clamped at 7, varlen attention), though its
                              # llama3 and qwen3 have none of them
                              family_features=frozenset({"gpt_oss"}),
                              # its token exchange: all-to-all ("standard"), DeepEP / HybridEP kernels priced as
                              # Megatron's flex dispatcher, or MinimalAsyncEP's symmetric memory (0.3.0
                              # make_token_dispatcher_config; ≤ 0.2 parallelism.expert_parallel_comm_backend);
                              # HybridEP sized without a host sync (non_blocking_capacity_factor); the kernel
                              # dispatchers need ep > 1 (update_ep_token_dispatcher_config)
                              moe_dispatcher=frozenset({"alltoall", "flex", "symmetric_memory"}),
                              moe_dispatch_capacity=True, kernel_dispatch_needs_ep=True,
                              # FSDP2's reduce dtype (`training.mixed_precision_reduce`: its MixedPrecisionPolicy's
                              # reduce_dtype, torchtitan/distributed/utils.py): the reduce-scatter in bf16
                              grad_reduce_in_bf16=True,
                              # its full-bf16 training (`training.dtype = "bfloat16"`: model and optimizer
                              # states in bf16, train.py casts the model before parallelizing)
                              pure_bf16=True,
                              # ≤ 0.2's optimizer.early_step_in_backward (OptimizersInBackwardContainer)
                              optimizer_in_backward=True,
                              # `compile.components` with "loss" (components/loss.py build_cross_entropy_loss:
                              # torch.compile of cross_entropy_loss, its `.float()` upcast inside)
                              compiled_loss=True,
                              # compile.enable_async_tensor_parallel (distributed/compile.py _maybe_enable_async_tp:
                              # Inductor's _micro_pipeline_tp over the tp mesh's symmetric memory)
                              async_tp=True,
                              # 0.3's ChunkedLossWrapper.Config.num_chunks (every registered trainer config wraps
                              # its loss in it)
                              loss_chunks=True,
                              # training.enable_cpu_offload: apply_fsdp's CPUOffloadPolicy (models/*/parallelize.py)
                              fsdp_offload=True,
                              # 0.3 captures the forward and backward in one CUDA graph unless
                              # training.disable_cuda_graphs (trainer.py, wrap_with_cuda_graph), and refuses it with
                              # pipeline stages or an exchange that syncs with the host (its all-to-all, DeepEP)
                              cuda_graphs=frozenset({"full_iteration"}), cuda_graphs_host_free=True,
                              # 0.3.0's converters: Float8LinearConverter (recipes rowwise and
                              # rowwise_with_gw_hp only: an fp8 plan runs rowwise there, and is priced
                              # so) and MXFP8LinearConverter (components/quantization/float8.py, mx.py)
                              precisions=frozenset({"bf16", "fp32", "fp8", "fp8-rowwise", "mxfp8"}),
                              # and their grouped-experts converters (Float8GroupedExpertsConverter,
                              # MXFP8GroupedExpertsConverter: torchao's scaled grouped GEMMs for the routed experts),
                              # which its export writes beside them for a mixture of experts
                              low_precision_experts=True),
    memory=MemoryAccounting(states="fsdp", loss_grad="fp32_grad", quantized_gemm_inputs=False,
                            unfused_swiglu=True, fp32_routing_weights=True),  # models/common feed_forward.py and moe.py
    # its default attention is F.scaled_dot_product_attention, whose default flash backend is FlashAttention-2
    attention_kernel="fa2",
    # models/moe GroupedExperts: use_grouped_mm (the default) runs the routed experts on torch._grouped_mm
    expert_kernel="torch_grouped_mm",
    moe_host_s=MOE_HOST_S,
    # 0.3's trainer configs (models/*/config_registry.py) wrap the loss in ChunkedLossWrapper, 8 chunks by default;
    # ≤ 0.2's TOML runs have none (their reader says 1)
    loss_chunks=8,
    pipeline_reduce_after_backward=True,
    reduces_every_microbatch=True,
    resharding=Resharding(
        "torch.distributed.checkpoint (DCP)", DCP_RESHARDS,
        "torchtitan docs/checkpoint.md: DCP checkpoints load under another parallelism; its model and optimizer "
        "state dicts are keyed by parameter name (torch.distributed.checkpoint.state_dict)"),
)
