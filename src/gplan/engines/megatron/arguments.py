"""Megatron-LM's training arguments that can touch the layout or its cost, as its parser defines them:
each flag of the argument groups network size, regularization (dropout), training, mixed precision,
distributed, Transformer-Engine, the CUDA-graph flags of inference, moe, mla, heterogeneous architecture
and experimental, with its default — `off` for a switch (store_true or store_false: giving it is a change).

Source: NVIDIA/Megatron-LM `megatron/training/arguments.py` at main 000c4ac (2026), the `add_argument`
calls of `_add_network_size_args`, `_add_regularization_args`, `_add_training_args`,
`_add_mixed_precision_args`, `_add_distributed_args`, `_add_transformer_engine_args`, `_add_inference_args`,
`_add_moe_args`, `_add_mla_args`, `_add_heterogeneous_args` and `_add_experimental_args`. The other groups
(logging, checkpointing, data, tokenizer, learning rate, initialization, validation, rl, retro, …) set
nothing a step's time or memory depends on. Megatron-LM is not on the package index, so this list is the
snapshot every flag is classified against (engines.megatron.flags; tests/cli/test_corpus.py fails on a
flag here that nobody classified): to refresh it for a newer release, rewrite it from that release's
arguments.py.
"""

from __future__ import annotations

SOURCE = "NVIDIA/Megatron-LM megatron/training/arguments.py (main at 000c4ac, 2026)"

