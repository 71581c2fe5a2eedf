"""`gplan estimate`, `models`, `hardware`, `validate`: JSON on stdout, text on stderr, exit codes."""

from __future__ import annotations

import pytest

from gplan.cost_models.compute import model_flops_per_step
from gplan.profiles.catalogue import load_model
from gplan.spec.training import TrainingSpec

GPT3 = ["estimate", "gpt3-175b", "--cluster", "dgx-a100-80g", "--devices", "1024", "--tp", "8", "--pp", "8",
        "--dp", "16", "--mbs", "1", "--gbs", "1536", "--recompute", "full"]


def test_estimate_json_is_the_prediction_block(gplan):
    r = gplan(*GPT3, "--json")
    assert r.code == 0 and r.stderr == ""
    p = r.json()
    for key in ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_device", "mfu",
                "memory_bytes_per_device_max", "fits", "breakdown"):
        assert key in p
    assert set(p["breakdown"]) == {"compute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble", "optimizer",
                                  "overhead"}
    assert sum(p["breakdown"].values()) == pytest.approx(p["step_time_s"])
    flops = model_flops_per_step(load_model("gpt3-175b"), TrainingSpec(gbs=1536, seq_length=2048))
    assert p["model_tflops_per_device"] == pytest.approx(flops / p["step_time_s"] / 1024 / 1e12)
    assert p["tokens_per_s"] == pytest.approx(1536 * 2048 / p["step_time_s"])
    assert p["fits"] and len(p["stages"]) == 8


def test_estimate_human_output_goes_to_stderr(gplan):
    r = gplan(*GPT3)
    assert r.code == 0 and r.stdout == ""
    assert "step time" in r.stderr and "MFU" in r.stderr


def test_more_recompute_trades_time_for_memory(gplan):
    base = ["estimate", "llama3-8b", "--devices", "8", "--dp", "8", "--gbs", "64"]
    none, full = gplan(*base, "--json").json(), gplan(*base, "--recompute", "full", "--json").json()
    assert full["step_time_s"] > none["step_time_s"]
    assert full["memory_bytes_per_device_max"] < none["memory_bytes_per_device_max"]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_estimate_states_the_recompute_it_priced(gplan, recompute):
    """The configuration printed and in --json says the recompute its layers were priced with (it said
    rc=none beside a priced full recompute)."""
    args = ["estimate", "llama3-8b", "--devices", "8", "--gbs", "64", "--recompute", recompute]
    assert gplan(*args, "--json").json()["parallel"]["recompute"] == recompute
    assert f"rc={recompute} " in gplan(*args).stderr


BAD = [
    (["--devices", "1024", "--tp", "8", "--pp", "8", "--dp", "8"], "≠ 1024 devices"),
    (["--devices", "1024", "--tp", "0", "--pp", "8", "--dp", "16"], "--tp"),
    (["--devices", "1024", "--tp", "-8", "--pp", "8", "--dp", "16"], "--tp"),
    (["--devices", "896", "--tp", "7", "--pp", "8", "--dp", "16"], "does not divide the model's heads"),
    (["--devices", "1024", "--hardware", "a100-90g", "--tp", "8", "--pp", "8", "--dp", "16"], "unknown hardware"),
    (["--devices", "1024", "--cluster", "dgx-a100-8g", "--tp", "8", "--pp", "8", "--dp", "16"], "unknown cluster"),
    (["--devices", "1024", "--tp", "8", "--pp", "8", "--dp", "16", "--gbs", "100"], "not a multiple of mbs·dp"),
    (["--devices", "1024", "--tp", "8", "--pp", "8", "--dp", "16", "--zero", "4"], "--zero"),
    (["--devices", "1024", "--tp", "8", "--pp", "8", "--dp", "16", "--recompute", "some"], "--recompute"),
    (["--devices", "64", "--hardware", "v100-32g", "--dp", "64", "--precision", "bf16"], "does not support bf16"),
]


