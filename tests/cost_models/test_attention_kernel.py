"""The attention kernel an engine runs: FlashAttention-2's class (flash-attn 2, torch SDPA's flash backend) cannot
use Hopper's asynchronous tensor cores that Transformer Engine's cuDNN kernels use, so on H100 it runs at the
device's `fa2_attention_ratio` of the fused-attention speed the catalogue fits on Megatron-LM's runs; on A100
FlashAttention-2 is that kernel, and nothing changes."""

from __future__ import annotations

import pytest

from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import cluster_from_hardware, load_cluster, load_model
from gplan.engines import ENGINES
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

MODEL = load_model("llama3-8b")
CONFIG = ParallelConfig(dp=8, mbs=1, zero=1)


def load_hardware(name: str):
    return cluster_from_hardware(name, 8).primary.hardware


def _attention_s(engine: str, cluster: str, seq: int = 8192) -> float:
    training = TrainingSpec(gbs=8, seq_length=seq, precision="bf16", engine=engine)
    return StepModel(MODEL, training, load_cluster(cluster, 8), CONFIG).layer_time("decoder", 0).attention_forward_s


def test_on_hopper_the_fa2_engines_run_attention_at_the_ratio_of_the_fused_kernel():
    ratio = load_hardware("h100-sxm").fa2_attention_ratio
    assert 0 < ratio < 1
    fused = _attention_s("megatron", "dgx-h100")
    for engine in ("torch", "torchtitan", "llm-foundry", "deepspeed"):
        assert ENGINES[engine].attention_kernel == "fa2"
        # llm-foundry and DeepSpeed carry no other factor on H100 that touches attention than their own
        factor = load_hardware("h100-sxm").engine_efficiency.get(engine, 1.0)
        assert _attention_s(engine, "dgx-h100") == pytest.approx(fused / (ratio * factor), rel=1e-9)


def test_on_a100_flash_attention_2_is_the_fused_kernel_and_nothing_changes():
    assert load_hardware("a100-80g").fa2_attention_ratio == 1.0
    assert _attention_s("torch", "dgx-a100-80g") == pytest.approx(_attention_s("megatron", "dgx-a100-80g"))


def test_only_attention_slows_and_the_gap_grows_with_the_sequence():
    h100 = load_hardware("h100-sxm")
    fa2, fused = h100.for_engine("torch", "fa2"), h100.for_engine("torch", "fused")
    assert fa2.efficiency.gemm == fused.efficiency.gemm and fa2.efficiency.memory == fused.efficiency.memory
    assert fa2.efficiency.attention == pytest.approx(fused.efficiency.attention * h100.fa2_attention_ratio)

    def step_ratio(seq: int) -> float:
        def step(engine: str) -> float:
            training = TrainingSpec(gbs=8, seq_length=seq, precision="bf16", engine=engine)
            return StepModel(MODEL, training, load_cluster("dgx-h100", 8), CONFIG).predict().step_time_s
        return step("torch") / step("megatron")

    assert 1 < step_ratio(2048) < step_ratio(32768)


@pytest.mark.parametrize("cluster, target, said", [("dgx-h100", "torch", True), ("dgx-h100", "megatron", False),
                                                   ("dgx-a100-80g", "torch", False)])
def test_the_search_says_when_attention_is_priced_at_flash_attention_2s_speed(gplan, tmp_path, cluster, target, said):
    r = gplan("search", "llama3-8b", "--cluster", cluster, "--devices", "8", "--target", target,
              "--out", str(tmp_path / "plan.json"))
    assert r.code == 0
    assert ("priced at FlashAttention-2's speed on h100-sxm, 0.467" in " ".join(r.stderr.split())) is said
