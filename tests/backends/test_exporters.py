"""`gplan export`: each target's output goes through the engine's own parser or validator where it
installs on CPU (megatron-core, torchtitan, DeepSpeed are in the test extras); where it does not,
through a check of every name against the engine's documented ones, with the reason given."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gplan.backends.exporters import targets
from gplan.backends.exporters.megatron import megatron_args
from gplan.backends.exporters.torchtitan import overrides
from gplan.plan import Plan, write_plan
from gplan.planner.build import make_plan
from gplan.planner.placement import axis_groups
from gplan.profiles.catalogue import load_cluster
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
from gplan.spec.training import TrainingSpec
from gplan.testing import requires_engine

MODEL = ModelSpec(name="llama-mini", num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=4,
                  ffn_hidden_size=1376, ffn_kind="swiglu", vocab_size=32000, seq_length=1024, norm="rmsnorm",
                  position_embedding="rope")
TRAINING = TrainingSpec(gbs=64, seq_length=1024)


def plan_of(config: ParallelConfig, stages: list[list[tuple[str, int]]] | None = None) -> Plan:
    cluster = load_cluster("dgx-a100-80g", config.world_size)
    layouts = None
    if stages:
        layouts = [StageLayout(layers=[LayerCount(kind="decoder", recompute=r, count=n) for r, n in stage],
                               embedding=i == 0, head=i == len(stages) - 1) for i, stage in enumerate(stages)]
    return make_plan(MODEL, TRAINING, cluster, config, layouts)


PLANS = {
    "dp_only": lambda: plan_of(ParallelConfig(dp=8)),
    "tp_pp_dp_sp_interleaved": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, vpp=2, sp=True, zero=1,
                                                              recompute="selective")),
    "zero3_full_recompute": lambda: plan_of(ParallelConfig(dp=8, zero=3, recompute="full")),
    "uneven_first_last": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, sp=True),
                                         [[("full", 2), ("none", 1)], [("none", 5)]]),
    "uneven_layout": lambda: plan_of(ParallelConfig(dp=1, tp=1, pp=4),
                                     [[("none", 1)], [("none", 3)], [("none", 2)], [("none", 2)]]),
}


# ---- Megatron-LM ----------------------------------------------------------------------------------

#: Flags of Megatron-LM's `megatron/training/arguments.py` that gplan emits. Megatron's own argument
#: parser ships with the Megatron-LM repository (megatron/training), not with the megatron-core wheel
#: installed here, so every emitted flag is checked against these documented names; the values go
#: through megatron-core's own TransformerConfig validation and RankGenerator below.
MEGATRON_FLAGS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--seq-length",
    "--max-position-embeddings", "--normalization", "--position-embedding-type", "--attention-dropout",
    "--hidden-dropout", "--group-query-attention", "--num-query-groups", "--swiglu",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--bf16", "--fp16",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--micro-batch-size", "--global-batch-size", "--sequence-parallel", "--num-layers-per-virtual-pipeline-stage",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--mock-data", "--tokenizer-type",
    "--vocab-size", "--train-iters", "--lr", "--log-interval",
}
SWITCHES = {"--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
            "--bf16", "--fp16", "--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp",
            "--mock-data"}


def parse_megatron(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in MEGATRON_FLAGS:
        if flag in SWITCHES:
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag)
    return parser.parse_args(args)


@requires_engine("megatron.core", "dev")
@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_arguments_pass_megatron_core_validation(name):
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    from megatron.core.transformer.transformer_config import TransformerConfig

    plan = PLANS[name]()
    args, _ = megatron_args(plan)
    assert {a for a in args if a.startswith("--")} <= MEGATRON_FLAGS
    ns = parse_megatron(args)
    tp, pp, cp = int(ns.tensor_model_parallel_size), int(ns.pipeline_model_parallel_size), int(ns.context_parallel_size)
    dp = plan.world_size // (tp * pp * cp)
    assert dp == plan.parallel.dp and int(ns.global_batch_size) % (int(ns.micro_batch_size) * dp) == 0
    layers = int(ns.num_layers)
    vpp = layers // pp // int(ns.num_layers_per_virtual_pipeline_stage) if ns.num_layers_per_virtual_pipeline_stage else None
    layout = ns.pipeline_model_parallel_layout
    config = TransformerConfig(
        num_layers=layers, hidden_size=int(ns.hidden_size), ffn_hidden_size=int(ns.ffn_hidden_size),
        num_attention_heads=int(ns.num_attention_heads),
        num_query_groups=int(ns.num_query_groups) if ns.num_query_groups else None,
        gated_linear_unit=ns.swiglu, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, context_parallel_size=cp, sequence_parallel=ns.sequence_parallel,
        bf16=ns.bf16, pipeline_dtype=torch.bfloat16 if pp > 1 else None,
        recompute_granularity=ns.recompute_granularity, recompute_method=ns.recompute_method,
        recompute_num_layers=int(ns.recompute_num_layers) if ns.recompute_num_layers else None,
        num_layers_in_first_pipeline_stage=int(ns.decoder_first_pipeline_num_layers) if ns.decoder_first_pipeline_num_layers else None,
        num_layers_in_last_pipeline_stage=int(ns.decoder_last_pipeline_num_layers) if ns.decoder_last_pipeline_num_layers else None,
        pipeline_model_parallel_layout=PipelineParallelLayerLayout(layout, pp) if layout else None,
    )
    assert config.num_layers == plan.model.num_layers
    if layout:
        built = [sum(1 for kind in stage[0] if kind.name == "decoder") for stage in config.pipeline_model_parallel_layout.layout]
        assert built == [s.layer_end - s.layer_start for s in plan.stages]


@requires_engine("megatron.core", "dev")
@pytest.mark.parametrize("name", ["tp_pp_dp_sp_interleaved", "uneven_first_last"])
def test_rank_layout_matches_megatron_core_rank_generator(name):
    from megatron.core.parallel_state import RankGenerator

    plan = PLANS[name]()
    c = plan.parallel
    generator = RankGenerator(tp=c.tp, ep=1, dp=c.dp, pp=c.pp, cp=c.cp, order="tp-cp-ep-dp-pp")
    for axis in ("tp", "dp", "pp", "cp"):
        assert sorted(generator.get_ranks(axis)) == sorted(axis_groups(c, axis))


def test_megatron_script_is_valid_bash_and_carries_the_digest(tmp_path):
    plan = PLANS["uneven_first_last"]()
    text = targets()["megatron"](plan).files["megatron_pretrain_gpt.sh"]
    assert plan.digest in text.splitlines()[1]
    path = tmp_path / "run.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


# ---- torchtitan ------------------------------------------------------------------------------------

def titan_config(args: list[str]):
    """torchtitan's own parser (tyro with torchtitan's registry) over the sections of its Trainer
    config that the export sets. The Trainer config itself cannot be imported here: torchtitan 0.3
    imports triton (GPU only) with its models, so its sections are parsed with their own classes."""
    from dataclasses import field, make_dataclass

    import tyro
    from torchtitan.config.configs import ParallelismConfig, TrainingConfig
    from torchtitan.config.manager import custom_registry
    from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig, SelectiveAC

    # Real annotations (not strings) so that tyro resolves torchtitan's types.
    Sections = make_dataclass("Sections", [
        ("training", TrainingConfig, field(default_factory=TrainingConfig)),
        ("parallelism", ParallelismConfig, field(default_factory=ParallelismConfig)),
        ("activation_checkpoint", ActivationCheckpointingConfig, field(default_factory=SelectiveAC.Config)),
    ])
    return tyro.cli(Sections, args=args, default=Sections(), registry=custom_registry)


@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan_overrides_parse_and_build_parallel_dims(name):
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = PLANS[name]()
    args, _ = overrides(plan)
    config = titan_config(args)
    p, t, c = config.parallelism, config.training, plan.parallel
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (c.tp, c.pp, c.cp)
    assert p.enable_sequence_parallel == c.sp
    assert t.local_batch_size * c.dp == plan.training.gbs == t.global_batch_size
    assert t.local_batch_size % p.pipeline_parallel_microbatch_size == 0  # Trainer.Config's own rule
    if c.pp > 1:
        get_schedule_class(p.pipeline_parallel_schedule)
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=1, world_size=plan.world_size)
    assert (dims.dp_replicate * dims.dp_shard) == c.dp
    expected_ac = "FullAC" if "full" in str(plan.stages) else ("SelectiveAC" if "selective" in str(plan.stages) else None)
    assert (type(config.activation_checkpoint).__qualname__.split(".")[0] if config.activation_checkpoint else None) == expected_ac


def test_torchtitan_uneven_split_writes_the_exact_modules():
    plan = PLANS["uneven_layout"]()
    files = targets()["torchtitan"](plan).files
    parts = json.loads(files["torchtitan_module_fqns.json"])["module_fqns_per_model_part"]
    assert [sum(1 for m in part if m.startswith("layers.")) for part in parts] == [1, 3, 2, 2]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]


# ---- DeepSpeed -------------------------------------------------------------------------------------

DEEPSPEED_CHECK = """
import json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig
deepspeed.init_distributed(dist_backend="gloo")
class DataParallelOnly:
    def get_data_parallel_world_size(self):
        return int(sys.argv[2])
