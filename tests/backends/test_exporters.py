"""`gplan export`: every target's output goes through the engine's own code where it installs on CPU —
megatron-core's config and layout classes, torchtitan's full ConfigManager (the model built on the meta
device and counted), DeepSpeed's config, the Kubeflow SDKs' models and kubernetes-validate, shellcheck
— and through the rules of Megatron-LM's arguments.py (megatron_rules.py) where its parser does not
install. The plans cover zero 3, uneven pipeline splits, interleaving, selective and per-stage
recompute, on Llama and GPT."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import megatron_rules
from gplan.backends.exporters import Export, engine_split, render_export
from gplan.engines.megatron.export import megatron_args, vocab_divisor
from gplan.engines.torchtitan.export import overrides
from gplan.errors import InputError
from gplan.plan import Plan, layouts_of, write_plan
from gplan.cost_models.step import StepModel
from gplan.planner.build import make_plan, reprice_split
from gplan.planner.placement import axis_groups
from gplan.profiles.catalogue import load_cluster, load_model
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
from gplan.spec.targets import TARGETS, as_engine_runs, runs_as, same_split
from gplan.spec.training import TrainingSpec
from helpers import mixed_cluster_file, requires_engine, requires_program

LLAMA = ModelSpec(name="llama-mini", num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=4,
                  ffn_hidden_size=1376, ffn_kind="swiglu", vocab_size=32000, seq_length=1024, norm="rmsnorm",
                  position_embedding="rope", rope_theta=500000.0)
GPT = ModelSpec(name="gpt-mini", num_layers=8, hidden_size=512, num_attention_heads=8, vocab_size=50304,
                seq_length=1024, tie_embeddings=True, dropout=0.1, bias=True)
TRAINING = TrainingSpec(gbs=64, seq_length=1024)


def plan_of(config: ParallelConfig, stages: list[list[tuple[str, int]]] | None = None, model: ModelSpec = LLAMA,
            cluster: str = "dgx-a100-80g", training: TrainingSpec = TRAINING) -> Plan:
    layouts = None
    if stages:
        layouts = [StageLayout(layers=[LayerCount(kind="decoder", recompute=r, count=n) for r, n in stage],
                               embedding=i == 0, head=i == len(stages) - 1) for i, stage in enumerate(stages)]
    return make_plan(model, training, load_cluster(cluster, config.world_size), config, layouts)


MEGATRON_FP8 = TRAINING.model_copy(update={"engine": "megatron", "precision": "fp8"})


PLANS = {
    "dp_only": lambda: plan_of(ParallelConfig(dp=8)),
    "tp_pp_dp_sp_interleaved": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, vpp=2, sp=True, zero=1,
                                                              recompute="selective")),
    "zero3_full_recompute": lambda: plan_of(ParallelConfig(dp=8, zero=3, recompute="full")),
    "zero3_tp_pp_uneven": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, sp=True, zero=3),
                                          [[("full", 2), ("none", 1)], [("full", 2), ("none", 3)]]),
    "uneven_first_last": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, sp=True),
                                         [[("full", 2), ("none", 1)], [("none", 5)]]),
    "uneven_layout": lambda: plan_of(ParallelConfig(dp=1, tp=1, pp=4),
                                     [[("none", 1)], [("none", 3)], [("none", 2)], [("none", 2)]]),
    "per_stage_recompute_vpp": lambda: plan_of(ParallelConfig(dp=1, tp=2, pp=4, vpp=2, sp=True, zero=1),
                                               [[("full", 2)], [("full", 1), ("selective", 1)], [("none", 2)],
                                                [("selective", 2)]]),
    "gpt_tp_pp_cp": lambda: plan_of(ParallelConfig(dp=1, tp=2, pp=2, cp=2, sp=True, zero=1, recompute="selective"),
                                    model=GPT),
    "gpt_tp_pp_zero1_full": lambda: plan_of(ParallelConfig(dp=2, tp=2, pp=2, sp=True, zero=1, recompute="full"),
                                            model=GPT),
    "mixtral_dp8_tp2_ep8": lambda: plan_of(ParallelConfig(dp=8, tp=2, ep=8, sp=True, zero=1),
                                           model=load_model("mixtral-8x7b"), cluster="dgx-h100"),
    # DeepSpeed-MoE at ZeRO-2 (its engine partitions the experts' gradients over their data-parallel group)
    "mixtral_dp8_ep8_zero2": lambda: plan_of(ParallelConfig(dp=8, ep=8, zero=2),
                                             model=load_model("mixtral-8x7b"), cluster="dgx-h100"),
    # priced for Megatron: tp's collectives overlapped with the GEMMs (--tp-comm-overlap) ...
    "megatron_fp8_tp2_sp": lambda: plan_of(ParallelConfig(dp=4, tp=2, sp=True, zero=1), cluster="dgx-h100",
                                           training=MEGATRON_FP8),
    # ... but not in NVFP4 (Megatron-Bridge's recipes turn it off), nor the MXFP8 parameter all-gather
    "megatron_nvfp4_tp2_sp": lambda: plan_of(ParallelConfig(dp=4, tp=2, sp=True, zero=1), cluster="dgx-b200",
                                             training=MEGATRON_FP8.model_copy(update={"precision": "nvfp4"})),
    "megatron_fp8_overlap_off": lambda: plan_of(ParallelConfig(dp=4, tp=2, sp=True, zero=1), cluster="dgx-h100",
                                                training=MEGATRON_FP8.model_copy(update={"tp_comm_overlap": False})),
    "megatron_mxfp8_tp2_sp_zero2": lambda: plan_of(ParallelConfig(dp=4, tp=2, sp=True, zero=2), cluster="dgx-b200",
                                                   training=MEGATRON_FP8.model_copy(update={"precision": "mxfp8"})),
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def export(plan: Plan, target: str, **kw) -> Export:
    return render_export(plan, target, reprice=reprice_split, **kw)


# ---- the split an engine runs (spec.targets.runs_as) --------------------------------------------------

def test_a_target_runs_its_own_plans_exactly():
    for name in ("megatron", "torchtitan", "deepspeed"):
        plan = plan_of(ParallelConfig(dp=2, pp=2, zero=1, recompute="full"))
        assert same_split(runs_as(TARGETS[name], plan.model, plan.parallel, layouts_of(plan)), layouts_of(plan))


def test_megatron_block_recompute_covers_every_stage_and_never_adds_activations():
    plan = PLANS["per_stage_recompute_vpp"]()
    engine = runs_as(TARGETS["megatron"], plan.model, plan.parallel, layouts_of(plan))
    # the largest recomputed count of any chunk is 1 (2 layers per stage over vpp=2): block N=1 per chunk
    assert [{c.recompute: c.count for c in s.layers} for s in engine] == [{"full": 2}] * 4
    for planned, ran in zip(layouts_of(plan), engine):
        kept = sum(c.count for c in planned.layers if c.recompute == "none")
        assert sum(c.count for c in ran.layers if c.recompute == "none") <= kept


def test_deepspeed_runs_an_uneven_split_evenly_and_torchtitan_every_layer_alike():
    plan = PLANS["uneven_layout"]()
    engine = runs_as(TARGETS["deepspeed"], plan.model, plan.parallel, layouts_of(plan))
    assert [s.num_layers for s in engine] == [2, 2, 2, 2]
    mixed = PLANS["uneven_first_last"]()
    titan = runs_as(TARGETS["torchtitan"], mixed.model, mixed.parallel, layouts_of(mixed))
    assert {c.recompute for s in titan for c in s.layers} == {"full"}


def test_an_export_re_prices_the_split_its_engine_runs_and_says_so():
    plan = PLANS["uneven_first_last"]()
    result = export(plan, "megatron")
    note = next(n for n in result.notes if "re-priced" in n)
    step_s, fits, _ = reprice_split(plan, runs_as(TARGETS["megatron"], plan.model, plan.parallel, layouts_of(plan)), "megatron")
    assert f"{step_s:.3f} s/step" in note and fits
    assert note in result.files["megatron_pretrain_gpt.sh"]


def test_an_export_whose_engine_split_would_not_fit_is_refused():
    plan = PLANS["uneven_layout"]()
    with pytest.raises(InputError, match="stage 1 needs 9.0 GiB"):
        engine_split(plan, "deepspeed", lambda p, layouts, engine: (1.0, False, "stage 1 needs 9.0 GiB against its 8.0 GiB"))


def test_an_export_its_engine_runs_as_written_but_over_budget_is_refused_unless_asked(gplan, tmp_path):
    """A plan searched for torch with zero 1 (FSDP2 shards the gradients too) runs in Megatron-LM with the same
    split, but Megatron's distributed optimizer keeps every fp32 gradient: its own memory accounting puts stage 0
    over the budget — refused, exit 3, nothing written; --over-budget writes it with the same figures in its note."""
    path = tmp_path / "plan.json"
    assert gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--target", "torch",
                 "--zero", "1", "--pp", "1", "--out", str(path)).code == 0
    r = gplan("export", str(path), "--to", "megatron", "--out-dir", str(tmp_path / "refused"))
    assert r.code == 3 and "by its memory accounting stage 0 needs" in r.stderr and "--over-budget" in r.stderr
    assert not (tmp_path / "refused").exists() and "Traceback" not in r.stderr
    r = gplan("export", str(path), "--to", "megatron", "--out-dir", str(tmp_path / "asked"), "--over-budget")
    assert r.code == 0 and "(written as asked: --over-budget)" in (tmp_path / "asked" / "megatron_pretrain_gpt.sh").read_text()


def test_an_export_its_engine_cannot_run_names_the_target_the_plan_was_searched_for(gplan, tmp_path):
    """Meta's 405B layout searched for Megatron-LM (chunks of unequal size): torchtitan and gplan's SLURM
    job (the torch worker) cannot run it; each export exits 3, writes nothing, and says how to run the plan
    where it was searched for."""
    from helpers import meta_405b_plan

    path = tmp_path / "plan.json"
    write_plan(meta_405b_plan(), path)
    for to in ("torchtitan", "slurm"):
        r = gplan("export", str(path), "--to", to, "--out-dir", str(tmp_path / to))
        assert r.code == 3 and "(uneven_interleaved)" in r.stderr and "Traceback" not in r.stderr
        assert "hint: the plan was searched for megatron: gplan export PLAN --to megatron; or search again" in r.stderr
        assert not (tmp_path / to).exists()
    assert gplan("export", str(path), "--to", "megatron", "--out-dir", str(tmp_path / "megatron")).code == 0


@pytest.mark.parametrize("to, hint", [("slurm", "--backend mindspore --slurm job.sh"),
                                      ("k8s", "gplan export PLAN --to mindformers")])
def test_a_torch_worker_export_of_an_ascend_plan_is_refused(gplan, tmp_path, to, hint):
    """The SLURM and Kubernetes exports run gplan's torch worker with --device auto: on Ascend devices it
    would find no CUDA and train on the host CPUs. Refused (exit 3, nothing written), pointing at what
    runs the plan on MindSpore; MindSpore's own batch script is written for the same plan."""
    from helpers import ascend_plan

    path = tmp_path / "plan.json"
    write_plan(ascend_plan(dp=8), path)
    r = gplan("export", str(path), "--to", to, "--image", "registry/gplan:1", "--out-dir", str(tmp_path / to))
    assert r.code == 3 and "this plan was priced on ascend-910b (Ascend)" in r.stderr and hint in r.stderr
    assert not (tmp_path / to).exists() and "Traceback" not in r.stderr
    script = tmp_path / "job.sh"
    ok = gplan("launch", str(path), "--backend", "mindspore", "--slurm", str(script), "--run-dir", str(tmp_path / "run"))
    assert ok.code == 0 and "msrun" in script.read_text()


