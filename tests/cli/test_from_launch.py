"""`--from FILE`: a Megatron-LM launch read and priced as Megatron runs it (planner.launch_files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TRAIN_SH = Path(__file__).resolve().parents[1] / "data" / "megatron_llama3_70b_train.sh"
ARGS = ["--cluster", "dgx-h100"]


def test_a_team_script_is_read_with_its_layout_and_its_recipe_left_alone(gplan):
    data = gplan("estimate", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--json").json()
    c = data["parallel"]
    assert (c["dp"], c["tp"], c["pp"], c["sp"], c["mbs"], c["zero"], c["recompute"]) == (2, 8, 4, True, 1, 1, "full")
    assert {"--data-path", "--save", "--lr", "--tokenizer-model"} <= set(data["not_read"])


def test_search_from_a_launch_shows_it_beside_the_best_plan_and_the_gain(gplan, tmp_path):
    out = tmp_path / "plan.json"
    r = gplan("search", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--out", str(out), "--json")
    assert r.code == 0, r.stderr
    versus = r.json()["from"]
    plan = json.loads(out.read_text())
    c = plan["parallel"]
    assert plan["training"]["gbs"] == 512 and plan["training"]["seq_length"] == 8192
    assert c["dp"] * c["tp"] * c["pp"] * c["cp"] == 64 and plan["training"]["engine"] == "megatron"
    assert versus["gain"] >= 0  # the search's best is at least as fast as the launch under the model
    assert versus["gain"] == pytest.approx(plan["prediction"]["tokens_per_s"] / versus["prediction"]["tokens_per_s"] - 1)
    for key, (mine, best) in versus["differences"].items():
        if key == "recompute_modules":  # written only where not Megatron's default
            shown = [",".join(d["parallel"].get(key, ["core_attn"])) or "none" for d in (versus, plan)]
            assert shown == [mine, best]
            continue
        assert str(versus["parallel"][key]) == mine and str(plan["parallel"][key]) == best
    text = gplan("search", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--out", str(out)).stderr
    assert "your launch (megatron_llama3_70b_train.sh)" in text and "tokens/s over your launch" in text


def test_a_launch_without_megatrons_overlap_switches_is_priced_with_that_communication_exposed(gplan, tmp_path):
    """Megatron-LM's --tp-comm-overlap, --overlap-grad-reduce and --overlap-param-gather are off unless passed: a
    tp-8, dp-2 launch without them runs tp's collectives beside its GEMMs and its gradient reduction and parameter
    gather outside the backward and forward, is priced so (and says why), and a search from it keeps its choice —
    the plan, its export and the launch written back run without them, as priced. With the switches the same
    launch is priced overlapped, and says nothing."""
    text = TRAIN_SH.read_text()
    assert not any(flag in text for flag in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"))
    with_them = tmp_path / "with_overlap.sh"
    with_them.write_text(text.replace("--sequence-parallel", "--sequence-parallel --tp-comm-overlap "
                                      "--overlap-grad-reduce --overlap-param-gather"))
    exposed, overlapped = (gplan("estimate", "llama3-70b", "--from", str(p), *ARGS, "--json").json()
                           for p in (TRAIN_SH, with_them))
    assert exposed["breakdown"]["tp_comm"] > 10 * overlapped["breakdown"]["tp_comm"]
    assert exposed["breakdown"]["dp_comm"] > overlapped["breakdown"]["dp_comm"]
    assert exposed["step_time_s"] > overlapped["step_time_s"]
    said = " ".join(gplan("estimate", "llama3-70b", "--from", str(TRAIN_SH), *ARGS).stderr.split())
    assert "priced exposed, as the launch runs them" in said
    assert all(flag in said for flag in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"))
    assert "priced exposed" not in gplan("estimate", "llama3-70b", "--from", str(with_them), *ARGS).stderr
    plan_path, better = tmp_path / "plan.json", tmp_path / "better.sh"
    r = gplan("search", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--tp", "8", "--zero", "1", "--out",
              str(plan_path), "--out-launch", str(better))  # zero 1: Megatron-FSDP would turn the dp overlaps on
    assert r.code == 0, r.stderr
    assert "the best plan keeps your launch's switches, so it too pays exposed" in " ".join(r.stderr.split())
    training = json.loads(plan_path.read_text())["training"]
    assert not (training["tp_comm_overlap"] or training["grad_reduce_overlap"] or training["param_gather_overlap"])
    out = tmp_path / "export"
    assert gplan("export", str(plan_path), "--to", "megatron", "-o", str(out)).code == 0
    for script in (better.read_text(), (out / "megatron_pretrain_gpt.sh").read_text()):
        assert not any(flag in script for flag in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"))


@pytest.mark.parametrize("extra, grad, gather", [
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads", True, False),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params", True, True),
    ("--overlap-grad-reduce", True, False),
])
def test_megatron_fsdp_turns_its_overlaps_on_as_validate_args_does(gplan, tmp_path, extra, grad, gather):
    """Megatron-LM's validate_args turns the gradient reduction's overlap on for Megatron-FSDP's optim_grads and
    both for optim_grads_params, whatever the launch passes: read so, not as the switches' defaults."""
    data = gplan("estimate", "llama3-70b", "--from", str(bad_script(tmp_path, extra)), *ARGS, "--json").json()
    options = data["engine_options"]
    assert (options["grad_reduce_overlap"], options["param_gather_overlap"]) == (grad, gather)


