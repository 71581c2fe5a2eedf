"""Communication overlap as the engines run it: Megatron-LM hides tp's collectives behind the GEMMs
(--tp-comm-overlap) except in NVFP4 and outside an NVLink domain, and does not hide the MXFP8
parameter all-gather; the other engines and runs that turn it off pay the collectives in full."""

from __future__ import annotations

import pytest

from gplan.cost_models import communication as comm
from gplan.cost_models import memory
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

LLAMA = load_model("llama3-70b")
SMALL = ModelSpec(name="small", num_layers=4, hidden_size=512, num_attention_heads=8, ffn_hidden_size=1536,
                  ffn_kind="swiglu", vocab_size=32000, seq_length=512, norm="rmsnorm", position_embedding="rope")


def step_of(model, engine, precision="bf16", cluster="dgx-h100", tp=8, overlap=True, seq=8192) -> StepModel:
    training = TrainingSpec(gbs=64, seq_length=seq, precision=precision, engine=engine, tp_comm_overlap=overlap)
    return StepModel(model, training, load_cluster(cluster, 8 * tp), ParallelConfig(dp=8, tp=tp, sp=True, zero=1))


def unoverlapped(step: StepModel, passes: int) -> float:
    return 2 * passes * step.tp_allreduce_s(0)


@pytest.mark.parametrize("model, seq", [(LLAMA, 8192), (SMALL, 512)])
@pytest.mark.parametrize("recompute, passes", [("none", (1, 2)), ("full", (1, 2, 1))])
def test_megatron_exposes_per_pass_only_what_tps_collectives_take_beyond_the_gemms(model, seq, recompute, passes):
    step = step_of(model, "megatron", seq=seq)
    assert step.tp_overlapped
    collectives, gemm = 2 * step.tp_allreduce_s(0), step.layer_gemm_s("decoder", 0)
    exposed = step.layer_tp_comm_s("decoder", recompute, 0)
    assert exposed == pytest.approx(sum(max(0.0, collectives - k * gemm) for k in passes))
    assert exposed < unoverlapped(step, len(passes))


def test_a_small_layers_gemms_cannot_hide_all_of_it():
    """The 512-wide layer's GEMMs are shorter than its collectives' latency: part stays exposed."""
    step = step_of(SMALL, "megatron", seq=512)
    assert 0 < step.layer_tp_comm_s("decoder", "none", 0) < unoverlapped(step, 2)


@pytest.mark.parametrize("engine, precision, cluster, overlap", [
    ("torch", "bf16", "dgx-h100", True),          # gplan's worker and the other engines do not overlap it
    ("torchtitan", "bf16", "dgx-h100", True),
    (None, "bf16", "dgx-h100", True),             # plans written before engines were priced
    ("megatron", "nvfp4", "dgx-b200", True),      # Megatron-Bridge's recipes turn it off in NVFP4
    ("megatron", "bf16", "dgx-h100", False),      # a run that asks for it off (older releases)
])
def test_tp_collectives_are_paid_in_full_where_nothing_overlaps_them(engine, precision, cluster, overlap):
    step = step_of(LLAMA, engine, precision, cluster, overlap=overlap)
    assert not step.tp_overlapped
    assert step.layer_tp_comm_s("decoder", "none", 0) == unoverlapped(step, 2)


@pytest.mark.parametrize("async_tp", [False, True])
def test_torchtitans_async_tp_hides_tps_collectives_as_the_userbuffers_do(async_tp):
    """torch's micro-pipelined tp (torchtitan's compile.enable_async_tensor_parallel) pipelines each all-gather and
    reduce-scatter with the matmul beside it: priced as Megatron's userbuffers overlap; without it, in full."""
    training = TrainingSpec(gbs=64, seq_length=8192, engine="torchtitan", async_tp=async_tp)
    step = StepModel(LLAMA, training, load_cluster("dgx-h100", 64), ParallelConfig(dp=8, tp=8, sp=True, zero=1))
    megatron = step_of(LLAMA, "megatron")
    assert step.tp_overlapped == async_tp
    expected = megatron.layer_tp_comm_s("decoder", "none", 0) if async_tp else unoverlapped(step, 2)
    assert step.layer_tp_comm_s("decoder", "none", 0) == pytest.approx(expected)


def test_tp_across_nvlink_domains_is_not_overlapped():
    """tp = 16 on 8-GPU nodes: its group leaves the NVLink domain the userbuffers exchange over."""
    step = step_of(LLAMA, "megatron", tp=16)
    assert step.cluster.primary.domain_devices == 8 and not step.tp_overlapped
    assert step.layer_tp_comm_s("decoder", "none", 0) == unoverlapped(step, 2)


