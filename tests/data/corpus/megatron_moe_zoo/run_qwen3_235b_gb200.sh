# Qwen3-235B-A22B on 256 GB200 (64 trays of 4), the model zoo's GB200 BF16 line (best_practice/qwen3/
# run_gb200_235b.sh: HybridEP, TP 1, PP 8, EP 8, MBS 1, GBS 8192, CUDA graphs of attention, router and
# preprocessing), with the export its script makes and no cluster config (GB200_CLUSTER unset).
export NVLINK_DOMAIN_SIZE=72
export MODEL=${MODEL:-Qwen3-235B-A22B}
export SEQ_LEN=${SEQ_LEN:-4096}
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_GRAPH_REGISTER=0 DISPATCHER=hybridep SEGMENT=2 PR=bf16 A2A_OVERLAP=0 TP=1 PP=8 VPP=1 EP=8 NNODES=64 MBS=1 GBS=8192 bash ./sbatch_benchmarking.sh --moe-router-force-load-balancing --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess
