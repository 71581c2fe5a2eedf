"""gplan's own torch worker (backends/torch): cp with its own ring attention (apply_cp.py); MoE
(backends/torch/moe.py) with ep over all_to_all_single and etp over gathered tokens at tp = 1, zero 0;
torchao's float8 tensorwise and rowwise and MXFP8 (backends/torch/apply_lowp.py); selective recompute of the
attention core or, as torchtitan's, per operator (the module `op`: backends/torch/model.per_op_contexts)."""

from gplan.engines.profile import ALL_SCHEDULES, ALL_ZERO, Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="torch", title="gplan's torch worker (torchrun, NCCL)", order=0, launches=True,
    runs_in_short="every schedule, cp (ring attention), per-layer recompute, MoE at tp 1, torchao FP8/MXFP8",
    memory_in_short="fsdp states, fp32 loss gradient",
    capabilities=Capabilities("torch", ALL_SCHEDULES, microbatches_at_least_stages=True, cp=True,
                              tied_embeddings_across_stages=True, recompute="per_layer", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False, experts=True,
                              expert_zero=frozenset({0}), latent_attention=True, expert_tp="etp",
                              precisions=frozenset({"bf16", "fp16", "fp32", "fp8", "fp8-rowwise", "mxfp8"}),
                              low_precision_tp=False, recompute_modules=frozenset({"core_attn", "op"})),
    # FSDP2 over autocast; the loss is F.cross_entropy on fp32 logits
    memory=MemoryAccounting(states="fsdp", loss_grad="fp32_grad", quantized_gemm_inputs=False,
                            unfused_swiglu=True),  # backends/torch model.py and moe.py: F.silu(w1 x) * w3 x
    # F.scaled_dot_product_attention: its default flash backend is FlashAttention-2 (cuDNN's ranks below it)
    attention_kernel="fa2",
    pipeline_reduce_after_backward=True,
    reduces_every_microbatch=True,
    resharding=Resharding(
        "torch.distributed.checkpoint, by parameter name (gplan's format 2)", DCP_RESHARDS,
        "backends/torch/checkpoint.py: weights and AdamW state keyed by global parameter name; DCP reshards "
        "DTensor shards on load (tests/backends/test_resume_elsewhere.py trains on through a change of layout)"),
)