config = DeepSpeedConfig(json.load(open(sys.argv[1])), mpu=DataParallelOnly())
print(json.dumps({"stage": config.zero_optimization_stage, "train_batch_size": config.train_batch_size,
                  "micro": config.train_micro_batch_size_per_gpu, "accumulation": config.gradient_accumulation_steps,
                  "bf16": config.bfloat16_config.enabled if hasattr(config, "bfloat16_config") else config.bfloat16_enabled}))
"""


@requires_engine("deepspeed", "dev")
@pytest.mark.parametrize("name", ["dp_only", "tp_pp_dp_sp_interleaved", "zero3_full_recompute"])
def test_deepspeed_config_passes_deepspeeds_own_validation(name, tmp_path):
    plan = PLANS[name]()
    files = targets()["deepspeed"](plan).files
    (tmp_path / "ds_config.json").write_text(files["ds_config.json"])
    port = str(29600 + list(PLANS).index(name))
    done = subprocess.run([sys.executable, "-c", DEEPSPEED_CHECK, str(tmp_path / "ds_config.json"), str(plan.parallel.dp), port],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    checked = json.loads(done.stdout.strip().splitlines()[-1])
    c = plan.parallel
    assert checked == {"stage": c.zero, "train_batch_size": plan.training.gbs, "micro": c.mbs,
                       "accumulation": c.num_microbatches, "bf16": True}


def test_deepspeed_refuses_zero3_with_pipeline(gplan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(plan_of(ParallelConfig(dp=2, pp=2, zero=3)), path)
    r = gplan("export", str(path), "--to", "deepspeed", "-o", str(tmp_path))
    assert r.code == 3 and "(zero)" in r.stderr and "--zero 0,1" in r.stderr and "--target deepspeed" in r.stderr
    assert not (tmp_path / "ds_config.json").exists()


# ---- Kubernetes, SLURM, the command --------------------------------------------------------------

def test_pytorchjob_manifest_structure():
    """Structure of Kubeflow's PyTorchJob (kubeflow.org/v1): the training operator's CRD schema is
    not installable here, so its documented fields are checked."""
    plan = plan_of(ParallelConfig(dp=4, tp=8, pp=2))
    config_map, job = yaml.safe_load_all(targets()["k8s"](plan).files["pytorchjob.yaml"])
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 7
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch"  # the operator injects its variables into this container
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert job["spec"]["nprocPerNode"] == "8"
    assert "--nnodes=8" in container["command"]
    assert job["metadata"]["labels"]["gplan/plan-digest"] == plan.layout_digest
    assert job["metadata"]["labels"]["gplan/inputs-digest"] == plan.digest
    assert Plan.model_validate_json(config_map["data"]["plan.json"]) == plan
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # the launch recipe's environment, not dropped
    assert container["command"][container["command"].index("-m") + 1] == "gplan.backends.torch.worker"


def test_different_plans_of_one_model_get_different_kubernetes_resources():
    """Their inputs digest is the same; their layout digest is not, so the second apply cannot
    overwrite the first plan's PyTorchJob and ConfigMap."""
    names = set()
    for config in (ParallelConfig(dp=4, tp=8, pp=2), ParallelConfig(dp=8, tp=8, pp=1), ParallelConfig(dp=64)):
        plan = plan_of(config)
        config_map, job = yaml.safe_load_all(targets()["k8s"](plan).files["pytorchjob.yaml"])
        assert len(job["metadata"]["name"]) <= 63 and config_map["metadata"]["name"].startswith(job["metadata"]["name"])
        names.add((job["metadata"]["name"], config_map["metadata"]["name"]))
    assert len(names) == 3


