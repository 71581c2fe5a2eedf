# Mixtral-8x22B with token dropping at capacity factor 1.0, every expert padded to its capacity (Megatron-MoE-ModelZoo best_practice/Mixtral/run_mixtral_8x22B.sh, its second line)
MODEL=Mixtral-8x22B DISPATCHER=alltoall bash ./sbatch_benchmarking.sh --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity
