#!/bin/bash
# gplan export of plan 48660b8c4549f069 (layout 87a0eec3aee1c53c; llama3-70b: dp=16 tp=4 pp=1 mbs=1 zero=3 sp, recompute 2 full of 80 layers, predicted 62.268 s/step)
# written for Megatron-LM core_r0.16 (pretrain_gpt.py; megatron/training/arguments.py as on main at 000c4ac, 2026)
# Run from a Megatron-LM checkout, the same command on every node (NODE_RANK 0..NNODES-1).
# note: priced for torch, run by megatron; re-priced as megatron runs it: 54.451 s/step (-12.6% on the plan's 62.268); search with --target megatron for a plan it runs exactly
set -euo pipefail
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP needs it unset or > 1
MEGATRON_ARGS=(
  --num-layers 80
  --hidden-size 8192
  --ffn-hidden-size 28672
  --num-attention-heads 64
  --seq-length 8192
  --max-position-embeddings 8192
  --normalization RMSNorm
  --position-embedding-type rope
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --rotary-base 500000
  --group-query-attention
  --num-query-groups 8
  --swiglu
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --bf16
  --vocab-size 128255
  --make-vocab-size-divisible-by 64
  --tensor-model-parallel-size 4
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --micro-batch-size 1
  --global-batch-size 512
  --sequence-parallel
  --tp-comm-overlap
  --overlap-grad-reduce
  --overlap-param-gather
  --use-distributed-optimizer
  --use-megatron-fsdp
  --data-parallel-sharding-strategy optim_grads_params
  --ckpt-format fsdp_dtensor
  --recompute-granularity full
  --recompute-method block
  --recompute-num-layers 2
  --mock-data
  --tokenizer-type NullTokenizer
  --train-iters 100
  --lr 3.0e-4
  --log-interval 1
)
torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node 8 --rdzv-backend static --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --max-restarts 0 --monitor-interval 0.5 pretrain_gpt.py "${MEGATRON_ARGS[@]}" "$@"