def test_a_batch_ramp_up_is_priced_at_the_batch_every_later_step_runs(gplan, tmp_path):
    """Megatron-LM's own GPT-3 175B example ramps its batch up (--rampup-batch-size 16 16 5859375): it was refused;
    read at its --global-batch-size, the steady state, and the ramp said."""
    plain = gplan("estimate", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--json").json()
    ramped = gplan("estimate", "llama3-70b", "--from", str(bad_script(tmp_path, "--rampup-batch-size 16 16 5859375")),
                   *ARGS, "--json").json()
    assert ramped["step_time_s"] == plain["step_time_s"]
    assert any(note.startswith("(--rampup-batch-size 16 16 5859375: the first 5859375 samples")
               for note in ramped["not_read"])


def test_sequence_parallelism_at_tp_1_is_read_off_as_megatron_turns_it_off(gplan, tmp_path):
    """validate_args turns sequence parallelism off at tp 1; the tp overlap there has nothing to overlap (the model
    zoo's bf16 launches pass it at tp 1, and ran). At tp 8 without sequence parallelism it asserts: refused."""
    path = tmp_path / "tp1.sh"
    path.write_text(TRAIN_SH.read_text().replace("--tensor-model-parallel-size 8",
                                                 "--tensor-model-parallel-size 1 --tp-comm-overlap"))
    data = gplan("estimate", "llama3-70b", "--from", str(path), *ARGS, "--json").json()
    assert data["parallel"]["tp"] == 1 and data["parallel"]["sp"] is False
    path.write_text(TRAIN_SH.read_text().replace("--sequence-parallel", "--tp-comm-overlap"))
    r = gplan("estimate", "llama3-70b", "--from", str(path), *ARGS)
    assert r.code == 3 and "overlap can happen only when sequence parallelism is enabled" in r.stderr
    assert "Traceback" not in r.stderr and "hint:" in r.stderr


@pytest.mark.parametrize("args", [
    ["llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--target", "megatron"],
    ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"],
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "megatron", "--pp", "4", "--vpp", "2"],
])
def test_an_export_read_back_is_the_same_configuration_and_prediction(gplan, tmp_path, args):
    """`gplan export --to megatron` then `--from`: the plan's degrees, batch and split, priced alike."""
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *args, "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", "megatron", "-o", str(tmp_path / "m")).code == 0
    plan = json.loads(plan_path.read_text())
    cluster = args[args.index("--cluster") + 1]
    back = gplan("estimate", args[0], "--from", str(tmp_path / "m" / "megatron_pretrain_gpt.sh"), "--cluster", cluster,
                 "--json").json()
    keys = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "zero")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    assert back["memory_bytes_per_device_max"] == pytest.approx(plan["prediction"]["memory_bytes_per_device_max"], rel=1e-9)


