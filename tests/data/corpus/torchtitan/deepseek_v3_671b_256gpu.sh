# A multi-node launch of torchtitan's DeepSeek-V3 671B TOML with pipeline and expert parallel overrides on the
# command line, as torchtitan's pull requests launch their large MoE runs (torchrun per node, the TOML named by
# --job.config_file, `--section.key value` overrides after it): 32 nodes of 8 GPUs.
torchrun --nnodes 32 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint $MASTER:29500 -m torchtitan.train \
    --job.config_file ./deepseek_v3_671b.toml \
    --parallelism.pipeline_parallel_degree 8 --parallelism.expert_parallel_degree 32 \
    --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatch_size 1
