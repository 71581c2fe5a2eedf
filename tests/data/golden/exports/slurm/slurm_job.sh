#!/bin/bash
# gplan export of plan 48660b8c4549f069 (layout 87a0eec3aee1c53c; llama3-70b: dp=16 tp=4 pp=1 mbs=1 zero=3 sp, recompute 2 full of 80 layers, predicted 62.268 s/step)
# written for SLURM (sbatch, srun) with torchrun c10d rendezvous (a heterogeneous job, one component per node group, with static rendezvous when stages need different hardware)
#SBATCH --job-name=gplan-llama3-70b
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
set -euo pipefail
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export GPLAN_PG_TIMEOUT_S=300
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
srun --nodes=8 --ntasks-per-node=1 torchrun --nnodes 8 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:29500" --rdzv-id "$SLURM_JOB_ID" --max-restarts 0 --monitor-interval 0.5 -m gplan.backends.torch.worker --plan /jobs/plan.json --run-dir gplan-run --steps 10 --warmup-steps 2 --lr 0.003 --seed 0 --device auto
