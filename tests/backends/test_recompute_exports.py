"""Megatron's recompute modules, memory options and activation offloading from the command line to the
export and back: searched or estimated, written as Megatron-LM's flags (checked by megatron_rules.py,
Megatron-LM's own rules), read back by `--from` as the same configuration at the same price; bad input
exits 3 with a hint."""

from __future__ import annotations

import json

import pytest

import megatron_rules
from test_exporters import script_args, script_env

MOE = ["qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "16", "--gbs", "256", "--seq-length", "4096"]


def test_a_module_set_is_searched_exported_and_read_back_at_the_same_price(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    r = gplan("search", *MOE, "--target", "megatron", "--precision", "fp8", "--recompute", "selective",
              "--recompute-modules", "moe_act,layernorm", "--grad-reduce-in-bf16", "--fp8-param-gather",
              "--out", str(plan_path))
    assert r.code == 0, r.stderr
    plan = json.loads(plan_path.read_text())
    assert plan["parallel"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert plan["training"]["grad_reduce_in_bf16"] and plan["training"]["fp8_param_gather"]
    assert gplan("validate", str(plan_path)).code == 0
    out = tmp_path / "megatron"
    assert gplan("export", str(plan_path), "--to", "megatron", "-o", str(out)).code == 0
    text = (out / "megatron_pretrain_gpt.sh").read_text()
    args = megatron_rules.validate(script_args(text, "MEGATRON_ARGS"), plan["parallel"]["dp"] * plan["parallel"]["tp"]
                                   * plan["parallel"]["pp"] * plan["parallel"]["cp"], script_env(text), device_arch=9)
    assert args.recompute_granularity == "selective" and args.recompute_modules == ["moe_act", "layernorm"]
    assert args.grad_reduce_in_bf16 and args.fp8_param_gather
    back = gplan("estimate", "qwen3-30b-a3b", "--from", str(out / "megatron_pretrain_gpt.sh"), "--cluster", "dgx-h100",
                 "--json").json()
    assert back["parallel"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)
    assert back["memory_bytes_per_device_max"] == pytest.approx(plan["prediction"]["memory_bytes_per_device_max"],
                                                                rel=1e-6)


def test_an_offloading_estimate_is_exported_as_megatron_offloads_and_read_back(gplan, tmp_path):
    base = ["llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--gbs", "64", "--target", "megatron"]
    with_offload = gplan("estimate", *base, "--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "1", "--offload-layers",
                         "8", "--json").json()
    without = gplan("estimate", *base, "--tp", "1", "--pp", "1", "--zero", "1", "--mbs", "1", "--recompute", "none",
                    "--json").json()
    assert with_offload["parallel"]["offload_layers"] == 8 and "offload_layers" not in without["parallel"]
    assert with_offload["memory_bytes_per_device_max"] < without["memory_bytes_per_device_max"]
    assert with_offload["step_time_s"] >= without["step_time_s"]  # the host link may show, never hurry
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *base, "--tp", "1", "--pp", "1", "--recompute", "none", "--out", str(plan_path)).code == 0
    data = json.loads(plan_path.read_text())
    assert "offload_layers" not in data["parallel"]  # never searched: written only where set
    # a plan that offloads, written as Megatron runs it and read back by --from
    data["parallel"] = {**data["parallel"], "offload_layers": 8}
    from gplan.plan import Plan, write_plan
    from gplan.planner.build import repredict

    edited = Plan.model_validate({k: v for k, v in data.items() if k != "digest"} | {"digest": data["digest"]})
    edited = edited.model_copy(update={"prediction": repredict(edited)})
    write_plan(edited, plan_path)
    out = tmp_path / "megatron"
    r = gplan("export", str(plan_path), "--to", "megatron", "-o", str(out))
    assert r.code == 0, r.stderr
    text = (out / "megatron_pretrain_gpt.sh").read_text()
    args = megatron_rules.validate(script_args(text, "MEGATRON_ARGS"), 8, script_env(text), device_arch=9)
    assert args.cpu_offloading and args.cpu_offloading_num_layers == 8 and args.recompute_granularity is None
    back = gplan("estimate", "llama3-8b", "--from", str(out / "megatron_pretrain_gpt.sh"), "--cluster", "dgx-h100",
                 "--json").json()
    assert back["parallel"]["offload_layers"] == 8
    assert back["step_time_s"] == pytest.approx(edited.prediction.step_time_s, rel=1e-6)
    # offloading beside recomputed layers is not a plan Megatron runs: the plan check says so
    data["stages"][0]["layers"] = [{**data["stages"][0]["layers"][0], "recompute": "full"}]
    plan_path.write_text(json.dumps(data))
    r = gplan("validate", str(plan_path))
    assert r.code == 3 and "offloaded" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--recompute-modules", "attention"], "unknown recompute module 'attention'"),
    (["--target", "torchtitan", "--recompute-modules", "moe_act"], "cannot recompute the module moe_act"),
    (["--target", "megatron", "--recompute-modules", "mla_up_proj"], "qwen3-30b-a3b has none"),
    (["--target", "torch", "--grad-reduce-in-bf16"], "capability grad_reduce_in_bf16"),
    (["--target", "megatron", "--fp8-param-gather"], "bf16 has none"),
    # torchtitan's per-operator policy: not Megatron's, and a policy over the whole block, alone
    (["--target", "megatron", "--recompute-modules", "op"], "cannot recompute the module op"),
    (["--target", "torchtitan", "--recompute-modules", "op,layernorm"], "op alone"),
])
def test_bad_recompute_and_memory_options_exit_3_with_a_hint(gplan, tmp_path, args, words):
    for command in ("search", "estimate"):
        r = gplan(command, *MOE, *args, *(["--out", str(tmp_path / "p.json")] if command == "search" else []))
        assert r.code == 3, (command, r.stderr)
        assert words in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "p.json").exists()


def test_torchtitans_per_op_policy_is_searched_exported_and_read_back_at_the_same_price(gplan, tmp_path):
    """A torchtitan search offers its own selective recompute (the module op, not the attention core it lacks);
    the export's config function sets SelectiveAC, and its job config read back by --from prices the same."""
    plan_path, out = tmp_path / "plan.json", tmp_path / "titan"
    base = ["llama2-70b", "--cluster", "dgx-a100-80g", "--devices", "64", "--gbs", "64", "--target", "torchtitan"]
    assert gplan("search", *base, "--recompute", "selective", "--pp", "1", "--out", str(plan_path)).code == 0
    plan = json.loads(plan_path.read_text())
    assert plan["parallel"]["recompute_modules"] == ["op"]
    assert {c["recompute"] for s in plan["stages"] for c in s["layers"]} == {"selective"}
    assert gplan("export", str(plan_path), "--to", "torchtitan", "-o", str(out)).code == 0
    assert "ACTIVATION_CHECKPOINT = 'selective'" in (out / "gplan_torchtitan.py").read_text()
    toml = tmp_path / "job.toml"
    p = plan["parallel"]
    toml.write_text(f"""[training]
local_batch_size = {p["mbs"]}
global_batch_size = {plan["training"]["gbs"]}
seq_len = {plan["training"]["seq_length"]}
[parallelism]
data_parallel_shard_degree = {p["dp"]}
tensor_parallel_degree = {p["tp"]}
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
""")
    back = gplan("estimate", "llama2-70b", "--from", str(toml), "--cluster", "dgx-a100-80g", "--devices", "64",
                 "--json").json()
    assert back["parallel"]["recompute_modules"] == ["op"]
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)
