#!/bin/bash
#SBATCH --job-name=gplan-tiny-llama
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --exclusive
set -euo pipefail
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export GPLAN_PG_TIMEOUT_S=300
export OMP_NUM_THREADS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
srun --nodes=2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:29500" --rdzv-id "$SLURM_JOB_ID" --max-restarts 0 --monitor-interval 0.5 -m gplan.backends.torch.worker --plan /runs/job/plan.json --run-dir /runs/job --steps 100 --warmup-steps 2 --lr 0.003 --seed 0 --device auto
