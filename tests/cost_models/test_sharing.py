"""StepModel.sharing: configurations that agree on the shard, the expert grid and the devices share their
priced layers; the key is StepModel's own, so a caller cannot share what differs."""

from __future__ import annotations

from gplan.cost_models.step import StepModel
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec


def test_configurations_share_what_their_shards_agree_on_and_nothing_else():
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", 16)
    training = TrainingSpec(gbs=64, seq_length=4096, engine="megatron")
    pool: dict = {}
    a = StepModel.sharing(pool, model, training, cluster, ParallelConfig(dp=4, tp=2, pp=2, sp=True))
    b = StepModel.sharing(pool, model, training, cluster, ParallelConfig(dp=2, tp=2, pp=4, sp=True, zero=1))
    c = StepModel.sharing(pool, model, training, cluster, ParallelConfig(dp=2, tp=4, pp=2, sp=True))
    torch = StepModel.sharing(pool, model, training.model_copy(update={"engine": "torchtitan"}), cluster,
                              ParallelConfig(dp=4, tp=2, pp=2, sp=True))
    assert a._shared is b._shared and a._shared is not c._shared and a._shared is not torch._shared
    assert a.layer_time("decoder", 0) == StepModel(model, training, cluster, a.config).layer_time("decoder", 0)
    assert c.layer_time("decoder", 0) != a.layer_time("decoder", 0)  # a tp 4 shard is priced on its own
