"""`gplan export --to mindformers-pynative`, read back by MindFormers' own PyNative code: its TrainConfig (which
refuses a key it does not know and validates every section), its ParallelDims (the degrees on the world size
msrun starts), its PpLayerSetting (each virtual stage's layers) and its trainer's batch rule.

Its distributed modules import `hyper_parallel` (MindSpore's device-mesh library, not on the package index) for
the mesh and pipeline-stage classes alone; the degree checks and the layer split read here are plain Python, so
those two files are loaded as they are with empty stand-ins for the three names they import from it."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import yaml
from helpers import requires_engine, stage_layouts

from gplan.backends.exporters import render_export
from gplan.engines.mindformers_pynative.export import rank_ranges
from gplan.plan import layouts_of
from gplan.planner.build import make_plan
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.parallel import ParallelConfig
from gplan.spec.training import TrainingSpec

pytestmark = [requires_engine("mindspore", "mindspore"), requires_engine("mindformers", "dev")]

SHAPES = {
    "fsdp_ep": dict(model="deepseek-v3-16b", degrees=dict(dp=16, ep=8, zero=3)),
    "fsdp_kept_gathered_pp": dict(model="deepseek-v3-16b", degrees=dict(dp=8, pp=2, ep=4, zero=2),
                                  stages=[[("full", 6), ("none", 7)], [("none", 14)]]),
    "interleaved_uneven_tp": dict(model="deepseek-v3-16b", degrees=dict(dp=4, tp=2, sp=True, pp=2, vpp=2, ep=8, zero=3,
                                                                        schedule="interleaved_1f1b"),
                                  stages=[[("none", 13)], [("full", 2), ("none", 12)]]),
    "replicas_ep_in_tp": dict(model="deepseek-v3-16b", degrees=dict(dp=4, tp=4, sp=True, ep=4, zero=0)),
    "dense_qwen3": dict(model="qwen3-8b", degrees=dict(dp=8, tp=2, sp=True, zero=3)),
}


USERS_SECTIONS = {"train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset",
                                                  "config": {"seq_length": 4096, "data_path": ["1", "/data/text_document"]}}},
                  "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.01},
                  "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1.0e-5, "warmup_ratio": 0}}
"""The dataset, optimizer and learning-rate sections of its DeepSeek-V3 1B recipe, trimmed: what the export says a
user's YAML brings."""


def plan_of(model: str, degrees: dict, stages=None):
    config = ParallelConfig(**degrees)
    spec = load_model(model)
    layouts = stage_layouts(stages, spec) if stages else None
    training = TrainingSpec(gbs=64, seq_length=4096, engine="mindformers-pynative")
    return make_plan(spec, training, load_cluster("atlas-800-910b", config.world_size), config, layouts)