@pytest.mark.parametrize("args,fragment", BAD)
def test_bad_input_is_one_line_with_hint_and_exit_3(gplan, args, fragment):
    r = gplan("estimate", "gpt3-175b", *args, "--json")
    assert r.code == 3, r.stderr
    error = r.json()["error"]  # --json: the failure as one document on stdout, the same line on stderr
    assert error["exit_code"] == 3 and fragment in error["message"] and error["hint"]
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and fragment in lines[0]
    assert lines[1].startswith("hint:") and len(lines) == 2
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content,fragment", [
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n", "missing required key"),
    ("num_layres: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 9\n", "unknown key"),
    ("num_layers: {{\n", "malformed YAML"),
])
def test_bad_model_file_exit_3(gplan, tmp_path, content, fragment):
    path = tmp_path / "model.yaml"
    path.write_text(content)
    r = gplan("estimate", str(path), "--devices", "8", "--dp", "8")
    assert r.code == 3 and fragment in r.stderr


def test_unsupported_hf_config_exit_3(gplan, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "t5", "d_model": 512}')
    r = gplan("estimate", str(path), "--devices", "8", "--dp", "8")
    assert r.code == 3 and "unsupported Hugging Face architecture" in r.stderr


def test_malformed_json_exit_3(gplan, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama",')
    assert gplan("estimate", str(path), "--devices", "8", "--dp", "8").code == 3


def test_contradictory_flags_are_usage_errors(gplan):
    r = gplan("estimate", "llama3-8b", "--devices", "8", "--dp", "8", "--cluster", "dgx-h100", "--hardware", "h100-sxm")
    assert r.code == 2 and "exclusive" in r.stderr


def test_unknown_flag_is_usage_error(gplan):
    assert gplan("estimate", "llama3-8b", "--bogus").code == 2


def test_models_and_hardware_json(gplan):
    models = gplan("models", "--json").json()
    assert {"gpt3-175b", "llama3-405b", "transformer-base", "gpt-1t"} <= {m["name"] for m in models}
    hw = gplan("hardware", "--json").json()
    assert {d["name"] for d in hw["hardware"]} >= {"a100-40g", "a100-80g", "h100-sxm", "h200", "v100-32g",
                                                  "ascend-910a", "ascend-910b", "cpu"}
    assert {"dgx-a100-80g", "dgx-h100", "dgx-h200", "atlas-800-910b", "dgx-v100", "local-cpu"} <= set(hw["clusters"])


def test_validate_model_and_cluster(gplan, tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 100\n")
    r = gplan("validate", str(model), "--json")
    assert r.code == 0 and r.json()["kind"] == "model"
    cluster = tmp_path / "c.yaml"
    cluster.write_text("node_groups:\n  - {hardware: h100-sxm, nodes: 2, devices_per_node: 8, "
                       "intra_node: {bandwidth_GBps: 450}, inter_node: {bandwidth_GBps: 50}}\n")
    r = gplan("validate", str(cluster), "--json")
    assert r.code == 0 and r.json()["kind"] == "cluster"
    cluster.write_text("node_groups:\n  - {hardware: h100-sxm, nodes: 0, devices_per_node: 8, "
                       "intra_node: {bandwidth_GBps: 450}, inter_node: {bandwidth_GBps: 50}}\n")
    assert gplan("validate", str(cluster)).code == 3


def test_internal_errors_hide_the_traceback(gplan, monkeypatch):
    import gplan.cost_models.step as step

    def boom(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(step, "predict", boom)
    r = gplan("estimate", "llama3-8b", "--devices", "8", "--dp", "8")
    assert r.code == 1 and "internal error" in r.stderr and "Traceback" not in r.stderr


def test_estimate_takes_the_stage_split_it_is_given(gplan):
    """--stages: DeepSeek-V3's published uneven interleaved layout, priced as written; a split that does
    not cover the layers, or leaves a chunk empty, is one line and a hint."""
    args = ["estimate", "deepseek-v3", "--cluster", "dgx-h100", "--devices", "1024", "--dp", "64", "--tp", "2", "--sp",
            "--pp", "8", "--vpp", "4", "--ep", "64", "--zero", "1", "--gbs", "8192", "--seq-length", "4096"]
    r = gplan(*args, "--stages", "7,8,8,8,8,8,8,6", "--json")
    assert r.code == 0, r.stderr
    assert [s["num_layers"] for s in r.json()["stages"]] == [7, 8, 8, 8, 8, 8, 8, 6]
    for bad in ("7,8,8,8,8,8,8", "2,8,8,8,8,8,8,11"):
        r = gplan(*args, "--stages", bad)
        assert r.code == 3 and "--stages" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr


META_405B = ["--cluster", "dgx-h100", "--devices", "2048", "--dp", "16", "--tp", "8", "--sp", "--pp", "16", "--vpp", "8",
             "--gbs", "2048"]


def test_estimate_refuses_what_its_named_target_would_not_run(gplan):
    """Meta's Llama 3.1 405B layout (126 layers over pp 16 × vpp 8: chunks of unequal size) named for torch
    is refused with torch's rule, once, and the targets that would run it; for Megatron-LM it is priced."""
    r = gplan("estimate", "llama3-405b", *META_405B, "--target", "torch", "--json")
    assert r.code == 3
    error = r.json()["error"]
    assert error["message"].count("equal size") == 1 and "--target megatron" in error["hint"]  # one cause, said once
    runs = gplan("estimate", "llama3-405b", *META_405B, "--target", "megatron", "--json")
    assert runs.code == 0 and runs.json()["target_runs_it"] and runs.json()["target_refusals"] == []
    assert runs.json()["step_time_s"] > 0 and runs.json()["stages"][0]["num_layers"] == 7
    assert "would not run" not in gplan("estimate", "llama3-405b", *META_405B, "--target", "megatron").stderr


def test_compare_names_the_configurations_its_target_would_not_run(gplan):
    r = gplan("compare", "llama3-405b", "--cluster", "dgx-h100", "--devices", "2048", "--gbs", "2048", "--target", "torch",
              "--config", "tp=8,pp=16,vpp=8", "--config", "tp=8,pp=16,vpp=1", "--json")
    assert r.code == 0, r.stderr
    by_name = {e["name"]: e for e in r.json()}
    assert by_name["tp=8,pp=16,vpp=1"]["target_refusals"] == []
    assert "equal size" in by_name["tp=8,pp=16,vpp=8"]["target_refusals"][0]
    human = gplan("compare", "llama3-405b", "--cluster", "dgx-h100", "--devices", "2048", "--gbs", "2048", "--target",
                  "torch", "--config", "tp=8,pp=16,vpp=8", "--config", "tp=8,pp=16,vpp=1")
    assert "note: torch would not run 'tp=8,pp=16,vpp=8'" in human.stderr
    assert "'tp=8,pp=16,vpp=1' as written" not in human.stderr


SEARCHES = [
    ["llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512"],
    ["llama3-8b", "--devices", "8"],
    ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"],
    ["gpt3-175b", "--cluster", "dgx-a100-80g", "--devices", "256", "--gbs", "512"],
]


@pytest.mark.parametrize("args", SEARCHES, ids=lambda a: f"{a[0]}-{a[a.index('--devices') + 1]}")
def test_a_search_rows_degrees_reprice_to_the_row(gplan, tmp_path, args):
    """Copy a row's columns (the degrees, mbs, zero, the recompute modules) into `estimate`: what the row does
    not show (the split,
    the per-layer recompute, sp) is chosen as the search chose it, so the numbers are the row's — for each
    of the top 5."""
    rows = gplan("search", *args, "--top", "5", "--out", str(tmp_path / "p.json"), "--json").json()["ranked"]
    assert len(rows) >= 2
    for row in rows:
        c = row["parallel"]
        flags = [f"--{k}={c[k]}" for k in ("dp", "tp", "pp", "vpp", "cp", "mbs", "zero")]
        if c["ep"] > 1 or c["etp"] > 1:
            flags += [f"--ep={c['ep']}", f"--etp={c['etp']}"]
        if "recompute_modules" in c:  # shown in the row's recompute column, e.g. selective(moe_act)
            flags += [f"--recompute-modules={','.join(c['recompute_modules']) or 'none'}"]
        got = gplan("estimate", *args, *flags, "--json")
        assert got.code == 0, got.stderr
        priced, searched = got.json(), row["prediction"]
        assert priced["step_time_s"] == pytest.approx(searched["step_time_s"], rel=1e-9)
        assert priced["memory_bytes_per_device_max"] == pytest.approx(searched["memory_bytes_per_device_max"], rel=1e-9)
        assert priced["chosen_by"] == "search" and "split" in priced["chosen"]


def test_estimate_says_what_it_chose(gplan):
    r = gplan("estimate", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--tp", "8", "--pp", "4")
    assert r.code == 0
    line = next(x for x in r.stderr.splitlines() if x.startswith("chosen as gplan search would"))
    for option in ("mbs", "zero", "sp", "recompute", "split"):
        assert f"{option} " in line
    given = gplan("estimate", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--tp", "8",
                  "--pp", "4", "--zero", "0", "--no-sp", "--mbs", "1", "--recompute", "full", "--json").json()
    assert given["parallel"]["zero"] == 0 and given["parallel"]["sp"] is False
    assert not {"zero", "sp", "mbs", "recompute"} & set(given["chosen"])


def test_estimate_of_a_layout_that_cannot_fit_still_prices_it_and_says_so(gplan):
    r = gplan("estimate", "llama3-70b", "--cluster", "dgx-h100", "--devices", "8", "--gbs", "64", "--dp", "8", "--json")
    data = r.json()
    assert r.code == 0 and data["fits"] is False and data["chosen_by"] == "defaults"


def test_recompute_modules_none_is_the_empty_set(gplan):
    """`--recompute-modules none`, as the help offers it: selective layers that recompute nothing."""
    r = gplan("estimate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "1", "--pp", "1",
              "--recompute", "selective", "--recompute-modules", "none", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["parallel"]["recompute_modules"] == []


def test_an_fsdp_ep_layout_its_named_target_cannot_run_is_refused_with_the_engines_rule(gplan):
    """torchtitan's experts follow tp (etp 1 with ep): `--etp 2` with FSDP + EP named for torchtitan is bad
    input — one line naming torchtitan's rule, exit 3, the engine that runs it in the hint; `compare` still
    prices it as a what-if, etp 2 as given (it used to price etp 1 silently)."""
    layout = ["qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "16", "--gbs", "256", "--target", "torchtitan"]
    r = gplan("estimate", *layout, "--dp", "16", "--ep", "4", "--etp", "2", "--zero", "3", "--json")
    assert r.code == 3 and "etp must be 1" in r.json()["error"]["message"]
    human = gplan("estimate", *layout, "--dp", "16", "--ep", "4", "--etp", "2", "--zero", "3")
    assert human.code == 3 and "Traceback" not in human.stderr
    assert "error: torchtitan would not run this configuration" in human.stderr and "etp must be 1 at ep=4" in human.stderr
    assert "hint: --target megatron runs it as written" in human.stderr
    ep_off_the_shards = gplan("estimate", *layout[:4], "24", *layout[5:], "--dp", "24", "--ep", "16", "--zero", "3")
    assert ep_off_the_shards.code == 3 and "does not fold into" in ep_off_the_shards.stderr
    what_if = gplan("compare", *layout, "--config", "dp=16,ep=4,etp=2,zero=3", "--json")
    assert what_if.code == 0, what_if.stderr
    (p,) = what_if.json()
    assert p["configuration"]["ep etp"] == "4 2" and "etp must be 1 at ep=4" in p["target_refusals"][0]
    runs = gplan("estimate", *layout, "--dp", "16", "--ep", "4", "--zero", "3", "--json")
    assert runs.code == 0 and runs.json()["target_runs_it"] and runs.json()["parallel"]["zero"] == 3


@pytest.mark.parametrize("target, cluster, said", [
    ("torchtitan", "dgx-h100", "torchtitan's speed on h100-sxm not fitted on its own runs"),
    ("torchtitan", "dgx-a100-80g", None),  # its A100 rows (S10) fit at 1: fitted, not the prior
    ("megatron", "dgx-h100", None),        # the efficiencies are Megatron-LM's own
    ("llm-foundry", "dgx-h100", None),
])
def test_the_header_says_where_an_engines_speed_is_megatrons_for_lack_of_its_own_runs(gplan, target, cluster, said):
    r = gplan("estimate", "llama3-8b", "--devices", "8", "--cluster", cluster, "--target", target, "--dp", "8",
              "--zero", "3", "--mbs", "1", "--gbs", "64")
    assert r.code == 0, r.stderr
    header = " ".join((r.stdout + r.stderr).split())
    assert (said in header) if said else ("not fitted on its own runs" not in header)