@pytest.mark.parametrize("precision, hidden", [("bf16", True), ("fp8", True), ("mxfp8", False)])
def test_the_parameter_all_gather_hides_behind_the_forward_except_megatrons_mxfp8(precision, hidden):
    step = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, precision=precision, engine="megatron"),
                     load_cluster("dgx-b200", 64), ParallelConfig(dp=64, zero=1))
    params, forward_s, backward_s = 1e9, 10.0, 20.0
    link = comm.axis_link(step.group(0), step.config, "dp")
    gather = comm.allgather_time_s(params * step.training.element_bytes, 64, link)
    scatter = comm.reduce_scatter_time_s(params * memory.GRAD_BYTES, 64, link)
    expected = max(0.0, scatter - backward_s) + max(0.0, gather - (forward_s if hidden else 0.0))
    assert step.dp_sync_exposed_s(params, forward_s, backward_s, 0) == pytest.approx(expected)
    assert (step.dp_sync_exposed_s(params, forward_s, backward_s, 0) > 0) == (not hidden)


@pytest.mark.parametrize("zero", [0, 2])
def test_each_run_of_the_schedule_synchronises_its_stage_again(zero):
    """torchtitan's and AutoModel's loops over `schedule.step` (ParallelConfig.schedule_runs): each run's last
    backward lifts no_sync, so the stage's gradients are reduced (and, sharded, gathered again) once per run —
    exposed as often; zero 3 gathers per micro-batch whatever the runs, and reduce-scatters once per run (torch's
    pipelining leaves the weights gathered and the gradients unreduced after every backward of a run)."""
    def exposed(runs: int, zero: int) -> float:
        step = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, engine="torchtitan"),
                         load_cluster("dgx-h100", 64), ParallelConfig(dp=16, pp=4, zero=zero, schedule_runs=runs))
        return step.dp_sync_exposed_s(4e9, 0.001, 0.002, 0)

    assert exposed(1, zero) > 0
    assert exposed(4, zero) == pytest.approx(4 * exposed(1, zero))
    per_run = exposed(2, 3) - exposed(1, 3)
    assert per_run > 0 and exposed(4, 3) == pytest.approx(exposed(1, 3) + 3 * per_run)


def test_zero3_under_torch_pipelining_gathers_once_a_microbatch_and_reduces_once_a_run():
    """FSDP's zero 3 in a torch pipeline (torchtitan with fsdp_reshard_after_forward "always"): each backward leaves
    the stage's weights gathered and its gradients unreduced (`set_reshard_after_backward(False)`,
    `set_requires_gradient_sync(False)`), so per micro-batch one all-gather per unit where unpipelined FSDP pays two
    and a reduce-scatter, and the reduce-scatter comes once per run, whole: fewer collectives, and the 16-bit
    weights held gathered as zero 2 holds them."""
    from gplan.spec.parallel import LayerCount, StageLayout

    def step(pp: int) -> StepModel:
        return StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, engine="torchtitan"),
                         load_cluster("dgx-h100", 64), ParallelConfig(dp=64 // pp, pp=pp, zero=3))

    piped, flat = step(4), step(1)
    assert piped.accumulates_unsharded and not flat.accumulates_unsharded
    layout = StageLayout(layers=[LayerCount(kind=piped.model.layer_kinds()[0].name, count=20, recompute="none")],
                         embedding=False, head=False)
    ranks, link = 16, comm.axis_link(piped.group(0), piped.config, "dp")
    pipelined = piped.zero3_exposed_s(layout, ranks, link)
    params = piped.layer_params(layout.layers[0].kind) * 20
    gather = comm.allgather_time_s(params * 2, ranks, link) / piped.training.profile.zero3_comm_efficiency
    scatter = comm.reduce_scatter_time_s(params * piped.reduced_grad_bytes, ranks, link) / \
        piped.training.profile.zero3_comm_efficiency
    m = piped.num_microbatches
    # never more than a gather a micro-batch, and the run's reduce-scatter in full
    assert scatter <= pipelined <= m * gather + scatter + 1e-12
    assert piped.state_bytes.weights == pytest.approx(4.0 / 16 + 2)   # the fp32 shard and the gathered bf16
    assert flat.state_bytes.weights == pytest.approx(4.0 / 64)


@pytest.mark.parametrize("engine, pp, behind_backward", [("megatron", 4, True), ("torchtitan", 1, True),
                                                         ("torchtitan", 4, False), ("nemo-automodel", 4, False)])
def test_torch_pipelining_reduces_a_stage_after_its_last_backward(engine, pp, behind_backward):
    """Megatron's distributed optimizer reduce-scatters beside the last micro-batch's backward; torch's pipelining
    runs FSDP's post-backward once the stage's backwards are done and waits for it (REDUCE_GRAD), so there the
    reduce-scatter is exposed in full. Without stages FSDP's own hooks overlap it as before."""
    step = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, engine=engine), load_cluster("dgx-h100", 64),
                     ParallelConfig(dp=64 // pp, pp=pp, zero=1))
    params, forward_s, backward_s = 4e9, 10.0, 0.01
    link = comm.axis_link(step.group(0), step.config, "dp")
    scatter = comm.reduce_scatter_time_s(params * step.reduced_grad_bytes, 64 // pp, link)
    assert scatter > backward_s
    expected = scatter - backward_s if behind_backward else scatter
    assert step.dp_sync_exposed_s(params, forward_s, backward_s, 0) == pytest.approx(expected)


@pytest.mark.parametrize("engine, per_microbatch", [("torchtitan", True), ("torch", True), ("nemo-automodel", False),
                                                    ("megatron", False)])
def test_fsdp_without_stages_reduces_every_micro_batch_where_the_engine_does(engine, per_microbatch):
    """torchtitan's train loop and gplan's worker keep FSDP2's sync on every micro-batch (a reduce-scatter and a
    reshard each, so the next forward gathers again): m synchronisations a step; one where the engine defers."""
    step = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, engine=engine), load_cluster("dgx-h100", 64),
                     ParallelConfig(dp=16, tp=4, zero=2))
    assert step.num_microbatches == 4
    assert step.syncs_per_step == (4 if per_microbatch else 1)