def bad_script(tmp_path, extra: str) -> Path:
    path = tmp_path / "train.sh"
    path.write_text(TRAIN_SH.read_text().replace("    --use-distributed-optimizer\n",
                                                 f"    --use-distributed-optimizer\n    {extra}\n"))
    return path


@pytest.mark.parametrize("extra, fragment", [
    ("--fine-grained-activation-offloading", "cannot price --fine-grained-activation-offloading (per-module activation offloading)"),
    ("--num-layers-per-virtual-pipeline-stage $VPP_LAYERS", "expected an integer"),
    ("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "--exp-avg-dtype bf16 without --use-precision-aware-optimizer"),
    ("--use-precision-aware-optimizer --exp-avg-dtype bf16", "--exp-avg-dtype bf16 and --exp-avg-sq-dtype fp32"),
    # Megatron-LM's validate_args asserts against these: refused as it would refuse them
    ("--overlap-param-gather", "Must use --overlap-param-gather with --overlap-grad-reduce"),
])
def test_a_launch_gplan_cannot_read_whole_is_refused_naming_the_flag(gplan, tmp_path, extra, fragment):
    r = gplan("search", "llama3-70b", "--from", str(bad_script(tmp_path, extra)), *ARGS,
              "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and fragment in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_a_launch_with_the_precision_aware_optimizer_is_read_and_priced_with_its_states(gplan, tmp_path):
    """Megatron's precision-aware optimizer (a bf16 launch: the master weights as remainders, bf16 moments) and its
    bf16 main gradients are read as the engine options they are, and priced: less memory than the same launch's."""
    plain = gplan("estimate", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--json").json()
    aware = gplan("estimate", "llama3-70b", "--from", str(bad_script(tmp_path, "--use-precision-aware-optimizer "
                  "--main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")), *ARGS, "--json").json()
    assert {k: aware["engine_options"][k] for k in ("precision_aware_optimizer", "adam_moments", "grad_reduce_in_bf16")} \
        == {"precision_aware_optimizer": True, "adam_moments": "bf16", "grad_reduce_in_bf16": True}
    assert aware["parallel"] == plain["parallel"]
    assert aware["memory_bytes_per_device_max"] < plain["memory_bytes_per_device_max"]


def test_a_launch_of_another_model_or_without_a_device_count_is_refused(gplan, tmp_path):
    r = gplan("estimate", "llama3-8b", "--from", str(TRAIN_SH), *ARGS)
    assert r.code == 3 and "--num-layers 80, but llama3-8b has 32" in r.stderr
    bare = tmp_path / "args.txt"
    bare.write_text("--num-layers 80 --hidden-size 8192 --tensor-model-parallel-size 8 --global-batch-size 64\n")
    r = gplan("estimate", "llama3-70b", "--from", str(bare), *ARGS)
    assert r.code == 3 and "does not say how many GPUs" in r.stderr and "--devices" in r.stderr
    assert gplan("estimate", "llama3-70b", "--from", str(bare), *ARGS, "--devices", "16").code == 0
    r = gplan("estimate", "llama3-70b", "--from", str(tmp_path / "missing.sh"), *ARGS)
    assert r.code == 3 and "no such file" in r.stderr


@pytest.mark.parametrize("layout, pp, sizes, vpp", [
    ("Et*4|t*4|t*4|t*4|t*5|t*4|t*4|t*3L", 4, [9, 8, 8, 7], 2),
    ("Et|(tt|)*30mL", 8, [7, 8, 8, 8, 8, 8, 8, 6], 4),       # DeepSeek-V3's published layout (Megatron-Bridge)
    ("Et*4|(t*4|)*14tmL", 16, [4] * 15 + [1], 1),
])
def test_megatrons_pipeline_layout_is_read_rank_by_rank(layout, pp, sizes, vpp):
    from gplan.engines.megatron.launch import parse_layout

    assert parse_layout(layout, pp) == (sizes, vpp)


def test_the_best_plan_is_written_back_into_the_users_own_launch(gplan, tmp_path):
    """`search --from train.sh --out-launch better.sh`: only the layout flags change — read back, it is the
    best plan, priced the same — and every line that is not a layout flag (data, tokenizer, checkpoints,
    learning-rate schedule, logging) is still there as it was."""
    from gplan.engines.megatron.export import LAYOUT_OWNED

    better, plan_path = tmp_path / "better.sh", tmp_path / "plan.json"
    r = gplan("search", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--out", str(plan_path),
              "--out-launch", str(better))
    assert r.code == 0, r.stderr
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "llama3-70b", "--from", str(better), *ARGS, "--json").json()
    keys = ("dp", "tp", "pp", "vpp", "cp", "sp", "mbs", "zero")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    kept = [line for line in TRAIN_SH.read_text().splitlines()
            if not any(flag in line for flag in LAYOUT_OWNED)]
    assert all(line in better.read_text().splitlines() for line in kept)
    assert "--data-path $DATA_PATH" in better.read_text() and "--lr 1.5e-4" in better.read_text()
    import subprocess

    assert subprocess.run(["bash", "-n", str(better)]).returncode == 0  # still a valid script


def test_out_launch_needs_a_launch_to_rewrite(gplan, tmp_path):
    r = gplan("search", "llama3-70b", *ARGS, "--devices", "64", "--out-launch", str(tmp_path / "x.sh"),
              "--out", str(tmp_path / "p.json"))
    assert r.code == 2 and "--from" in r.stderr and not (tmp_path / "x.sh").exists()


def test_compare_prices_launches_side_by_side(gplan, tmp_path):
    better = tmp_path / "better.sh"
    assert gplan("search", "llama3-70b", "--from", str(TRAIN_SH), *ARGS, "--out", str(tmp_path / "p.json"),
                 "--out-launch", str(better)).code == 0
    data = gplan("compare", "llama3-70b", "--from", str(TRAIN_SH), "--from", str(better), *ARGS, "--json").json()
    mine, best = (d["prediction"]["tokens_per_s"] for d in data)
    assert [d["name"] for d in data] == [TRAIN_SH.name, "better.sh"] and best > mine
    from gplan.plan import layouts_of, read_plan
    from gplan.spec.parallel import recompute_mix

    plan = read_plan(tmp_path / "p.json")  # the best plan's recompute, modules and all
    expected = recompute_mix(layouts_of(plan), plan.parallel.recompute_modules)
    assert data[0]["configuration"]["recompute"] == "full" and data[1]["configuration"]["recompute"] == expected


TITAN_TOML = Path(__file__).resolve().parents[1] / "data" / "torchtitan_llama3_8b.toml"


def test_a_torchtitan_job_toml_is_read_as_torchtitan_runs_it(gplan):
    data = gplan("estimate", "llama3-8b", "--from", str(TITAN_TOML), "--cluster", "dgx-h100", "--devices", "16",
                 "--json").json()
    c = data["parallel"]
    assert (c["dp"], c["tp"], c["sp"], c["zero"], c["mbs"], c["recompute"]) == (8, 2, True, 3, 2, "full")
    assert data["engine"] == "torchtitan" and "training.dataset" in data["not_read"]
    assert "float8.enable_fsdp_float8_all_gather" in data["not_read"]  # float8 is off: its section changes nothing


@pytest.mark.parametrize("section, recompute", [("", "full"), ('mode = "selective"\n', "full"),
                                                ('mode = "selective"\nselective_ac_option = "op"\n', "selective"),
                                                ('mode = "none"\n', "none")])
def test_a_torchtitan_toml_without_its_checkpointing_keys_runs_its_defaults(gplan, tmp_path, section, recompute):
    """torchtitan ≤ 0.2 checkpoints every second block when a job config leaves [activation_checkpoint] out (mode
    "selective", option "2": priced as full recompute, said so) — not "none"; the per-op policy only where the
    option says op. Without the section the default is named in the notes."""
    import re

    text = re.sub(r"\[activation_checkpoint\]\n(.*\n)*?\n", "", TITAN_TOML.read_text(), count=1)
    assert "[activation_checkpoint]" not in text
    path = tmp_path / "job.toml"
    path.write_text(text + (f"\n[activation_checkpoint]\n{section}" if section else ""))
    r = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["parallel"]["recompute"] == recompute
    assert ("activation_checkpoint.mode not set" in json.dumps(data)) == (section == "")


def test_a_torchtitan_toml_without_a_batch_runs_torchtitans_local_batch(gplan, tmp_path):
    """Neither training.global_batch_size nor local_batch_size nor seq_len: torchtitan ≤ 0.2 trains 8 sequences of
    2048 tokens a rank (its defaults), the global batch that times dp — read so, the defaults named, not refused
    (and not the model's own sequence length)."""
    import re

    text = re.sub(r"^(global_batch_size|local_batch_size|batch_size|seq_len) *=.*\n", "", TITAN_TOML.read_text(),
                  flags=re.M)
    assert "batch_size" not in text and "seq_len" not in text
    path = tmp_path / "job.toml"
    path.write_text(text)
    r = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["parallel"]["mbs"] == 8 and data["num_microbatches"] == 1  # gbs = 8 · dp, one micro-batch a rank
    assert "training.local_batch_size not set" in json.dumps(data) and "training.seq_len not set" in json.dumps(data)
    tokens_per_s, step_s = data["tokens_per_s"], data["step_time_s"]
    assert tokens_per_s * step_s == pytest.approx(8 * data["parallel"]["dp"] * 2048)  # torchtitan's seq_len, 2048
    # a global batch given, the local one left out: the micro-batch is torchtitan's 8, said so
    path.write_text(text + "\n[training]\nglobal_batch_size = 128\n" if "[training]" not in text else
                    text.replace("[training]\n", "[training]\nglobal_batch_size = 128\n", 1))
    data = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--devices", "16",
                 "--json").json()
    assert data["parallel"]["mbs"] == 8 and "training.local_batch_size not set" in json.dumps(data)


@pytest.mark.parametrize("compile_section, compiled", [("enable = true\n", True),
                                                      ('enable = true\ncomponents = ["loss"]\n', True),
                                                      ('enable = true\ncomponents = ["model"]\n', False),
                                                      ('enable = false\ncomponents = ["loss"]\n', False)])
def test_a_torchtitan_toml_that_compiles_its_loss_is_priced_without_the_fp32_logits(gplan, tmp_path, compile_section,
                                                                                  compiled):
    """compile.enable with "loss" among compile.components (its default holds both) runs the loss compiled: read as
    --compiled-loss, the memory below the eager loss's by the fp32 logits; "model" alone or compile off is eager."""
    path = tmp_path / "job.toml"
    path.write_text(TITAN_TOML.read_text() + "\n[compile]\n" + compile_section)
    args = ("estimate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--json")
    data = gplan(*args[:2], "--from", str(path), *args[2:]).json()
    eager = gplan(*args[:2], "--from", str(TITAN_TOML), *args[2:]).json()
    assert data["engine_options"].get("compiled_loss", False) is compiled
    assert (data["memory_bytes_per_device_max"] < eager["memory_bytes_per_device_max"]) is compiled


def test_a_torchtitan_toml_stating_every_degree_needs_no_device_count(gplan, tmp_path):
    """data_parallel_shard_degree stated (not -1) fixes the world size — torchtitan asserts the degrees' product is
    it: read without --devices; another count refused, exit 3, naming both."""
    import re

    text = re.sub(r"data_parallel_shard_degree *=.*", "data_parallel_shard_degree = 4", TITAN_TOML.read_text())
    path = tmp_path / "job.toml"
    path.write_text(text)
    r = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["parallel"]["dp"] == 4  # replicate 1 × shard 4, on tp·pp·cp more ranks each
    wrong = gplan("estimate", "llama3-8b", "--from", str(path), "--cluster", "dgx-h100", "--devices", "64")
    assert wrong.code == 3 and "replicate × shard" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_per_op_plan_is_written_into_a_toml_with_its_option(gplan, tmp_path):
    """A plan recomputing torchtitan's per-op policy writes `selective_ac_option = "op"` beside the mode: the job
    config's default option, "2", would checkpoint every second block whole instead."""
    import tomllib

    better, plan_path = tmp_path / "better.toml", tmp_path / "plan.json"
    r = gplan("search", "llama3-8b", "--from", str(TITAN_TOML), "--cluster", "dgx-h100", "--devices", "16",
              "--recompute", "selective", "--recompute-modules", "op", "--out", str(plan_path), "--out-launch", str(better))
    assert r.code == 0, r.stderr
    assert {c["recompute"] for s in json.loads(plan_path.read_text())["stages"] for c in s["layers"]} == {"selective"}
    written = tomllib.loads(better.read_text())["activation_checkpoint"]
    assert written == {"mode": "selective", "selective_ac_option": "op"}
    back = gplan("estimate", "llama3-8b", "--from", str(better), "--cluster", "dgx-h100", "--devices", "16", "--json")
    assert back.json()["parallel"]["recompute"] == "selective"


@pytest.mark.parametrize("args", [
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "torchtitan"],
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "torchtitan", "--pp", "2", "--tp", "2",
     "--zero", "3"],
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "torchtitan", "--pp", "4", "--vpp", "2"],
])
def test_a_torchtitan_export_read_back_is_the_same_plan(gplan, tmp_path, args):
    """`gplan export --to torchtitan` then `--from` (its script, with the config module beside it): the same
    degrees, batch, split and prediction — zero 1 comes back as 2, as the export's note says torchtitan runs it."""
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *args, "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", "torchtitan", "-o", str(tmp_path / "t")).code == 0
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "llama3-8b", "--from", str(tmp_path / "t" / "torchtitan_train.sh"), "--cluster",
                 "dgx-h100", "--json").json()
    keys = ("dp", "tp", "pp", "vpp", "cp", "sp", "mbs")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["parallel"]["zero"] == (2 if plan["parallel"]["zero"] == 1 else plan["parallel"]["zero"])
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)