ARGUMENTS = """
[network size]
--num-layers None
--encoder-num-layers None
--decoder-num-layers None
--hidden-size None
--ffn-hidden-size None
--num-attention-heads None
--attention-backend auto
--kv-channels None
--group-query-attention off
--num-query-groups 1
--softmax-type vanilla
--window-size None
--window-attn-skip-freq None
--max-position-embeddings None
--position-embedding-type learned_absolute
--relative-attention-num-buckets 32
--relative-attention-max-distance 128
--use-rotary-position-embeddings off
--rotary-base 10000
--rotary-percent 1.0
--rotary-interleaved off
--rotary-seq-len-interpolation-factor None
--use-rope-scaling off
--rope-scaling-factor 8.0
--no-rope-freq None
--no-position-embedding off
--mrope-section None
--make-vocab-size-divisible-by 128
--normalization LayerNorm
--norm-epsilon 1e-05
--apply-layernorm-1p off
--apply-residual-connection-post-layernorm off
--openai-gelu off
--squared-relu off
--swiglu off
--quick-geglu off
--activation-func-clamp-value None
--glu-linear-offset 0.0
--onnx-safe None
--bert-no-binary-head off
--untie-embeddings-and-output-weights off
--multi-latent-attention off
--mtp-num-layers None
--mtp-loss-scaling-factor 0.1
[regularization]
--attention-dropout 0.1
--hidden-dropout 0.1
[training]
--micro-batch-size None
--batch-size None
--global-batch-size None
--rampup-batch-size None
--decrease-batch-size-if-needed off
--recompute-activations off
--recompute-granularity None
--no-check-for-nan-in-loss-and-grad off
--check-for-spiky-loss off
--check-for-large-grads off
--distribute-saved-activations off
--recompute-method None
--recompute-num-layers None
--recompute-modules None
--cpu-offloading-num-layers 0
--no-clone-scatter-output-in-embedding off
--profile off
--profile-step-start 10
--profile-step-end 12
--iterations-to-skip []
--disable-gloo-process-groups off
--use-pytorch-profiler off
--profile-ranks [0]
--record-memory-history off
--tp-comm-overlap off
--tp-comm-overlap-cfg None
--disable-tp-comm-overlap-ag off
--disable-tp-comm-overlap-rs off
--tp-comm-overlap-rs-dgrad off
--disable-tp-comm-bulk-dgrad off
--disable-tp-comm-bulk-wgrad off
--tp-comm-bootstrap-backend nccl
--use-cpu-initialization off
--empty-unused-memory-level 0
--deterministic-mode off
--check-weight-hash-across-dp-replicas-interval None
--calculate-per-token-loss off
--train-sync-interval None
--checkpoint-activations off
--no-masked-softmax-fusion off
--no-bias-gelu-fusion off
--no-bias-swiglu-fusion off
--use-fused-weighted-squared-relu off
--no-bias-dropout-fusion off
--no-rope-fusion off
--rope-type None
--cross-entropy-loss-fusion off
--cross-entropy-fusion-impl native
--use-flash-attn off
--disable-bias-linear off
--add-qkv-bias off
--optimizer adam
--optimizer-cpu-offload off
--optimizer-offload-fraction 1.0
--use-torch-optimizer-for-cpu-offload off
--overlap-cpu-optimizer-d2h-h2d off
--no-pin-cpu-grads off
--no-pin-cpu-params off
--no-async-tensor-model-parallel-allreduce off
--no-persist-layer-norm off
--sequence-parallel off
--no-gradient-accumulation-fusion off
--use-mcore-models off
--use-legacy-models off
--manual-gc off
--manual-gc-interval 0
--no-manual-gc-eval off
--disable-tp-comm-split-ag off
--disable-tp-comm-split-rs off
--pipeline-model-parallel-comm-backend None
--high-priority-stream-groups []
--use-te-activation-func off
[mixed precision]
--fp16 off
--bf16 off
--grad-reduce-in-bf16 off
--loss-scale None
--initial-loss-scale 4294967296
--min-loss-scale 1.0
--loss-scale-window 1000
--hysteresis 2
--fp32-residual-connection off
--apply-query-key-layer-scaling off
--attention-softmax-in-fp32 off
--accumulate-allreduce-grads-in-fp32 off
--fp16-lm-cross-entropy off
--disable-bf16-reduced-precision-matmul off
--reuse-grad-buf-for-mxfp8-param-ag off
[distributed]
--tensor-model-parallel-size 1
--pipeline-model-parallel-size 1
--decoder-first-pipeline-num-layers None
--decoder-last-pipeline-num-layers None
--pipeline-model-parallel-layout None
--model-parallel-size None
--num-layers-per-virtual-pipeline-stage None
--num-virtual-stages-per-pipeline-rank None
--microbatch-group-size-per-virtual-pipeline-stage None
--no-overlap-p2p-communication off
--overlap-p2p-communication-warmup-flush off
--distributed-backend nccl
--distributed-timeout-minutes 10
--distributed-timeout-seconds-after-init None
--overlap-grad-reduce off
--defer-embedding-wgrad-compute off
--wgrad-deferral-limit 0
--no-align-grad-reduce off
--ddp-num-buckets None
--ddp-bucket-size None
--ddp-pad-buckets-for-high-nccl-busbw off
--ddp-reduce-scatter-with-fp32-accumulation off
--ddp-average-in-collective off
--overlap-param-gather off
--overlap-param-gather-with-optimizer-step off
--no-align-param-gather off
--no-scatter-gather-tensors-in-pipeline off
--use-ring-exchange-p2p off
--local-rank 0
--lazy-mpu-init None
--account-for-embedding-in-pipeline-split off
--account-for-loss-in-pipeline-split off
--use-distributed-optimizer off
--use-nccl-ub off
--disable-symmetric-registration off
--use-sharp off
--sharp-enabled-group None
--use-megatron-fsdp off
--init-model-with-meta-device off
--data-parallel-sharding-strategy no_shard
--no-gradient-reduce-div-fusion off
--fsdp-double-buffer off
--suggested-communication-unit-size None
--keep-fp8-transpose-cache off
--enable-full-sharding-in-hsdp off
--num-distributed-optimizer-instances 1
--use-torch-fsdp2 off
--torch-fsdp2-no-reshard-after-forward off
--context-parallel-size 1
--cp-comm-type p2p
--hierarchical-context-parallel-sizes None
--nccl-communicator-config-path None
--use-tp-pp-dp-mapping off
--replication off
--replication-jump None
--replication-factor 2
[Transformer-Engine]
--fp8-format None
--fp8-recipe delayed
--fp8-quantizer-factory None
--fp8-margin 0
--fp8-interval 1
--fp8-amax-history-len 1
--fp8-amax-compute-algo most_recent
--no-fp8-wgrad off
--transformer-impl transformer_engine
--fp8-param-gather off
--first-last-layers-bf16 off
--num-layers-at-start-in-bf16 1
--num-layers-at-end-in-bf16 1
--fp4-format None
--fp4-recipe nvfp4
--fp4-quantizer-factory None
--fp4-param-gather off
--te-rng-tracker off
--inference-rng-tracker off
[inference: CUDA graphs]
--enable-cuda-graph off
--cuda-graph-warmup-steps 3
--external-cuda-graph off
--cuda-graph-impl none
--cuda-graph-scope full
[moe]
--expert-model-parallel-size 1
--expert-tensor-parallel-size None
--num-experts None
--moe-layer-freq 1
--moe-ffn-hidden-size None
--moe-shared-expert-intermediate-size None
--moe-shared-expert-overlap off
--moe-grouped-gemm off
--moe-use-legacy-grouped-gemm off
--moe-layer-recompute off
--moe-extended-tp off
--moe-use-upcycling off
--moe-router-load-balancing-type aux_loss
--moe-router-dtype None
--moe-router-fusion off
--moe-router-score-function softmax
--moe-router-topk 2
--moe-router-pre-softmax off
--moe-router-num-groups None
--moe-router-group-topk None
--moe-router-topk-scaling-factor None
--moe-router-enable-expert-bias off
--moe-router-bias-update-rate 0.001
--moe-router-force-load-balancing off
--moe-router-padding-for-fp8 off
--moe-aux-loss-coeff 0.0
--moe-z-loss-coeff None
--moe-input-jitter-eps None
--moe-per-layer-logging off
--moe-token-dispatcher-type allgather
--moe-enable-deepep off
--moe-deepep-num-sms 20
--moe-permute-fusion off
--moe-expert-capacity-factor None
--moe-pad-expert-input-to-capacity off
--moe-token-drop-policy probs
--moe-apply-probs-on-input off
--overlap-moe-expert-parallel-comm off
--delay-wgrad-compute off
--moe-upcycling-granularity 1
--moe-pad-experts-for-cuda-graph-inference off
[mla]
--q-lora-rank None
--kv-lora-rank 32
--qk-head-dim 128
--qk-pos-emb-head-dim 64
--v-head-dim 128
--rotary-scaling-factor 1.0
--mscale 1.0
--mscale-all-dim 0.0
--cache-mla-latents off
[heterogeneous architecture]
--heterogeneous-layers-config-path None
--heterogeneous-layers-config-encoded-json None
[experimental]
--enable-experimental off
--spec None
--hybrid-attention-ratio 0.0
--hybrid-mlp-ratio 0.0
--hybrid-override-pattern None
--mamba-state-dim 128
--mamba-head-dim 64
--mamba-num-groups 8
--mamba-num-heads None
--is-hybrid-model off
--disable-mamba-mem-eff-path off
--yaml-cfg None
--use-precision-aware-optimizer off
--main-grads-dtype fp32
--main-params-dtype fp32
--exp-avg-dtype fp32
--exp-avg-sq-dtype fp32
"""


def arguments() -> dict[str, tuple[str, object]]:
    """flag -> (its argument group, its default: False for a switch, None, or the default as written)."""
    found: dict[str, tuple[str, object]] = {}
    group = ""
    for line in ARGUMENTS.strip().splitlines():
        if line.startswith("["):
            group = line.strip("[]")
            continue
        flag, default = line.split(" ", 1)
        found[flag] = (group, False if default == "off" else None if default == "None" else default)
    return found
