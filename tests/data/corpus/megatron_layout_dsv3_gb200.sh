#!/bin/bash
# Written for gplan's corpus with the parallel flags of Megatron-LM's DeepSeek-V3 GB200 reproduction guide
# (a quoted --pipeline-model-parallel-layout with a repeated group, combined 1F1B with the expert
# all-to-all overlap recipe), the model flags of DeepSeek-V3 (bundled deepseek-v3), 64 nodes of 4 GPUs.
NNODES=64
GPUS_PER_NODE=4
ARGS=(
    --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
    --num-experts 256 --moe-ffn-hidden-size 2048 --moe-router-topk 8 --moe-shared-expert-intermediate-size 2048
    --moe-layer-freq "([0]*3+[1]*58)" --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5
    --moe-grouped-gemm --moe-permute-fusion --moe-router-dtype fp32 --moe-aux-loss-coeff 1e-4
    --moe-router-load-balancing-type seq_aux_loss
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3
    --seq-length 4096 --max-position-embeddings 4096 --normalization RMSNorm --swiglu --position-embedding-type rope
    --untie-embeddings-and-output-weights --disable-bias-linear
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 8 --expert-model-parallel-size 32
    --pipeline-model-parallel-layout "Et|(tt|)*30L"
    --combined-1f1b --combined-1f1b-recipe ep_a2a
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep
    --micro-batch-size 1 --global-batch-size 2048 --use-distributed-optimizer
    --recompute-granularity selective --recompute-modules mla_up_proj mlp
    --bf16
)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py "${ARGS[@]}"