# ---- Megatron-LM -------------------------------------------------------------------------------------

def script_args(text: str, array: str) -> list[str]:
    return shlex.split(text.split(f"{array}=(")[1].split("\n)")[0])


def script_env(text: str) -> dict[str, str]:
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # a user's environment that set it: the script must undo it for FSDP
    for line in text.splitlines():
        if line.startswith("export CUDA_DEVICE_MAX_CONNECTIONS="):
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = line.split("=")[1].split()[0]
        if line.startswith("unset CUDA_DEVICE_MAX_CONNECTIONS"):
            env.pop("CUDA_DEVICE_MAX_CONNECTIONS")
    return env


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_script_passes_megatron_lm_validate_args(name):
    plan = PLANS[name]()
    result = export(plan, "megatron")
    text = result.files["megatron_pretrain_gpt.sh"]
    args = megatron_rules.validate(script_args(text, "MEGATRON_ARGS"), plan.world_size, script_env(text), device_arch=8)
    c, m = plan.parallel, plan.model
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size,
            args.data_parallel_size) == (c.tp, c.pp, c.cp, c.dp)
    assert (args.virtual_pipeline_model_parallel_size or 1) == c.vpp
    assert args.global_batch_size // (args.micro_batch_size * args.data_parallel_size) == c.num_microbatches
    assert megatron_rules.padded_vocab_size(args) == m.vocab_size  # Megatron builds the plan's vocabulary
    if m.position_embedding == "rope":
        assert args.rotary_base == m.rope_theta
    assert args.untie_embeddings_and_output_weights == (not m.tie_embeddings)
    # zero levels as Megatron shards them
    assert args.use_distributed_optimizer == (c.zero >= 1)
    assert args.data_parallel_sharding_strategy == {2: "optim_grads", 3: "optim_grads_params"}.get(c.zero, "no_shard")
    # the communication overlap Megatron runs is the one its export's note re-priced the plan with (as Megatron runs it)
    step = StepModel(plan.model, as_engine_runs(plan.training, "megatron", c), plan.cluster, plan.parallel)
    assert args.tp_comm_overlap == (c.tp > 1 and step.tp_overlapped)
    assert args.overlap_grad_reduce == (c.dp * c.cp > 1)
    assert args.overlap_param_gather == (c.dp * c.cp > 1 and c.zero >= 1 and plan.training.precision != "mxfp8")
    # what Megatron recomputes on every stage is the split gplan re-priced
    engine = runs_as(TARGETS["megatron"], plan.model, plan.parallel, layouts_of(plan))
    expected = [{o: sum(x.count for x in s.layers if x.recompute == o) for o in ("full", "selective", "none")}
                for s in engine]
    assert megatron_rules.recompute_per_stage(args, [s.num_layers for s in engine]) == expected


