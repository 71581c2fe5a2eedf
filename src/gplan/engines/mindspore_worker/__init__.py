"""gplan's own MindSpore worker (backends/mindspore): the Llama family; MindSpore's Pipeline cell runs 1F1B."""

from gplan.engines.profile import ALL_ZERO, Capabilities, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="mindspore", title="gplan's MindSpore worker (msrun, HCCL)", order=1, launches=True,
    runs_in_short="1F1B / interleaved, Llama family, per-layer recompute",
    memory_in_short="mixed-precision states",
    capabilities=Capabilities("mindspore", frozenset({"1f1b", "interleaved_1f1b"}), microbatches_at_least_stages=True,
                              cp=False, tied_embeddings_across_stages=False, recompute="per_layer", uneven_split=True,
                              zero=ALL_ZERO, zero_with_pp=ALL_ZERO, encoder_decoder=False, llama_family_only=True),
    memory=MemoryAccounting(),  # optimizer parallel keeps Megatron's mixed-precision states,
    resharding=Resharding(
        "MindSpore checkpoints with their strategy files", frozenset({"dp", "zero"}),
        "gplan's MindSpore worker writes no checkpoint yet: only the data-parallel layout it runs can change",
        conversion="mindspore.transform_checkpoints with the strategy files"),
)
