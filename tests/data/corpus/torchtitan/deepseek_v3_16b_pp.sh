# A torchtitan launch of the DeepSeek-V3 16B TOML with a pull request's overrides on the command line
# (torchtitan's run_train.sh: NGPU and CONFIG_FILE in the environment, `--section.key value` after it),
# pipeline over 2 ranks with the TOML's Interleaved1F1B and no layers-per-stage (two stages per rank).
NGPU=8 CONFIG_FILE="./deepseek_v3_16b.toml" ./run_train.sh --parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 --training.local_batch_size 4 --parallelism.pipeline_parallel_microbatch_size 1
