"""MindFormers' PyNative trainer YAMLs (its `training` / `parallelism` / `recompute` / `model` sections, the schema
its DeepSeek-V3 1B and DeepSeek-V4 recipes are written in): torchtitan's FSDP + EP layout on Ascend, read as its
ParallelDims builds it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import mindformers_configs, requires_engine

from gplan.planner.launch_files import read_launch

PYNATIVE = """\
training:
  local_batch_size: 1
  global_batch_size: 16
optimizer:
  type: AdamW
parallelism:
  data_parallel_shard: -1
  data_parallel_shard_strategy: "optim_grads_params"
  expert_parallel: 4
  tensor_parallel: 1
  context_parallel: 1
  pipeline_parallel: 1
  pipeline_parallel_interleave_num: 1
  pipeline_parallel_layers_per_stage: null
  sequence_parallel: true
  moe_token_dispatcher_type: "alltoall"
recompute:
  mode: full
  full_recompute_layer: [0-7]
train_dataset:
  dataloader:
    config:
      seq_length: 4096
model:
  model_type: deepseek_v3
  vocab_size: 129280
  hidden_size: 1792
  intermediate_size: 3072
  num_hidden_layers: 16
  num_attention_heads: 4
  kv_lora_rank: 512
  q_lora_rank: 1536
  qk_rope_head_dim: 64
  v_head_dim: 192
  qk_nope_head_dim: 128
  num_nextn_predict_layers: 1
  moe_intermediate_size: 1024
  first_k_dense_replace: 1
  n_routed_experts: 8
  num_experts_per_tok: 4
  n_shared_experts: 1
  scoring_func: "sigmoid"
  topk_group: 2
  n_group: 4