def test_megatron_rules_catch_what_the_old_export_got_wrong():
    plan = PLANS["zero3_tp_pp_uneven"]()
    text = export(plan, "megatron").files["megatron_pretrain_gpt.sh"]
    argv = script_args(text, "MEGATRON_ARGS")
    with pytest.raises(megatron_rules.Violation, match="CUDA_DEVICE_MAX_CONNECTIONS value large than one"):
        megatron_rules.validate(argv, plan.world_size, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, device_arch=9)
    without_format = [a for a in argv if a not in ("--ckpt-format", "fsdp_dtensor")]
    with pytest.raises(megatron_rules.Violation, match="fsdp_dtensor checkpoint format"):
        megatron_rules.validate(without_format, plan.world_size, {}, device_arch=9)
    tp_only = export(PLANS["uneven_first_last"](), "megatron").files["megatron_pretrain_gpt.sh"]
    with pytest.raises(megatron_rules.Violation, match="CUDA_DEVICE_MAX_CONNECTIONS to 1"):
        megatron_rules.validate(script_args(tp_only, "MEGATRON_ARGS"), 8, {}, device_arch=9)
    assert megatron_rules.validate(script_args(tp_only, "MEGATRON_ARGS"), 8, {}, device_arch=10)  # Blackwell


def test_megatron_vocab_divisor_pads_nothing_when_tp_divides_the_vocabulary():
    assert vocab_divisor(128256, 8) == 32 and 128256 % (32 * 8) == 0 and 128256 % (64 * 8)
    assert vocab_divisor(50304, 2) == 64  # 50304 = 393·128
    assert vocab_divisor(32000, 3) == 1


@requires_engine("megatron.core", "dev")
@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_arguments_pass_megatron_core_validation(name):
    import torch
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    from megatron.core.transformer.transformer_config import TransformerConfig

    plan = PLANS[name]()
    args, _ = megatron_args(plan, runs_as(TARGETS["megatron"], plan.model, plan.parallel, layouts_of(plan)))
    ns = megatron_rules.validate(args, plan.world_size, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if not
                                 ("--use-megatron-fsdp" in args) else {}, device_arch=9)
    layout = ns.pipeline_model_parallel_layout
    config = TransformerConfig(
        num_layers=ns.num_layers, hidden_size=ns.hidden_size, ffn_hidden_size=ns.ffn_hidden_size,
        num_attention_heads=ns.num_attention_heads, kv_channels=ns.kv_channels,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        gated_linear_unit=ns.swiglu, tensor_model_parallel_size=ns.tensor_model_parallel_size,
        pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=ns.virtual_pipeline_model_parallel_size,
        context_parallel_size=ns.context_parallel_size, sequence_parallel=ns.sequence_parallel,
        bf16=ns.bf16, pipeline_dtype=torch.bfloat16 if ns.pipeline_model_parallel_size > 1 else None,
        recompute_granularity=ns.recompute_granularity, recompute_method=ns.recompute_method,
        recompute_num_layers=ns.recompute_num_layers,
        num_layers_in_first_pipeline_stage=ns.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=ns.decoder_last_pipeline_num_layers,
        pipeline_model_parallel_layout=PipelineParallelLayerLayout(layout, ns.pipeline_model_parallel_size) if layout else None,
    )
    assert config.num_layers == plan.model.num_layers
    if layout:
        built = [sum(1 for kind in stage[0] if kind.name == "decoder") for stage in config.pipeline_model_parallel_layout.layout]
        assert built == [s.layer_end - s.layer_start for s in plan.stages]


@requires_engine("megatron.core", "dev")
@pytest.mark.parametrize("name", ["tp_pp_dp_sp_interleaved", "uneven_first_last", "gpt_tp_pp_cp"])
def test_rank_layout_matches_megatron_core_rank_generator(name):
    from megatron.core.parallel_state import RankGenerator

    plan = PLANS[name]()
    c = plan.parallel
    generator = RankGenerator(tp=c.tp, ep=1, dp=c.dp, pp=c.pp, cp=c.cp, order="tp-cp-ep-dp-pp")
    for axis in ("tp", "dp", "pp", "cp"):
        assert sorted(generator.get_ranks(axis)) == sorted(axis_groups(c, axis))


def test_megatron_refuses_a_rope_base_its_int_argument_cannot_carry():
    plan = plan_of(ParallelConfig(dp=8), model=LLAMA.model_copy(update={"rope_theta": 1e4 + 0.5}))
    with pytest.raises(InputError, match="--rotary-base takes an int"):
        export(plan, "megatron")


# ---- torchtitan ----------------------------------------------------------------------------------------

def titan_parse(tmp_path: Path, plan: Plan):
    """torchtitan's own ConfigManager over the exported script's overrides, with the exported config
    module on the path (as the script puts it)."""
    from torchtitan.config.manager import ConfigManager

    files = export(plan, "torchtitan").files
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = ["--module", "gplan_torchtitan", "--config", "gplan_plan", *script_args(files["torchtitan_train.sh"], "OVERRIDES")]
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("gplan_torchtitan", None)
    try:
        return ConfigManager().parse_args(argv)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gplan_torchtitan", None)


TITAN_ONLY = {
    # torchtitan's per-operator selective AC (the module op; Megatron refuses it): SelectiveAC in its config
    "zero3_per_op_recompute": lambda: plan_of(ParallelConfig(dp=8, zero=3, recompute="selective",
                                                             recompute_modules=("op",))),
}
TITAN_PLANS = ["dp_only", "tp_pp_dp_sp_interleaved", "zero3_full_recompute", "zero3_per_op_recompute", "zero3_tp_pp_uneven",
               "uneven_layout", "per_stage_recompute_vpp"]