@pytest.mark.parametrize("zero", [2, 3])
def test_a_deferred_gradient_sync_reduces_once_a_step(zero):
    """NeMo AutoModel without stages (`defer_fsdp_grad_sync`, its default): the reduce-scatter comes behind the
    step's last micro-batch only — one where `--grad-sync-each-microbatch` (its `false`) pays one a micro-batch;
    zero 3 still gathers every micro-batch either way."""
    def step(each: bool) -> StepModel:
        training = TrainingSpec(gbs=256, seq_length=8192, engine="nemo-automodel", grad_sync_each_microbatch=each)
        return StepModel(LLAMA, training, load_cluster("dgx-h100", 64), ParallelConfig(dp=32, tp=2, zero=zero))

    deferred, each = step(False), step(True)
    assert deferred.defers_grad_sync and not each.defers_grad_sync and deferred.num_microbatches == 8
    assert deferred.accumulates_unsharded and not deferred.reduces_after_last_backward
    params, forward_s, backward_s = 2e9, 0.004, 0.002  # a backward too short to hide the reduce-scatter
    once, every = (s.dp_sync_exposed_s(params, forward_s, backward_s, 0) for s in (deferred, each))
    assert 0 < once < every
    if zero == 2:
        assert every == pytest.approx(8 * once)


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("grad_behind, gather_behind", [(True, True), (True, False), (False, False)])
def test_a_run_without_megatrons_dp_overlaps_pays_its_reduction_and_gather_in_full(zero, grad_behind, gather_behind):
    """Megatron-LM without --overlap-grad-reduce reduces after the backward, without --overlap-param-gather gathers
    before the forward (`grad_reduce_overlap`, `param_gather_overlap` False): each exposed whole, where the switch
    hides what fits behind the pass beside it."""
    training = TrainingSpec(gbs=64, seq_length=8192, engine="megatron", grad_reduce_overlap=grad_behind,
                            param_gather_overlap=gather_behind)
    step = StepModel(LLAMA, training, load_cluster("dgx-h100", 64), ParallelConfig(dp=64, zero=zero))
    params, forward_s, backward_s = 1e9, 0.005, 0.01
    link = comm.axis_link(step.group(0), step.config, "dp")
    if zero == 0:
        reduce = comm.ring_allreduce_time_s(params * step.reduced_grad_bytes, 64, link)
        gather = 0.0
    else:
        reduce = comm.reduce_scatter_time_s(params * step.reduced_grad_bytes, 64, link)
        gather = comm.allgather_time_s(params * step.training.element_bytes, 64, link)
    assert reduce > backward_s and (zero == 0 or gather > forward_s)  # each longer than the pass that would hide it
    expected = (reduce - (backward_s if grad_behind else 0.0)) + \
        (max(0.0, gather - (forward_s if gather_behind else 0.0)) if zero else 0.0)
    assert step.dp_sync_exposed_s(params, forward_s, backward_s, 0) == pytest.approx(expected)


@pytest.mark.parametrize("engine, zero, expected", [
    ("megatron", 1, (False, False)),       # the distributed optimizer: as the switches say
    ("megatron", 2, (True, False)),        # Megatron-FSDP optim_grads: validate_args turns the reduction's on
    ("megatron", 3, (True, True)),         # optim_grads_params: both
    ("torchtitan", 2, (False, False)),     # another engine: as the plan says
])
def test_megatron_fsdp_overlaps_whatever_the_switches_say(engine, zero, expected):
    from gplan.spec.targets import dp_overlaps

    training = TrainingSpec(gbs=64, seq_length=8192, engine=engine, grad_reduce_overlap=False,
                            param_gather_overlap=False)
    assert dp_overlaps(training, ParallelConfig(dp=64, zero=zero)) == expected
