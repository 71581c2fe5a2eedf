# Several runs in one file, as the zoo's best-practice scripts hold them (best_practice/DeepSeekV3/run.sh).
export MODEL=Qwen3-235B-A22B
A2A_OVERLAP=1 PP=8 VPP=4 TP=2 EP=32 NNODES=32 GBS=2048 PR=bf16 bash sbatch_benchmarking.sh \
    --recompute-granularity selective --recompute-modules layernorm moe_act
A2A_OVERLAP=0 PP=4 VPP=6 TP=1 EP=64 NNODES=32 GBS=2048 PR=bf16 bash sbatch_benchmarking.sh