def test_slurm_export_is_valid_bash(tmp_path):
    plan = plan_of(ParallelConfig(dp=4, tp=8))
    path = tmp_path / "job.sh"
    path.write_text(targets()["slurm"](plan).files["slurm_job.sh"])
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "#SBATCH --nodes=4" in path.read_text() and plan.digest in path.read_text()


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed", "k8s", "slurm"])
def test_every_export_file_carries_the_plan_digest(gplan, tmp_path, target):
    path = tmp_path / "plan.json"
    plan = PLANS["dp_only"]()
    write_plan(plan, path)
    data = gplan("export", str(path), "--to", target, "-o", str(tmp_path / "out"), "--json").json()
    assert data["files"]
    for file in data["files"]:
        assert plan.digest in Path(file).read_text()


def test_unknown_target_and_newer_schema_exit_3(gplan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(PLANS["dp_only"](), path)
    r = gplan("export", str(path), "--to", "alpa")
    assert r.code == 3 and "unknown target" in r.stderr and "megatron" in r.stderr
    data = json.loads(path.read_text())
    data["schema_version"] = 2
    path.write_text(json.dumps(data))
    r = gplan("export", str(path), "--to", "megatron")
    assert r.code == 3 and "schema" in r.stderr


def test_help_lists_the_targets(gplan):
    r = gplan("export", "--help")
    assert all(t in r.stdout for t in ("megatron", "torchtitan", "deepspeed", "k8s", "slurm"))


def test_exports_refuse_what_their_engine_cannot_run_and_note_what_it_runs_differently(gplan, tmp_path):
    from gplan.spec.training import TrainingSpec
    from gplan.testing import TINY_GPT, TINY_LLAMA, tiny_plan

    gpt = tiny_plan(tmp_path / "gpt.json", TINY_GPT, None, dp=2)
    r = gplan("export", str(gpt), "--to", "mindformers", "-o", str(tmp_path / "mf"))
    assert r.code == 3 and "(model)" in r.stderr and "--target mindformers" in r.stderr
    assert not (tmp_path / "mf").exists()
    one_microbatch = tiny_plan(tmp_path / "m1.json", TINY_LLAMA, None, TrainingSpec(gbs=1, seq_length=32,
                                                                                     precision="fp32"), pp=2)
    for target in ("k8s", "slurm"):  # they run gplan's torch worker
        r = gplan("export", str(one_microbatch), "--to", target, "-o", str(tmp_path / target))
        assert r.code == 3 and "(microbatches)" in r.stderr
    mixed = tiny_plan(tmp_path / "mixed.json", TINY_LLAMA, [[("full", 1)], [("none", 3)]], pp=2)
    r = gplan("export", str(mixed), "--to", "megatron", "-o", str(tmp_path / "mg"), "--json")
    assert r.code == 0 and any("runs differently than priced" in n for n in r.json()["notes"])
