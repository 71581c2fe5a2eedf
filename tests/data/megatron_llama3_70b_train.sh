#!/bin/bash
# A Megatron-LM launch of Llama 3 70B on 8 nodes of 8 H100 as a team writes it (data, tokenizer, checkpoints,
# schedule and logging beside the layout), from Megatron-LM's examples/llama conventions.
GPUS_PER_NODE=8
NNODES=${NNODES:-8}
CHECKPOINT_PATH=/checkpoints/llama3-70b
DATA_PATH=/data/redpajama_text_document

GPT_MODEL_ARGS=(
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --rotary-base 500000
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 512
    --train-iters 250000
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 2000
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
    --bf16
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --sequence-parallel
    --use-distributed-optimizer
)
DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-70B
    --split 99,1,0
)
EVAL_AND_LOGGING_ARGS=(
    --log-interval 10 --save-interval 1000 --eval-interval 1000 --eval-iters 10
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH --tensorboard-dir /logs/tb
)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]} ${EVAL_AND_LOGGING_ARGS[@]}
