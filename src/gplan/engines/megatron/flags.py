"""Megatron-LM's flags, named here once: the model flags a launch must agree with the model on, the layout flags the reader reads, and every other flag of arguments.py classified — no effect (why) or refused away from its default (why). Defaults: Megatron-LM's megatron/training/arguments.py (NVIDIA/Megatron-LM main at 000c4ac, 2026; the default= of each add_argument, store_true switches default off; engines.megatron.arguments). A flag at its default is never refused: it changes nothing."""

from __future__ import annotations

import re
from typing import Any


#: Megatron flags that set the model, with the ModelSpec value they must agree with.
MODEL_FLAGS = {
    "--num-layers": lambda m: m.num_layers, "--hidden-size": lambda m: m.hidden_size,
    "--ffn-hidden-size": lambda m: m.ffn_size, "--num-attention-heads": lambda m: m.num_attention_heads,
    "--num-query-groups": lambda m: m.kv_heads, "--num-experts": lambda m: m.num_experts,
    "--moe-router-topk": lambda m: m.top_k, "--moe-ffn-hidden-size": lambda m: m.expert_ffn_size,
    "--mtp-num-layers": lambda m: m.mtp_layers,
    "--window-attn-skip-freq": lambda m: m.full_attention_every,  # one full layer every N (a list: refused)
}
#: Flags read for the layout, the batch or the precision.
LAYOUT_FLAGS = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--virtual-pipeline-model-parallel-size", "--sequence-parallel", "--micro-batch-size", "--global-batch-size",
    "--seq-length", "--use-distributed-optimizer", "--recompute-granularity", "--recompute-method", "--recompute-modules",
    "--recompute-num-layers", "--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather", "--pipeline-model-parallel-layout",
    "--grad-reduce-in-bf16", "--fp8-param-gather", "--cpu-offloading", "--cpu-offloading-num-layers",
    "--overlap-moe-expert-parallel-comm", "--cuda-graph-impl", "--cuda-graph-scope", "--no-check-for-nan-in-loss-and-grad",
    "--moe-token-dispatcher-type", "--moe-enable-deepep", "--moe-flex-dispatcher-backend",
    "--use-custom-fsdp", "--num-virtual-stages-per-pipeline-rank", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--combined-1f1b", "--fp4-format", "--recompute-activations",
    "--checkpoint-activations", "--moe-use-legacy-grouped-gemm", "--use-precision-aware-optimizer", "--exp-avg-dtype",
    "--exp-avg-sq-dtype", "--main-params-dtype", "--main-grads-dtype", "--optimizer-cpu-offload",
    "--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d", "--moe-shared-expert-overlap",
    "--moe-pad-expert-input-to-capacity", "--rampup-batch-size",
}
#: Model flags whose presence gplan reads through the named model (checked as switches).
MODEL_SWITCHES = {
    "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--group-query-attention", "--normalization", "--position-embedding-type", "--rotary-base", "--kv-channels",
    "--max-position-embeddings", "--vocab-size", "--make-vocab-size-divisible-by", "--qk-layernorm",
    "--attention-dropout", "--hidden-dropout", "--window-size", "--moe-layer-freq", "--moe-grouped-gemm",
    "--moe-router-score-function", "--moe-router-enable-expert-bias",
    "--moe-shared-expert-intermediate-size", "--moe-router-num-groups", "--moe-router-group-topk",
    "--moe-router-topk-scaling-factor", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--moe-expert-capacity-factor",
    "--moe-token-drop-policy", "--tokenizer-type", "--mock-data", "--softmax-type", "--quick-geglu",
    "--glu-linear-offset", "--activation-func-clamp-value",
}

_FUSION = "a kernel fusion switch (within the per-layer efficiency gplan calibrates)"
_ROPE = "RoPE's numerics (elementwise, no GEMM)"
_TP_OVERLAP = "a detail of --tp-comm-overlap (priced as the overlap whole)"
_PROFILE = "profiling or a run-time check"
_NCCL = "NCCL's buffers, registration or in-network reduction (within the calibrated link efficiency)"
_OFFLOAD_DETAIL = "a detail of --optimizer-cpu-offload (its host copies' pinning, its CPU optimizer's class)"
_LOSS_SCALE = "fp16 loss scaling"
_CHECKPOINT = "checkpoint saving and loading (outside the step)"

