#!/bin/bash
# Written for gplan's corpus: a Megatron-LM launch of Llama 3 8B with Megatron-FSDP under its older flag
# name (--use-custom-fsdp, before megatron-core 0.14 renamed it --use-megatron-fsdp) and full sharding, the
# flags as Megatron-LM's examples/llama scripts write them, on 2 nodes of 8 GPUs.
GPUS_PER_NODE=8
NNODES=2
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 \
    --seq-length 8192 --max-position-embeddings 8192 \
    --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --swiglu \
    --untie-embeddings-and-output-weights --disable-bias-linear \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B \
    --micro-batch-size 1 --global-batch-size 128 \
    --use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params \
    --no-gradient-accumulation-fusion --overlap-grad-reduce --overlap-param-gather \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --bf16 --lr 3e-4 --min-lr 3e-5 --train-iters 1000 --log-interval 1 \
    --data-path /data/llama3_text_document --split 99,1,0 --save /ckpt --save-interval 500