@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("name", TITAN_PLANS)
def test_torchtitan_config_manager_parses_the_export_into_the_plans_model_and_layout(name, tmp_path):
    import torch
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = {**PLANS, **TITAN_ONLY}[name]()
    config = titan_parse(tmp_path, plan)
    p, t, c, m = config.parallelism, config.training, plan.parallel, plan.model
    # the model: torchtitan's Llama with the plan's shape, every parameter counted
    model_config = config.model_spec.model
    assert (model_config.dim, len(model_config.layers), model_config.vocab_size) == (m.hidden_size, m.num_layers, m.vocab_size)
    attention = model_config.layers[0].attention
    assert (attention.n_heads, attention.n_kv_heads, attention.rope.theta) == (m.num_attention_heads, m.kv_heads, m.rope_theta)
    with torch.device("meta"):
        built = model_config.build()
    assert sum(x.numel() for x in built.parameters()) == m.total_params()
    # the batch: accumulation steps of local sequences, split into micro-batches of mbs with stages
    accumulation = t.global_batch_size // (t.local_batch_size * c.dp)
    per_step = t.local_batch_size // (p.pipeline_parallel_microbatch_size if c.pp > 1 else 1)
    assert t.global_batch_size == plan.training.gbs and t.seq_len == plan.training.seq_length
    assert accumulation * per_step == c.num_microbatches and t.local_batch_size * accumulation == c.mbs * c.num_microbatches
    # the layout
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (c.tp, c.pp, c.cp)
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=1, world_size=plan.world_size)
    assert dims.dp_replicate * dims.dp_shard == c.dp
    engine = runs_as(TARGETS["torchtitan"], plan.model, plan.parallel, layouts_of(plan))
    if c.pp > 1:
        assert get_schedule_class(p.pipeline_parallel_schedule) and t.disable_cuda_graphs
        parts = p.module_fqns_per_model_part
        assert len(parts) == c.pp * c.vpp
        per_rank = [sum(sum(1 for x in parts[s] if x.startswith("layers.")) for s in range(r, len(parts), c.pp))
                    for r in range(c.pp)]
        assert per_rank == [s.num_layers for s in engine]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    # one policy for every block: full where any layer recomputes fully, the per-op policy where the plan's
    # selective layers recompute the module op (the attention core alone it runs as full), else none
    options = {x.recompute for s in engine for x in s.layers}
    policy = (FullAC if "full" in options else SelectiveAC if "selective" in options else None)
    assert type(config.activation_checkpoint) is policy.Config if policy else config.activation_checkpoint is None
    assert ("selective" in options) == (c.recompute_modules == ("op",))


@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("compiled_loss", [False, True])
def test_an_async_tp_plan_exports_to_torchtitan_compiled_and_reads_back(tmp_path, compiled_loss):
    """A torchtitan plan priced with async tp: its export compiles the model (and the loss where priced so) with
    compile.enable_async_tensor_parallel, which torchtitan's own ConfigManager takes; read back it is the plan,
    priced alike."""
    from gplan.planner.launch_files import priced_launch

    training = TRAINING.model_copy(update={"engine": "torchtitan", "async_tp": True, "compiled_loss": compiled_loss})
    plan = plan_of(ParallelConfig(dp=4, tp=2, sp=True, zero=3), cluster="dgx-h100", training=training,
                   model=load_model("llama3-8b"))
    assert StepModel(plan.model, plan.training, plan.cluster, plan.parallel).tp_overlapped
    parsed = tmp_path / "parsed"
    parsed.mkdir()
    compile_config = titan_parse(parsed, plan).compile
    assert compile_config.enable and compile_config.enable_async_tensor_parallel
    assert compile_config.components == (["model", "loss"] if compiled_loss else ["model"])
    files = export(plan, "torchtitan").files
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    launch, _, _, _, prediction = priced_launch(tmp_path / "torchtitan_train.sh", "llama3-8b", None, "dgx-h100", None, None,
                                                None, 0.1, None, None, 1.0)
    assert launch.engine_options["async_tp"] is True
    assert launch.engine_options.get("compiled_loss", False) is compiled_loss
    assert prediction.step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-9)


@requires_engine("torchtitan", "dev")
def test_torchtitan_refuses_a_gpt_plan_it_would_train_as_a_llama(tmp_path):
    with pytest.raises(InputError, match=r"\(model\).*Llama family"):
        export(plan_of(ParallelConfig(dp=8), model=GPT), "torchtitan")


def test_torchtitan_main_writes_token_counts():
    plan = PLANS["tp_pp_dp_sp_interleaved"]()
    args, _ = overrides(plan, main=True)
    value = dict(zip(args, args[1:]))
    seq = plan.training.seq_length
    assert value["--training.num_tokens_per_train_step"] == str(plan.training.gbs * seq)
    assert value["--training.num_tokens_per_microbatch_per_dp_rank"] == str(plan.parallel.mbs * seq)
    assert "--training.local_batch_size" not in value
    text = export(plan, "torchtitan", version="main").files["torchtitan_train.sh"]
    assert "not checked by torchtitan's parser" in text.splitlines()[2]


# ---- DeepSpeed and Megatron-DeepSpeed ------------------------------------------------------------------

DEEPSPEED_CHECK = """
import json, os, sys
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed
import importlib
from deepspeed.runtime.config import DeepSpeedConfig
# On a CPU host, DeepSpeed's TorchBackend JIT-compiles its shared-memory allreduce kernel (deepspeed_shm_comm,
# comm/torch.py build_shm_op) on first use: minutes on 2 cores, and a lock in ~/.cache/torch_extensions left
# behind if the run is killed. The config check sends no message, so the kernel is never built.
# (`deepspeed.comm.torch` as an attribute is the torch package that deepspeed.comm imports: go by module name.)
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
deepspeed.init_distributed(dist_backend="gloo")
class DataParallelOnly:
    def get_data_parallel_world_size(self):
        return int(sys.argv[2])
config = DeepSpeedConfig(json.load(open(sys.argv[1])), mpu=DataParallelOnly())
print(json.dumps({"stage": config.zero_optimization_stage, "train_batch_size": config.train_batch_size,
                  "micro": config.train_micro_batch_size_per_gpu, "accumulation": config.gradient_accumulation_steps,
                  "bf16": config.bfloat16_config.enabled if hasattr(config, "bfloat16_config") else config.bfloat16_enabled,
                  "checkpointing": config.activation_checkpointing_config.partition_activations}))
"""

DEEPSPEED_PLANS = ["dp_only", "zero3_full_recompute", "uneven_first_last", "gpt_tp_pp_zero1_full", "mixtral_dp8_tp2_ep8",
                   "mixtral_dp8_ep8_zero2"]


@requires_engine("deepspeed", "dev")
@pytest.mark.parametrize("name", DEEPSPEED_PLANS)
def test_deepspeed_config_passes_deepspeeds_own_validation(name, tmp_path):
    plan = PLANS[name]()
    files = export(plan, "deepspeed").files
    (tmp_path / "ds_config.json").write_text(files["ds_config.json"])
    port = str(free_port())  # a fixed port collides with any other job on the machine
    # A private, empty extensions folder: a JIT build would start from nothing here (and show), and no lock of
    # another run's build can make this one wait.
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    done = subprocess.run([sys.executable, "-c", DEEPSPEED_CHECK, str(tmp_path / "ds_config.json"), str(plan.parallel.dp), port],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "torch_extensions").exists(), "DeepSpeed compiled an extension during a config check"
    checked = json.loads(done.stdout.strip().splitlines()[-1])
    c = plan.parallel
    assert {k: checked[k] for k in ("stage", "train_batch_size", "micro", "accumulation", "bf16")} == {
        "stage": c.zero, "train_batch_size": plan.training.gbs, "micro": c.mbs, "accumulation": c.num_microbatches,
        "bf16": True}


