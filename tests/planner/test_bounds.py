"""The search's bounds are sound: on random instances — large vocabularies, tight budgets — the bounded
search returns the same best plan as solving every candidate's ILP with no bound at all."""

from __future__ import annotations

import random

import pytest

from gplan.errors import InfeasibleError
from gplan.planner.search import memory_admits_a_split, search
from gplan.planner.space import SearchLimits
from gplan.planner.table import build_table
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.training import TrainingSpec
from gplan.cost_models.step import StepModel
from gplan.spec.parallel import ParallelConfig


def random_instance(rng: random.Random):
    heads = rng.choice([8, 16, 32])
    model = ModelSpec(name="r", num_layers=rng.choice([8, 12, 16, 24]), hidden_size=heads * 128,
                      num_attention_heads=heads, num_kv_heads=rng.choice([heads, 8]),
                      ffn_hidden_size=rng.choice([3, 4]) * heads * 128, ffn_kind="swiglu",
                      vocab_size=rng.choice([32000, 128256, 256000]), seq_length=rng.choice([2048, 4096, 8192]),
                      norm="rmsnorm", position_embedding="rope")
    devices = rng.choice([8, 16])
    cluster = load_cluster(rng.choice(["dgx-a100-40g", "dgx-a100-80g", "dgx-v100"]), devices)
    memory = rng.uniform(0.25, 1.0)  # tight budgets, down to a quarter of the device
    groups = [g.model_copy(update={"hardware": g.hardware.model_copy(update={"memory_GiB": g.hardware.memory_GiB * memory})})
              for g in cluster.node_groups]
    training = TrainingSpec(gbs=rng.choice([16, 32, 64]), seq_length=model.seq_length,
                            precision="fp16" if "v100" in cluster.name else "bf16")
    return model, training, cluster.model_copy(update={"node_groups": groups}), devices


@pytest.mark.parametrize("seed", range(10))
def test_the_bounded_search_finds_the_unbounded_best(seed):
    model, training, cluster, devices = random_instance(random.Random(seed))
    limits = SearchLimits(mbs=[1, 2], vpp=[1], zero=[0, 1, 3], allow_fewer_devices=False)
    try:
        unbounded = search(model, training, cluster, devices, limits, top=1, bounds=False).best
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            search(model, training, cluster, devices, limits, top=1)
        return
    bounded = search(model, training, cluster, devices, limits, top=1).best
    assert bounded.prediction.step_time_s == pytest.approx(unbounded.prediction.step_time_s, rel=1e-6)


def test_the_stage_holding_the_head_may_take_fewer_layers():
    """The old bound charged the head's stage the mean layer memory; with a 256k vocabulary on a tight
    budget that stage fits only if the ILP gives it fewer layers — the candidate must survive."""
    model = ModelSpec(name="v256k", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
                      ffn_hidden_size=14336, ffn_kind="swiglu", vocab_size=256000, seq_length=4096,
                      norm="rmsnorm", position_embedding="rope")
    cluster = load_cluster("dgx-a100-40g", 8)
    training = TrainingSpec(gbs=64, seq_length=4096)
    config = ParallelConfig(dp=1, tp=1, pp=8, mbs=1)
    table = build_table(StepModel(model, training, cluster, config), ["none", "selective", "full"])
    assert memory_admits_a_split(table)
    limits = SearchLimits(tp=[1], pp=[8], mbs=[1], vpp=[1], zero=[0])
    best = search(model, training, cluster, 8, limits, top=1).best
    sizes = [s.num_layers for s in best.layouts]
    assert best.prediction.fits and sizes[-1] < max(sizes)


def test_the_exit_4_hint_keeps_the_users_limits(gplan, tmp_path):
    """With --tp 1 --pp 8 on 40 GiB devices the hint used to name devices of 26 GiB (a size that had
    fitted with tp it was not allowed): the memory it names is more than the device has, or absent."""
    import re

    r = gplan("search", "llama3-70b", "--cluster", "dgx-a100-40g", "--devices", "16", "--tp", "1", "--pp", "8",
              "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "within the limits asked" in r.stderr
    named = re.search(r"devices with ≥ (\\d+) GiB", r.stderr)
    assert named is None or int(named.group(1)) > 40
