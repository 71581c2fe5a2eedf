"""The kernel an engine runs its routed experts on: torchtitan's GroupedExperts call `torch._grouped_mm`, whose BF16
forward runs at the device's measured `torch_grouped_mm_forward_ratio` of the grouped GEMMs the MoE constants were
fitted on (Transformer Engine's, in Megatron-core), and whose forward and backward together take what its
`torch_grouped_mm_ratio` says; both are the medians of the published kernel timings (bench/grouped_mm.py), so the
catalogue cannot drift from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gplan.cost_models import experts
from gplan.cost_models.compute import GEMM_BACKWARD_FLOP_RATIO, shard_of
from gplan.engines import ENGINES
from gplan.errors import InputError
from gplan.profiles.catalogue import cluster_from_hardware, load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

MODEL = load_model("qwen3-30b-a3b")
CONFIG = ParallelConfig(dp=8, ep=8, mbs=2, zero=3)


def device_of(cluster: str):
    return load_cluster(cluster, 8).node_groups[0].hardware


def routed_s(engine: str, cluster: str, precision: str = "bf16") -> tuple[float, float]:
    training = TrainingSpec(gbs=16, seq_length=4096, precision=precision, engine=engine)
    return experts.routed_time_s(MODEL, training, shard_of(training, CONFIG), CONFIG, device_of(cluster))


def gemm_s(engine: str, cluster: str) -> tuple[float, float]:
    """(forward, backward) of the routed experts less their element-wise traffic: the grouped GEMMs alone."""
    training = TrainingSpec(gbs=16, seq_length=4096, precision="bf16", engine=engine)
    shard = shard_of(training, CONFIG)
    moved = experts.memory_time_s(device_of(cluster),
                                  experts.routed_elementwise_elements(MODEL, shard, CONFIG) * training.element_bytes)
    forward, backward = routed_s(engine, cluster)
    return forward - moved, backward - GEMM_BACKWARD_FLOP_RATIO * moved


@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-b200"])
def test_torchtitan_runs_the_routed_gemms_at_the_measured_speeds(cluster):
    device = device_of(cluster)
    both, forward = device.torch_grouped_mm_ratio, device.torch_grouped_mm_forward_ratio
    assert ENGINES["torchtitan"].expert_kernel == "torch_grouped_mm" and ENGINES["megatron"].expert_kernel == "grouped"
    assert 0 < both < forward < 1  # the backward is the slower pass in every published timing
    fitted_forward, fitted_backward = gemm_s("megatron", cluster)
    torch_forward, torch_backward = gemm_s("torchtitan", cluster)
    assert torch_forward == pytest.approx(fitted_forward / forward, rel=1e-9)
    # the three products together take what the forward-and-backward timings say
    assert torch_forward + torch_backward == pytest.approx((fitted_forward + fitted_backward) / both, rel=1e-9)
    assert torch_backward / fitted_backward > torch_forward / fitted_forward


def test_without_a_published_timing_and_in_low_precision_nothing_changes():
    assert device_of("dgx-a100-80g").torch_grouped_mm_ratio == 1.0
    assert routed_s("torchtitan", "dgx-a100-80g") == pytest.approx(routed_s("megatron", "dgx-a100-80g"))
    # torchao's scaled grouped GEMMs (an FP8 recipe) are other kernels, not timed apart
    assert routed_s("torchtitan", "dgx-b200", "mxfp8") == pytest.approx(routed_s("megatron", "dgx-b200", "mxfp8"))


def test_a_forward_ratio_that_leaves_the_backward_no_time_is_refused():
    h100 = device_of("dgx-h100")
    with pytest.raises((ValueError, InputError), match="leaves no time for the backward"):
        type(h100).model_validate({**h100.model_dump(), "torch_grouped_mm_ratio": 0.3,
                                   "torch_grouped_mm_forward_ratio": 0.1})


def test_the_catalogue_ratios_are_the_medians_of_the_published_timings():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import grouped_mm
    finally:
        sys.path.pop(0)
    derived = grouped_mm.ratios()
    assert set(derived) == {"hopper", "blackwell"}
    for die, values in derived.items():
        for hardware in grouped_mm.CATALOGUE[die]:
            device = cluster_from_hardware(hardware, 8).primary.hardware
            for field, value in values.items():
                assert getattr(device, field) == pytest.approx(value, abs=0.005), (hardware, field)


@pytest.mark.parametrize("target, said", [("torchtitan", True), ("megatron", False)])
def test_the_header_says_the_kernel_speeds_where_it_prices_the_experts(target, said):
    from typer.testing import CliRunner

    from gplan.cli import app

    done = CliRunner().invoke(app, ["estimate", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "8",
                                    "--ep", "8", "--target", target])
    assert done.exit_code == 0, done.output
    training = TrainingSpec(gbs=16, seq_length=4096, precision="bf16", engine="torchtitan")
    forward, backward = experts.kernel_ratios(training, device_of("dgx-h100"))
    assert (f"routed experts on torch._grouped_mm at {forward:.2g} of the grouped GEMMs' speed forward, "
            f"{backward:.2g} backward on h100-sxm" in " ".join(done.output.split())) == said
