#!/bin/bash
# gplan export of plan 48660b8c4549f069 (layout 87a0eec3aee1c53c; llama3-70b: dp=16 tp=4 pp=1 mbs=1 zero=3 sp, recompute 2 full of 80 layers, predicted 62.268 s/step)
# written for torchtitan 0.3.0 (torchtitan.train, ConfigManager; checked by its own parser)
# Run from a torchtitan install, the same command on every node; gplan_torchtitan.py (beside this
# script) holds the model and the pipeline chunks.
# note: torchtitan recomputes 80f where the plan has 2f; re-priced as torchtitan runs it: 82.009 s/step (+31.7% on the plan's 62.268); search with --target torchtitan for a plan it runs exactly
set -euo pipefail
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
OVERRIDES=(
  --training.local_batch_size 1
  --training.global_batch_size 512
  --training.seq_len 8192
  --training.steps 100
  --training.mixed_precision_param bfloat16
  --parallelism.data_parallel_replicate_degree 1
  --parallelism.data_parallel_shard_degree 16
  --parallelism.fsdp_reshard_after_forward always
  --parallelism.tensor_parallel_degree 4
  --parallelism.enable_sequence_parallel
  --parallelism.context_parallel_degree 1
  --parallelism.pipeline_parallel_degree 1
)
torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node 8 --rdzv-backend static --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --max-restarts 0 --monitor-interval 0.5 -m torchtitan.train --module gplan_torchtitan --config gplan_plan "${OVERRIDES[@]}" "$@"
