# Qwen3-235B-A22B on 256 H100 (32 nodes), the model zoo's first H100 row (best_practice/qwen3/readme.md:
# TP 2, PP 8, VPP 4, EP 32, MBS 1, GBS 2048, DeepEP, recompute of norm and activation), launched the way
# its README launches runs.
NNODES=32 MODEL=Qwen3-235B-A22B TP=2 PP=8 VPP=4 EP=32 CP=1 MBS=1 GBS=2048 SEQ_LEN=4096 PR=bf16 A2A_OVERLAP=0 DISPATCHER=deepep bash sbatch_benchmarking.sh --recompute-granularity selective --recompute-modules layernorm moe_act
