"""NeMo AutoModel (engines/nemo_automodel/): an engine added as one folder. It is a target the search keeps to,
its export is taken by nemo_automodel's own parser and mesh builder, and the export read back with `--from`
(no MODEL) is the plan again."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import requires_engine, requires_program

from gplan.engines import ENGINE_NAMES, engine_part
from gplan.spec.targets import TARGETS

CASES = [("llama3-8b", 16), ("llama3-70b", 64), ("qwen3-30b-a3b", 16)]
"""A dense model on data parallel alone, one large enough for tp, cp and pp, and a mixture of experts."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each case searched for NeMo AutoModel on H100 nodes and exported: (plan, recipe YAML, devices)."""
    from typer.testing import CliRunner

    from gplan.cli import app

    runner, found = CliRunner(), {}
    for model, devices in CASES:
        root = tmp_path_factory.mktemp(model)
        plan = root / "plan.json"
        r = runner.invoke(app, ["search", model, "--devices", str(devices), "--cluster", "dgx-h100",
                                "--target", "nemo-automodel", "--out", str(plan)])
        assert r.exit_code == 0, r.stderr
        r = runner.invoke(app, ["export", str(plan), "--to", "nemo-automodel", "-o", str(root / "out")])
        assert r.exit_code == 0, r.stderr
        found[model] = (json.loads(plan.read_text()), root / "out" / f"automodel_{model}.yaml", devices)
    return found


def test_it_is_an_engine_found_by_its_folder():
    assert "nemo-automodel" in ENGINE_NAMES and "nemo-automodel" in TARGETS
    assert engine_part("nemo-automodel", "launch") is not None and engine_part("nemo-automodel", "export") is not None


def test_its_plans_keep_to_what_it_runs(exported):
    for plan, _, _ in exported.values():
        c = plan["parallel"]
        assert "target" not in plan and plan["training"]["engine"] == "nemo-automodel"
        assert c["zero"] in (1, 2, 3) and c["etp"] == 1
    assert exported["qwen3-30b-a3b"][0]["parallel"]["ep"] > 1  # experts parallel, folded into FSDP's ranks
    assert exported["llama3-70b"][0]["parallel"]["pp"] * exported["llama3-70b"][0]["parallel"]["tp"] > 1


