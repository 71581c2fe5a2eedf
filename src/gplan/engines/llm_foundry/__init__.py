"""MosaicML's llm-foundry (Composer over PyTorch FSDP1): data parallelism alone — `fsdp_config`'s
sharding strategies FULL_SHARD (zero 3), SHARD_GRAD_OP (2) or NO_SHARD (0), no tensor, pipeline or
context parallelism; `activation_checkpointing` recomputes every block; its MPT models (any shape, ALiBi
or RoPE, with or without biases). gplan prices its published runs (S21) and its plans; it neither
launches nor exports to it."""

from gplan.engines.profile import Capabilities, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="llm-foundry", title="llm-foundry", order=6,
    runs_in_short=("data parallelism alone (FSDP full / grad-op / no shard), AC on every block; FSDP1's BACKWARD_POST "
                   "(backward all-gathers exposed)"),
    memory_in_short="fsdp states, fused loss (no fp32 logits)",
    capabilities=Capabilities("llm-foundry", frozenset({"1f1b"}), microbatches_at_least_stages=False, cp=False,
                              tied_embeddings_across_stages=False, recompute="every_layer", uneven_split=False,
                              zero=frozenset({0, 2, 3}), zero_with_pp=frozenset({0, 2, 3}), encoder_decoder=False,
                              selective=False, recompute_modules=frozenset(), tensor_parallel=False, pipeline=False),
    # its fused cross-entropy (flash-attn's, inplace_backward) keeps no fp32 logits and works in place
    memory=MemoryAccounting(states="fsdp", fp32_logits=False, loss_grad="fused"),
    # Composer's FSDPConfig defaults to backward_prefetch='BACKWARD_POST' (composer/utils/parallelism.py), which
    # llm-foundry's MPT yamls and its benchmark script leave as is
    zero3_backward_prefetch=False,
    # attn_impl flash (flash-attn 2) or triton; its H100 table ran torch 2.1 (S23: the h100new.md image column)
    attention_kernel="fa2",
    resharding=Resharding(
        "Composer sharded checkpoint (torch.distributed.checkpoint)", frozenset({"dp", "zero"}),
        "Composer's FSDP sharded checkpoints load on another number of ranks (its elastic sharded checkpointing); "
        "llm-foundry shards data parallel only"),
)