#: Flags read without an effect on the layout or its cost, with the reason said beside the prediction.
MEGATRON_NO_EFFECT = {
    # kernel fusions and numerics of the router: inside the per-layer efficiency gplan calibrates
    "--moe-permute-fusion": "a fused permutation kernel (in the calibrated MoE efficiency)",
    "--moe-router-fusion": "a fused router kernel (in the calibrated MoE efficiency)",
    "--moe-router-dtype": "the router's softmax precision (a [tokens, experts] tensor)",
    "--moe-aux-loss-coeff": "a loss weight", "--moe-z-loss-coeff": "a loss weight",
    "--moe-router-load-balancing-type": "the balancing loss (the imbalance priced is --expert-imbalance)",
    "--moe-router-pre-softmax": "the router's score order", "--moe-router-bias-update-rate": "a router update rate",
    "--moe-router-padding-for-fp8": "pads routed tokens to the fp8 tile (at most 15 tokens per expert)",
    "--moe-router-padding-for-quantization": "pads routed tokens to the quantization tile",
    "--moe-router-force-load-balancing": "routing forced balanced (priced at --expert-imbalance, 1.0 unless given)",
    "--moe-per-layer-logging": "logging", "--moe-input-jitter-eps": "router noise",
    "--moe-hybridep-num-sms": "HybridEP's SM count (its dispatcher is read as flex)",
    "--moe-deepep-num-sms": "DeepEP's SM count (its dispatcher is read as flex)",
    "--moe-apply-probs-on-input": "where the routing weights multiply (elementwise)",
    "--moe-upcycling-granularity": "read with --moe-use-upcycling only",
    "--moe-pad-experts-for-cuda-graph-inference": "inference only", "--cache-mla-latents": "inference only",
    "--delay-wgrad-compute": "part of the expert all-to-all overlap (read with --overlap-moe-expert-parallel-comm)",
    "--combined-1f1b-recipe": "read with --combined-1f1b",
    "--distributed-timeout-minutes": "a timeout", "--distributed-timeout-seconds-after-init": "a timeout",
    "--no-create-attention-mask-in-dataloader": "data loading",
    "--cross-entropy-loss-fusion": "a fused loss kernel", "--cross-entropy-fusion-impl": "a fused loss kernel",
    "--use-mcore-models": "the default model implementation", "--use-flash-attn": "the attention kernel "
    "gplan prices", "--transformer-impl": "Megatron's own layers, priced as Transformer Engine's (the same GEMMs, its "
    "fused kernels in gplan's efficiencies; with --moe-grouped-gemm the experts' one grouped kernel is read: "
    "--legacy-grouped-gemm)",
    "--attention-backend": "the attention kernel (gplan prices the engine's fused one)",
    "--enable-experimental": "unlocks flags that are classified on their own",
    "--manual-gc": "Python garbage collection", "--manual-gc-interval": "Python garbage collection",
    "--no-manual-gc-eval": "Python garbage collection",
    "--use-separate-send-recv-groups": "pipeline send/receive on separate groups (same bytes)",
    "--no-rope-fusion": _FUSION, "--no-gradient-accumulation-fusion": _FUSION, "--no-bias-swiglu-fusion": _FUSION,
    "--no-masked-softmax-fusion": _FUSION, "--no-bias-gelu-fusion": _FUSION, "--no-bias-dropout-fusion": _FUSION,
    "--use-fused-weighted-squared-relu": _FUSION, "--no-persist-layer-norm": _FUSION, "--use-te-activation-func": _FUSION,
    "--no-gradient-reduce-div-fusion": _FUSION,
    "--no-overlap-p2p-communication": "pipeline sends are priced unoverlapped either way",
    "--overlap-p2p-communication-warmup-flush": "pipeline sends are priced unoverlapped either way",
    "--use-ring-exchange-p2p": "pipeline sends are priced unoverlapped either way",
    "--rotary-percent": _ROPE, "--rotary-interleaved": _ROPE, "--rotary-seq-len-interpolation-factor": _ROPE,
    "--use-rope-scaling": _ROPE, "--rope-scaling-factor": _ROPE, "--no-rope-freq": _ROPE, "--mrope-section": _ROPE,
    "--rope-type": _ROPE, "--rotary-scaling-factor": _ROPE, "--mscale": _ROPE, "--mscale-all-dim": _ROPE,
    "--use-rotary-position-embeddings": "the old spelling of --position-embedding-type rope (the model's)",
    "--no-position-embedding": "the model's position embedding (read through the model)",
    "--norm-epsilon": "normalization numerics", "--apply-layernorm-1p": "normalization numerics",
    "--apply-residual-connection-post-layernorm": "the residual's order (same operations)",
    "--openai-gelu": "the activation (same GEMMs)", "--squared-relu": "the activation (same GEMMs)",
    "--relative-attention-num-buckets": "T5's relative attention (not a GPT's)",
    "--relative-attention-max-distance": "T5's relative attention (not a GPT's)",
    "--onnx-safe": "ONNX export", "--bert-no-binary-head": "BERT only", "--mtp-loss-scaling-factor": "a loss weight",
    "--decrease-batch-size-if-needed": "only after a failure", "--check-for-spiky-loss": _PROFILE,
    "--check-for-large-grads": _PROFILE, "--no-check-for-nan-in-loss-and-grad": _PROFILE,
    "--check-weight-hash-across-dp-replicas-interval": _PROFILE, "--profile": _PROFILE,
    "--profile-step-start": _PROFILE, "--profile-step-end": _PROFILE, "--iterations-to-skip": _PROFILE,
    "--log-num-zeros-in-grad": "logging (the gradient's zeros, counted after the step)",
    "--moe-per-layer-logging": "logging (the router's per-layer statistics)",
    "--ckpt-fully-parallel-save": _CHECKPOINT, "--no-ckpt-fully-parallel-save": _CHECKPOINT,
    "--ckpt-fully-parallel-load": _CHECKPOINT, "--no-ckpt-fully-parallel-load": _CHECKPOINT,
    "--use-pytorch-profiler": _PROFILE, "--profile-ranks": _PROFILE, "--record-memory-history": _PROFILE,
    "--no-clone-scatter-output-in-embedding": "one [tokens, hidden] copy of the embedding's output",
    "--disable-gloo-process-groups": "host-side process groups", "--use-cpu-initialization": "initialization only",
    "--init-model-with-meta-device": "initialization only", "--lazy-mpu-init": "initialization only",
    "--local-rank": "set by the launcher", "--calculate-per-token-loss": "the loss's normalization",
    "--train-sync-interval": "host-device synchronization", "--empty-unused-memory-level": "allocator cache calls",
    "--tp-comm-overlap-cfg": _TP_OVERLAP, "--disable-tp-comm-overlap-ag": _TP_OVERLAP,
    "--disable-tp-comm-overlap-rs": _TP_OVERLAP, "--tp-comm-overlap-rs-dgrad": _TP_OVERLAP,
    "--disable-tp-comm-bulk-dgrad": _TP_OVERLAP, "--disable-tp-comm-bulk-wgrad": _TP_OVERLAP,
    "--disable-tp-comm-split-ag": _TP_OVERLAP, "--disable-tp-comm-split-rs": _TP_OVERLAP,
    "--tp-comm-bootstrap-backend": _TP_OVERLAP,
    "--use-torch-optimizer-for-cpu-offload": _OFFLOAD_DETAIL, "--no-pin-cpu-grads": _OFFLOAD_DETAIL,
    "--no-pin-cpu-params": _OFFLOAD_DETAIL,
    "--no-async-tensor-model-parallel-allreduce": "deprecated and ignored by Megatron",
    "--pipeline-model-parallel-comm-backend": "the pipeline's communicator library (same bytes)",
    "--high-priority-stream-groups": "stream priorities",
    "--loss-scale": _LOSS_SCALE, "--initial-loss-scale": _LOSS_SCALE, "--min-loss-scale": _LOSS_SCALE,
    "--loss-scale-window": _LOSS_SCALE, "--hysteresis": _LOSS_SCALE,
    "--apply-query-key-layer-scaling": "attention numerics", "--attention-softmax-in-fp32": "attention numerics",
    "--accumulate-allreduce-grads-in-fp32": "Megatron's own choice with bf16 (the reduction gplan prices)",
    "--fp16-lm-cross-entropy": "the loss's precision", "--disable-bf16-reduced-precision-matmul": "GEMM numerics",
    "--reuse-grad-buf-for-mxfp8-param-ag": "a buffer reuse of --fp8-param-gather with MXFP8",
    "--defer-embedding-wgrad-compute": "moves the head's weight-gradient GEMM to the pipeline flush",
    "--wgrad-deferral-limit": "read with --defer-embedding-wgrad-compute",
    "--no-align-grad-reduce": "when each stage starts its reduction", "--no-align-param-gather": "when each stage "
    "starts its gather", "--overlap-param-gather-with-optimizer-step": "the first bucket's gather timing",
    "--ddp-num-buckets": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-bucket-size": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-pad-buckets-for-high-nccl-busbw": "bucketing (the sync is priced as its bucketed overlap)",
    "--ddp-average-in-collective": "where the gradients are averaged",
    "--ddp-reduce-scatter-with-fp32-accumulation": "the reduction's accumulation",
    "--use-nccl-ub": _NCCL, "--disable-symmetric-registration": _NCCL, "--use-sharp": _NCCL,
    "--sharp-enabled-group": _NCCL, "--nccl-communicator-config-path": _NCCL,
    "--fsdp-double-buffer": "Megatron-FSDP's buffer reuse", "--suggested-communication-unit-size": "Megatron-FSDP's "
    "gather unit (priced layer by layer)",
    "--replication": "checkpoint replication", "--replication-jump": "checkpoint replication",
    "--replication-factor": "checkpoint replication",
    "--fp8-margin": "fp8 scaling numerics", "--fp8-interval": "fp8 scaling numerics (ignored by Megatron)",
    "--fp8-amax-history-len": "fp8 scaling numerics", "--fp8-amax-compute-algo": "fp8 scaling numerics",
    "--te-rng-tracker": "the random-number tracker", "--inference-rng-tracker": "inference only",
    "--cuda-graph-warmup-steps": "steps before the graphs are captured",
}
"""Flags of Megatron's layout groups (engines.megatron.arguments) that change neither the layout nor its
cost; flags of its other groups (data, tokenizer, checkpoints, learning rate, logging, evaluation, …) are
listed as not read."""

