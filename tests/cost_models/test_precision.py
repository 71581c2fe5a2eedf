"""FP8 recipes and scale-up domains: GEMMs at the FP8 peak and the rest at BF16, the quantised weight
copies, MFU against the BF16 peak; an NVL72 rack as one 72-GPU NVLink domain."""

from __future__ import annotations

import json

import pytest

from gplan.cost_models import communication as comm
from gplan.cost_models import compute, memory
from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

LLAMA = load_model("llama3-70b")


@pytest.mark.parametrize("precision, per_param", [("fp8", 2.0), ("mxfp8", 2 + 2 / 32), ("nvfp4", 1 + 2 / 16),
                                                  ("bf16", 0.0)])
def test_a_low_precision_recipe_keeps_quantised_copies_of_the_layer_weights(precision, per_param):
    config = ParallelConfig(dp=8, tp=8, zero=1)
    cluster = load_cluster("gb200-nvl72", 64)
    bf16 = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, engine="megatron"), cluster, config).predict()
    low = StepModel(LLAMA, TrainingSpec(gbs=64, seq_length=8192, precision=precision, engine="megatron"), cluster,
                    config).predict()
    layer_params = LLAMA.num_layers * LLAMA.layer_params_per_rank(LLAMA.layer_kinds()[0], 8)
    extra = low.stages[0].memory.weights_bytes - bf16.stages[0].memory.weights_bytes
    assert extra == pytest.approx(layer_params * per_param)
    assert memory.low_precision_weight_bytes(precision) == per_param


@pytest.mark.parametrize("precision", ["nvfp4", "mxfp8"])
def test_under_zero_3_a_rank_keeps_the_quantised_copies_of_its_own_shard(precision):
    """Megatron-FSDP and FSDP2 quantise the unit they gather: the persistent copies are the shard's, 1/(dp·cp)
    of the layer weights (row 155 of the Bridge table, Llama 3 70B NVFP4 at tp 1 pp 1 over 64 GB300, was
    priced with 73 GiB of unsharded copies)."""
    cluster = load_cluster("gb300-nvl72", 64)
    training = TrainingSpec(gbs=128, seq_length=8192, precision=precision, engine="megatron")
    bf16 = training.model_copy(update={"precision": "bf16"})

    def extra(zero: int) -> float:
        config = ParallelConfig(dp=64, zero=zero, mbs=1, recompute="full")
        low, base = (StepModel(LLAMA, t, cluster, config).predict().stages[0].memory.weights_bytes
                     for t in (training, bf16))
        return low - base

    layer_params = LLAMA.num_layers * LLAMA.layer_params_per_rank(LLAMA.layer_kinds()[0], 1)
    assert extra(1) == pytest.approx(layer_params * memory.low_precision_weight_bytes(precision))
    assert extra(3) == pytest.approx(extra(1) / 64)


def test_fp8_runs_the_layers_gemms_at_the_fp8_peak_and_attention_at_bf16():
    device = load_cluster("dgx-h100", 8).primary.hardware.model_copy(update={"precision_efficiency": {}})
    shard = compute.Shard(batch=1, seq=8192, kv_seq=8192, tp=8, sp=True)
    kind = LLAMA.layer_kinds()[0]
    gemm = compute.layer_gemms(LLAMA, kind, shard)[0]
    assert compute.gemm_time_s(device, "fp8", gemm) == pytest.approx(compute.gemm_time_s(device, "bf16", gemm) / 2, rel=1e-3)
    bf16 = compute.layer_time(LLAMA, kind, TrainingSpec(gbs=8, seq_length=8192), shard, device)
    fp8 = compute.layer_time(LLAMA, kind, TrainingSpec(gbs=8, seq_length=8192, precision="fp8"), shard, device)
    assert fp8.attention_forward_s == bf16.attention_forward_s
    assert fp8.forward_s < bf16.forward_s