#: Megatron-DeepSpeed's megatron/arguments.py (deepspeedai/Megatron-DeepSpeed main): the flags gplan emits.
MEGATRON_DEEPSPEED_FLAGS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-key-value-heads",
    "--seq-length", "--max-position-embeddings", "--normalization", "--attention-dropout", "--hidden-dropout",
    "--kv-channels", "--use-rotary-position-embeddings", "--no-position-embedding",
    "--rotary-position-embeddings-theta", "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--bf16", "--fp16", "--tokenizer-type", "--vocab-size", "--make-vocab-size-divisible-by",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--micro-batch-size", "--global-batch-size",
    "--zero-stage", "--no-pipeline-parallel", "--sequence-parallel", "--checkpoint-activations",
    "--deepspeed-activation-checkpointing", "--checkpoint-num-layers", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--train-iters", "--lr", "--log-interval",
    # DeepSpeed-MoE: _add_network_size_args (--num-experts nargs='+', --topk, --expert-interval default 2,
    # --mlp-type), _add_distributed_args (--moe-expert-parallel-size), _add_training_args (the capacity flags,
    # --disable-moe-token-dropping as dest moe_token_dropping, --create-moe-param-group "necessary for ZeRO")
    "--num-experts", "--topk", "--expert-interval", "--mlp-type", "--moe-expert-parallel-size",
    "--create-moe-param-group", "--disable-moe-token-dropping", "--moe-train-capacity-factor",
}


@pytest.mark.parametrize("name", DEEPSPEED_PLANS)
def test_megatron_deepspeed_arguments_turn_on_zero_init_and_recompute(name):
    plan = PLANS[name]()
    files = export(plan, "deepspeed").files
    text = files["megatron_deepspeed_pretrain_gpt.sh"]
    argv = script_args(text, "ARGS")
    flags = {a for a in argv if a.startswith("--")} - {"--data-path", "--deepspeed", "--deepspeed_config"}
    assert flags <= MEGATRON_DEEPSPEED_FLAGS
    value = dict(zip(argv, argv[1:]))
    c = plan.parallel
    # --zero-stage 3 is what makes Megatron-DeepSpeed build the model under deepspeed.zero.Init
    assert value["--zero-stage"] == str(c.zero) == str(json.loads(files["ds_config.json"])["zero_optimization"]["stage"])
    full = any(x.recompute == "full" for s in plan.stages for x in s.layers)
    assert ("--checkpoint-activations" in argv) == full == ("activation_checkpointing" in json.loads(files["ds_config.json"]))
    # "pipeline_model_parallel_size must be 1 if pipeline parallel is disabled"
    assert ("--no-pipeline-parallel" in argv) == (c.pp == 1)
    # "recompute method is not yet supported for selective recomputing granularity"
    assert not (value.get("--recompute-granularity") == "selective" and "--recompute-method" in argv)
    if "--sequence-parallel" in argv:  # "Using sequence parallelism requires setting ... CUDA_DEVICE_MAX_CONNECTIONS to 1"
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    if plan.model.position_embedding == "rope":
        assert value["--rotary-position-embeddings-theta"] == str(int(plan.model.rope_theta))
    else:
        assert "--use-rotary-position-embeddings" not in argv
    m = plan.model
    if m.is_moe:  # every layer routed (the default interval is 2), the experts as wide as --ffn-hidden-size
        assert (value["--num-experts"], value["--topk"], value["--expert-interval"]) == (str(m.num_experts), str(m.top_k), "1")
        assert value["--ffn-hidden-size"] == str(m.expert_ffn_size) and "--create-moe-param-group" in argv
        ep = int(value["--moe-expert-parallel-size"])
        assert ep == c.ep and m.num_experts % ep == 0  # deepspeed/moe/layer.py's assertion
        assert (c.dp * c.tp) % ep == 0  # deepspeed/utils/groups.py: _ensure_divisibility(dp·tp per stage, ep)
        assert ("--disable-moe-token-dropping" in argv) == (m.capacity_factor is None)
    else:
        assert "--num-experts" not in argv


def test_deepspeed_refuses_zero3_with_pipeline(gplan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(plan_of(ParallelConfig(dp=2, pp=2, zero=3)), path)
    r = gplan("export", str(path), "--to", "deepspeed", "-o", str(tmp_path))
    assert r.code == 3 and "(zero)" in r.stderr and "--zero 0,1" in r.stderr and "--target deepspeed" in r.stderr
    assert not (tmp_path / "ds_config.json").exists()


# ---- Kubernetes ----------------------------------------------------------------------------------------

def kube(plan: Plan) -> tuple[dict, dict, dict]:
    files = export(plan, "k8s", image="registry.example/gplan:0.1").files
    return tuple(yaml.safe_load(files[n]) for n in ("plan-configmap.yaml", "pytorchjob.yaml", "trainjob.yaml"))


def _quantities_as_strings(data):
    """Resource quantities are int-or-string; the SDK serialises them as strings."""
    if isinstance(data, dict):
        return {k: ({r: str(q) for r, q in v.items()} if k == "limits" else _quantities_as_strings(v))
                for k, v in data.items()}
    if isinstance(data, list):
        return [_quantities_as_strings(x) for x in data]
    return data


@requires_engine("kubeflow.training", "dev")
def test_pytorchjob_is_a_kubeflow_v1_pytorchjob_the_sdk_reads_back_whole():
    from kubeflow.training import ApiClient

    plan = plan_of(ParallelConfig(dp=4, tp=8, pp=2))
    _, job, _ = kube(plan)

    class Response:
        data = json.dumps(job)

    api = ApiClient()
    parsed = api.deserialize(Response(), "KubeflowOrgV1PyTorchJob")
    # every field is one the SDK knows: nothing is dropped on the way back
    assert api.sanitize_for_serialization(parsed) == _quantities_as_strings(job)
    specs = job["spec"]["pytorchReplicaSpecs"]
    # training-operator v1.9's webhook: a Master of one replica, a container named pytorch with an image,
    # a DNS-1035 name
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 7
    import re
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"]) and len(job["metadata"]["name"]) <= 63
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "pytorch" and container["image"] == "registry.example/gplan:0.1"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8} and job["spec"]["nprocPerNode"] == "8"
    assert "--nnodes=8" in container["command"]
    assert container["command"][container["command"].index("-m") + 1] == "gplan.backends.torch.worker"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