def test_search_from_a_torchtitan_toml_shows_the_gain(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--from", str(TITAN_TOML), "--cluster", "dgx-h100", "--devices", "16",
              "--out", str(tmp_path / "p.json"), "--json")
    assert r.code == 0, r.stderr
    versus = r.json()["from"]
    assert versus["engine"] == "torchtitan" and versus["gain"] >= 0
    assert json.loads((tmp_path / "p.json").read_text())["training"]["engine"] == "torchtitan"


@pytest.mark.parametrize("args", [
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed", "--pp", "2"],
    ["llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed", "--zero", "3",
     "--recompute", "full"],
    ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64", "--target", "deepspeed"],
])
def test_a_deepspeed_export_read_back_is_the_same_plan(gplan, tmp_path, args):
    """`gplan export --to deepspeed` (a Megatron-DeepSpeed script and its ds_config.json) then `--from`."""
    plan_path = tmp_path / "plan.json"
    r = gplan("search", *args, "--out", str(plan_path))
    assert r.code == 0, r.stderr
    assert gplan("export", str(plan_path), "--to", "deepspeed", "-o", str(tmp_path / "d")).code == 0
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", args[0], "--from", str(tmp_path / "d" / "megatron_deepspeed_pretrain_gpt.sh"),
                 "--cluster", "dgx-h100", "--json").json()
    assert back["engine"] == "deepspeed"
    keys = ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "mbs", "zero")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)