#: Megatron's defaults of flags newer than the arguments snapshot (engines.megatron.arguments) or from
#: development branches whose recipes use them; the snapshot holds the rest.
MEGATRON_DEFAULTS: dict[str, Any] = {
    "--fine-grained-activation-offloading": False, "--offload-modules": None, "--moe-flex-dispatcher-backend": None,
}
#: Flags gplan cannot price when set away from their default (a change to memory or time it has no term for).
MEGATRON_NOT_PRICED = {
    "--fine-grained-activation-offloading": "per-module activation offloading",
    "--offload-modules": "per-module activation offloading",
    "--optimizer": "another optimizer than Adam (its state differs)",
    "--batch-size": "the old spelling of --micro-batch-size: write --micro-batch-size",
    "--model-parallel-size": "the old spelling of --tensor-model-parallel-size: write that",
    "--distribute-saved-activations": "recompute inputs split over the tp ranks",
    "--deterministic-mode": "deterministic (slower) kernels", "--use-legacy-models": "Megatron's legacy models",
    "--fp32-residual-connection": "the residual stream in fp32",
    "--microbatch-group-size-per-virtual-pipeline-stage": "another interleaving of the micro-batches",
    "--distributed-backend": "collectives over gloo", "--no-scatter-gather-tensors-in-pipeline":
    "pipeline sends of the whole activation on every tp rank", "--keep-fp8-transpose-cache":
    "Megatron-FSDP's fp8 transpose cache", "--enable-full-sharding-in-hsdp": "hybrid sharding (HSDP)",
    "--num-distributed-optimizer-instances": "several distributed-optimizer instances (HSDP-like)",
    "--use-torch-fsdp2": "Megatron over torch FSDP2 (gplan prices Megatron-FSDP)",
    "--torch-fsdp2-no-reshard-after-forward": "Megatron over torch FSDP2 (gplan prices Megatron-FSDP)",
    "--cp-comm-type": "another context-parallel exchange than the p2p ring",
    "--hierarchical-context-parallel-sizes": "hierarchical context parallelism",
    "--use-tp-pp-dp-mapping": "another rank order (the links each group rides)",
    "--fp8-quantizer-factory": "a custom fp8 quantizer", "--fp4-quantizer-factory": "a custom fp4 quantizer",
    "--fp4-recipe": "another fp4 recipe than NVFP4", "--fp4-param-gather": "fp4 weights kept and gathered",
    "--no-fp8-wgrad": "weight gradients in higher precision", "--first-last-layers-bf16": "some layers kept in bf16",
    "--num-layers-at-start-in-bf16": "some layers kept in bf16", "--num-layers-at-end-in-bf16": "some layers kept in bf16",
    "--enable-cuda-graph": "its deprecated spelling: write --cuda-graph-impl local",
    "--external-cuda-graph": "its deprecated spelling: write --cuda-graph-impl transformer_engine",
    "--moe-layer-recompute": "its deprecated spelling: write --recompute-granularity selective --recompute-modules moe",
    "--moe-extended-tp": "its deprecated spelling: write --expert-tensor-parallel-size",
    "--moe-use-upcycling": "a checkpoint conversion, not a training run",
    "--encoder-num-layers": "an encoder-decoder model", "--decoder-num-layers": "an encoder-decoder model",
    "--heterogeneous-layers-config-path": "layers of different shapes",
    "--heterogeneous-layers-config-encoded-json": "layers of different shapes",
    "--spec": "a custom layer spec", "--yaml-cfg": "arguments in a YAML the launch names: pass that file",
    "--hybrid-attention-ratio": "a hybrid Mamba model", "--hybrid-mlp-ratio": "a hybrid Mamba model",
    "--hybrid-override-pattern": "a hybrid Mamba model", "--mamba-state-dim": "a hybrid Mamba model",
    "--mamba-head-dim": "a hybrid Mamba model", "--mamba-num-groups": "a hybrid Mamba model",
    "--mamba-num-heads": "a hybrid Mamba model", "--is-hybrid-model": "a hybrid Mamba model",
    "--disable-mamba-mem-eff-path": "a hybrid Mamba model",
}
MEGATRON_LAYOUT_LIKE = re.compile(r"parallel|pipeline|recompute|checkpoint-activations|batch|expert|fsdp|offload|"
                                  r"zero|overlap|fp8|fp4|moe|mtp|cuda-graph|num-layers|seq-length|hidden|heads")