def test_mfu_of_an_fp8_recipe_is_against_the_bf16_peak():
    cluster, config = load_cluster("dgx-h100", 64), ParallelConfig(dp=8, tp=8, zero=1)
    training = TrainingSpec(gbs=64, seq_length=8192, precision="fp8", engine="megatron")
    p = StepModel(LLAMA, training, cluster, config).predict()
    flops = compute.model_flops_per_step(LLAMA, training)
    assert p.mfu == pytest.approx(flops / p.step_time_s / (64 * 989e12))


def test_an_nvl72_rack_is_one_nvlink_domain_and_racks_meet_over_the_scale_out_network():
    group = load_cluster("gb200-nvl72", 576).primary
    assert (group.devices_per_node, group.domain_devices) == (4, 72)
    # tp 8 spans two trays of four, inside the rack's NVLink: the scale-up link, not InfiniBand
    assert comm.axis_link(group, ParallelConfig(dp=72, tp=8), "tp") == group.intra_node
    # dp 72 with tp 8: each dp group strides over 8 racks: the scale-out link
    assert comm.axis_link(group, ParallelConfig(dp=72, tp=8), "dp").latency_us == group.inter_node.latency_us
    # a pipeline of 8 stages of 72 devices crosses racks; 4 stages of 4 devices stay inside one
    assert comm.pipeline_link(group, ParallelConfig(pp=8, dp=9, tp=8)) == group.inter_node
    assert comm.pipeline_link(group, ParallelConfig(pp=4, dp=2, tp=2)) == group.intra_node
    # a DGX of 8 GPUs is its own domain: the same tp 8 rides NVLink, dp 2 InfiniBand
    dgx = load_cluster("dgx-b200", 16).primary
    assert dgx.domain_devices == 8 and comm.axis_link(dgx, ParallelConfig(dp=2, tp=8), "dp") == dgx.inter_node


def test_explain_names_the_nvlink_domain_across_trays():
    from gplan.planner.placement import DeviceRef, group_link, topology

    cluster = load_cluster("gb200-nvl72", 144)
    graph = topology(cluster)
    across_trays = [DeviceRef(node_group=0, node=n, local=i) for n in (0, 1) for i in range(4)]
    assert group_link(graph, across_trays)[0] == "intra"
    across_racks = [DeviceRef(node_group=0, node=0, local=0), DeviceRef(node_group=0, node=18, local=0)]
    assert group_link(graph, across_racks)[0] == "inter"


@pytest.mark.parametrize("cluster, devices, precision", [("gb200-nvl72", 576, "mxfp8"), ("dgx-b200", 64, "bf16"),
                                                        ("dgx-h100", 64, "fp8")])
def test_searches_of_the_2026_hardware_write_plans(gplan, tmp_path, cluster, devices, precision):
    out = tmp_path / "plan.json"
    r = gplan("search", "llama3-70b", "--cluster", cluster, "--devices", str(devices), "--precision", precision,
              "--out", str(out), "--json")
    assert r.code == 0, r.stderr
    from gplan.plan import read_plan

    plan = read_plan(out)
    assert plan.training.precision == precision
    assert plan.target == ("megatron" if precision != "bf16" else "torch")  # FP8 recipes: Megatron-LM by default


def test_hopper_has_no_mxfp8_and_the_torch_worker_no_nvfp4(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--precision", "mxfp8")
    assert r.code == 3 and "does not support mxfp8" in r.stderr
    r = gplan("search", "llama3-8b", "--cluster", "dgx-b200", "--devices", "8", "--precision", "nvfp4",
              "--target", "torch", "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "torch trains bf16, fp16, fp32, fp8, fp8-rowwise, mxfp8, not nvfp4" in r.stderr
    assert "hint: --target megatron" in r.stderr
    r = gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--precision", "fp8",
              "--target", "torch", "--out", str(tmp_path / "p.json"))
    assert r.code == 0 and json.loads((tmp_path / "p.json").read_text())["training"]["precision"] == "fp8"