def test_a_deepspeed_launch_without_its_config_is_refused(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed",
                 "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", "deepspeed", "-o", str(tmp_path / "d")).code == 0
    (tmp_path / "d" / "ds_config.json").unlink()
    r = gplan("search", "llama3-8b", "--from", str(tmp_path / "d" / "megatron_deepspeed_pretrain_gpt.sh"),
              "--cluster", "dgx-h100", "--out", str(tmp_path / "p2.json"))
    assert r.code == 3 and "ds_config.json" in r.stderr and not (tmp_path / "p2.json").exists()


@pytest.mark.parametrize("to, file", [("slurm", "slurm_job.sh"), ("k8s", "plan-configmap.yaml")])
def test_a_launch_of_gplans_own_worker_reads_back_as_its_plan(gplan, tmp_path, to, file):
    """SLURM and Kubernetes exports run gplan's torch worker on the plan they name or carry: read back, the
    plan itself, priced as the worker runs it."""
    plan_path = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", to, "-o", str(tmp_path / "e"), "--image", "registry/gplan:1").code == 0
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "llama3-8b", "--from", str(tmp_path / "e" / file), "--json").json()
    keys = ("dp", "tp", "pp", "vpp", "cp", "sp", "mbs", "zero")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["engine"] == "torch"
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    r = gplan("estimate", "llama3-70b", "--from", str(tmp_path / "e" / file), "--json")
    assert r.code == 3 and "runs llama3-8b, not llama3-70b" in r.json()["error"]["message"]


