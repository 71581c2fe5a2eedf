"""NVIDIA NeMo AutoModel (nemo_automodel 0.7): Hugging Face models trained on PyTorch's DTensor stack —
FSDP2 over the data-parallel ranks (its default strategy), tensor and sequence parallelism, context
parallelism, torch.distributed.pipelining, and expert parallelism borrowed from the non-pipeline ranks
(`components/distributed/mesh_utils.py`, `_create_fsdp2_device_mesh`: ep divides dp·cp·tp, the experts
FSDP-sharded over what is left). Activation checkpointing is one switch for every layer. Its checkpoints are
torch.distributed.checkpoint (DCP) state dicts. gplan prices it, exports its YAML recipe and reads one back.

Not priced here: its Megatron-FSDP and DDP strategies beside FSDP2 (read, and priced as the sharding they
keep), FP8 (its `fp8:` section), CPU offload, and per-operator selective checkpointing."""

from gplan.engines.profile import DCP_RESHARDS, Capabilities, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="nemo-automodel", title="NeMo AutoModel", order=7,
    runs_in_short=("every schedule, cp, FSDP2 (zero 2/3) with ep borrowed from dp·cp·tp, one AC switch for all layers, "
                   "any Hugging Face model gplan bundles"),
    memory_in_short="fsdp states, fp32 loss gradient",
    capabilities=Capabilities(
        "nemo-automodel",
        # PipelineConfig.pp_schedule: torch.distributed.pipelining's schedules by name (1f1b, interleaved1f1b, gpipe)
        frozenset({"gpipe", "1f1b", "interleaved_1f1b"}), microbatches_at_least_stages=True, cp=True,
        tied_embeddings_across_stages=False,
        # distributed.activation_checkpointing: true checkpoints every transformer block
        recompute="every_layer", uneven_split=False,
        # pipelining/functional.py: virtual stages cut from one layers_per_stage, their sizes differing by one
        uneven_interleaved=True, interleaved_by_layers_per_stage=True,
        # FSDP2 reshards after the forward unless reshard_after_forward is false (zero 3 / 2); it has no
        # optimizer-only sharding, so zero 1 runs as zero 2 (the export says so); its ddp strategy (no tp, pp, cp
        # or ep: mesh_utils.py) is not planned for here
        zero=frozenset({1, 2, 3}), zero_with_pp=frozenset({1, 2, 3}), encoder_decoder=False,
        selective=False, recompute_modules=frozenset(),
        experts=True, expert_tp="etp1", ep_within_fsdp=True, expert_zero=frozenset({1, 2, 3}),
        # model.backend.dispatcher: torch (DTensor all-gather / reduce-scatter), deepep, hybridep, uccl_ep (flex)
        moe_dispatcher=frozenset({"alltoall", "allgather", "flex"}),
        # model.backend.experts defaults to torch._grouped_mm on CUDA (torch_mm; gmm its alias): one kernel; priced at
        # the fitted grouped speed its published runs (grouped_gemm's gmm, with DeepEP) reached, not torch's timed one
        per_expert_launches=False,
        # its DeepSeek-V3 model (components/models/deepseek_v3): latent attention, left at tp = cp = 1 here
        latent_attention=True,
        # its gpt-oss model (components/models/gpt_oss): the sliding-window layers of config.layer_types, learned
        # sinks (FlexAttention's sink_weights, TE's softmax_offset) and the clamped gated unit (activation_limit)
        sliding_window=True, attention_sinks=True, clamped_glu=True,
        # model.backend.attn: te (the fused cuDNN kernel, its default) or sdpa / flex (FlashAttention-2's class)
        attention_kernel=frozenset({"fused", "fa2"}),
        # loss_fn.fp32_upcast: false (MaskedCrossEntropy, components/loss/masked_ce.py) on the 16-bit logits
        bf16_loss=True,
        # distributed.defer_fsdp_grad_sync: false — reduce-scatter every micro-batch (its default defers to the last)
        grad_sync_each_microbatch=True,
        # distributed.enable_async_tensor_parallel: torch's micro-pipelined tp over per-layer compiled blocks
        # (model_parallelizer.py compile_parallelized_model compiles them for it; parallelizer.py needs sequence_parallel)
        async_tp=True,
        precisions=frozenset({"bf16", "fp32"}),
        # mp_policy.reduce_dtype: the dtype FSDP2 reduce-scatters the gradients in (float32 by default)
        grad_reduce_in_bf16=True,
        # model.torch_dtype: the parameters' (and so Adam's) dtype — "auto", its default, builds them in bfloat16
        pure_bf16=True),
    # FSDP2's MixedPrecisionPolicy (param bf16, reduce fp32) over the model's own dtype (fp32 weights with
    # model.torch_dtype float32; its default bfloat16 is TrainingSpec.pure_bf16); the loss upcast in fp32
    memory=MemoryAccounting(states="fsdp", loss_grad="fp32_grad", quantized_gemm_inputs=False),
    # its BackendConfig's attention (components/models/common/utils.py): Transformer Engine's fused attention
    # (attn "te", the cuDNN kernel Megatron runs) wherever TE is installed on CUDA — its default, and what its
    # benchmark recipes state; torch's SDPA (FlashAttention-2) only without TE
    attention_kernel="fused",
    pipeline_reduce_after_backward=True,
    # distributed.defer_fsdp_grad_sync (default true): without stages, gradient sync on a step's last micro-batch only
    defers_grad_sync=True,
    resharding=Resharding(
        "torch.distributed.checkpoint (DCP)", DCP_RESHARDS,
        "NeMo AutoModel saves DCP state dicts keyed by parameter name (components/checkpoint), which load under "
        "another parallelism"),
)

HF_MODELS = {
    "meta-llama/Meta-Llama-3-8B": "llama3-8b", "meta-llama/Llama-3.1-8B": "llama3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama3-70b", "meta-llama/Llama-3.1-70B": "llama3-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama3-70b", "meta-llama/Llama-3.1-405B": "llama3-405b",
    "meta-llama/Llama-3.2-1B": "llama3.2-1b", "meta-llama/Llama-3.2-3B": "llama3.2-3b",
    "meta-llama/Llama-2-7b-hf": "llama2-7b", "meta-llama/Llama-2-13b-hf": "llama2-13b",
    "meta-llama/Llama-2-70b-hf": "llama2-70b", "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x22B-v0.1": "mixtral-8x22b", "Qwen/Qwen3-0.6B": "qwen3-0.6b", "Qwen/Qwen3-1.7B": "qwen3-1.7b",
    "Qwen/Qwen3-4B": "qwen3-4b", "Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-14B": "qwen3-14b", "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3",
    "deepseek-ai/DeepSeek-V2": "deepseek-v2-236b", "deepseek-ai/DeepSeek-V2-Lite": "deepseek-v3-16b",
    "openai/gpt-oss-20b": "gpt-oss-20b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "moonshotai/Kimi-K2-Base": "kimi-k2", "moonshotai/Kimi-K2-Instruct": "kimi-k2",
    "moonshotai/Kimi-K2-Instruct-0905": "kimi-k2", "moonshotai/Kimi-K2-Thinking": "kimi-k2",
}
"""Hugging Face repositories AutoModel recipes name (`model.pretrained_model_name_or_path`) -> the bundled
model of the same config.json (the bundled models' sources, profiles/data/models.yaml); instruct and base
checkpoints of one model share its shape. Case is ignored when matching."""