"""


def pynative(tmp_path, text: str = PYNATIVE) -> Path:
    path = tmp_path / "pretrain_pynative.yaml"
    path.write_text(text)
    return path


def test_a_pynative_yaml_is_read_as_fsdp_with_expert_parallel(tmp_path):
    launch = read_launch(pynative(tmp_path), None)
    assert launch.engine == "mindformers-pynative" and launch.seq_length == 4096 and launch.gbs == 16
    m = launch.model
    assert (m.num_layers, m.num_experts, m.top_k, m.first_dense_layers) == (16, 8, 4, 1)
    g = launch.given
    assert (g["zero"], g["ep"], g["mbs"], g["tp"], g["pp"]) == (3, 4, 1, 1, 1)
    assert launch.per_stage_recompute == ([8], [0])  # layers 0-7 of 16 fully recomputed
    assert launch.world_size is None  # dp_shard -1: all the ranks msrun starts


def test_a_pynative_yaml_is_priced_on_the_devices_named(gplan, tmp_path):
    r = gplan("estimate", "--from", str(pynative(tmp_path)), "--devices", "8", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert (data["parallel"]["dp"], data["parallel"]["ep"], data["parallel"]["zero"]) == (8, 4, 3)
    assert data["recompute_run"] == "full 8 · none 8" and data["num_microbatches"] == 2
    none = gplan("estimate", "--from", str(pynative(tmp_path)))
    assert none.code == 3 and "--devices" in none.stderr and len(none.stderr.strip().splitlines()) == 2


def test_pipeline_stages_keep_the_weights_gathered_by_default_and_layer_ranges_split_them(tmp_path):
    text = (PYNATIVE.replace("pipeline_parallel: 1", "pipeline_parallel: 2")
            .replace("pipeline_parallel_layers_per_stage: null", "pipeline_parallel_layers_per_stage: ['0-6', '7-15']"))
    launch = read_launch(pynative(tmp_path, text), None)
    assert launch.given["zero"] == 2 and launch.stage_sizes == [7, 9] and launch.given["schedule"] == "1f1b"
    assert launch.per_stage_recompute == ([7, 1], [0, 0])


def test_an_even_split_that_does_not_divide_is_refused_as_mindformers_refuses_it(gplan, tmp_path):
    text = PYNATIVE.replace("pipeline_parallel: 1", "pipeline_parallel: 3")
    r = gplan("estimate", "--from", str(pynative(tmp_path, text)), "--devices", "12")
    assert r.code == 3 and "do not split evenly" in r.stderr and len(r.stderr.strip().splitlines()) == 2


@pytest.mark.parametrize("line, said", [("moe_token_dispatcher_type: \"alltoall\"", "alltoall_deredundancy"),
                                        ("sequence_parallel: true", "enable_mc2")])
def test_what_gplan_does_not_price_is_refused_in_one_line(gplan, tmp_path, line, said):
    swapped = {"alltoall_deredundancy": 'moe_token_dispatcher_type: "alltoall_deredundancy"',
               "enable_mc2": "sequence_parallel: true\n  enable_mc2: true"}[said]
    r = gplan("estimate", "--from", str(pynative(tmp_path, PYNATIVE.replace(line, swapped))), "--devices", "8")
    assert r.code == 3 and said in r.stderr and len(r.stderr.strip().splitlines()) == 2, r.stderr


def test_hsdp_and_another_optimizer_are_said_with_what_they_leave_mispriced(tmp_path):
    text = PYNATIVE.replace("data_parallel_shard: -1", "data_parallel_shard: 4").replace("type: AdamW", "type: Muon")
    launch = read_launch(pynative(tmp_path, text), None)
    assert "under-priced dp/4×" in launch.no_effect["parallelism.data_parallel_shard"]
    assert launch.no_effect["optimizer.type"].startswith("Muon: priced as AdamW")


@requires_engine("mindformers", "dev")
def test_mindformers_own_pynative_deepseek_v3_recipe_is_priced(gplan):
    path = mindformers_configs() / "deepseek3" / "pretrain_deepseek3_1b_8p_pynative.yaml"
    r = gplan("estimate", "--from", str(path), "--devices", "8", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["parallel"]["zero"] == 3 and r.json()["parallel"]["dp"] == 8


@requires_engine("mindformers", "dev")
def test_mindformers_own_deepseek_v4_recipe_is_refused_naming_its_model_not_misread_as_torchtitan(gplan):
    r = gplan("estimate", "--from", str(mindformers_configs() / "deepseek4" / "pretrain_deepseek4_flash.yaml"),
              "--devices", "64")
    assert r.code == 3 and "deepseek_v4" in r.stderr and "torchtitan" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 2


@requires_engine("mindformers", "dev")
def test_every_layout_key_of_its_pynative_config_classes_is_classified():
    """Each field of MindFormers' ParallelismConfig, RecomputeConfig and SwapConfig is read, or classified with its
    default (a field a new release adds fails here, not silently in a user's YAML)."""
    import dataclasses

    from mindformers.pynative.config.config import ParallelismConfig, RecomputeCommConfig, RecomputeConfig, SwapConfig

    from gplan.engines.mindformers_pynative.flags import KEYS, READ

    for section, cls in (("parallelism", ParallelismConfig), ("recompute", RecomputeConfig), ("swap", SwapConfig),
                         ("recompute_comm", RecomputeCommConfig)):
        names = {f"{section}.{f.name}" for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        assert not names - READ - set(KEYS), sorted(names - READ - set(KEYS))
        for key in names & set(KEYS):
            field = next(f for f in dataclasses.fields(cls) if f"{section}.{f.name}" == key)
            if field.default is not dataclasses.MISSING:
                assert KEYS[key][1] == field.default, key


def test_mindformers_names_of_swiglu_are_swiglu(tmp_path):
    for act in ("swiglu", "fusedswiglu"):
        launch = read_launch(pynative(tmp_path, PYNATIVE.replace("  vocab_size: 129280", f"  vocab_size: 129280\n  hidden_act: {act}")), None)
        assert launch.model.ffn_kind == "swiglu"


def test_a_telechat3_moe_model_is_read_as_the_deepseek_v3_blocks_mindformers_builds_it_with(tmp_path):
    """Its converter maps TeleChat3-MoE's fields, DeepSeek-V3's names, onto the same latent-attention and MoE blocks."""
    text = (PYNATIVE.replace("model_type: deepseek_v3", "model_type: telechat3_moe")
            .replace("  n_shared_experts: 1\n", "  n_shared_experts: 1\n  moe_shared_expert_intermediate_size: 1024\n"))
    m = read_launch(pynative(tmp_path, text), None).model
    assert m.is_mla and (m.num_experts, m.num_shared_experts, m.first_dense_layers) == (8, 1, 1)


def test_the_best_plan_written_back_into_its_yaml_reads_back_as_the_plan(gplan, tmp_path):
    """search --from a PyNative YAML --out-launch: its comments and model stay, and read back it is the best plan,
    at the plan's step."""
    import json

    text = PYNATIVE.replace("recompute:\n", "recompute:  # layers recomputed\n").replace(
        "  full_recompute_layer: [0-7]", "  full_recompute_layer:\n  - 0-7")  # a block list, as users write them
    source, better, plan_path = pynative(tmp_path, text), tmp_path / "better.yaml", tmp_path / "p.json"
    r = gplan("search", "--from", str(source), "--devices", "16", "--out", str(plan_path), "--out-launch", str(better))
    assert r.code == 0, r.stderr
    written = better.read_text()
    assert "recompute:  # layers recomputed" in written and "first_k_dense_replace: 1" in written
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "--from", str(better), "--devices", "16", "--json")
    assert back.code == 0, back.stderr
    for key in ("dp", "tp", "pp", "vpp", "ep", "mbs", "zero"):
        assert back.json()["parallel"][key] == plan["parallel"][key], key
    assert back.json()["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_a_yaml_key_whose_value_is_a_block_is_rewritten_whole():
    """A write-back replaces a block list (pipeline_parallel_layers_per_stage, full_recompute_layer as users write
    them) with the plan's value, the key's comment and the lines after it kept; before, the old items stayed below."""
    import yaml

    from gplan.launch_text import rewrite_yaml

    text = ("parallelism:\n  pipeline_parallel_layers_per_stage:   # per rank\n    - '0-6'\n    - '7-15'\n"
            "  expert_parallel: 1\nrecompute:\n  full_recompute_layer:\n  - 0-3\n\n  # kept\nmodel:\n  x: 1\n")
    out = rewrite_yaml(text, {"parallelism.pipeline_parallel_layers_per_stage": ["0-7", "8-15"],
                              "recompute.full_recompute_layer": ["0-1"]})
    assert yaml.safe_load(out) == {"parallelism": {"pipeline_parallel_layers_per_stage": ["0-7", "8-15"], "expert_parallel": 1},
                                   "recompute": {"full_recompute_layer": ["0-1"]}, "model": {"x": 1}}
    assert "# per rank" in out and "# kept" in out
