"""Activation and state memory: Korthikanti et al. 2022 (Table 2) fall out as special cases."""

from __future__ import annotations

import pytest

from gplan.engines import ENGINES, profile_of
from gplan.cost_models import memory, pipeline
from gplan.cost_models.compute import Shard
from gplan.cost_models.step import StepModel
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig, uniform_layout
from gplan.spec.training import TrainingSpec

S, B = 2048, 4


def act(model: ModelSpec, t: int = 1, sp: bool = False, recompute: str = "none", flash: bool = False) -> float:
    return memory.layer_activation_bytes(model, model.layer_kinds()[0], Shard(B, S, S, t, sp), 2, flash, recompute)


def test_no_parallelism_is_34_plus_5as_over_h(gpt):
    h, a = gpt.hidden_size, gpt.num_attention_heads
    assert act(gpt) == pytest.approx(S * B * h * (34 + 5 * a * S / h))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_only(gpt, t):
    h, a = gpt.hidden_size, gpt.num_attention_heads
    assert act(gpt, t=t) == pytest.approx(S * B * h * (10 + 24 / t + 5 * a * S / (h * t)))


@pytest.mark.parametrize("t", [2, 8])
def test_tensor_and_sequence_parallel_divide_everything(gpt, t):
    h, a = gpt.hidden_size, gpt.num_attention_heads
    assert act(gpt, t=t, sp=True) == pytest.approx(S * B * h * (34 + 5 * a * S / h) / t)


def test_selective_recompute_with_sp_is_34_over_t(gpt):
    assert act(gpt, t=8, sp=True, recompute="selective") == pytest.approx(34 * S * B * gpt.hidden_size / 8)


def test_selective_recompute_without_sp(gpt):
    assert act(gpt, t=4, recompute="selective") == pytest.approx(S * B * gpt.hidden_size * (10 + 24 / 4))


def test_full_recompute_keeps_the_layer_input(gpt):
    assert act(gpt, recompute="full") == 2 * S * B * gpt.hidden_size
    assert act(gpt, t=4, sp=True, recompute="full") == 2 * S * B * gpt.hidden_size / 4


def test_flash_attention_drops_the_score_matrices(gpt):
    h, a = gpt.hidden_size, gpt.num_attention_heads
    lse = memory.FLASH_LSE_BYTES * a * S * B
    assert act(gpt, flash=True) == pytest.approx(S * B * h * 34 + lse)


def test_gqa_and_swiglu_change_the_34():
    # no dropout, swiglu f, GQA h_kv: attention 2·2 (norm, qkv input) + 2 (Q) + 2·2·h_kv/h (K, V) + 2 (out
    # input); MLP 2·2 (norm, fc1 input) + 3·2·f/h (fused swiglu: gate, up, product)
    m = ModelSpec(name="l", num_layers=1, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                  ffn_hidden_size=14336, ffn_kind="swiglu", vocab_size=1000)
    per_sbh = 4 + 2 + 4 * 1024 / 4096 + 2 + 4 + 6 * 14336 / 4096
    assert act(m, flash=True) == pytest.approx(S * B * 4096 * per_sbh + memory.FLASH_LSE_BYTES * 32 * S * B)


def test_state_bytes_follow_megatron():
    assert memory.state_bytes_per_param(2, 0, 8).total == 18
    assert memory.state_bytes_per_param(2, 1, 8).total == pytest.approx(6 + 12 / 8)
    assert memory.state_bytes_per_param(2, 2, 8).total == pytest.approx(2 + 16 / 8)
    assert memory.state_bytes_per_param(2, 3, 8).total == pytest.approx(18 / 8)
    assert memory.state_bytes_per_param(4, 0, 8).total == 16


