"""The MindSpore backend: msrun, semi-automatic parallelism with shard() strategies, HCCL on Ascend.

`launcher` and `strategy` import no MindSpore; only `worker` does.
"""
