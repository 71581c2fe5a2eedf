"""Megatron-DeepSpeed: its pipeline engine takes ZeRO ≤ 1; its partition method (type:transformer) splits
the layers evenly; its pipeline engine checkpoints every layer (--checkpoint-activations), selective is
Megatron's core-attention recompute on every layer. Experts: DeepSpeed-MoE layers in Megatron-DeepSpeed's
GPT (every layer, Mixtral-shaped), without pp, with ZeRO ≤ 2."""

from gplan.engines.profile import ALL_ZERO, Capabilities, DCP_RESHARDS, EngineProfile, MemoryAccounting, Resharding

ENGINE = EngineProfile(
    name="deepspeed", title="DeepSpeed (Megatron-DeepSpeed)", order=4,
    runs_in_short="1F1B, even split, ZeRO ≤ 1 with pp, Mixtral-shaped MoE without pp, ZeRO ≤ 2",
    memory_in_short=("ZeRO optimizers, 5·10⁸-element bucket, 0.295 reserve (BLOOM fit; ZeRO-3: 0.074, SC21's outcomes)"),
    capabilities=Capabilities("deepspeed", frozenset({"1f1b"}), microbatches_at_least_stages=False, cp=False,
                              tied_embeddings_across_stages=True, recompute="every_layer", uneven_split=False,
                              zero=ALL_ZERO, zero_with_pp=frozenset({0, 1}), encoder_decoder=False, experts=True,
                              expert_tp="etp1", experts_with_pp=False, token_dropping=True,
                              expert_families=frozenset({"mixtral"}),
                              # DeepSpeed's engine builds its ZeRO-1/2 optimizer with `has_moe_layers` (experts'
                              # states partitioned over the expert data-parallel group) and asserts "MoE not
                              # supported with Stage 3" (runtime/engine.py, _configure_zero_optimizer)
                              expert_zero=frozenset({0, 1, 2})),
    memory=MemoryAccounting(
        states="zero_optimizers",
        # its default reduce_bucket_size (runtime/zero/config.py), the 16-bit gradient bucket of ZeRO 1/2
        reduce_bucket_elements=5e8,
        # ZeRO-3 keeps at most stage3_max_live_parameters gathered (runtime/zero/config.py default, 1e9)
        zero3_live_params=1e9,
        # Megatron-DeepSpeed (2022, PyTorch 1.11, no expandable segments; its pipeline engine's buffers not
        # itemised): fitted by `bench/memory.py --fit` on the 32 measured peaks of the BLOOM sweep (S12)
        fragmentation=0.295,
        # ZeRO-3 never runs in the pipeline engine those peaks measure (PipelineEngine asserts "ZeRO-2 and ZeRO-3
        # are incompatible with pipeline parallelism", runtime/pipe/engine.py); its own is bracketed by SC21's
        # 530B at micro-batch 4, which ran on 640 A100s and did not fit 560 (Table 2's note): every fraction in
        # [0.058, 0.090] calls both (`bench/memory.py` prints it); this is the midpoint. No ZeRO-3 peak is
        # measured in any source here.
        zero3_fragmentation=0.074),
    # ZeRO-3 as SC21 ran it (DeepSpeed of early 2021; GPT 175B and 530B on 384–2240 A100s, Table 2,
    # bench/data/sc21_zero3_runs.csv): each parameter gathered by its own call and waited for (issue #1069, PR #1188),
    # so no collective hides (overlap 0), each call pays the ring's latency, ~0.38 ms of host time (#1069's
    # profile) and one copy kernel per rank (the list all_gather; a launch taken as 5 µs, not fitted). Those list
    # all-gathers of one tensor's slices reach 0.46 of the ring's speed: fitted by `bench/accuracy.py --fit` on the
    # six runs (at the ring's speed, nothing fitted, they are 13.7% off — the README's prior column).
    # Coalesced and asynchronous gathers (PRs #1188, #1453: 1.7x on 64 A100s) make later versions faster than this.
    zero3_comm_efficiency=0.46, zero3_overlap=0.0, zero3_gathers_per_tensor=True, zero3_gather_host_s=3.8e-4,
    zero3_copy_launch_s=5e-6,
    # Megatron-DeepSpeed's --use-flash-attn-v2 calls flash-attn 2 (no Transformer Engine)
    attention_kernel="fa2",
    resharding=Resharding(
        "DeepSpeed universal checkpoint", DCP_RESHARDS,
        "DeepSpeed's universal checkpointing tutorial (deepspeed.ai/tutorials/universal-checkpointing): ZeRO "
        "1-3, tp, pp and dp changes after ds_to_universal; mixtures of experts are not converted",
        dense_only=True,
        conversion="python -m deepspeed.checkpoint.ds_to_universal --input_folder CKPT/global_stepN "
                   "--output_folder CKPT/global_stepN_universal, then run with --universal-checkpoint"),
)