@pytest.mark.parametrize("precision, options, adam", [
    ("bf16", {}, 12),                                                       # fp32 master, m and v
    ("bf16", {"precision_aware_optimizer": True}, 2 + 4 + 4),               # the master as the bf16 weight's remainder
    ("bf16", {"precision_aware_optimizer": True, "adam_moments": "bf16"}, 2 + 2 + 2),
    ("mxfp8", {"precision_aware_optimizer": True, "adam_moments": "bf16"}, 4 + 2 + 2),  # Megatron-core keeps fp32 master
    ("fp8", {"precision_aware_optimizer": True, "adam_moments": "fp8", "master_weights": "fp16"}, 2 + 1 + 1),
    ("fp16", {"precision_aware_optimizer": True}, 4 + 4 + 4),               # remainders need bf16 weights
])
def test_the_precision_aware_optimizer_keeps_adams_states_as_megatron_does(precision, options, adam):
    """memory.adam_state_bytes: master + m + v per parameter, sharded by the distributed optimizer like the fp32 ones;
    the optimizer step moves each state twice and, with remainders, reads the 16-bit weight too."""
    t = TrainingSpec(gbs=64, seq_length=S, precision=precision, engine="megatron", **options)
    assert memory.adam_state_bytes(t) == adam
    states = memory.state_bytes_per_param(2, 1, 8, profile_of("megatron"), adam_bytes=memory.adam_state_bytes(t))
    assert states.optimizer == pytest.approx(adam / 8) and states.weights == 2 and states.grads == 4
    remainders = memory.keeps_master_remainders(t)
    assert remainders == (precision == "bf16" and bool(options))
    from gplan.cost_models.compute import ADAM_BYTES_PER_PARAM, adam_bytes_moved_per_param
    moved = adam_bytes_moved_per_param(adam, remainders)
    assert moved == (ADAM_BYTES_PER_PARAM if not options else 4 + 4 + 2 * adam + 2 + 2 * remainders)


@pytest.mark.parametrize("p,m", [(4, 16), (8, 8), (8, 3)])
def test_in_flight_microbatches(p, m):
    assert pipeline.in_flight_microbatches(0, p, m, "1f1b") == min(p, m)
    assert pipeline.in_flight_microbatches(p - 1, p, m, "1f1b") == 1
    assert pipeline.in_flight_microbatches(1, p, m, "gpipe") == m
    # Korthikanti et al.'s p·(1 + (p − 1)/(p·v)) for the first rank, when the m·v chunks outnumber its
    # warm-up; otherwise it holds every chunk of the step: all m micro-batches.
    first = pipeline.in_flight_microbatches(0, p, m, "interleaved_1f1b", 2)
    assert first == pytest.approx(p * (1 + (p - 1) / (2 * p)) if 2 * m > 2 * (p - 1) + p else m)


