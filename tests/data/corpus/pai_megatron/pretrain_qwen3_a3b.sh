# Written for gplan in the shape of alibaba/Pai-Megatron-Patch examples/qwen3/README.md's pre-training example:
# the script called with its 27 arguments (A3B, mbs 1, gbs 8, seq 128, bf16, tp 4, pp 2, cp 1, etp 1, ep 4, sp,
# distributed optimizer, flash attention, pre-training, selective recompute) on a DLC job of nodes it names.
cd /workspace/Pai-Megatron-Patch/examples/qwen3
sh run_mcore_qwen3.sh  \
dlc  \
A3B   \
1    \
8 \
1e-5   \
1e-6   \
128  \
128  \
bf16  \
4   \
2  \
1 \
1 \
4 \
true \
true   \
true \
false \
sel   \
false \
100000  \
/mnt/qwen-datasets/mmap_qwen3_datasets_text_document   \
/mnt/qwen-datasets/mmap_qwen3_datasets_text_document   \
/mnt/qwen-ckpts/Qwen3-30B-A3B-to-mcore  \
10000  \
100   \
/mnt/logs/output_mcore_qwen3_pretrain
