#!/bin/bash
# Written for gplan in the shape of NVIDIA/Megatron-LM examples/deepseek2_lite/train_deepseek2_lite_h100_fp8.sh:
# sizes in variables (one of them arithmetic), flags in bash arrays, an FP8 block and a mock-data block behind
# `if` tests the script's own variables rule out, array elements that hold a flag with its value.
CHECKPOINT_PATH=${1:-"checkpoints/ds2_lite"}
DATA_ARG=${4:-"dataset/wiki_text_document"}     # data prefix, or "MOCK"
TOKENIZER_ARG="deepseek-ai/DeepSeek-V2-Lite"
GPUS_PER_NODE=8
NUM_NODES=1
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
TP_SIZE=8
CP_SIZE=1
PP_SIZE=1
MICRO_BATCH_SIZE=1
GLOBAL_BATCH_SIZE=64
NUM_LAYERS=16 
MOE_LAYERS=$(($NUM_LAYERS-1))
DTYPE="bf16"
SEQ_LENGTH=1024

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
GPT_ARGS=(
    --num-layers $NUM_LAYERS 
    --hidden-size 2048 
    --ffn-hidden-size 10944 
    --num-attention-heads 16 
    --seq-length $SEQ_LENGTH 
    --max-position-embeddings $SEQ_LENGTH 
    --disable-bias-linear 
    --untie-embeddings-and-output-weights 
    --normalization RMSNorm 
    --swiglu 
    --tokenizer-type HuggingFaceTokenizer 
    --transformer-impl local  # MCore's own layers
)
MLA_ARGS=(
    --multi-latent-attention 
    --kv-lora-rank 512 
    --v-head-dim 128 
    --qk-head-dim 128 
    --qk-layernorm 
    --qk-pos-emb-head-dim 64 
)
MOE_ARGS=(
    --num-experts 64 
    --moe-layer-freq "([0]+[1]*$MOE_LAYERS)" 
    --moe-ffn-hidden-size 1408 
    --moe-grouped-gemm 
    --moe-router-topk 6 
    --moe-shared-expert-intermediate-size 2816 
    --moe-token-dispatcher-type alltoall 
)
TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --lr 0.00015
    --bf16
    --grad-reduce-in-bf16
)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-param-gather"
    )
fi
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --context-parallel-size $CP_SIZE
    --pipeline-model-parallel-size $PP_SIZE
    --sequence-parallel
)
DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
DATA_ARGS_LIST=()
if [[ "$TOKENIZER_ARG" == "MOCK" ]] || [[ "$DATA_ARG" == "MOCK" ]]; then
    DATA_ARGS_LIST+=(
        "--mock-data"
        "--vocab-size 128256"
    )
else
    DATA_ARGS_LIST+=(
        "--data-path $DATA_ARG"
        "--tokenizer-model $TOKENIZER_ARG"
        "--vocab-size 102400"
    )
fi
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_ARGS[@]} \
    ${MLA_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${DTYPE_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS_LIST[@]} \
    --save "$CHECKPOINT_PATH"