def test_first_stage_holds_about_all_layers_whatever_pp(gpt, a100_cluster):
    """SOURCES.md: the first 1F1B stage holds p micro-batches of L/p layers, about L layers' worth."""
    training = TrainingSpec(gbs=64, seq_length=S, flash_attention=False)
    per_layer = act(gpt, recompute="full") / B  # mbs 1
    for pp in (2, 4, 8):
        config = ParallelConfig(dp=64 // pp, pp=pp, mbs=1, recompute="full")
        stage0 = StepModel(gpt, training, a100_cluster, config).stage(0, uniform_layout(gpt, pp, "full")[0])
        layers_activations = stage0.memory.activations_bytes - pp * memory.embedding_activation_bytes(gpt, Shard(1, S, S, 1, False))
        assert layers_activations == pytest.approx(gpt.num_layers * per_layer)


def test_weights_of_a_stage(llama8b, a100_cluster):
    config = ParallelConfig(dp=16, tp=4, mbs=1)
    step = StepModel(llama8b, TrainingSpec(gbs=64, seq_length=8192), a100_cluster, config)
    stage = step.stage(0, uniform_layout(llama8b, 1, "none")[0])
    # Megatron's tp split: everything but the norms (two per layer and the final one, replicated on
    # every rank: RMSNorm has no bias) is divided by tp = 4.
    norms = (2 * llama8b.num_layers + 1) * llama8b.hidden_size
    per_rank = (llama8b.total_params() - norms) / 4 + norms
    assert stage.params == pytest.approx(per_rank)
    assert stage.memory.weights_bytes + stage.memory.grads_bytes + stage.memory.optimizer_bytes == pytest.approx(
        18 * per_rank)


def test_replicated_parameters_are_not_divided_by_tp():
    """GPT with learned positions and biases: positions, norms (scale and shift) and the row-parallel
    biases stay whole on every tp rank; the rest is divided (what `gplan launch --validate` builds)."""
    from gplan.spec.model import ModelSpec

    m = ModelSpec(name="g", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=512, seq_length=128,
                  bias=True, position_embedding="learned")
    kind = m.layer_kinds()[0]
    h = m.hidden_size
    replicated = 2 * (2 * h) + 2 * h  # two LayerNorms (scale, shift) and two row-parallel biases
    assert m.layer_params_per_rank(kind, 4) == (m.layer_params(kind) - replicated) / 4 + replicated
    assert m.layer_params_per_rank(kind, 1) == m.layer_params(kind)
    assert m.embedding_params_per_rank(4) == 512 * h / 4 + 128 * h
    assert m.head_params_per_rank(4) == 512 * h / 4 + 2 * h


def test_vpp_implies_the_interleaved_schedule_and_contradictions_are_refused():
    assert ParallelConfig(pp=4, vpp=2).schedule == "interleaved_1f1b"
    with pytest.raises(ValueError, match="interleaved_1f1b goes with vpp > 1"):
        ParallelConfig(pp=4, vpp=2, schedule="gpipe")
    with pytest.raises(ValueError):
        ParallelConfig(pp=4, schedule="interleaved_1f1b")


def test_context_parallel_ranks_keep_only_their_own_keys_and_values(llama8b, a100_cluster):
    """cp = 16 at 128k tokens: a rank saves K and V of its 8k tokens, not of all 128k (issue 14 found
    16× too much); everything a layer keeps shrinks with cp."""
    from gplan.spec.model import LayerKind

    training = TrainingSpec(gbs=16, seq_length=131072)
    kind = LayerKind("decoder", 32, True, False)
    per_cp = []
    for cp in (1, 16):
        step = StepModel(llama8b, training, a100_cluster, ParallelConfig(dp=64 // cp, cp=cp, mbs=1))
        per_cp.append(memory.layer_activation_bytes(llama8b, kind, step.shard, 2, True, "none"))
    assert per_cp[1] == pytest.approx(per_cp[0] / 16)


# ---- what each engine keeps, the working sets, the buffers ------------------------------------------

@pytest.mark.parametrize("engine, precision, zero, expected", [
    ("deepspeed", "fp16", 1, 2 + 2 + 16 / 8),          # fp16 weights and grads; master, m, v, fp32 grad partition
    ("deepspeed", "bf16", 1, 2 + (2 + 4) + 12 / 8),    # BF16 optimizer: full-size fp32 gradient accumulation
    ("deepspeed", "fp16", 3, 2 / 8 + 2 / 8 + 16 / 8),
    ("torch", "bf16", 0, 16),                          # fp32 weights under autocast, fp32 grads, m, v
    ("torch", "bf16", 1, 2 + 16 / 8),                  # FSDP2 without resharding keeps the 16-bit weights gathered
    ("torch", "bf16", 3, 16 / 8),
    (None, "bf16", 1, 6 + 12 / 8),                     # Megatron-LM
])
def test_state_bytes_follow_each_engine(engine, precision, zero, expected):
    element = 4 if precision == "fp32" else 2
    states = memory.state_bytes_per_param(element, zero, 8, profile_of(engine), bf16=precision == "bf16")
    assert states.total == pytest.approx(expected)


def test_full_recompute_recreates_one_layers_activations_in_its_backward():
    m = ModelSpec(name="gpt", num_layers=1, hidden_size=1024, num_attention_heads=16, vocab_size=1000, dropout=0.1)
    shard = Shard(batch=B, seq=S, kv_seq=S, tp=1, sp=False)
    kind = m.layer_kinds()[0]
    full = memory.recompute_working_bytes(m, kind, shard, 2, False, "full")
    assert full == memory.layer_activation_bytes(m, kind, shard, 2, False, "none") == S * B * 1024 * (34 + 5 * 16 * S / 1024)
    # selective recompute replays the scores (5·a·s²·b with dropout); fused attention has none to replay
    assert memory.recompute_working_bytes(m, kind, shard, 2, False, "selective") == 5 * 16 * S * S * B
    assert memory.recompute_working_bytes(m, kind, shard, 2, True, "selective") == 0


def test_the_loss_backward_working_set_depends_on_the_engines_cross_entropy():
    m = ModelSpec(name="llama", num_layers=1, hidden_size=4096, num_attention_heads=32, vocab_size=128256)
    shard = Shard(batch=1, seq=8192, kv_seq=8192, tp=8, sp=True)
    logits = 8192 * 128256 / 8
    assert memory.loss_working_bytes(m, shard, 2, ENGINES["megatron"]) == 2 * logits   # gradient in the softmax buffer
    assert memory.loss_working_bytes(m, shard, 2, ENGINES["torch"]) == 6 * logits      # F.cross_entropy: fp32 grad + copy
    assert memory.loss_working_bytes(m, shard, 2, ENGINES["llm-foundry"]) == 0          # fused, in place


def test_a_compiled_loss_keeps_neither_an_fp32_copy_of_the_logits_nor_an_fp32_gradient():
    """torchtitan's compiled cross-entropy (compile.components with "loss"): the 16-bit logits kept for the
    backward, which writes the 16-bit gradient — 2 + 2 bytes a logit where the eager loss holds 6 + 6."""
    titan = ENGINES["torchtitan"]
    m = ModelSpec(name="dsv3ish", num_layers=1, hidden_size=2048, num_attention_heads=16, vocab_size=102400)
    shard = Shard(batch=1, seq=131072, kv_seq=131072, tp=1, sp=False)
    logits, hidden = 131072 * 102400, 2 * 2 * 131072 * 2048
    assert memory.head_activation_bytes(m, shard, 2, titan) == hidden + 6 * logits
    assert memory.head_activation_bytes(m, shard, 2, titan, compiled_loss=True) == hidden + 2 * logits
    assert memory.loss_working_bytes(m, shard, 2, titan) == 6 * logits
    assert memory.loss_working_bytes(m, shard, 2, titan, compiled_loss=True) == 2 * logits
    # Megatron's vocab-parallel loss has no fp32 copy to drop: a compiled flag changes nothing there
    megatron = ENGINES["megatron"]
    assert memory.loss_working_bytes(m, shard, 2, megatron, compiled_loss=True) == \
        memory.loss_working_bytes(m, shard, 2, megatron)


def test_a_chunked_loss_keeps_no_logits_and_makes_one_chunk_at_a_time():
    """torchtitan 0.3's ChunkedLossWrapper: each chunk's logits made, lost and differentiated in the forward — none
    kept to the backward, only the hidden states' gradient it accumulated (in their dtype); one chunk's logits,
    copy and gradient at a time (the eager loss's 6 + 6 bytes a logit over the chunks) beside the fp32 accumulator."""
    titan = ENGINES["torchtitan"]
    m = ModelSpec(name="llamaish", num_layers=1, hidden_size=4096, num_attention_heads=32, vocab_size=128256)
    shard = Shard(batch=2, seq=8192, kv_seq=8192, tp=2, sp=True)
    logits, hidden = 2 * 8192 * 128256 / 2, 2 * 2 * 2 * 8192 * 4096 / 2
    assert memory.head_activation_bytes(m, shard, 2, titan, chunks=8) == hidden + 2 * 2 * 8192 * 4096
    assert memory.loss_working_bytes(m, shard, 2, titan, chunks=8) == (6 + 6) * logits / 8 + 4 * 2 * 8192 * 4096
    whole = memory.head_activation_bytes(m, shard, 2, titan) + memory.loss_working_bytes(m, shard, 2, titan)
    chunked = memory.head_activation_bytes(m, shard, 2, titan, chunks=8) + memory.loss_working_bytes(m, shard, 2, titan, chunks=8)
    assert whole - chunked > 5 * 2**30  # 12 bytes on 2.1 G logits a tp rank, against 1.5 on them and the fp32 grad


def test_the_loss_chunks_must_split_each_cp_ranks_sequence():
    """ChunkedLossWrapper: "sequence length must be divisible by num_chunks", a cp rank's share of it."""
    from gplan.spec.parallel import config_violations

    model = ModelSpec(name="llamaish", num_layers=2, hidden_size=256, num_attention_heads=4, vocab_size=1024)
    config = ParallelConfig(dp=2, cp=2, zero=3)
    found = config_violations(model, TrainingSpec(gbs=8, seq_length=8 * 2 * 5, engine="torchtitan"), config)
    assert not [v for v in found if v.rule == "loss_chunks"]  # 40 tokens a cp rank: 8 chunks of 5
    found = config_violations(model, TrainingSpec(gbs=8, seq_length=72, engine="torchtitan"), config)
    assert [v.rule for v in found if v.rule == "loss_chunks"] == ["loss_chunks"]  # 36 a rank, not in 8
    assert not config_violations(model, TrainingSpec(gbs=8, seq_length=72, engine="torchtitan", loss_chunks=1), config)
    assert TrainingSpec(gbs=8, seq_length=72, engine="torchtitan", loss_chunks=8).loss_chunks is None  # its own


def test_zero3_gathers_a_large_vocabulary_embedding_not_just_a_layer():
    """BLOOM's 250880 × 14336 embedding on tp=4 is ~0.9 B parameters, twice a layer's 0.6 B: FSDP gathers it
    whole, and prefetches the next unit beside it."""
    layer, embedding = 12 * 14336**2 / 4, 250880 * 14336 / 4
    assert memory.zero3_gather_buffer_bytes([layer] * 6 + [embedding], 2) == (embedding + layer) * 2 + embedding * 4


def test_a_plan_is_priced_with_its_targets_memory_accounting(tmp_path):
    from gplan.planner import plan as best_plan
    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.space import SearchLimits

    assert resolve_inputs("llama3-8b", 8, "dgx-a100-80g").training.engine == "torch"  # the cluster's backend
    inputs = resolve_inputs("llama3-8b", 8, "dgx-a100-80g", target="megatron")
    planned = best_plan(inputs, SearchLimits(zero=[1], tp=[2], pp=[1]))
    assert planned.plan.training.engine == "megatron" == planned.plan.target


def test_stage_memory_itemises_communicators_and_fragmentation():
    from gplan.cost_models.step import StepModel
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.training import TrainingSpec

    config = ParallelConfig(dp=2, tp=2, pp=2, zero=1)
    step = StepModel(load_model("llama3-8b"), TrainingSpec(gbs=32, seq_length=4096, engine="deepspeed"),
                     load_cluster("dgx-a100-80g", 8), config)
    stage = step.predict().stages[0]
    device = step.cluster.primary.hardware
    assert stage.memory.communicator_bytes == 4 * device.communicator_MiB * 2**20  # tp, dp, two pipeline peers
    assert stage.memory.fragmentation_bytes == pytest.approx(stage.memory.allocated_bytes * ENGINES["deepspeed"].memory.fragmentation)
    assert stage.memory_bytes == pytest.approx(stage.memory.allocated_bytes + stage.memory.fragmentation_bytes
                                               + stage.memory.communicator_bytes + stage.memory.reserve_bytes)


def test_zero3_pays_its_ring_latency_per_unit_and_micro_batch():
    """ZeRO-3 at dp = 16384: every micro-batch, every layer all-gathers its weights twice and
    reduce-scatters its gradients, each paying (n−1)·α — about 3 × 82 ms a layer, more than a llama3-8b
    layer computes at mbs 1, so the step pays it (the old one-collective-per-stage pricing charged one
    latency per pass)."""
    from gplan.cost_models import communication as comm
    from gplan.profiles.catalogue import load_cluster, load_model

    model, n = load_model("llama3-8b"), 16384
    config = ParallelConfig(dp=n, zero=3, recompute="full")
    step = StepModel(model, TrainingSpec(gbs=n, seq_length=8192), load_cluster("dgx-h100", n), config)
    prediction = step.predict()
    link = comm.axis_link(step.group(0), config, "dp")
    latency_per_layer = 3 * (n - 1) * link.latency_s
    lt = step.layer_time("decoder", 0)
    floor = model.num_layers * (latency_per_layer - lt.forward_s - lt.backward_s - lt.recompute_s("full"))
    assert floor > 1.0  # seconds a micro-batch cannot hide
    assert prediction.breakdown.dp_comm >= step.num_microbatches * floor


def test_a_tied_embedding_across_stages_all_reduces_its_gradient():
    from gplan.cost_models import communication as comm
    from gplan.profiles.catalogue import load_cluster

    gpt = ModelSpec(name="gpt", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=50304,
                    tie_embeddings=True)
    config = ParallelConfig(dp=1, pp=2)
    step = StepModel(gpt, TrainingSpec(gbs=8, seq_length=1024), load_cluster("dgx-a100-80g", 2), config)
    layouts = uniform_layout(gpt, 2, "none")
    expected = comm.ring_allreduce_time_s(50304 * 1024 * 4, 2, comm.pipeline_link(step.group(0), config))
    assert step.tied_embedding_s(layouts[0]) == step.tied_embedding_s(layouts[1]) == pytest.approx(expected)
    assert step.predict().breakdown.dp_comm == pytest.approx(expected)
    untied = StepModel(gpt.model_copy(update={"tie_embeddings": False}), step.training, step.cluster, config)
    assert untied.predict().breakdown.dp_comm == 0


def test_each_engine_reduces_its_gradients_in_the_dtype_it_keeps_them():
    """DeepSpeed reduces its 16-bit gradients (fp32 only in its BF16 optimizer, bf16 with ZeRO-1), as its
    states hold them; Megatron its fp32 main gradients unless told to reduce in bf16."""
    from gplan.profiles.catalogue import load_cluster, load_model

    def reduced(engine, precision, zero, **switches):
        training = TrainingSpec(gbs=64, seq_length=2048, precision=precision, engine=engine, **switches)
        step = StepModel(load_model("llama3-8b"), training, load_cluster("dgx-a100-80g", 8),
                         ParallelConfig(dp=8, zero=zero))
        assert step.reduced_grad_bytes == memory.reduced_grad_bytes(
            training.element_bytes, zero, training.profile, bf16=precision == "bf16", grad_bytes=training.grad_bytes,
            pure_bf16=training.pure_bf16)
        return step.reduced_grad_bytes, step.state_bytes.grads

    assert reduced("deepspeed", "fp16", 1) == (2, 2.0)
    assert reduced("deepspeed", "bf16", 3) == (2, 2.0 / 8)
    assert reduced("deepspeed", "bf16", 1) == (4, 6.0)  # the BF16 optimizer's fp32 buffers beside the bf16 grads
    assert reduced("megatron", "bf16", 1)[0] == 4
    assert reduced("megatron", "bf16", 1, grad_reduce_in_bf16=True)[0] == 2
    # torchtitan: FSDP2's reduce dtype, its sharded gradients fp32 either way; without FSDP (DDP) fp32
    assert reduced("torchtitan", "bf16", 3, grad_reduce_in_bf16=True) == (2, 4.0 / 8)
    assert reduced("torchtitan", "bf16", 3) == (4, 4.0 / 8)
    assert reduced("torchtitan", "bf16", 0, grad_reduce_in_bf16=True)[0] == 4
    # full-bf16 training: bf16 gradients, DDP reduces them as kept; FSDP as its reduce dtype says
    assert reduced("torchtitan", "bf16", 0, pure_bf16=True) == (2, 2.0)
    assert reduced("torchtitan", "bf16", 3, pure_bf16=True) == (4, 2.0 / 8)


def test_full_bf16_training_keeps_every_state_in_bf16_without_an_fp32_copy():
    """torchtitan's training.dtype = "bfloat16": weights, gradients, m and v in bf16 — 8 bytes per parameter, not
    16 — sharded as FSDP shards them, the gathered weights of zero 1/2 as before."""
    from gplan.engines import profile_of

    titan = profile_of("torchtitan")
    full = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True, pure_bf16=True)
    mixed = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True)
    assert (full.weights, full.grads, full.optimizer) == (2 / 8, 2 / 8, 4 / 8)
    assert (mixed.weights, mixed.grads, mixed.optimizer) == (4 / 8, 4 / 8, 8 / 8)
    unsharded = memory.state_bytes_per_param(2, 0, 8, titan, bf16=True, pure_bf16=True)
    assert (unsharded.weights, unsharded.grads, unsharded.optimizer) == (2, 2, 4)
    kept = memory.state_bytes_per_param(2, 2, 8, titan, bf16=True, pure_bf16=True)
    assert kept.weights == 2 / 8 + 2  # the bf16 weights gathered in the forward, held to the backward


def test_fsdp_cpu_offload_leaves_only_what_is_gathered_or_accumulated_on_the_device():
    """FSDP2's CPUOffloadPolicy (torchtitan's training.enable_cpu_offload): the fp32 shards, their gradients and
    Adam's states are the host's — even on a one-rank mesh (routed experts with edp 1); under torch's pipelining the
    16-bit weights still stay gathered and the whole gradients still accumulate on the device."""
    from gplan.engines import profile_of

    titan = profile_of("torchtitan")
    for ranks in (8, 1):
        off = memory.state_bytes_per_param(2, 3, ranks, titan, bf16=True, offloaded=True)
        assert (off.weights, off.grads, off.optimizer) == (0.0, 0.0, 0.0)
    kept = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True, offloaded=True, stays_gathered=True,
                                        unsharded_grads=True)
    assert (kept.weights, kept.grads, kept.optimizer) == (2, 4, 0.0)
    on_device = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True)
    assert (on_device.weights, on_device.grads, on_device.optimizer) == (4 / 8, 4 / 8, 8 / 8)


