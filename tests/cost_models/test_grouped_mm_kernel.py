"""The kernel an engine runs its routed experts on: torchtitan's GroupedExperts call `torch._grouped_mm`, whose BF16
forward and backward run at the device's measured `torch_grouped_mm_ratio` of the grouped GEMMs the MoE constants
were fitted on (Transformer Engine's, in Megatron-core); the ratio is the median of the published kernel timings
(bench/grouped_mm.py), so the catalogue cannot drift from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gplan.cost_models import experts
from gplan.cost_models.compute import shard_of
from gplan.engines import ENGINES
from gplan.profiles.catalogue import cluster_from_hardware, load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

MODEL = load_model("qwen3-30b-a3b")
CONFIG = ParallelConfig(dp=8, ep=8, mbs=2, zero=3)


def routed_s(engine: str, cluster: str, precision: str = "bf16") -> tuple[float, float]:
    training = TrainingSpec(gbs=16, seq_length=4096, precision=precision, engine=engine)
    device = load_cluster(cluster, 8).node_groups[0].hardware
    return experts.routed_time_s(MODEL, training, shard_of(training, CONFIG), CONFIG, device)


def gemm_share_s(engine: str, cluster: str) -> float:
    """The routed forward less its element-wise traffic: the grouped GEMMs alone (balanced routing)."""
    training = TrainingSpec(gbs=16, seq_length=4096, precision="bf16", engine=engine)
    device = load_cluster(cluster, 8).node_groups[0].hardware
    shard = shard_of(training, CONFIG)
    moved = experts.memory_time_s(device, experts.routed_elementwise_elements(MODEL, shard, CONFIG) * training.element_bytes)
    return routed_s(engine, cluster)[0] - moved


@pytest.mark.parametrize("cluster, hardware", [("dgx-h100", "h100-sxm"), ("dgx-b200", "b200")])
def test_torchtitan_runs_the_routed_gemms_at_the_measured_ratio(cluster, hardware):
    ratio = cluster_from_hardware(hardware, 8).primary.hardware.torch_grouped_mm_ratio
    assert ENGINES["torchtitan"].expert_kernel == "torch_grouped_mm" and ENGINES["megatron"].expert_kernel == "grouped"
    assert 0 < ratio < 1
    assert gemm_share_s("torchtitan", cluster) == pytest.approx(gemm_share_s("megatron", cluster) / ratio, rel=1e-9)
    forward, backward = routed_s("torchtitan", cluster)
    assert backward == pytest.approx(2 * forward)


def test_without_a_published_timing_and_in_low_precision_nothing_changes():
    assert cluster_from_hardware("a100-80g", 8).primary.hardware.torch_grouped_mm_ratio == 1.0
    assert routed_s("torchtitan", "dgx-a100-80g") == pytest.approx(routed_s("megatron", "dgx-a100-80g"))
    # torchao's scaled grouped GEMMs (an FP8 recipe) are other kernels, not measured apart
    assert routed_s("torchtitan", "dgx-b200", "mxfp8") == pytest.approx(routed_s("megatron", "dgx-b200", "mxfp8"))


def test_the_catalogue_ratio_is_the_median_of_the_published_timings():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        import grouped_mm
    finally:
        sys.path.pop(0)
    derived = grouped_mm.ratios()
    assert set(derived) == {"h100-sxm", "b200"}
    for hardware, ratio in derived.items():
        assert cluster_from_hardware(hardware, 8).primary.hardware.torch_grouped_mm_ratio == pytest.approx(ratio, abs=0.005)


@pytest.mark.parametrize("target, said", [("torchtitan", True), ("megatron", False)])
def test_the_header_says_the_kernel_ratio_where_it_prices_the_experts(target, said):
    from typer.testing import CliRunner

    from gplan.cli import app

    done = CliRunner().invoke(app, ["estimate", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "8",
                                    "--ep", "8", "--target", target])
    assert done.exit_code == 0, done.output
    ratio = cluster_from_hardware("h100-sxm", 8).primary.hardware.torch_grouped_mm_ratio
    assert (f"routed experts on torch._grouped_mm at {ratio:.2g} of the grouped GEMMs' speed on h100-sxm"
            in " ".join(done.output.split())) == said