READ_BACK = {"megatron": "megatron_pretrain_gpt.sh", "torchtitan": "torchtitan_train.sh",
             "deepspeed": "megatron_deepspeed_pretrain_gpt.sh", "mindformers": "mindformers_parallel.yaml",
             "slurm": "slurm_job.sh", "k8s": "plan-configmap.yaml"}
#: What an engine cannot express comes back as what it runs (the export's note says so).
RUNS_AS = {("torchtitan", 1): 2}


@pytest.mark.parametrize("golden", sorted(__import__("golden", fromlist=["INSTANCES"]).INSTANCES))
def test_every_export_of_every_golden_plan_reads_back_as_its_engine_runs_it(gplan, tmp_path, golden):
    """For each golden search and each export target that takes its plan: `gplan export` then `--from`
    gives the plan's configuration (or what that engine runs of it: RUNS_AS) and the step the export's
    note re-priced it at (the plan's own where the engine is the plan's)."""
    from gplan.backends.exporters import targets
    from golden import INSTANCES
    from gplan.plan import layouts_of, read_plan
    from gplan.planner.build import reprice_split
    from gplan.spec.targets import TARGETS, runs_as

    args = list(INSTANCES[golden])
    plan_path = tmp_path / "plan.json"
    assert gplan("search", *args, "--out", str(plan_path)).code == 0
    plan = read_plan(plan_path)
    cluster = args[args.index("--cluster") + 1]
    read = 0
    for to, file in READ_BACK.items():
        out = tmp_path / to
        r = gplan("export", str(plan_path), "--to", to, "-o", str(out), "--image", "registry/gplan:1")
        if r.code == 3:  # the engine does not run this plan: refused, nothing to read back
            assert not out.exists()
            continue
        assert r.code == 0, (to, r.stderr)
        back = gplan("estimate", args[0], "--from", str(out / file), "--cluster", cluster, "--json").json()
        assert "error" not in back, (to, back)
        c = plan.parallel
        for key in ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs"):
            assert back["parallel"][key] == getattr(c, key), (to, key)
        assert back["parallel"]["zero"] == RUNS_AS.get((targets()[to].engine, c.zero), c.zero), to
        engine = back["engine"]
        if plan.cluster.is_heterogeneous and engine != "torch":
            continue  # a launch names no node group: its stages land where its launcher puts them
        layouts = runs_as(TARGETS[engine], plan.model, c, layouts_of(plan))
        expected = (plan.prediction.step_time_s if engine == plan.training.engine
                    else reprice_split(plan, layouts, engine)[0])
        assert back["step_time_s"] == pytest.approx(expected, rel=1e-6), to
        read += 1
    assert read >= 1