def test_fsdp_cpu_offload_steps_adam_on_the_host_and_copies_every_shard_across_the_host_link():
    """The offloaded run's optimizer is the host's Adam over its local parameters at the host memory bandwidth; each
    unit's all-gather and reduce-scatter carry its shard across the host link, so the step is slower and the states
    leave the device."""
    from gplan.cost_models import compute
    from gplan.cost_models.step import StepModel, predict
    from gplan.planner.inputs import resolve_inputs
    from gplan.spec.parallel import even_stage_sizes, layout_from_sizes

    config = ParallelConfig(dp=8, zero=3, recompute="full")
    priced = {}
    for offload in (False, True):
        inputs = resolve_inputs("llama3-70b", 8, "dgx-h100", gbs=8, seq_length=8192, target="torchtitan",
                                fsdp_offload=offload)
        m = inputs.model
        layouts = layout_from_sizes(m, even_stage_sizes(m.total_layers, 1, 1), ["full"])
        priced[offload] = (predict(m, inputs.training, inputs.cluster, config, layouts),
                           StepModel(m, inputs.training, inputs.cluster, config))
    (eager, _), (off, sm) = priced[False], priced[True]
    hardware = inputs.cluster.node_groups[0].hardware
    local = off.stages[0].params / 8
    assert sm.optimizer_s(off.stages[0]) == pytest.approx(local * compute.ADAM_BYTES_PER_PARAM /
                                                          (hardware.host_memory_GBps * 1e9))
    assert sm.offload_copy_s(1e9, 0) == pytest.approx(4e9 / (hardware.host_link_GBps * 1e9))
    assert off.stages[0].memory.optimizer_bytes == 0 and eager.stages[0].memory.optimizer_bytes > 0
    assert off.step_time_s > eager.step_time_s and off.memory_bytes_per_device_max < eager.memory_bytes_per_device_max


