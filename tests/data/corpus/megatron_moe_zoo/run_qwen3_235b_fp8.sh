# The same model in the zoo's fp8 recipe (PR=fp8: blockwise fp8, bf16 Adam moments), 1F1B all-to-all overlap.
NNODES=32 MODEL=Qwen3-235B-A22B TP=2 PP=8 VPP=4 EP=32 CP=1 MBS=1 GBS=2048 PR=fp8 A2A_OVERLAP=1 bash sbatch_benchmarking.sh