def test_a_torchtitan_toml_is_written_back_with_only_its_layout_keys(gplan, tmp_path):
    better, plan_path = tmp_path / "better.toml", tmp_path / "plan.json"
    r = gplan("search", "llama3-8b", "--from", str(TITAN_TOML), "--cluster", "dgx-h100", "--devices", "16",
              "--out", str(plan_path), "--out-launch", str(better))
    assert r.code == 0, r.stderr
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "llama3-8b", "--from", str(better), "--cluster", "dgx-h100", "--devices", "16",
                 "--json").json()
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    import tomllib

    before, after = tomllib.loads(TITAN_TOML.read_text()), tomllib.loads(better.read_text())
    for section in ("job", "metrics", "model", "optimizer", "lr_scheduler", "checkpoint", "float8"):
        assert after[section] == before[section]
    assert after["training"]["dataset"] == "c4" and after["training"]["steps"] == 1000


def test_a_megatron_deepspeed_launch_is_written_back_with_its_config(gplan, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed",
                 "--pp", "4", "--out", str(plan_path)).code == 0
    assert gplan("export", str(plan_path), "--to", "deepspeed", "-o", str(tmp_path / "d")).code == 0
    config = tmp_path / "d" / "ds_config.json"
    mine = json.loads(config.read_text()) | {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    config.write_text(json.dumps(mine))
    out_dir = tmp_path / "new"
    out_dir.mkdir()
    best_path = tmp_path / "best.json"
    r = gplan("search", "llama3-8b", "--from", str(tmp_path / "d" / "megatron_deepspeed_pretrain_gpt.sh"),
              "--cluster", "dgx-h100", "--out", str(best_path), "--out-launch", str(out_dir / "train.sh"))
    assert r.code == 0, r.stderr
    written = json.loads((out_dir / "ds_config.json").read_text())
    best = json.loads(best_path.read_text())
    assert written["optimizer"] == mine["optimizer"]  # the user's own keys kept
    assert written["zero_optimization"]["stage"] == best["parallel"]["zero"]
    assert written["train_micro_batch_size_per_gpu"] == best["parallel"]["mbs"]
    back = gplan("estimate", "llama3-8b", "--from", str(out_dir / "train.sh"), "--cluster", "dgx-h100", "--json").json()
    assert back["step_time_s"] == pytest.approx(best["prediction"]["step_time_s"], rel=1e-9)


def test_the_best_plan_is_written_back_into_a_mindformers_yaml(gplan, tmp_path):
    """MindFormers: `search --from run.yaml --out-launch better.yaml` rewrites the YAML's layout keys only —
    comments, the optimizer, the context and every other key kept — and read back it is the best plan,
    priced the same."""
    import shutil

    import yaml

    source = tmp_path / "run.yaml"
    shutil.copy(Path(__file__).resolve().parents[1] / "data" / "logs" / "mindformers_llama2_13b_dp8_2025.yaml", source)
    better, plan_path = tmp_path / "better.yaml", tmp_path / "plan.json"
    # zero ≤ 2: a zero 3 plan comes back as the zero 2 MindSpore's optimizer parallel runs (the export says so)
    r = gplan("search", "llama2-13b", "--from", str(source), "--cluster", "atlas-800-910b", "--out", str(plan_path),
              "--zero", "0,1,2", "--out-launch", str(better))
    assert r.code == 0, r.stderr
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "llama2-13b", "--from", str(better), "--cluster", "atlas-800-910b", "--json").json()
    keys = ("dp", "tp", "pp", "vpp", "mbs", "zero")
    assert {k: back["parallel"][k] for k in keys} == {k: plan["parallel"][k] for k in keys}
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)
    before, after = yaml.safe_load(source.read_text()), yaml.safe_load(better.read_text())
    for kept in ("optimizer", "context", "trainer", "seed"):
        assert after[kept] == before[kept]
    assert [line for line in source.read_text().splitlines() if line.startswith("#")] == \
        [line for line in better.read_text().splitlines() if line.startswith("#")]