def test_the_optimizer_in_the_backward_holds_no_gradients():
    """torchtitan ≤ 0.2's optimizer.early_step_in_backward steps each parameter as its gradient arrives and frees
    it: the states keep weights and Adam's moments, no gradients."""
    from gplan.engines import profile_of

    titan = profile_of("torchtitan")
    freed = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True, optimizer_in_backward=True)
    held = memory.state_bytes_per_param(2, 3, 8, titan, bf16=True)
    assert freed.grads == 0 and held.grads == 4 / 8
    assert (freed.weights, freed.optimizer) == (held.weights, held.optimizer)


@pytest.mark.parametrize("engine, pp, whole", [("torchtitan", 4, True), ("nemo-automodel", 2, True), ("torch", 2, True),
                                               ("torchtitan", 1, False), ("megatron", 4, False)])
def test_torch_pipelining_holds_every_gradient_whole_until_the_stages_reduction(engine, pp, whole):
    """torch's pipelining runs a run's backwards without gradient sync (FSDP2 accumulates each gradient unsharded,
    in the reduce dtype) and reduces after the stage's last one: 4 bytes a parameter held whole beside the 4/d
    shard the reduction yields. Without stages FSDP reduces each micro-batch into the shard; Megatron's
    distributed optimizer keeps its own accounting."""
    from gplan.profiles.catalogue import load_cluster, load_model

    config = ParallelConfig(dp=64 // pp, pp=pp, zero=2)
    step = StepModel(load_model("llama3-8b"), TrainingSpec(gbs=64, seq_length=4096, engine=engine),
                     load_cluster("dgx-h100", 64), config)
    d = memory.zero_shard_ranks(config)
    sharded = memory.state_bytes_per_param(2, 2, d, profile_of(engine), bf16=True).grads
    assert step.accumulates_unsharded is whole
    assert step.state_bytes.grads == pytest.approx(4.0 + 4.0 / d if whole else sharded)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_offloaded_optimizer_leaves_the_device_and_is_stepped_by_the_host(overlap):
    """Megatron's --optimizer-cpu-offload (a share F of the states): the device keeps (1 − F) of Adam's state, and
    the step is the slower of the device's share and the host's — gradients down and weights up the host link,
    Adam on fp32 states at the host's memory bandwidth: in sequence, or pipelined (the slowest shows)."""
    from gplan.profiles.catalogue import load_cluster, load_model

    model, cluster = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100").sized(16)
    config = ParallelConfig(dp=16, ep=8, zero=1)
    t = TrainingSpec(gbs=64, seq_length=S, engine="megatron", precision_aware_optimizer=True, adam_moments="bf16")
    kept = StepModel(model, t, cluster, config)
    half = StepModel(model, t.model_copy(update={"optimizer_offload": 0.5, "optimizer_offload_overlap": overlap}),
                     cluster, config)
    assert half.state_bytes.optimizer == pytest.approx(kept.state_bytes.optimizer / 2)
    assert memory.device_adam_bytes(half.training) == pytest.approx(memory.adam_state_bytes(t) / 2)
    stage = half.predict().stages[0]
    local = half.optimizer_local_params(stage.params, stage.expert_params) / 2
    h = cluster.node_groups[0].hardware
    parts = (local * 4 / (h.host_link_GBps * 1e9), local * 34 / (h.host_memory_GBps * 1e9),
             local * 2 / (h.host_link_GBps * 1e9))
    assert half.offloaded_optimizer_s(0, local) == pytest.approx(max(parts) if overlap else sum(parts))
    assert half.optimizer_s(stage) == pytest.approx(max(kept.optimizer_s(stage) / 2, half.offloaded_optimizer_s(0, local)))


def test_torchtitan_keeps_what_its_unfused_swiglu_and_fp32_routing_weights_leave_for_the_backward():
    """torchtitan's FeedForward and grouped experts run `F.silu(w1(x)) * w3(x)` as separate ops, and its MoE scales
    the routed tokens by the router's weights in an fp32 op of their own: without recompute it keeps, per token of
    a dense or shared-expert MLP, the SiLU's output (one more e·f) and, per routed pair, that and the fp32 operand
    (4·h) beyond what Megatron-core's fused SwiGLU and unpermute keep. Under its per-op checkpointing nothing of
    it stays (the elementwise ops replay), so a per-op layer keeps the same either way."""
    from gplan.cost_models import experts
    from gplan.profiles.catalogue import load_cluster, load_model

    model, cluster = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100").sized(8)
    kept = {}
    for engine in ("torchtitan", "nemo-automodel"):
        t = TrainingSpec(gbs=8, seq_length=4096, engine=engine)
        for rc, modules in (("none", None), ("selective", ("op",))):
            config = ParallelConfig(dp=8, zero=3, mbs=1, recompute=rc,
                                    **({"recompute_modules": modules} if modules else {}))
            step = StepModel(model, t, cluster, config)
            kind = next(k for k, v in step.kinds.items() if v.moe)
            kept[engine, rc] = step.layer_activation_bytes(kind, rc)
    tokens = 4096
    pairs = experts.routed_pairs(model, StepModel(model, TrainingSpec(gbs=8, seq_length=4096, engine="torchtitan"),
                                                  cluster, ParallelConfig(dp=8, zero=3, mbs=1)).shard, 1)
    extra = pairs * (4 * model.hidden_size + 2 * model.expert_ffn_size) + tokens * 2 * model.shared_expert_ffn_size
    assert kept["torchtitan", "none"] - kept["nemo-automodel", "none"] == pytest.approx(extra)
    assert kept["torchtitan", "selective"] == pytest.approx(kept["nemo-automodel", "selective"])
    assert profile_of("torchtitan").memory.unfused_swiglu and not profile_of("megatron").memory.unfused_swiglu