@requires_engine("kubernetes_validate", "dev")
def test_configmap_and_pod_templates_pass_kubernetes_validate():
    import kubernetes_validate

    plan = plan_of(ParallelConfig(dp=4, tp=8, pp=2))
    config_map, job, trainjob = kube(plan)
    kubernetes_validate.validate(config_map, "1.31", strict=True)
    assert Plan.model_validate_json(config_map["data"]["plan.json"]) == plan
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": replica["template"]}
        kubernetes_validate.validate(template, "1.31", strict=True)
    assert job["metadata"]["labels"]["gplan/plan-digest"] == plan.layout_digest
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == \
        config_map["metadata"]["name"] == trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"][
        "spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]


@requires_engine("kubeflow_trainer_api", "dev")
def test_trainjob_is_a_kubeflow_trainer_v2_trainjob_its_models_read_back_whole():
    from kubeflow_trainer_api import models

    plan = plan_of(ParallelConfig(dp=4, tp=8, pp=2))
    _, _, trainjob = kube(plan)
    parsed = models.TrainerV1alpha1TrainJob.from_dict(trainjob)
    assert parsed.to_dict() == trainjob  # the models drop what they do not know: nothing was dropped
    trainer = trainjob["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (8, 8)
    assert "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)" in trainer["command"]


def test_different_plans_of_one_model_get_different_kubernetes_resources():
    """Their inputs digest is the same; their layout digest is not, so the second apply cannot
    overwrite the first plan's jobs and ConfigMap."""
    names = set()
    for config in (ParallelConfig(dp=4, tp=8, pp=2), ParallelConfig(dp=8, tp=8, pp=1), ParallelConfig(dp=64)):
        config_map, job, trainjob = kube(plan_of(config))
        assert job["metadata"]["name"] == trainjob["metadata"]["name"]
        assert len(config_map["metadata"]["name"]) <= 63 and config_map["metadata"]["name"].startswith(job["metadata"]["name"])
        names.add((job["metadata"]["name"], config_map["metadata"]["name"]))
    assert len(names) == 3


def test_kubernetes_needs_an_image_and_carries_the_launch_notes(gplan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(plan_of(ParallelConfig(dp=8, zero=1)), path)
    r = gplan("export", str(path), "--to", "k8s", "-o", str(tmp_path / "k"))
    assert r.code == 3 and "--image" in r.stderr and not (tmp_path / "k").exists()
    r = gplan("export", str(path), "--to", "k8s", "-o", str(tmp_path / "k"), "--image", "reg/gplan:1", "--json")
    assert r.code == 0
    job = yaml.safe_load((tmp_path / "k" / "pytorchjob.yaml").read_text())
    assert "zero 1 runs as zero 2" in job["metadata"]["annotations"]["gplan/notes"]
    assert "rc=" not in (tmp_path / "k" / "pytorchjob.yaml").read_text().splitlines()[0]


# ---- SLURM, shell scripts, the command -----------------------------------------------------------------

def test_slurm_export_points_at_the_exported_plan_by_its_absolute_path(gplan, tmp_path, monkeypatch):
    plan = plan_of(ParallelConfig(dp=8, tp=4))
    (tmp_path / "plans").mkdir()
    write_plan(plan, tmp_path / "plans" / "p.json")
    monkeypatch.chdir(tmp_path)
    assert gplan("export", "plans/p.json", "--to", "slurm", "-o", "out").code == 0
    text = (tmp_path / "out" / "slurm_job.sh").read_text()
    assert f"--plan {tmp_path / 'plans' / 'p.json'}" in text and "#SBATCH --nodes=4" in text


@requires_program("shellcheck", "dev")
@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed", "slurm"])
def test_exported_scripts_pass_shellcheck(gplan, tmp_path, target):
    path = tmp_path / "plan.json"
    write_plan(PLANS["uneven_first_last" if target != "deepspeed" else "dp_only"](), path)
    r = gplan("export", str(path), "--to", target, "-o", str(tmp_path / "out"), "--json")
    assert r.code == 0, r.stderr
    for file in (Path(f) for f in r.json()["files"] if f.endswith(".sh")):
        done = subprocess.run(["shellcheck", "--severity=style", str(file)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
        assert file.stat().st_mode & 0o111


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed", "k8s", "slurm"])
def test_every_export_file_carries_the_plan_digest_and_its_engine_version(gplan, tmp_path, target):
    from gplan.backends.exporters import targets

    path = tmp_path / "plan.json"
    plan = PLANS["dp_only"]()
    write_plan(plan, path)
    data = gplan("export", str(path), "--to", target, "-o", str(tmp_path / "out"), "--json", "--image", "reg/g:1").json()
    assert data["files"]
    version = next(iter(targets()[target].versions.values()))
    for file in data["files"]:
        text = Path(file).read_text()
        assert plan.digest in text and f"written for {version}" in text


def test_unknown_target_version_and_newer_schema_exit_3(gplan, tmp_path):
    path = tmp_path / "plan.json"
    write_plan(PLANS["dp_only"](), path)
    r = gplan("export", str(path), "--to", "alpa")
    assert r.code == 3 and "unknown target" in r.stderr and "megatron" in r.stderr
    r = gplan("export", str(path), "--to", "torchtitan", "--target-version", "0.1")
    assert r.code == 3 and "0.3, main" in r.stderr
    data = json.loads(path.read_text())
    data["schema_version"] = 2
    path.write_text(json.dumps(data))
    r = gplan("export", str(path), "--to", "megatron")
    assert r.code == 3 and "schema" in r.stderr


def test_help_lists_the_targets(gplan):
    r = gplan("export", "--help")
    assert all(t in r.stdout for t in ("megatron", "torchtitan", "deepspeed", "k8s", "slurm"))


def test_exports_refuse_what_their_engine_cannot_run_and_note_what_it_runs_differently(gplan, tmp_path):
    from helpers import TINY_GPT, TINY_LLAMA, tiny_plan

    gpt = tiny_plan(tmp_path / "gpt.json", TINY_GPT, None, dp=2)
    r = gplan("export", str(gpt), "--to", "mindformers", "-o", str(tmp_path / "mf"))
    assert r.code == 3 and "(model)" in r.stderr and "--target mindformers" in r.stderr
    assert not (tmp_path / "mf").exists()
    one_microbatch = tiny_plan(tmp_path / "m1.json", TINY_LLAMA, None, TrainingSpec(gbs=1, seq_length=32,
                                                                                     precision="fp32"), pp=2)
    for target in ("k8s", "slurm"):  # they run gplan's torch worker
        r = gplan("export", str(one_microbatch), "--to", target, "-o", str(tmp_path / target), "--image", "reg/g:1")
        assert r.code == 3 and "(microbatches)" in r.stderr
    mixed = tiny_plan(tmp_path / "mixed.json", TINY_LLAMA, [[("full", 1)], [("none", 3)]], pp=2)
    r = gplan("export", str(mixed), "--to", "megatron", "-o", str(tmp_path / "mg"), "--json")
    assert r.code == 0 and any("re-priced as megatron runs it" in n for n in r.json()["notes"])


@pytest.mark.parametrize("precision, flags", [("fp8", ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]),
                                              ("mxfp8", ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]),
                                              ("nvfp4", ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"])])
def test_megatron_carries_the_fp8_recipe_and_the_torch_backend_runs_what_torchao_has(precision, flags, gplan, tmp_path):
    """Transformer Engine's recipes on Megatron's command line; gplan's torch worker runs FP8 through
    torchao (tensorwise here), MXFP8 at tp = 1 only, and no NVFP4."""
    cluster = "dgx-h100" if precision == "fp8" else "dgx-b200"
    training = TRAINING.model_copy(update={"precision": precision, "engine": "megatron"})
    config = ParallelConfig(dp=2, tp=2, pp=2, sp=True, zero=1)
    plan = make_plan(LLAMA, training, load_cluster(cluster, 8), config)
    text = export(plan, "megatron").files["megatron_pretrain_gpt.sh"]
    argv = script_args(text, "MEGATRON_ARGS")
    args = megatron_rules.validate(argv, 8, script_env(text), device_arch=9 if precision == "fp8" else 10)
    assert args.bf16 and " ".join(flags) in " ".join(argv)
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    r = gplan("launch", str(path), "--dry-run")
    if precision == "fp8":
        assert r.code == 0, r.stderr
    else:
        assert r.code == 3 and "(precision)" in r.stderr
        assert ("not nvfp4" if precision == "nvfp4" else "runs mxfp8 layers at tp = 1") in r.stderr


def hetero_plan(gplan, tmp_path) -> tuple[Path, Plan]:
    """A plan on two A100 and two V100 nodes whose pipeline stages alternate between the groups."""
    from gplan.plan import read_plan

    cluster = mixed_cluster_file(tmp_path / "mixed.yaml", nodes=2)
    path = tmp_path / "p.json"
    assert gplan("search", "llama2-7b", "--cluster", str(cluster), "--gbs", "64", "--precision", "fp16", "--pp", "4",
                 "--tp", "8", "--out", str(path)).code == 0
    plan = read_plan(path)
    assert len({s.node_group for s in plan.stages}) == 2
    return path, plan


def run_with(script: str, env: dict[str, str]) -> str:
    """Run a node's launch line with torchrun replaced by echo: what that node would start."""
    done = subprocess.run(["bash", "-c", script.replace("exec torchrun", "echo torchrun").replace("; torchrun", "; echo torchrun")],
                          capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env}, check=True)
    return done.stdout


def test_a_heterogeneous_slurm_job_puts_every_node_rank_on_its_groups_hardware(gplan, tmp_path):
    from gplan.backends.recipes import node_groups_of

    path, plan = hetero_plan(gplan, tmp_path)
    assert gplan("export", str(path), "--to", "slurm", "-o", str(tmp_path / "slurm")).code == 0
    text = (tmp_path / "slurm" / "slurm_job.sh").read_text()
    groups_of_node = node_groups_of(plan, 8)
    components = text.split("#SBATCH hetjob")
    order = sorted(set(groups_of_node))
    assert len(components) == len(order)  # one component per node group, in group order
    for component, g in zip(components, order):
        assert f"#SBATCH --constraint={plan.cluster.node_groups[g].hardware.name}" in component
        assert f"#SBATCH --nodes={groups_of_node.count(g)}" in component
    ranks = next(line for line in text.splitlines() if line.startswith("NODE_RANKS=("))
    table = ranks.split("(")[1].split(")")[0].split()
    srun = next(line for line in text.splitlines() if line.startswith("srun --het-group="))
    inner = shlex.split(srun)[-1]
    procid = 0
    for g in order:  # SLURM numbers the step's tasks across the components in order
        for _ in range(groups_of_node.count(g)):
            started = run_with(inner, {"GPLAN_NODE_RANKS": " ".join(table), "SLURM_PROCID": str(procid),
                                       "HEAD_NODE": "head"})
            node_rank = int(started.split("--node-rank ")[1].split()[0])
            assert groups_of_node[node_rank] == g and "--rdzv-backend static" in started
            procid += 1
    assert sorted(map(int, table)) == list(range(len(groups_of_node)))
    # the rendezvous host is node rank 0's: the first node of its group's component
    head = order.index(groups_of_node[0])
    assert f'"$SLURM_JOB_NODELIST_HET_GROUP_{head}"' in text and int(table[sum(groups_of_node.count(g) for g in order[:head])]) == 0
    import shutil

    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", "--severity=style", str(tmp_path / "slurm" / "slurm_job.sh")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


@requires_engine("kubernetes_validate", "dev")
def test_heterogeneous_kubernetes_jobs_select_each_groups_nodes_and_ranks(gplan, tmp_path):
    import kubernetes_validate
    import yaml

    from gplan.backends.recipes import node_groups_of

    path, plan = hetero_plan(gplan, tmp_path)
    assert gplan("export", str(path), "--to", "k8s", "-o", str(tmp_path / "k8s"), "--image", "reg/g:1").code == 0
    documents = list(yaml.safe_load_all((tmp_path / "k8s" / "node-group-jobs.yaml").read_text()))
    service, jobs = documents[0], documents[1:]
    for document in documents:
        kubernetes_validate.validate(document, "1.31", strict=True)
    groups_of_node = node_groups_of(plan, 8)
    seen = []
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        hardware = pod["nodeSelector"]["gplan/hardware"]
        group = next(g for g in set(groups_of_node) if plan.cluster.node_groups[g].hardware.name == hardware)
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == groups_of_node.count(group)
        assert pod["subdomain"] == service["metadata"]["name"] and all(len(f"{job['metadata']['name']}-{k}") <= 63
                                                                      for k in range(job["spec"]["completions"]))
        script = pod["containers"][0]["command"][2]
        for index in range(job["spec"]["completions"]):
            started = run_with(script, {"JOB_COMPLETION_INDEX": str(index)})
            node_rank = int(started.split("--node-rank ")[1].split()[0])
            assert groups_of_node[node_rank] == group
            seen.append(node_rank)
            if node_rank == 0:  # the rendezvous endpoint is this very pod's DNS name
                assert f"--rdzv-endpoint {job['metadata']['name']}-{index}.{service['metadata']['name']}:29500" in started
    assert sorted(seen) == list(range(len(groups_of_node)))


def _imported_names(source: str) -> set[str]:
    import ast

    return {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
            for alias in node.names}


@requires_engine("torchtitan", "dev")
def test_the_llama3_module_uses_only_torchtitans_public_names_and_builds_as_its_builder(tmp_path):
    """No `_private` import; the model config equals what torchtitan's own (private) llama3 builder makes
    of the same shape: every parameter's shape and every initialiser's arguments."""
    import torch
    from torchtitan.models.common import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers

    plan = PLANS["tp_pp_dp_sp_interleaved"]()
    source = export(plan, "torchtitan").files["gplan_torchtitan.py"]
    assert not {n for n in _imported_names(source) if n.startswith("_")}
    namespace: dict = {}
    exec(compile(source, "gplan_torchtitan.py", "exec"), namespace)
    ours = namespace["model_config"]()
    s = namespace["SHAPE"]
    rope = ComplexRoPE.Config(dim=s["dim"] // s["n_heads"], max_seq_len=s["max_seq_len"], theta=s["rope_theta"])
    theirs = _build_llama3_layers(n_layers=s["n_layers"], dim=s["dim"], n_heads=s["n_heads"], n_kv_heads=s["n_kv_heads"],
                                  hidden_dim=s["hidden_dim"], rope=rope, attn_backend="flex", fuse_qkv=True)

    def inits(config, path="") -> list:
        """Every initialiser in a config tree: (path, parameter, function, its arguments)."""
        import dataclasses

        found = []
        for field in dataclasses.fields(config) if dataclasses.is_dataclass(config) else []:
            value = getattr(config, field.name)
            if field.name == "param_init" and isinstance(value, dict):
                found += [(path, k, getattr(f, "func", f).__name__, getattr(f, "keywords", {})) for k, f in value.items()]
            elif dataclasses.is_dataclass(value):
                found += inits(value, f"{path}.{field.name}")
        return sorted(found, key=repr)

    assert len(ours.layers) == len(theirs)
    for a, b in zip(ours.layers, theirs):
        assert inits(a) and inits(a) == inits(b)
    with torch.device("meta"):
        built = dict((n, p.shape) for n, p in ours.build().named_parameters())
        import dataclasses

        reference = dict((n, p.shape) for n, p in dataclasses.replace(ours, layers=theirs).build().named_parameters())
    assert built == reference



@requires_engine("torchtitan", "dev")
@pytest.mark.parametrize("precision, cluster, converted", [("fp8-rowwise", "dgx-h100", "Float8Linear"),
                                                           ("mxfp8", "dgx-b200", "MXFP8Linear")])
def test_torchtitan_export_turns_the_recipe_on_with_its_own_converter(tmp_path, monkeypatch, precision, cluster, converted):
    """torchtitan's ConfigManager builds the exported FP8 plan: every block's linear layers become its
    low-precision layer config, the head stays BF16 (as priced). torchtitan checks the GPU's capability
    when it builds the converter; that check answers as an H100/B200 would here."""
    import torchtitan.components.quantization.float8 as float8
    import torchtitan.components.quantization.mx as mx
    from torchtitan.models.common import Linear

    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    monkeypatch.setattr(mx, "has_cuda_capability", lambda major, minor: True)
    training = TrainingSpec(gbs=16, seq_length=2048, precision=precision, engine="torchtitan")
    config = ParallelConfig(dp=8, zero=1)
    plan = make_plan(LLAMA, training, load_cluster(cluster, 8), config, None)
    parsed = titan_parse(tmp_path, plan).model_spec.model
    kinds = {type(c).__qualname__.rsplit(".", 1)[0] for layer in parsed.layers
             for _, c, _, _ in layer.traverse(Linear.Config)}
    assert kinds == {converted}
    assert type(parsed.lm_head).__qualname__ == "Linear.Config"
    if precision == "fp8-rowwise":
        first = next(c for _, c, _, _ in parsed.layers[0].traverse(Linear.Config))
        assert "rowwise" in repr(first._torchao_config).lower() or first._torchao_config is not None


@pytest.mark.parametrize("precision, target, hint", [("nvfp4", "torchtitan", "--target megatron"),
                                                     ("fp8-rowwise", "megatron", "--target torch or torchtitan")])
def test_a_recipe_the_engine_lacks_is_refused_with_who_runs_it(precision, target, hint):
    from gplan.spec.targets import TARGETS, config_refusals

    found = config_refusals(TARGETS[target], LLAMA, ParallelConfig(dp=8), 1, precision)
    assert found and found[0].capability == "precision" and hint in found[0].avoid


@requires_engine("torchtitan", "dev")
def test_an_fp8_plan_for_gplans_worker_exports_to_torchtitan_rowwise_and_re_priced(gplan, tmp_path, monkeypatch):
    """`gplan search llama3-8b --cluster dgx-h100 --devices 8 --precision fp8 --target torch`, exported to
    torchtitan: its float8 converter (rowwise, torchtitan 0.3's only float8 recipe) turned on, the step
    re-priced as torchtitan runs it and the difference in the file header; torchtitan's parser builds it."""
    import torchtitan.components.quantization.float8 as float8
    from torchtitan.models.common import Linear

    from gplan.plan import read_plan

    path = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--precision", "fp8",
                 "--target", "torch", "--out", str(path)).code == 0
    r = gplan("export", str(path), "--to", "torchtitan", "-o", str(tmp_path / "tt"))
    assert r.code == 0, r.stderr
    plan = read_plan(path)
    step_s, _, _ = reprice_split(plan, layouts_of(plan), "torchtitan")
    header = (tmp_path / "tt" / "torchtitan_train.sh").read_text().splitlines()[:8]
    assert any(f"re-priced as torchtitan runs it: {step_s:.3f} s/step" in line and line.startswith("# note:")
               for line in header)
    assert step_s > plan.prediction.step_time_s  # rowwise is slower than the tensorwise the plan priced
    assert 'Float8LinearConverter.Config(recipe_name="rowwise"' in (tmp_path / "tt" / "gplan_torchtitan.py").read_text()
    monkeypatch.setattr(float8, "has_cuda_capability", lambda major, minor: True)
    parsed = titan_parse(tmp_path / "parse", plan) if (tmp_path / "parse").mkdir() is None else None
    converted = {type(c).__qualname__ for layer in parsed.model_spec.model.layers for _, c, _, _ in layer.traverse(Linear.Config)}
    assert converted == {"Float8Linear.Config"}


def test_a_megatron_plans_overlap_is_not_carried_into_another_engines_timing(gplan, tmp_path):
    """Searched for Megatron-LM (tp's collectives priced overlapped with the GEMMs), exported to torchtitan
    (which pays them in full): the export re-prices the step as torchtitan runs it and says by how much."""
    path = tmp_path / "plan.json"
    assert gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--target",
                 "megatron", "--tp", "8", "--recompute-modules", "core_attn", "--out", str(path)).code == 0
    # over torchtitan's budget as it runs it (its stages hold whole gradients until the run's end): written as asked
    r = gplan("export", str(path), "--to", "torchtitan", "-o", str(tmp_path / "tt"), "--over-budget", "--json")
    note = next(n for n in r.json()["notes"] if "re-priced as torchtitan runs it" in n)
    change = float(note.split("(")[1].split("%")[0])
    assert "priced for megatron, run by torchtitan" in note and change > 0