def test_the_export_read_back_is_the_plan(gplan, exported):
    for model, (plan, recipe, devices) in exported.items():
        r = gplan("estimate", "--from", str(recipe), "--cluster", "dgx-h100", "--devices", str(devices), "--json")
        assert r.code == 0, r.stderr
        data = r.json()
        assert data["engine"] == "nemo-automodel" and data["model_from_launch"].startswith(model)
        for key in ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "recompute"):
            assert data["parallel"][key] == plan["parallel"][key], (model, key)
        # FSDP2 has no optimizer-only sharding: zero 1 is written (and read back) as the zero 2 it runs as,
        # which the FSDP accounting prices the same
        assert data["parallel"]["zero"] == max(plan["parallel"]["zero"], 2)
        assert data["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
        assert data["num_microbatches"] == plan["parallel"]["num_microbatches"]


CHECK = textwrap.dedent("""
    import json, sys, yaml
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from nemo_automodel.components.distributed.mesh_utils import _create_device_meshes
    from nemo_automodel.components.training.step_scheduler import StepScheduler
    from nemo_automodel.recipes._dist_utils import parse_distributed_section

    recipe, world = yaml.safe_load(open(sys.argv[1])), int(sys.argv[2])
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    parsed = parse_distributed_section(dict(recipe["distributed"]))
    mesh, moe = _create_device_meshes(parsed["strategy_config"], parsed["parallelism_sizes"], world_size=world)
    dims = dict(zip([str(n).split(".")[-1].lower() for n in mesh.mesh_dim_names], mesh.mesh.shape))
    s = recipe["step_scheduler"]
    steps = StepScheduler(s["global_batch_size"], s["local_batch_size"], dims["dp_shard"] * dims["dp_replicate"],
                          dataloader=None, max_steps=1, preemption_signal=None)
    micro = recipe["distributed"].get("pipeline", {}).get("pp_microbatch_size")
    # its recipe builds `cfg.optimizer` (train_ft.py): the section resolved and built as its typed config does
    from nemo_automodel.components.optim.optimizer import build_optimizer_config
    from nemo_automodel.recipes._typed_config import _callable_and_kwargs
    import torch
    part = torch.nn.Linear(4, 4).to(torch.bfloat16)
    built = build_optimizer_config(*_callable_and_kwargs(recipe["optimizer"])).build(part)
    built[0].zero_grad()
    for p in part.parameters():
        p.grad = torch.ones_like(p)
    built[0].step()
    moments = {str(v.dtype) for state in built[0].state.values() for k, v in state.items() if k.startswith("exp_avg")}
    from nemo_automodel.components.loss.loss import build_loss_config
    import importlib.util
    # the class its YAML loader resolves `_target_` to (whose module needs transformers, not installed here: found
    # by its file), and its typed config by that class's registry name
    target, kwargs = _callable_and_kwargs(recipe["loss_fn"])
    module, name = target.rsplit(".", 1)
    assert f"class {name}(" in open(importlib.util.find_spec(module).origin).read(), target
    loss = build_loss_config(name, **kwargs)
    print(json.dumps({"mesh": dims, "ep": dict(zip([str(n).split(".")[-1].lower() for n in moe.mesh_dim_names],
                                                   moe.mesh.shape)) if moe is not None else None,
                      "microbatches": steps.grad_acc_steps * (s["local_batch_size"] // micro if micro else 1),
                      "checkpointing": parsed["activation_checkpointing"],
                      "reshard": parsed["strategy_config"].reshard_after_forward,
                      "reduce": str(parsed["strategy_config"].mp_policy.reduce_dtype),
                      "optimizer": type(built[0]).__name__, "moments": sorted(moments),
                      "loss": type(loss).__name__, "fp32_upcast": loss.fp32_upcast}))
""")


@requires_engine("nemo_automodel", "dev")
def test_its_own_code_takes_the_export(exported, tmp_path):
    """nemo_automodel's parser reads the distributed section, its FSDP2 mesh builder lays out the ranks (on a
    fake process group of the plan's size), its step scheduler runs the plan's micro-batches, and its optimizer
    builder makes the recipe's optimizer, whose moments follow the parameters' dtype."""
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    for model, (plan, recipe, devices) in exported.items():
        done = subprocess.run([sys.executable, str(script), str(recipe), str(devices)], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        built, c = json.loads(done.stdout.strip().splitlines()[-1]), plan["parallel"]
        assert built["mesh"] == {"pp": c["pp"], "dp_replicate": 1, "dp_shard": c["dp"], "cp": c["cp"], "tp": c["tp"]}
        assert (built["ep"] or {}).get("ep", 1) == c["ep"], model
        assert built["microbatches"] == c["num_microbatches"], model
        assert built["checkpointing"] == (c["recompute"] != "none"), model
        # stated, not left to its default (which keeps the weights gathered wherever ep > 1 or pp > 1)
        assert built["reshard"] == (c["zero"] == 3) and built["reduce"] == "torch.float32", model
        # an optimizer its recipe can build (it has none by default), its moments in the parameters' dtype: as priced
        assert built["optimizer"] == "AdamW" and built["moments"] == ["torch.bfloat16"], model
        # and its loss (it has none by default either): the masked cross-entropy, upcast unless priced on 16 bits
        assert built["loss"] == "MaskedCrossEntropyConfig"
        assert built["fp32_upcast"] is not plan["training"].get("bf16_loss", False), model


def recipe_with(tmp_path: Path, exported, **distributed) -> Path:
    import yaml

    plan, recipe, _ = exported["llama3-8b"]
    data = yaml.safe_load(recipe.read_text())
    data["distributed"].update(distributed)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("change, fragment", [
    ({"strategy": "ddp"}, "strategy ddp"),
    ({"strategy": "zero_bubble"}, "fsdp2, megatron_fsdp and ddp"),
    ({"offload_policy": {"pin_memory": True}}, "on the host"),
    ({"enable_async_tensor_parallel": True, "tp_size": 2, "dp_size": 8, "sequence_parallel": False},
     "requires sequence_parallel=True"),  # AutoModel's parallelizer raises it
    ({"some_new_layout_key": 4}, "distributed.some_new_layout_key"),
    ({"activation_checkpointing": "selective"}, "selective"),
])
def test_a_recipe_it_cannot_price_is_refused_naming_the_key(gplan, tmp_path, exported, change, fragment):
    r = gplan("estimate", "--from", str(recipe_with(tmp_path, exported, **change)), "--cluster", "dgx-h100",
              "--devices", "16")
    assert r.code == 3 and fragment in r.stderr and "hint:" in r.stderr, r.stderr


def test_its_async_tensor_parallel_is_read_and_priced_with_tps_collectives_pipelined(gplan, tmp_path, exported):
    """distributed.enable_async_tensor_parallel (AutoModel compiles each block for it) was refused: read as --async-tp
    at tp 2 with sequence parallelism — tp's collectives pipelined with the matmuls — and exported back."""
    args = ("--cluster", "dgx-h100", "--devices", "16", "--json")
    layout = {"tp_size": 2, "dp_size": 8, "sequence_parallel": True}
    on = gplan("estimate", "--from", str(recipe_with(tmp_path, exported, enable_async_tensor_parallel=True, **layout)),
               *args).json()
    off = gplan("estimate", "--from", str(recipe_with(tmp_path, exported, **layout)), *args).json()
    assert on["engine_options"]["async_tp"] is True and on["parallel"]["tp"] == 2
    assert on["breakdown"]["tp_comm"] < off["breakdown"]["tp_comm"] / 2
    plan = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--devices", "16", "--cluster", "dgx-h100", "--target", "nemo-automodel",
                 "--tp", "2", "--async-tp", "--out", str(plan)).code == 0
    assert gplan("export", str(plan), "--to", "nemo-automodel", "-o", str(tmp_path / "out")).code == 0
    assert "enable_async_tensor_parallel: true" in (tmp_path / "out" / "automodel_llama3-8b.yaml").read_text()


def test_keys_at_their_default_and_other_sections_are_read_without_effect(gplan, tmp_path, exported):
    path = recipe_with(tmp_path, exported, enable_async_tensor_parallel=False, defer_fsdp_grad_sync=True,
                       enable_compile=True)
    r = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert "distributed.enable_compile" in data["no_effect"]
    assert data["step_time_s"] == pytest.approx(exported["llama3-8b"][0]["prediction"]["step_time_s"], rel=1e-9)


def test_a_recipe_naming_a_model_gplan_does_not_bundle_asks_for_it(gplan, tmp_path, exported):
    import yaml

    _, recipe, _ = exported["llama3-8b"]
    data = yaml.safe_load(recipe.read_text())
    data["model"]["pretrained_model_name_or_path"] = "someone/unknown-7b"
    path = tmp_path / "unknown.yaml"
    path.write_text(yaml.safe_dump(data))  # no gplan header: the model is the one the recipe names
    r = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16")
    assert r.code == 3 and "someone/unknown-7b" in r.stderr and "MODEL" in r.stderr
    r = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert r.code == 0 and r.json()["engine"] == "nemo-automodel"


RECIPE = """# my AutoModel run
recipe: TrainFinetuneRecipeForNextTokenPrediction
step_scheduler:
  global_batch_size: 512   # the batch we train at
  local_batch_size: 4
  max_steps: 1000
model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
distributed:
  strategy: fsdp2
  dp_size: null
  tp_size: 4
  cp_size: 1
  sequence_parallel: true
  activation_checkpointing: true
dataset:
  _target_: nemo_automodel.components.datasets.llm.mock_iterable_dataset.MockIterableDataset
  seq_len: 8192
optimizer:
  _target_: torch.optim.AdamW
  lr: 3.0e-4
"""


def test_the_best_plan_is_written_back_into_the_users_recipe(gplan, tmp_path):
    """--out-launch: the recipe with its layout keys set as the best plan's export writes them, and every other
    line (comments, model, data, optimizer) kept; read back, it is the best plan."""
    import yaml

    source, better, out = tmp_path / "recipe.yaml", tmp_path / "better.yaml", tmp_path / "plan.json"
    source.write_text(RECIPE)
    r = gplan("search", "--from", str(source), "--cluster", "dgx-h100", "--devices", "16", "--out", str(out),
              "--out-launch", str(better))
    assert r.code == 0, r.stderr
    text = better.read_text()
    assert "# my AutoModel run" in text and "# the batch we train at" in text and "lr: 3.0e-4" in text
    assert yaml.safe_load(text)["model"] == yaml.safe_load(RECIPE)["model"]
    plan = json.loads(out.read_text())
    r = gplan("estimate", "--from", str(better), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    assert {k: data["parallel"][k] for k in ("dp", "tp", "pp", "cp", "mbs")} == \
        {k: plan["parallel"][k] for k in ("dp", "tp", "pp", "cp", "mbs")}


def test_a_pipeline_section_the_best_plan_drops_is_refused_not_left_behind(gplan, tmp_path):
    source, better = tmp_path / "recipe.yaml", tmp_path / "better.yaml"
    source.write_text(RECIPE.replace("  tp_size: 4\n", "  tp_size: 1\n  pp_size: 2\n  pipeline:\n"
                                     "    pp_schedule: 1f1b\n    pp_microbatch_size: 1\n"))
    r = gplan("search", "--from", str(source), "--cluster", "dgx-h100", "--devices", "16", "--pp", "1",
              "--out", str(tmp_path / "plan.json"), "--out-launch", str(better))
    assert r.code == 3 and "distributed.pipeline" in r.stderr and not better.exists()


@requires_program("shellcheck", "dev")
def test_its_run_script_passes_shellcheck(exported):
    for _, recipe, _ in exported.values():
        script = recipe.parent / "run_automodel.sh"
        done = subprocess.run(["shellcheck", "--severity=style", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
        assert "-m nemo_automodel.cli.app" in script.read_text() and script.stat().st_mode & 0o111


def test_its_interleaved_cut_is_the_one_its_own_code_makes():
    """AutoModel cuts virtual stages from one layers_per_stage count, rounded to a multiple of pp, the first
    L mod stages one layer longer: gplan's cut (spec.targets.layers_per_stage_cut) gives exactly pp·vpp stages by
    AutoModel's own calculate_virtual_stages wherever any count does, and each rank's layers are those of
    AutoModel's generate_hf_model_fqn_per_model_part (61 layers on pp 8 × 3: the Kimi K2 and DeepSeek-V3 recipes)."""
    pytest.importorskip("nemo_automodel", reason="needs NeMo AutoModel (dev extras)")
    from nemo_automodel.components.distributed.pipelining.functional import (
        calculate_virtual_stages, generate_hf_model_fqn_per_model_part, stage_ids_this_rank)

    from gplan.engines.nemo_automodel.launch import rank_layers
    from gplan.spec.targets import layers_per_stage_cut

    def reaches(layers, pp, vpp):
        for per_stage in range(1, layers + 1):
            for rounding in (None, "down", "up"):
                try:
                    if calculate_virtual_stages(layers, per_stage, pp, False, rounding)[0] == pp * vpp:
                        return True
                except ValueError:
                    pass
        return False

    for layers, pp, vpp in [(61, 8, 3), (61, 4, 2), (94, 8, 4), (80, 8, 3), (27, 4, 3), (126, 16, 2), (63, 8, 3)]:
        cut = layers_per_stage_cut(layers, pp, vpp)
        if cut is None:
            assert not reaches(layers, pp, vpp), (layers, pp, vpp)
            continue
        assert calculate_virtual_stages(layers, cut[0], pp, False, cut[1])[0] == pp * vpp
        stages = generate_hf_model_fqn_per_model_part(pp * vpp, layers)
        held = [sum(sum(1 for m in stages[j] if ".layers." in m) for j in stage_ids_this_rank(r, pp, pp * vpp, "loop"))
                for r in range(pp)]
        assert rank_layers(layers, pp, vpp) == held, (layers, pp, vpp)


def test_a_recipe_interleaving_unequal_stages_is_priced_and_exported_as_it_cuts_them(gplan, tmp_path):
    """Kimi K2's benchmark recipe (61 layers, pp 8, stages of 2 rounded down to 24): priced, not refused; a plan
    with 61 layers on pp 8 × vpp 3 exports the layers_per_stage and rounding that cut it so, and reads back."""
    import yaml

    recipe = Path(__file__).parents[1] / "data" / "corpus" / "nemo_automodel" / "kimi_k2_benchmark_32nodes.yaml"
    r = gplan("estimate", "--from", str(recipe), "--cluster", "dgx-h100", "--devices", "256", "--json")
    assert r.code == 0, r.stderr
    assert [s["num_layers"] for s in r.json()["stages"]] == [8, 8, 8, 8, 8, 7, 7, 7]
    plan_path, out = tmp_path / "plan.json", tmp_path / "out"
    r = gplan("search", "deepseek-v3", "--devices", "256", "--cluster", "dgx-h100", "--target", "nemo-automodel",
              "--pp", "8", "--vpp", "3", "--gbs", "512", "--out", str(plan_path))
    assert r.code == 0, r.stderr
    assert gplan("export", str(plan_path), "--to", "nemo-automodel", "-o", str(out)).code == 0
    pipeline = yaml.safe_load(next(out.glob("*.yaml")).read_text().split("\n", 1)[1])["distributed"]["pipeline"]
    assert (pipeline["layers_per_stage"], pipeline.get("round_virtual_stages_to_pp_multiple")) in [(2, "down"), (3, "up")]
    back = gplan("estimate", "--from", str(next(out.glob("*.yaml"))), "--cluster", "dgx-h100", "--devices", "256",
                 "--json").json()
    assert back["step_time_s"] == pytest.approx(json.loads(plan_path.read_text())["prediction"]["step_time_s"], rel=1e-6)


def test_a_vpp_no_layers_per_stage_count_reaches_is_refused_with_the_rule(gplan):
    from gplan.spec.targets import layers_per_stage_cut

    assert layers_per_stage_cut(32, 8, 3) is None  # 32 layers: 32, 16 or 11 stages — never 24
    r = gplan("estimate", "llama3-8b", "--devices", "64", "--cluster", "dgx-h100", "--target", "nemo-automodel",
              "--pp", "8", "--vpp", "3", "--dp", "8", "--zero", "3")
    assert r.code == 3 and "layers-per-stage" in r.stderr and "hint:" in r.stderr


LEGACY = Path(__file__).parents[1] / "data" / "corpus" / "nemo_automodel"


def test_a_recipe_of_its_earlier_layout_is_read_as_that_release_ran_it(gplan):
    """AutoModel's own benchmark recipes, as its performance summary ran them, keep the pipeline in `autopipeline:`,
    the MoE parallelizer's checkpointing and resharding in `parallelizer:`, the strategy as a manager class and
    DeepEP as `enable_deepep`: read as that release ran them (the run checkpointed, on DeepEP), with a note that
    0.7 ignores them — not read as 0.7 would run them unchanged (nothing checkpointed: over the device)."""
    r = gplan("estimate", "--from", str(LEGACY / "qwen3_moe_30b_benchmark_legacy.yaml"), "--cluster", "dgx-h100",
              "--devices", "8", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["parallel"]["recompute"] == "full" and data["parallel"]["zero"] == 2
    assert data["engine_options"]["moe_dispatcher"] == "flex" and data["fits"]
    note = next(n for n in data["not_read"] if "0.7 ignores" in n)
    assert all(old in note for old in ("autopipeline", "parallelizer", "enable_deepep", "FSDP2Manager"))
    assert not any(k.startswith(("parallelizer.", "autopipeline.")) for k in data["not_read"] + list(data["no_effect"]))


def test_a_recipe_of_its_earlier_layout_written_back_reads_back_as_the_best_plan(gplan, tmp_path):
    """The best plan written into such a recipe sets 0.7's keys beside the old sections; read back, 0.7's keys are
    the ones read (as 0.7 reads them), and the recipe is the best plan."""
    better, out = tmp_path / "better.yaml", tmp_path / "plan.json"
    r = gplan("search", "--from", str(LEGACY / "qwen3_moe_30b_benchmark_legacy.yaml"), "--cluster", "dgx-h100",
              "--devices", "8", "--out", str(out), "--out-launch", str(better))
    assert r.code == 0, r.stderr
    text, plan = better.read_text(), json.loads(out.read_text())
    assert "parallelizer:" in text and "activation_checkpointing: true" in text  # the user's lines stay
    data = gplan("estimate", "--from", str(better), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    assert data["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    assert {k: data["parallel"][k] for k in ("dp", "tp", "pp", "ep", "mbs", "recompute")} == \
        {k: plan["parallel"][k] for k in ("dp", "tp", "pp", "ep", "mbs", "recompute")}
    assert data["parallel"]["zero"] == max(plan["parallel"]["zero"], 2)  # zero 1 runs as zero 2


@pytest.mark.parametrize("distributed, moe, zero", [
    ({"pp_size": 1, "ep_size": 1}, {}, 3),                        # every layer but the last resharded
    ({"pp_size": 2, "ep_size": 1}, {}, 2),                        # pipeline stages keep their weights
    ({"pp_size": 1, "ep_size": 8}, {}, 2),                        # the MoE parallelizer's default
    ({"pp_size": 1, "ep_size": 8}, {"reshard_after_forward": True}, 3),
    ({"pp_size": 1, "ep_size": 8, "reshard_after_forward": True}, {"reshard_after_forward": False}, 3),
    ({"pp_size": 2, "ep_size": 1, "reshard_after_forward": True}, {}, 3),
])
def test_its_resharding_default_follows_the_layout_as_its_parallelizers_decide(distributed, moe, zero):
    """0.7's model_parallelizer: `distributed.reshard_after_forward` where set; else with ep > 1 the MoE
    parallelizer's own (false by default); else false with pipeline stages, true without."""
    from gplan.engines.nemo_automodel.launch import reshards_after_forward

    values = {f"distributed.{k}": v for k, v in distributed.items()} | {f"distributed.moe.{k}": v for k, v in moe.items()}
    assert reshards_after_forward(values, distributed["pp_size"], distributed["ep_size"]) == (zero == 3)


def moe_recipe(tmp_path: Path, **changes) -> Path:
    import yaml

    data = yaml.safe_load((LEGACY / "qwen3_moe_30b_benchmark_legacy.yaml").read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        data.setdefault(section, {})[key] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_models_own_dtype_decides_its_states_and_the_reduce_dtype_its_gradient_traffic(gplan, tmp_path):
    """AutoModel builds the model in `model.torch_dtype` ("auto": bfloat16) and Adam's states follow it: left out, the
    run keeps no fp32 copy (8 bytes a parameter, not 16); float32 keeps fp32 weights under FSDP2's bf16 compute.
    `mp_policy.reduce_dtype: bfloat16` halves the gradients' reduce-scatter; float16 storage is refused. (Gradient
    sync every micro-batch: no whole gradient, held in the reduce dtype whatever the model's, in the ratio.)"""
    def estimate(**changes):
        changes = {"distributed__defer_fsdp_grad_sync": False, **changes}
        r = gplan("estimate", "--from", str(moe_recipe(tmp_path, **changes)), "--cluster", "dgx-h100", "--devices",
                  "8", "--json")
        return r

    default, fp32 = estimate().json(), estimate(model__torch_dtype="float32").json()
    assert default["engine_options"].get("pure_bf16") and not fp32["engine_options"].get("pure_bf16")
    states = lambda d: sum(d["stages"][0]["memory"][k] for k in ("weights_bytes", "grads_bytes", "optimizer_bytes"))  # noqa: E731
    assert states(fp32) / states(default) == pytest.approx(2.0, rel=0.1)
    reduced = estimate(distributed__mp_policy={"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}).json()
    assert reduced["engine_options"].get("grad_reduce_in_bf16")
    r = estimate(model__torch_dtype="float16")
    assert r.code == 3 and "model.torch_dtype" in r.stderr and "hint:" in r.stderr


def test_its_deferred_gradient_sync_holds_whole_gradients_and_reduces_once(gplan, tmp_path):
    """`distributed.defer_fsdp_grad_sync` (default true): without stages, FSDP2 accumulates every gradient whole, in
    the reduce dtype (fp32), through a step's micro-batches and reduce-scatters once, behind the last backward —
    its 70B recipe sets it false ("True → delayed resharding → OOM"): read, priced (m reduce-scatters, no whole
    gradients), exported and read back."""
    import yaml

    def estimate(path):
        r = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100", "--devices", "8", "--json")
        assert r.code == 0, r.stderr
        return r.json()

    deferred = estimate(moe_recipe(tmp_path))
    each = estimate(moe_recipe(tmp_path, distributed__defer_fsdp_grad_sync=False))
    assert each["engine_options"].get("grad_sync_each_microbatch") and \
        not deferred["engine_options"].get("grad_sync_each_microbatch")
    m, zero = deferred["num_microbatches"], deferred["parallel"]["zero"]
    assert m > 1 and zero == 2
    grads = lambda d: d["stages"][0]["memory"]["grads_bytes"]  # noqa: E731
    stage = deferred["stages"][0]
    # whole fp32 gradients of the FSDP-sharded weights beside the bf16 shard they are reduced into (the routed
    # experts, ep 8 of 8 ranks, are sharded over no one: their gradients were whole already)
    assert grads(deferred) - grads(each) == pytest.approx(4 * (stage["params"] - stage["expert_params"]), rel=1e-6)
    assert each["breakdown"]["dp_comm"] >= deferred["breakdown"]["dp_comm"]  # on one node both hide (test_overlap)
    out, exported = tmp_path / "plan.json", tmp_path / "export"
    r = gplan("search", "--from", str(moe_recipe(tmp_path, distributed__defer_fsdp_grad_sync=False)), "--cluster",
              "dgx-h100", "--devices", "8", "--out", str(out), "--pp", "1", "--json")
    assert r.code == 0, r.stderr
    assert json.loads(out.read_text())["training"]["grad_sync_each_microbatch"] is True
    r = gplan("export", str(out), "--to", "nemo-automodel", "--out-dir", str(exported))
    assert r.code == 0, r.stderr
    recipe = next(exported.glob("*.yaml"))
    assert yaml.safe_load(recipe.read_text())["distributed"]["defer_fsdp_grad_sync"] is False
    assert estimate(recipe)["engine_options"].get("grad_sync_each_microbatch")


def test_gpt_oss_is_priced_as_its_own_model_runs_it(gplan):
    """Its gpt-oss model (components/models/gpt_oss) runs the sliding-window layers, the sinks and the clamped
    gated unit: priced for AutoModel, not refused."""
    r = gplan("estimate", "gpt-oss-20b", "--devices", "8", "--cluster", "dgx-h100", "--target", "nemo-automodel",
              "--ep", "8", "--json")
    assert r.code == 0, r.stderr


def test_its_attention_backend_is_the_kernel_priced_and_exported(gplan, tmp_path):
    """`model.backend.attn`: te (its default) prices the fused cuDNN kernel, flex and sdpa FlashAttention-2's class
    (slower on Hopper); an unknown backend is refused. A plan naming FlashAttention-2's class exports flex for
    gpt-oss (its model takes flex or te, not sdpa) and reads back as itself."""
    import yaml

    def estimate(attn):
        r = gplan("estimate", "--from", str(moe_recipe(tmp_path, model__backend={"attn": attn, "dispatcher": "deepep"})),
                  "--cluster", "dgx-h100", "--devices", "8", "--json")
        return r

    te, flex = estimate("te").json(), estimate("flex").json()
    assert "attention_kernel" not in te["engine_options"] and flex["engine_options"]["attention_kernel"] == "fa2"
    assert flex["step_time_s"] > te["step_time_s"]
    r = estimate("quack")
    assert r.code == 3 and "model.backend.attn" in r.stderr and "hint:" in r.stderr
    plan, out = tmp_path / "plan.json", tmp_path / "out"
    r = gplan("search", "gpt-oss-20b", "--devices", "8", "--cluster", "dgx-h100", "--target", "nemo-automodel",
              "--attention-kernel", "fa2", "--ep", "8", "--out", str(plan))
    assert r.code == 0, r.stderr
    assert gplan("export", str(plan), "--to", "nemo-automodel", "-o", str(out)).code == 0
    recipe = next(out.glob("*.yaml"))
    assert yaml.safe_load(recipe.read_text().split("\n", 1)[1])["model"]["backend"]["attn"] == "flex"
    back = gplan("estimate", "--from", str(recipe), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    assert back["engine_options"]["attention_kernel"] == "fa2"
    assert back["step_time_s"] == pytest.approx(json.loads(plan.read_text())["prediction"]["step_time_s"], rel=1e-9)


def test_an_attention_kernel_only_the_engine_runs_is_a_choice_elsewhere_refused(gplan):
    """Naming an engine's own kernel chooses nothing (accepted everywhere); naming another one is refused by engines
    that run only theirs, with the engines that take it in the hint."""
    plain = gplan("estimate", "llama3-8b", "--devices", "8", "--cluster", "dgx-h100", "--target", "torch", "--json")
    named = gplan("estimate", "llama3-8b", "--devices", "8", "--cluster", "dgx-h100", "--target", "torch",
                  "--attention-kernel", "fa2", "--json")
    assert named.code == 0 and named.json()["step_time_s"] == plain.json()["step_time_s"]
    r = gplan("estimate", "llama3-8b", "--devices", "8", "--cluster", "dgx-h100", "--target", "megatron",
              "--attention-kernel", "fa2")
    assert r.code == 3 and "--attention-kernel fa2" in r.stderr and "nemo-automodel" in r.stderr


def test_a_loss_on_the_16_bit_logits_keeps_its_softmax_and_gradient_in_16_bits(gplan, tmp_path):
    """`loss_fn.fp32_upcast: false` (every benchmark recipe of AutoModel's): the softmax kept and the loss gradient in
    bf16 — 2 + 2 bytes a logit less on the last stage than the fp32 upcast, its default — read, exported (its loss
    section) and read back; elsewhere --bf16-loss is refused."""
    import yaml

    def estimate(upcast):
        r = gplan("estimate", "--from", str(moe_recipe(tmp_path, loss_fn__fp32_upcast=upcast)), "--cluster",
                  "dgx-h100", "--devices", "8", "--json")
        assert r.code == 0, r.stderr
        return r.json()

    upcast, bf16 = estimate(True), estimate(False)
    assert bf16["engine_options"]["bf16_loss"] and "bf16_loss" not in upcast["engine_options"]
    logits = 4 * 4096 * 151936  # mbs 4 × seq 4096 tokens × Qwen3's vocabulary, at ep 8 and tp 1
    saved = upcast["memory_bytes_per_device_max"] - bf16["memory_bytes_per_device_max"]
    assert saved == pytest.approx((2 + 2) * logits, rel=0.01)
    plan, out = tmp_path / "plan.json", tmp_path / "out"
    r = gplan("search", "qwen3-30b-a3b", "--devices", "8", "--cluster", "dgx-h100", "--target", "nemo-automodel",
              "--bf16-loss", "--out", str(plan))
    assert r.code == 0, r.stderr
    assert gplan("export", str(plan), "--to", "nemo-automodel", "-o", str(out)).code == 0
    recipe = next(out.glob("*.yaml"))
    assert yaml.safe_load(recipe.read_text().split("\n", 1)[1])["loss_fn"]["fp32_upcast"] is False
    back = gplan("estimate", "--from", str(recipe), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    assert back["step_time_s"] == pytest.approx(json.loads(plan.read_text())["prediction"]["step_time_s"], rel=1e-9)
    r = gplan("estimate", "llama3-8b", "--devices", "8", "--cluster", "dgx-h100", "--target", "megatron", "--bf16-loss")
    assert r.code == 3 and "--bf16-loss" in r.stderr and "nemo-automodel" in r.stderr


def test_an_earlier_layout_switch_neither_true_nor_false_is_refused(gplan, tmp_path):
    r = gplan("estimate", "--from", str(moe_recipe(tmp_path, model__backend={"enable_deepep": "maybe"})), "--cluster",
              "dgx-h100", "--devices", "8")
    assert r.code == 3 and "enable_deepep" in r.stderr and "hint:" in r.stderr


def test_a_recipe_with_transformer_engines_fused_adam_says_what_its_price_leaves_out(gplan):
    """Its 70B benchmark recipe steps Transformer Engine's FusedAdam, whose moments default to fp32 beside the bf16
    model: not priced yet, and said beside the prediction rather than left silent (torch Adam's recipes say nothing)."""
    corpus = Path(__file__).parents[1] / "data" / "corpus" / "nemo_automodel"
    fused = gplan("estimate", "--from", str(corpus / "llama3_1_70b_pretrain_benchmark_8nodes_tp1cp2pp1.yaml"),
                  "--cluster", "dgx-h100", "--devices", "64")
    assert fused.code == 0, fused.stderr
    said = " ".join((fused.stderr + fused.stdout).split())  # the terminal wraps it
    assert "FusedAdam: Transformer Engine's keeps its moments in float32" in said and "not priced yet" in said
    plain = gplan("estimate", "--from", str(corpus / "qwen3_moe_30b_benchmark_legacy.yaml"), "--cluster", "dgx-h100",
                  "--devices", "8")
    assert plain.code == 0 and "FusedAdam" not in plain.stderr + plain.stdout