"""A flag outside the snapshot that matches this could change the layout or its cost: refused unless at
its default."""


def megatron_class(flag: str, values: list[str]) -> tuple[str, str]:
    """("no effect", why) or ("refused", why) for a Megatron flag the launch reader does not read: at its
    default (Megatron's arguments.py, engines.megatron.arguments) it changes nothing; else as classified."""
    from gplan.engines.megatron.arguments import arguments

    known = arguments()
    default = known[flag][1] if flag in known else MEGATRON_DEFAULTS.get(flag, "<none>")
    if default != "<none>" and at_default(values, default):
        return "no effect", "at Megatron's default"
    if flag in MEGATRON_NOT_PRICED:
        return "refused", MEGATRON_NOT_PRICED[flag]
    if flag in MEGATRON_NO_EFFECT:
        return "no effect", MEGATRON_NO_EFFECT[flag]
    if flag in known or MEGATRON_LAYOUT_LIKE.search(flag):
        return "refused", "would change the layout or its cost"
    return "no effect", "not a layout setting"


def at_default(values: list[str] | Any, default: Any) -> bool:
    """Whether a flag's values (a store_true switch has none: True) equal its default."""
    if isinstance(values, list):
        if not values and not (isinstance(default, bool) or default is None):
            return False  # a bare flag where the parser wants a value: not the default
        given: Any = True if not values else (values[0] if len(values) == 1 else values)
    else:
        given = values
    if isinstance(default, bool) or default is None:
        if default is None:
            return given in (None, "None", "none", "null")
        return str(given).lower() in (("true", "1") if default else ("false", "0"))
    try:
        return float(given) == float(default)
    except (TypeError, ValueError):
        return str(given) == str(default)