@pytest.fixture(scope="module")
def mindformers(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LOCAL_DEFAULT_PATH", str(tmp_path_factory.mktemp("mindformers")))
        import mindformers

        yield mindformers


@pytest.fixture(scope="module")
def pynative_distributed(mindformers):
    """(ParallelDims, PpLayerSetting) from MindFormers' own files, `hyper_parallel`'s names stood in for."""
    from pathlib import Path

    folder = Path(mindformers.__file__).parent / "pynative" / "distributed"
    stub = types.ModuleType("hyper_parallel")
    stub.DeviceMesh = stub.PipelineStage = type("Stub", (), {})
    stub.init_device_mesh = lambda *args, **kwargs: None
    loaded = {}
    with pytest.MonkeyPatch.context() as env:
        env.setitem(sys.modules, "hyper_parallel", stub)
        for name in ("parallel_dims", "pipeline_parallel"):
            spec = importlib.util.spec_from_file_location(f"_mf_pynative_{name}", folder / f"{name}.py")
            loaded[name] = importlib.util.module_from_spec(spec)
            env.setitem(sys.modules, spec.name, loaded[name])  # its dataclasses look their module up there
            spec.loader.exec_module(loaded[name])
    return loaded["parallel_dims"].ParallelDims, loaded["pipeline_parallel"].PpLayerSetting


@pytest.mark.parametrize("name", list(SHAPES))
def test_its_own_code_builds_the_plans_layout(name, pynative_distributed, tmp_path):
    from mindformers.pynative.config.config import TrainConfig

    ParallelDims, PpLayerSetting = pynative_distributed
    plan = plan_of(SHAPES[name]["model"], SHAPES[name]["degrees"], SHAPES[name].get("stages"))
    c = plan.parallel
    path = tmp_path / "mindformers_pynative.yaml"
    data = yaml.safe_load(render_export(plan, "mindformers-pynative").files["mindformers_pynative.yaml"])
    path.write_text(yaml.safe_dump({**data, **USERS_SECTIONS}))  # merged into the user's sections, as it says
    config = TrainConfig.load_from_yaml(str(path))

    parallelism = config.parallelism
    parallelism.data_parallel = plan.world_size // (c.tp * c.pp * c.cp)  # as its trainer stores it
    dims = ParallelDims.from_config(parallelism, plan.world_size)
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (c.tp, c.pp, c.cp, c.ep)
    assert dims.dp_shard * dims.dp_replicate == c.dp and dims.dp_shard == (1 if c.zero == 0 else c.dp)
    assert parallelism.sequence_parallel == (c.tp > 1)

    setting = PpLayerSetting(plan.model.num_layers, parallelism)
    ranges = rank_ranges(layouts_of(plan), c.pp, c.vpp)
    for v in range(c.vpp):
        for r in range(c.pp):
            start, end = setting.get_layer_range(v * c.pp + r)
            assert range(start, end + 1) == ranges[r][v]

    # its trainer: gbs divisible by dp · local batch, the rest accumulated (the pipeline's micro-batches)
    assert config.training.global_batch_size % (c.dp * config.training.local_batch_size) == 0
    assert config.training.global_batch_size // (c.dp * config.training.local_batch_size) == c.num_microbatches


def test_the_recomputed_layers_are_each_ranks_first(mindformers):
    plan = plan_of(**{k: SHAPES["fsdp_kept_gathered_pp"][k] for k in ("model", "degrees", "stages")})
    data = yaml.safe_load(render_export(plan, "mindformers-pynative").files["mindformers_pynative.yaml"])
    assert data["recompute"] == {"mode": "full", "full_recompute_layer": ["0-5"]}
    assert data["parallelism"]["reshard_after_forward_policy"] == "never"


def test_a_model_its_trainer_does_not_build_is_refused(gplan, tmp_path):
    from gplan.plan import write_plan

    plan = plan_of("llama3-8b", dict(dp=8, zero=3))
    write_plan(plan, tmp_path / "plan.json")
    r = gplan("export", str(tmp_path / "plan.json"), "--to", "mindformers-pynative", "--out-dir", str(tmp_path / "out"))
    assert r.code == 3 and "Qwen3" in r.stderr and len(r.stderr.strip().splitlines()) == 2, r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["fsdp_kept_gathered_pp", "interleaved_uneven_tp", "replicas_ep_in_tp"])
def test_an_export_read_back_by_gplan_is_the_plan(name, tmp_path):
    """gplan's own reader of these YAMLs takes the export back to the plan's degrees, split and recompute."""
    from gplan.planner.launch_files import read_launch

    plan = plan_of(SHAPES[name]["model"], SHAPES[name]["degrees"], SHAPES[name].get("stages"))
    path = tmp_path / "mindformers_pynative.yaml"
    path.write_text(render_export(plan, "mindformers-pynative").files["mindformers_pynative.yaml"])
    launch = read_launch(path, None)
    c, g = plan.parallel, launch.given
    assert (g["tp"], g["pp"], g["vpp"], g["cp"], g["ep"], g["zero"], g["mbs"]) == (c.tp, c.pp, c.vpp, c.cp, c.ep, c.zero, c.mbs)
    assert launch.gbs == plan.training.gbs
    assert launch.stage_sizes == ([s.num_layers for s in layouts_of(plan)] if c.pp > 1 else None)  # None: one stage
    full = [sum(n.count for n in s.layers if n.recompute != "none") for s in layouts_of(plan)]
    assert launch.per_stage_recompute[0] == full
    assert (launch.model.num_experts, launch.model.top_k, launch.model.router) == (
        plan.model.num_experts, plan.model.top_k, plan.model.router)
