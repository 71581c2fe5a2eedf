"""Megatron's engine switches — the MoE all-to-all overlap and CUDA graphs, beside bf16 gradients — from the
command line to the export and back: searched, written as Megatron-LM's flags (checked by megatron_rules.py,
Megatron-LM's own rules), read back by `--from` at the same price; another engine's export or worker runs
without them and says so; an engine without them, or a model without experts, exits 3 with a hint."""

from __future__ import annotations

import json
import re

import pytest

import megatron_rules
from test_exporters import script_args, script_env

MOE = ["qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "16", "--gbs", "256", "--seq-length", "4096"]
DEEPSEEK = ["deepseek-v3", "--cluster", "dgx-h100", "--devices", "256", "--target", "megatron"]


def _exported(gplan, plan_path, out):
    assert gplan("export", str(plan_path), "--to", "megatron", "-o", str(out)).code == 0
    plan = json.loads(plan_path.read_text())
    text = (out / "megatron_pretrain_gpt.sh").read_text()
    world = plan["parallel"]["dp"] * plan["parallel"]["tp"] * plan["parallel"]["pp"] * plan["parallel"]["cp"]
    return plan, megatron_rules.validate(script_args(text, "MEGATRON_ARGS"), world, script_env(text), device_arch=9)


def test_an_overlapped_graphed_search_is_exported_as_megatron_runs_it_and_read_back(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    r = gplan("search", *MOE, "--target", "megatron", "--precision", "fp8", "--moe-a2a-overlap",
              "--cuda-graphs", "moe_router", "--out", str(plan_path))
    assert r.code == 0, r.stderr
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert plan["training"]["moe_a2a_overlap"] and plan["training"]["cuda_graphs"] == "moe_router"
    c = plan["parallel"]
    assert c["ep"] > 1 and (c["pp"] == 1 or c["vpp"] > 1)  # the overlap's own rules, kept by the search
    assert args.overlap_moe_expert_parallel_comm
    assert args.cuda_graph_impl == "transformer_engine" and "moe_router" in args.cuda_graph_scope
    back = gplan("estimate", "qwen3-30b-a3b", "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_a_full_iteration_graph_is_cheaper_and_exported_with_megatrons_nan_check_off(gplan, tmp_path):
    base = [*MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--ep", "8", "--mbs", "1", "--recompute", "none",
            "--zero", "1"]
    plain = gplan("estimate", *base, "--json").json()
    graphed = gplan("estimate", *base, "--cuda-graphs", "full_iteration", "--json").json()
    assert graphed["step_time_s"] < plain["step_time_s"]  # no host time on the MoE layers
    assert graphed["memory_bytes_per_device_max"] == plain["memory_bytes_per_device_max"]
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--cuda-graphs", "full_iteration",
                 "--out", str(plan_path)).code == 0
    _, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert args.cuda_graph_impl == "local" and args.cuda_graph_scope == ["full_iteration"]
    assert args.no_check_for_nan_in_loss_and_grad


@pytest.mark.parametrize("argv, says, hint", [
    ([*MOE, "--target", "torchtitan", "--cuda-graphs", "moe_router"], "capability cuda_graphs", "--target megatron"),
    # torchtitan 0.3 captures the whole step, never with pipeline stages or its host-synced expert exchange
    ([*MOE, "--target", "torchtitan", "--cuda-graphs", "full_iteration", "--ep", "8"], "with ep=8",
     "--training.disable_cuda_graphs"),
    ([*MOE, "--target", "torchtitan", "--cuda-graphs", "full_iteration", "--ep", "1", "--pp", "2"], "with pp=2",
     "use pp=1"),
    ([*MOE, "--target", "torchtitan", "--moe-a2a-overlap"], "capability moe_a2a_overlap", "--target megatron"),
    (["llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--target", "megatron", "--moe-a2a-overlap"],
     "has no experts", "leave --moe-a2a-overlap out"),
    ([*MOE, "--target", "megatron", "--cuda-graphs", "layers"], "--cuda-graphs", "gplan --help"),
    ([*MOE, "--target", "megatron", "--moe-a2a-overlap", "--ep", "1"], "ep is 1", "leave --moe-a2a-overlap out"),
    ([*MOE, "--target", "torchtitan", "--legacy-grouped-gemm"], "capability legacy_grouped_gemm", "--target megatron"),
    (["llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--target", "megatron", "--legacy-grouped-gemm"],
     "has no experts", "leave --legacy-grouped-gemm out"),
    ([*MOE, "--target", "megatron", "--adam-moments", "bf16"], "--adam-moments bf16", "add --precision-aware-optimizer"),
    ([*MOE, "--target", "megatron", "--master-weights", "fp16"], "--master-weights fp16", "add --precision-aware-optimizer"),
    ([*MOE, "--target", "megatron", "--precision-aware-optimizer", "--zero", "0"], "runs on the distributed optimizer",
     "use zero ≥ 1"),
    ([*MOE, "--target", "torchtitan", "--precision-aware-optimizer"], "capability precision_aware_optimizer",
     "--target megatron"),
    ([*MOE, "--target", "megatron", "--precision-aware-optimizer", "--adam-moments", "int8"], "--adam-moments",
     "gplan --help"),
    ([*MOE, "--target", "megatron", "--optimizer-offload", "1"], "through its precision-aware optimizer",
     "add --precision-aware-optimizer"),
    ([*MOE, "--target", "megatron", "--precision", "fp8", "--fp8-param-gather", "--precision-aware-optimizer",
      "--optimizer-offload", "1"], "delayed scaling", "leave --fp8-param-gather out"),
    ([*MOE, "--target", "megatron", "--optimizer-offload-overlap"], "nothing is offloaded", "add --optimizer-offload"),
    ([*MOE, "--target", "megatron", "--precision-aware-optimizer", "--optimizer-offload", "1.5"], "--optimizer-offload",
     "gplan --help"),
    (["qwen3-30b-a3b", "--cluster", "dgx-v100", "--devices", "16", "--precision", "fp16", "--target", "megatron",
      "--ep", "1", "--precision-aware-optimizer", "--optimizer-offload", "1"], "no host link or host memory bandwidth",
     "add host_link_GBps and host_memory_GBps"),
    ([*MOE, "--target", "megatron", "--moe-shared-expert-overlap"], "has none", "leave --moe-shared-expert-overlap out"),
    ([*DEEPSEEK, "--moe-shared-expert-overlap", "--moe-dispatcher", "flex"], "alltoall token dispatcher",
     "use --moe-dispatcher alltoall"),
    ([*DEEPSEEK, "--moe-shared-expert-overlap", "--moe-a2a-overlap"], "cannot run with --moe-a2a-overlap",
     "leave one of them out"),
    ([*DEEPSEEK, "--moe-shared-expert-overlap", "--recompute", "selective", "--recompute-modules", "shared_experts"],
     "cannot replay the shared experts", "leave --moe-shared-expert-overlap out"),
    ([*MOE, "--target", "torchtitan", "--moe-shared-expert-overlap"], "capability moe_shared_expert_overlap",
     "--target megatron"),
])
def test_bad_engine_options_exit_3_with_a_hint(gplan, argv, says, hint):
    r = gplan("estimate", *argv)
    assert r.code == 3, r.stderr
    assert says in r.stderr and hint in r.stderr
    assert "Traceback" not in r.stderr


def test_an_export_to_an_engine_without_the_options_runs_and_reprices_without_them(gplan, tmp_path):
    """torchtitan captures no CUDA graphs with expert parallel (its exchange syncs with the host): its export of an
    ep > 1 plan says it runs without them and re-prices the plan so (spec.targets.as_engine_runs) — the host time
    comes back, so it is slower. Its bf16 gradient
    reduction is FSDP's reduce dtype on torchtitan main, kept there; 0.3.0 takes float32 only, and says so."""
    plan_path = tmp_path / "plan.json"
    # full recompute: torchtitan keeps more of an MoE layer than Megatron does (its unfused SwiGLU, its fp32 routing
    # weights), so a plan recomputing nothing would be refused for torchtitan's memory before its options are
    assert gplan("search", *MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--ep", "8", "--recompute", "full",
                 "--cuda-graphs", "full_iteration", "--grad-reduce-in-bf16", "--out", str(plan_path)).code == 0
    refused = gplan("export", str(plan_path), "--to", "torchtitan", "-o", str(tmp_path / "tt"))
    assert refused.code == 3 and "float32 only" in refused.stderr
    r = gplan("export", str(plan_path), "--to", "torchtitan", "--target-version", "main", "-o", str(tmp_path / "tt"))
    assert r.code == 0, r.stderr
    note = next(line for line in " ".join(r.stderr.split()).split("note: ") if "re-priced as torchtitan" in line)
    assert "without --cuda-graphs" in note and "--grad-reduce-in-bf16" not in note
    # and written so: torchtitan 0.3 would refuse its default graphs with ep's host-synced exchange
    assert "--training.disable_cuda_graphs" in (tmp_path / "tt" / "torchtitan_train.sh").read_text()
    change = float(note.split("s/step (")[1].split("%")[0])
    assert change > 0


@pytest.mark.parametrize("impl, scope, graphs", [
    (None, None, "none"), ("none", ["full_iteration"], "none"),
    ("local", ["full_iteration"], "full_iteration"),                    # a log prints the scope as a list
    ("transformer_engine", ["attn", "moe_router", "moe_preprocess"], "moe_router"),
    ("transformer_engine", [], "moe_router"),                           # no scope: every layer whole
    ("transformer_engine", ["attn"], "none"),                           # dense parts only: no MoE host time saved
    ("transformer_engine", "moe_router moe_preprocess", "moe_router"),
])
def test_megatrons_cuda_graph_flags_read_as_the_capture_gplan_prices(impl, scope, graphs):
    from gplan.engines.megatron.launch import cuda_graphs_of

    assert cuda_graphs_of(impl, scope) == graphs


def test_a_launch_on_a_worker_without_the_switches_says_it_runs_without_them(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--target", "megatron", "--tp", "1,2",
                 "--pp", "1", "--grad-reduce-in-bf16", "--out", str(plan_path)).code == 0
    r = gplan("launch", str(plan_path), "--dry-run")
    assert r.code == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "priced with --grad-reduce-in-bf16 (megatron's); the torch worker runs without" in said


def test_megatrons_legacy_grouped_gemm_pays_no_launch_per_local_expert():
    """Megatron-core's legacy GroupedMLP runs each matrix of all local experts as one grouped_gemm kernel: the
    dispatcher's sync is kept, Transformer Engine's launch per local expert is not paid."""
    from gplan.cost_models import experts
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.training import TrainingSpec

    model, config = load_model("qwen3-30b-a3b"), ParallelConfig(dp=8, ep=2)
    te = TrainingSpec(gbs=64, seq_length=4096, engine="megatron")
    legacy = te.model_copy(update={"legacy_grouped_gemm": True})
    assert experts.host_time_s(model, config, legacy) == experts.HOST_SYNC_S["none"]
    assert experts.host_time_s(model, config, te) == pytest.approx(
        experts.HOST_SYNC_S["none"] + experts.EXPERT_LAUNCH_S * 64)


def test_a_legacy_grouped_gemm_plan_exports_megatrons_flag_and_reads_back(gplan, tmp_path):
    """--legacy-grouped-gemm: faster than the same plan with Transformer Engine's grouped linear (64 local
    experts' launches saved), exported as --moe-use-legacy-grouped-gemm (Megatron's parser takes it), read back."""
    import json

    plan_path, out = tmp_path / "plan.json", tmp_path / "meg"
    base = [*MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--ep", "2", "--json"]
    legacy = gplan("search", *base, "--legacy-grouped-gemm", "--out", str(plan_path))
    assert legacy.code == 0, legacy.stderr
    assert gplan("search", *base, "--out", str(tmp_path / "te.json")).code == 0
    step = json.loads(plan_path.read_text())["prediction"]["step_time_s"]
    assert step < json.loads((tmp_path / "te.json").read_text())["prediction"]["step_time_s"]
    _, args = _exported(gplan, plan_path, out)
    assert args.moe_use_legacy_grouped_gemm and args.moe_grouped_gemm
    back = gplan("estimate", "--from", str(out / "megatron_pretrain_gpt.sh"), "--cluster", "dgx-h100", "--json").json()
    assert back["engine_options"]["legacy_grouped_gemm"] is True
    assert back["step_time_s"] == pytest.approx(step, rel=1e-6)


def test_a_precision_aware_optimizer_search_is_exported_as_megatron_runs_it_and_read_back(gplan, tmp_path):
    """Megatron's precision-aware optimizer with bf16 moments: searched on the distributed optimizer only (its
    rule), written as Megatron-LM's flags (checked by megatron_rules.py) and read back by `--from` at the same
    price; the states it keeps are smaller than fp32 Adam's, the step the same or faster."""
    plan_path = tmp_path / "plan.json"
    r = gplan("search", *MOE, "--target", "megatron", "--precision-aware-optimizer", "--adam-moments", "bf16",
              "--out", str(plan_path))
    assert r.code == 0, r.stderr
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    t = plan["training"]
    assert t["precision_aware_optimizer"] and t["adam_moments"] == "bf16" and plan["parallel"]["zero"] >= 1
    assert args.use_precision_aware_optimizer and args.exp_avg_dtype == args.exp_avg_sq_dtype == "bf16"
    assert args.main_params_dtype == "fp32"
    back = gplan("estimate", "qwen3-30b-a3b", "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)
    assert back["memory_bytes_per_device_max"] == pytest.approx(plan["prediction"]["memory_bytes_per_device_max"])
    script = tmp_path / "megatron" / "megatron_pretrain_gpt.sh"
    plain = tmp_path / "fp32_adam.sh"  # the same launch without the optimizer's flags: fp32 Adam
    plain.write_text(re.sub(r"\s*--(use-precision-aware-optimizer|main-params-dtype \w+|exp-avg-dtype \w+|"
                            r"exp-avg-sq-dtype \w+)\b", "", script.read_text()))
    assert "precision-aware" not in plain.read_text() and "exp-avg" not in plain.read_text()
    same = gplan("estimate", "qwen3-30b-a3b", "--from", str(plain), "--cluster", "dgx-h100", "--json").json()
    assert same["memory_bytes_per_device_max"] > back["memory_bytes_per_device_max"]
    assert same["step_time_s"] >= back["step_time_s"]


def test_an_offloaded_optimizer_is_exported_as_megatron_runs_it_and_read_back(gplan, tmp_path):
    """Megatron's optimizer on the host (--optimizer-cpu-offload, whole, its copies overlapped): its states leave
    the device's memory and the step pays the host's Adam and the copies; written as Megatron-LM's flags (its
    rules: the precision-aware optimizer, no FP8 parameters) and read back at the same price."""
    base = [*MOE, "--target", "megatron", "--tp", "1", "--pp", "1", "--ep", "8", "--mbs", "1", "--recompute", "full",
            "--zero", "1", "--precision-aware-optimizer"]
    kept = gplan("estimate", *base, "--json").json()
    offloaded = gplan("estimate", *base, "--optimizer-offload", "1.0", "--optimizer-offload-overlap", "--json").json()
    assert offloaded["memory_bytes_per_device_max"] < kept["memory_bytes_per_device_max"]
    assert offloaded["step_time_s"] > kept["step_time_s"]
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *MOE, "--target", "megatron", "--precision-aware-optimizer", "--optimizer-offload", "1.0",
                 "--optimizer-offload-overlap", "--out", str(plan_path)).code == 0
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert args.optimizer_cpu_offload and args.optimizer_offload_fraction == 1.0 and args.overlap_cpu_optimizer_d2h_h2d
    back = gplan("estimate", "qwen3-30b-a3b", "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["engine_options"]["optimizer_offload"] == 1.0
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_the_shared_experts_hide_part_of_the_exchange_and_are_exported_and_read_back(gplan, tmp_path):
    """--moe-shared-expert-overlap: DeepSeek-V3's shared expert runs beside the dispatch and combine, so a step
    exposes less of the exchange and nothing else changes; exported as Megatron's flag (its rules: the alltoall
    dispatcher) and read back at the same price."""
    layout = ["--tp", "1", "--pp", "8", "--ep", "32", "--zero", "1", "--mbs", "1", "--recompute", "selective",
              "--recompute-modules", "mla_up_proj,mlp"]
    plain = gplan("estimate", *DEEPSEEK, *layout, "--json").json()
    shared = gplan("estimate", *DEEPSEEK, *layout, "--moe-shared-expert-overlap", "--json").json()
    assert 0 < plain["breakdown"]["ep_comm"] - shared["breakdown"]["ep_comm"] < plain["breakdown"]["ep_comm"]
    assert shared["breakdown"]["compute"] == pytest.approx(plain["breakdown"]["compute"])
    assert shared["step_time_s"] < plain["step_time_s"]
    assert shared["memory_bytes_per_device_max"] == plain["memory_bytes_per_device_max"]
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *DEEPSEEK, *layout[:6], "--moe-shared-expert-overlap", "--out", str(plan_path)).code == 0
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert args.moe_shared_expert_overlap and args.moe_token_dispatcher_type == "alltoall"
    back = gplan("estimate", "deepseek-v3", "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["engine_options"]["moe_shared_expert_overlap"]
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_a_capacity_padded_model_is_exported_as_megatron_runs_it_and_read_back(gplan, tmp_path):
    """A model that drops tokens over a capacity, its experts padded to it: priced at the capacity, written as
    Megatron-core's flags (its rule: the padding needs the capacity) and read back onto the model at the same
    price; the padding without a capacity, or with DeepEP's flex dispatcher, exits 3."""
    import yaml

    from gplan.profiles.catalogue import load_model

    spec = load_model("mixtral-8x7b").model_dump(mode="json", exclude_defaults=True)
    model_file = tmp_path / "mixtral_capacity.yaml"
    model_file.write_text(yaml.safe_dump({**spec, "name": "mixtral-capacity", "capacity_factor": 1.25}))
    run = [str(model_file), "--cluster", "dgx-h100", "--devices", "16", "--gbs", "256", "--target", "megatron"]
    layout = ["--tp", "1", "--pp", "2", "--ep", "8", "--zero", "1", "--mbs", "1", "--recompute", "full"]
    dropless = gplan("estimate", *run, *layout, "--json").json()
    padded = gplan("estimate", *run, *layout, "--moe-pad-to-capacity", "--json").json()
    assert padded["step_time_s"] > dropless["step_time_s"]  # every expert computes 1.25× the balanced share
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *run, *layout[:6], "--moe-pad-to-capacity", "--out", str(plan_path)).code == 0
    plan, args = _exported(gplan, plan_path, tmp_path / "megatron")
    assert args.moe_expert_capacity_factor == 1.25 and args.moe_pad_expert_input_to_capacity
    back = gplan("estimate", str(model_file), "--from", str(tmp_path / "megatron" / "megatron_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["engine_options"]["moe_pad_to_capacity"]
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)
    for argv, says in ((["mixtral-8x7b", *run[1:], "--moe-pad-to-capacity"], "sets no capacity_factor"),
                       ([*run, "--moe-pad-to-capacity", "--moe-dispatcher", "flex"], "DeepEP backend does not pad")):
        r = gplan("estimate", *argv)
        assert r.code == 3 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("ep, runs", [("8", "none"), ("1", "full_iteration")])
def test_a_torchtitan_search_asked_for_graphs_prices_each_layout_as_torchtitan_runs_it(gplan, tmp_path, ep, runs):
    """--cuda-graphs full_iteration no longer limits a torchtitan search to the layouts it can capture: an ep-8 layout
    (which 0.3 runs without its graphs, its all-to-all reading the splits back) is searched and priced without them
    — the step a search without graphs gives it — and its plan written so, which reads back; an ep-1 layout keeps
    them and is faster for it."""
    base = ["search", *MOE, "--target", "torchtitan", "--ep", ep]
    asked, plain = tmp_path / "asked.json", tmp_path / "plain.json"
    assert gplan(*base, "--cuda-graphs", "full_iteration", "--out", str(asked)).code == 0
    assert gplan(*base, "--out", str(plain)).code == 0
    graphed, ungraphed = json.loads(asked.read_text()), json.loads(plain.read_text())
    assert graphed["training"]["cuda_graphs"] == runs
    step, without = graphed["prediction"]["step_time_s"], ungraphed["prediction"]["step_time_s"]
    assert step == pytest.approx(without) if runs == "none" else step < without
    assert gplan("estimate", str(asked)).code == 0  # the plan, checked as every reader checks it
