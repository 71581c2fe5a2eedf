"""Users' own launch files, read with no MODEL (tests/data/corpus/corpus.yaml): each file is written with the
keys, flags and layout of a real public one, and states the configuration its source states — or is refused
in one line naming what gplan cannot price."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from helpers import mindformers_configs, requires_engine

from gplan.errors import InputError
from gplan.engines.megatron.flags import MEGATRON_DEFAULTS, MEGATRON_NOT_PRICED, at_default, megatron_class
from gplan.engines.torchtitan.flags import TITAN_DEFAULTS, titan_class
from gplan.planner.launch import launch_config
from gplan.planner.launch_files import read_launch

CORPUS = Path(__file__).parents[1] / "data" / "corpus"
ENTRIES = yaml.safe_load((CORPUS / "corpus.yaml").read_text())


def entry_id(entry: dict) -> str:
    return entry["file"]


@pytest.mark.parametrize("entry", [e for e in ENTRIES if "reads" in e], ids=entry_id)
def test_every_corpus_launch_is_read_as_its_source_states_without_a_model(entry):
    """Read with no MODEL, or the one its entry names where the file's model is one gplan does not bundle (a fork's
    flavor: `model_given`)."""
    from gplan.profiles.catalogue import load_model

    launch = read_launch(CORPUS / entry["file"], load_model(entry["model_given"]) if "model_given" in entry else None)
    assert launch.engine == entry["engine"] and launch.model.name == entry["model"]
    devices = entry.get("devices") or launch.world_size
    assert devices == entry.get("world_size", devices)
    config = launch_config(launch, launch.model, devices)
    assert {key: getattr(config, key) for key in entry["reads"]} == entry["reads"]
    if "gbs" in entry:
        assert launch.gbs == entry["gbs"]
    if "stage_sizes" in entry:
        assert launch.stage_sizes == entry["stage_sizes"] and sum(launch.stage_sizes) == launch.model.total_layers
    for option, expected in entry.get("engine_options", {}).items():
        assert launch.engine_options[option] == expected
    assert launch.model.capacity_factor == entry.get("capacity_factor")  # a run's capacity, read onto the model
    for words in entry.get("said", []):  # what the reader says it assumed, beside the prediction
        assert any(words in line for line in launch.unread), (words, launch.unread)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if "refused" in e], ids=entry_id)
def test_a_corpus_launch_gplan_cannot_price_is_refused_naming_what(entry):
    with pytest.raises(InputError) as caught:
        read_launch(CORPUS / entry["file"], None)
    assert entry["refused"] in caught.value.message


def test_estimate_from_a_model_zoo_launch_line_needs_no_model(gplan):
    r = gplan("estimate", "--from", str(CORPUS / "megatron_moe_zoo" / "run_qwen3_235b_h100.sh"), "--cluster",
              "dgx-h100", "--json")
    assert r.code == 0, r.stderr
    out = json.loads(r.stdout)["data"]
    assert out["model_from_launch"].startswith("qwen3-235b-a22b")
    assert out["parallel"]["dp"] * out["parallel"]["tp"] * out["parallel"]["pp"] == 256
    assert "--moe-permute-fusion" in out["no_effect"] and "--lr" in out["not_read"]


def test_a_model_given_is_still_checked_against_the_launch(gplan):
    r = gplan("estimate", "llama3-70b", "--from", str(CORPUS / "megatron_fsdp_llama3_8b.sh"), "--cluster", "dgx-h100")
    assert r.code == 3 and "--num-layers 32, but llama3-70b has 80" in r.stderr and "Traceback" not in r.stderr


def test_estimate_without_model_or_launch_is_a_usage_error(gplan):
    r = gplan("estimate", "--devices", "8")
    assert r.code != 0 and "MODEL is missing" in r.stderr and "--from FILE" in r.stderr


@pytest.mark.parametrize("flag", sorted(MEGATRON_DEFAULTS))
def test_a_megatron_flag_at_its_default_is_never_refused(flag):
    default = MEGATRON_DEFAULTS[flag]
    values = [] if default is True else ["None" if default is None else str(default)]
    if default is False:
        return  # a store_true switch at its default is simply absent from the launch
    assert megatron_class(flag, values)[0] == "no effect"


@pytest.mark.parametrize("flag", sorted(MEGATRON_NOT_PRICED))
def test_a_megatron_flag_gplan_cannot_price_is_refused_away_from_its_default(flag):
    from gplan.engines.megatron.arguments import arguments

    default = arguments()[flag][1] if flag in arguments() else MEGATRON_DEFAULTS.get(flag)
    values = [] if default in (None, False) else ["bf16" if default == "fp32" else "a2a" if default == "p2p" else
                                                  "muon" if default == "adam" else "custom" if default == "nvfp4" else "7"]
    assert megatron_class(flag, values)[0] == "refused"


@pytest.mark.parametrize("key", sorted(TITAN_DEFAULTS))
def test_a_torchtitan_key_at_its_default_is_never_refused(key):
    assert titan_class(key, TITAN_DEFAULTS[key])[0] == "no effect"


def test_torchtitan_keys_away_from_their_default_are_refused_when_unpriced():
    assert titan_class("parallelism.enable_async_tensor_parallel", True)[0] == "refused"
    assert titan_class("parallelism.pipeline_parallel_schedule_csv", "my.csv")[0] == "refused"
    assert titan_class("parallelism.disable_loss_parallel", True)[0] == "no effect"


def test_the_torchtitan_defaults_are_torchtitans_own():
    """Where torchtitan 0.3's ParallelismConfig still has a key, its default is the one gplan holds."""
    configs = pytest.importorskip("torchtitan.config.configs", reason="needs the optional engine torchtitan")
    import dataclasses

    fields = {f"parallelism.{f.name}": f.default for f in dataclasses.fields(configs.ParallelismConfig)
              if f.default is not dataclasses.MISSING}
    shared = sorted(set(fields) & set(TITAN_DEFAULTS))
    assert len(shared) >= 5, shared
    assert {k: fields[k] for k in shared} == {k: TITAN_DEFAULTS[k] for k in shared}


@pytest.mark.parametrize("values, default, expected", [
    ([], False, False), (["1"], 1, True), (["1.0"], 1, True), (["fp32"], "fp32", True), (["None"], None, True),
    (["bf16"], "fp32", False), (["false"], False, True),
])
def test_at_default_reads_argparse_values(values, default, expected):
    assert at_default(values, default) is expected


def test_a_moe_plan_written_back_into_torchtitans_own_toml_reads_back_as_the_plan(gplan, tmp_path):
    """search --from torchtitan's DeepSeek-V3 16B TOML --out-launch: the TOML keeps what torchtitan ≤ 0.2 reads
    (no enable_sequence_parallel), and read back it is the best plan as torchtitan runs it (zero 1 as FSDP
    without resharding: zero 2), at the plan's step."""
    toml, better, plan_path = CORPUS / "torchtitan" / "deepseek_v3_16b.toml", tmp_path / "better.toml", tmp_path / "p.json"
    r = gplan("search", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "8", "--out", str(plan_path),
              "--out-launch", str(better))
    assert r.code == 0, r.stderr
    assert "enable_sequence_parallel" not in better.read_text() and 'name = "deepseek_v3"' in better.read_text()
    plan = json.loads(plan_path.read_text())
    back = gplan("estimate", "--from", str(better), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    for key in ("dp", "tp", "pp", "ep", "mbs"):
        assert back["parallel"][key] == plan["parallel"][key], key
    # the recompute its layers run (a plan's configuration field can read none while its stages recompute)
    layers = {layer["recompute"] for stage in plan["stages"] for layer in stage["layers"]}
    assert layers == {back["parallel"]["recompute"]}
    assert back["parallel"]["zero"] == max(plan["parallel"]["zero"], 2 if plan["parallel"]["zero"] else 0)
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_a_model_zoo_launch_line_is_not_rewritten_in_place(gplan, tmp_path):
    r = gplan("search", "--from", str(CORPUS / "megatron_moe_zoo" / "run_qwen3_235b_h100.sh"), "--cluster", "dgx-h100",
              "--out", str(tmp_path / "p.json"), "--out-launch", str(tmp_path / "better.sh"))
    assert r.code == 3 and "Megatron-MoE-ModelZoo launch line" in r.stderr and "gplan export PLAN --to megatron" in r.stderr
    assert not (tmp_path / "better.sh").exists() and not (tmp_path / "p.json").exists()


def test_the_change_in_recompute_is_said_as_the_split_runs_it():
    """A plan whose stages recompute fully while its configuration's `recompute` reads none: the change said
    is the layers' recompute, not the configuration field (search --from printed 'full → none' while writing
    full)."""
    from gplan.planner.launch import differences
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import ParallelConfig, layout_from_sizes

    model = load_model("llama3-8b")
    mine = ParallelConfig(dp=8, recompute="full")
    best = ParallelConfig(dp=8, recompute="none")
    full = layout_from_sizes(model, [32], ["full"])
    assert differences(mine, best)["recompute"] == ("full", "none")
    assert "recompute" not in differences(mine, best, full, full)
    assert differences(mine, best, full, layout_from_sizes(model, [32], ["none"]))["recompute"] == ("full", "none")


@pytest.mark.parametrize("section, cls", [("parallelism", "ParallelismConfig"), ("training", "TrainingConfig"),
                                          ("compile", "CompileConfig")])
def test_every_key_of_torchtitans_current_release_is_classified(section, cls):
    """Every field of the installed torchtitan's config sections that decide the layout is read, or
    classified (no effect with why, refused unless at its default, or no layout setting): a release that
    adds one fails here until someone classifies it."""
    configs = pytest.importorskip("torchtitan.config.configs", reason="needs the optional engine torchtitan")
    import dataclasses

    from gplan.engines.torchtitan.flags import TITAN_NO_EFFECT, TITAN_NOT_LAYOUT, TITAN_NOT_PRICED
    from gplan.engines.torchtitan.launch import TITAN_KEYS

    classified = TITAN_KEYS | TITAN_DEFAULTS.keys() | TITAN_NO_EFFECT.keys() | TITAN_NOT_PRICED.keys() | TITAN_NOT_LAYOUT
    keys = {f"{section}.{f.name}" for f in dataclasses.fields(getattr(configs, cls))}
    assert not keys - classified, sorted(keys - classified)


def test_every_flag_of_megatrons_layout_groups_is_classified():
    """Every flag of Megatron-LM's arguments.py argument groups that can touch the layout (the snapshot,
    engines.megatron.arguments) is read, read with no effect (with why), or refused away from its default
    (with why): a flag a newer arguments.py adds there fails here until someone classifies it."""
    from gplan.engines.megatron.flags import MEGATRON_NO_EFFECT, MEGATRON_NOT_PRICED
    from gplan.engines.megatron.flags import LAYOUT_FLAGS, MODEL_FLAGS, MODEL_SWITCHES
    from gplan.engines.megatron.arguments import arguments

    snapshot = arguments()
    assert len(snapshot) > 250 and {"training", "distributed", "moe", "Transformer-Engine"} <= {g for g, _ in snapshot.values()}
    classified = LAYOUT_FLAGS | MODEL_FLAGS.keys() | MODEL_SWITCHES | MEGATRON_NO_EFFECT.keys() | MEGATRON_NOT_PRICED.keys()
    assert not [f for f in snapshot if f not in classified]
    assert not set(MEGATRON_NO_EFFECT) & set(MEGATRON_NOT_PRICED)


@pytest.mark.parametrize("flag", [f for f, (_, d) in __import__("gplan.engines.megatron.arguments",
                                                                     fromlist=["arguments"]).arguments().items()
                                  if d is not False])
def test_every_megatron_flag_given_at_its_default_is_not_refused(flag):
    """A value flag written at arguments.py's default changes nothing: never refused (those the launch reader
    reads are priced at it)."""
    from gplan.engines.megatron.arguments import arguments

    default = arguments()[flag][1]
    values = ["None" if default is None else str(default)]
    assert megatron_class(flag, values)[0] == "no effect"


ROUND_TRIPS = [  # model, cluster, devices, target, the exported file read back
    ("qwen3-30b-a3b", "dgx-h100", "16", "megatron", "megatron_pretrain_gpt.sh"),
    ("qwen3-30b-a3b", "dgx-h100", "16", "torchtitan", "torchtitan_train.sh"),
    ("gpt-oss-20b", "dgx-h100", "16", "torchtitan", "torchtitan_train.sh"),
    ("llama3-8b", "dgx-h100", "16", "deepspeed", "megatron_deepspeed_pretrain_gpt.sh"),
    ("llama3-8b", "atlas-800-910b", "16", "mindformers", "mindformers_parallel.yaml"),
]


@pytest.mark.parametrize("model, cluster, devices, target, exported", ROUND_TRIPS,
                         ids=[f"{r[3]}-{r[0]}" for r in ROUND_TRIPS])
def test_an_export_read_back_with_no_model_is_the_plan_as_its_engine_runs_it(gplan, tmp_path, model, cluster, devices,
                                                                            target, exported):
    """search → export → estimate --from the exported launch (no MODEL): the plan's model, configuration (as the
    engine runs it: torchtitan's zero 1 is FSDP without resharding, zero 2) and step, MoE included."""
    plan_path, out = tmp_path / "plan.json", tmp_path / "out"
    assert gplan("search", model, "--cluster", cluster, "--devices", devices, "--target", target, 
                 "--out", str(plan_path)).code == 0
    r = gplan("export", str(plan_path), "--to", target, "--out-dir", str(out))
    assert r.code == 0, r.stderr
    back = gplan("estimate", "--from", str(out / exported), "--cluster", cluster, "--json").json()
    plan = json.loads(plan_path.read_text())
    assert back["model_from_launch"].startswith(model)
    runs_zero = {1: 2} if target == "torchtitan" else {}
    for key in ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs"):
        assert back["parallel"][key] == plan["parallel"][key], key
    assert back["parallel"]["zero"] == runs_zero.get(plan["parallel"]["zero"], plan["parallel"]["zero"])
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


@pytest.mark.parametrize("name, text, said", [
    ("recipe.py", "from megatron.bridge.recipes.llama import llama3_8b\ncfg = llama3_8b.pretrain_config()\n",
     "a Python file (a Megatron-Bridge or NeMo recipe"),
    ("ds_config.json", '{"train_batch_size": 64, "zero_optimization": {"stage": 3}}\n',
     "a DeepSpeed config, read with the script that names it"),
    ("base.yml", "base_config: base.yml\nici_fsdp_parallelism: -1\nper_device_batch_size: 2\n", "a MaxText config"),
    ("nemo.yaml", "trainer:\n  devices: 8\nmodel:\n  tensor_model_parallel_size: 2\n", "a NeMo YAML config"),
    ("train.log", "some words\n", "no Megatron-LM arguments found"),
    ("job.toml", "[parallelism]\ntensor_parallel_degree = \n", "not a complete TOML job config"),
])
def test_a_file_gplan_does_not_read_as_a_launch_is_one_line_naming_what_it_is(gplan, tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    r = gplan("estimate", "--from", str(path), "--devices", "8")
    assert r.code == 3 and said in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1


def test_every_zero_key_of_deepspeeds_own_config_is_classified():
    """Every field of the installed DeepSpeed's DeepSpeedZeroConfig (and its stage3_ alias) is classified: a
    release that adds one fails here until someone does."""
    zero = pytest.importorskip("deepspeed.runtime.zero.config", reason="needs the optional engine deepspeed")
    from gplan.engines.deepspeed.flags import DS_ZERO_NO_EFFECT, DS_ZERO_NOT_PRICED

    fields = zero.DeepSpeedZeroConfig.model_fields
    keys = set(fields) | {f.alias for f in fields.values() if f.alias}
    assert not keys - set(DS_ZERO_NO_EFFECT) - set(DS_ZERO_NOT_PRICED), sorted(keys - set(DS_ZERO_NO_EFFECT))
    for key, (_, default) in DS_ZERO_NOT_PRICED.items():
        if key in fields and default is not None:
            assert fields[key].default == default, key


def test_a_deepspeed_launch_offloading_its_optimizer_is_refused_naming_it(gplan, tmp_path):
    """A Megatron-DeepSpeed launch (gplan's export of a plan) whose ds_config.json offloads the optimizer:
    refused naming the key; `"device": "none"` is DeepSpeed's default and reads as before."""
    plan = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed",
                 "--out", str(plan)).code == 0
    assert gplan("export", str(plan), "--to", "deepspeed", "--out-dir", str(tmp_path / "ds")).code == 0
    launch, config = tmp_path / "ds" / "megatron_deepspeed_pretrain_gpt.sh", tmp_path / "ds" / "ds_config.json"
    data = json.loads(config.read_text())
    data.setdefault("zero_optimization", {})["offload_optimizer"] = {"device": "cpu"}
    config.write_text(json.dumps(data))
    r = gplan("estimate", "--from", str(launch), "--cluster", "dgx-h100")
    assert r.code == 3 and "zero_optimization.offload_optimizer (the optimizer on the host or NVMe)" in r.stderr
    data["zero_optimization"]["offload_optimizer"] = {"device": "none"}
    config.write_text(json.dumps(data))
    r = gplan("estimate", "--from", str(launch), "--cluster", "dgx-h100", "--json")
    assert r.code == 0 and r.json()["no_effect"]["zero_optimization.offload_optimizer"] == "at DeepSpeed's default"


def test_every_top_level_key_deepspeeds_own_config_reads_is_classified():
    """DeepSpeed's own DeepSpeedConfig, given a config that records what it looks up: every top-level key it
    reads is read by gplan's reader or classified (no effect, or refused away from its default) — a release
    that reads a new key fails here until someone classifies it."""
    config = pytest.importorskip("deepspeed.runtime.config", reason="needs the optional engine deepspeed")
    from gplan.engines.deepspeed.flags import DS_NO_EFFECT, DS_NOT_PRICED, DS_READ

    looked_up = set()

    class Keys(set):
        def __contains__(self, key):
            looked_up.add(key)
            return super().__contains__(key)

    class Recording(dict):
        def get(self, key, *default):
            looked_up.add(key)
            return super().get(key, *default)

        def __getitem__(self, key):
            looked_up.add(key)
            return super().__getitem__(key)

        def __contains__(self, key):
            looked_up.add(key)
            return super().__contains__(key)

        def keys(self):
            return Keys(super().keys())

    config.DeepSpeedConfig(Recording({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8}))
    assert len(looked_up) > 40  # the recording saw DeepSpeed's reads
    classified = DS_READ | DS_NO_EFFECT.keys() | DS_NOT_PRICED.keys() | {"optimizer"}
    assert not looked_up - classified, sorted(looked_up - classified)
    for key, (_, default) in DS_NOT_PRICED.items():  # a scalar default is DeepSpeed's own
        name = key.upper() + "_DEFAULT"
        if default != "off" and hasattr(config, name):
            assert getattr(config, name) == default, key


@pytest.mark.parametrize("key, given, refused", [
    ("steps_per_print", 10, None), ("optimizer", {"type": "AdamW", "params": {"lr": 3e-4}}, None),
    ("optimizer", {"type": "OneBitAdam"}, "optimizer onebitadam"), ("sparse_attention", {"mode": "fixed"},
                                                                     "sparse_attention (block-sparse attention)"),
    ("communication_data_type", None, None), ("communication_data_type", "fp32", "communication_data_type"),
    ("elasticity", {"enabled": False}, None), ("elasticity", {"enabled": True}, "elasticity (elastic batch sizes)"),
    ("tensor_parallel", {"autotp_size": 1}, None), ("tensor_parallel", {"autotp_size": 4}, "AutoTP"),
    ("activation_checkpointing", {"partition_activations": True, "cpu_checkpointing": True}, "on the host"),
    ("_comment", "a note DeepSpeed ignores", None),
])
def test_a_deepspeed_config_key_is_refused_only_away_from_its_default_and_unpriced(gplan, tmp_path, key, given,
                                                                                   refused):
    """gplan's own DeepSpeed export with one key of DeepSpeed's config added: read (no effect) at DeepSpeed's
    default or when it changes nothing priced; refused (exit 3) naming it otherwise."""
    plan = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--target", "deepspeed",
                 "--zero", "1", "--out", str(plan)).code == 0
    assert gplan("export", str(plan), "--to", "deepspeed", "--out-dir", str(tmp_path / "ds")).code == 0
    launch, config = tmp_path / "ds" / "megatron_deepspeed_pretrain_gpt.sh", tmp_path / "ds" / "ds_config.json"
    data = json.loads(config.read_text())
    config.write_text(json.dumps(data | {key: given}))
    r = gplan("estimate", "--from", str(launch), "--cluster", "dgx-h100", "--json")
    if refused:
        assert r.code == 3 and refused in r.stderr and len(r.stderr.strip().splitlines()) == 2, r.stderr
    else:
        assert r.code == 0, r.stderr
        assert r.json()["parallel"]["zero"] == 1


def test_every_layout_key_of_mindformers_own_config_classes_is_classified():
    """Every argument of MindFormers' TransformerOpParallelConfig and TransformerRecomputeConfig (the
    `parallel_config` and `recompute_config` sections) is read or classified: a release that adds one fails."""
    pytest.importorskip("mindformers", reason="needs the optional engine mindformers")
    import inspect

    from mindformers.modules.transformer import TransformerOpParallelConfig, TransformerRecomputeConfig

    from gplan.engines.mindformers.flags import MF_KEYS, MF_READ

    for section, cls in (("parallel_config", TransformerOpParallelConfig), ("recompute_config", TransformerRecomputeConfig)):
        keys = {f"{section}.{n}" for n in inspect.signature(cls.__init__).parameters if n != "self"}
        assert not keys - MF_READ - set(MF_KEYS), sorted(keys - MF_READ - set(MF_KEYS))


@pytest.mark.parametrize("key, value, kind", [("parallel_config.seq_split_num", 4, "refused"),
                                              ("parallel_config.context_parallel_algo", "ulysses_cp", "refused"),
                                              ("parallel_config.gradient_aggregation_group", 8, "no effect"),
                                              ("parallel.parallel_mode", 1, "no effect"),
                                              # a sub-key of a section without effect, as MindFormers' own
                                              # llm_pretrain_moe_template.yaml nests it
                                              ("parallel.strategy_ckpt_config.save_file", "./s.ckpt", "no effect"),
                                              ("parallel_config.optimizer_shard.sub_key", 1, "refused"), ("parallel.unknown.sub_key", 1, "refused")])
def test_mindformers_keys_are_refused_only_away_from_their_default_and_when_unpriced(key, value, kind):
    from gplan.engines.mindformers.flags import mindformers_class

    assert mindformers_class(key, value)[0] == kind


TITAN_FAMILIES = {"llama3": "llama3_configs", "qwen3": "qwen3_configs", "deepseek_v3": "deepseekv3_configs",
                  "gpt_oss": "gptoss_configs"}


def titan_flavors():
    """(model.name, flavor, builder) of every flavor the installed torchtitan ships of the families gplan
    prices (its debug models left out)."""
    import importlib

    found = []
    for name, table in TITAN_FAMILIES.items():
        configs = getattr(importlib.import_module(f"torchtitan.models.{name}"), table)
        found += [(name, flavor, builder) for flavor, builder in configs.items() if "debug" not in flavor]
    return found


def test_every_torchtitan_flavor_is_bundled_with_torchtitans_own_parameter_count():
    """Each flavor torchtitan ships (llama3, qwen3, deepseek_v3, gpt_oss) has a bundled model of its shape —
    the same parameter count as torchtitan's own model built on the meta device — so that a launch naming
    it needs no model file; a flavor a newer torchtitan adds fails here until it is bundled."""
    pytest.importorskip("torchtitan.models.qwen3", reason="needs the optional engine torchtitan")
    import inspect

    import torch

    from gplan.engines.torchtitan.logs import bundled
    from gplan.profiles.catalogue import load_model

    checked = []
    for name, flavor, builder in titan_flavors():
        ours = bundled(name, flavor)
        assert ours is not None, f"torchtitan {name} {flavor} has no bundled model"
        known = inspect.signature(builder).parameters
        config = builder(**{k: v for k, v in {"attn_backend": "flex", "moe_comm_backend": "standard"}.items()
                            if k in known})
        with torch.device("meta"):
            model = config.build()
        theirs = sum(p.numel() for p in model.parameters())
        spec = load_model(ours)
        # the aux-loss-free expert bias (one per routed expert and MoE layer) is a parameter to gplan's count
        # and a buffer to torchtitan's (its `expert_bias`)
        bias = (spec.num_layers - spec.first_dense_layers) * spec.num_experts if spec.router == "sigmoid" else 0
        assert spec.total_params() - theirs in (0, bias), (name, flavor, ours, spec.total_params() - theirs)
        checked.append(ours)
    assert len(checked) >= 12


def test_an_fsdp_ep_launch_its_engine_cannot_run_is_refused_naming_the_engines_rule(gplan, tmp_path):
    """torchtitan shards experts over ep alone with ep (etp 1): a TOML asking tp-sharded experts too is
    refused, exit 3, naming the rule; at etp 1 the same FSDP + EP layout is priced."""
    toml = tmp_path / "qwen3_moe.toml"
    text = ('[model]\nname = "qwen3"\nflavor = "30B-A3B"\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n'
            '[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n'
            'expert_parallel_degree = 8\nexpert_tensor_parallel_degree = {etp}\n')
    toml.write_text(text.format(etp=2))
    r = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "16")
    assert r.code == 3 and "torchtitan does not run this layout (expert_tp)" in r.stderr and "Traceback" not in r.stderr
    toml.write_text(text.format(etp=1))
    data = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "16", "--json").json()
    assert (data["parallel"]["ep"], data["parallel"]["etp"], data["parallel"]["zero"]) == (8, 1, 3)


def test_compare_of_launches_of_different_models_names_each_model(gplan):
    """Two launches that state different models: each column says its model, since the steps are not one job's;
    launches of one model keep their file names alone."""
    qwen, llama = CORPUS / "torchtitan" / "qwen3_32b.toml", CORPUS / "megatron_fsdp_llama3_8b.sh"
    r = gplan("compare", "--from", str(qwen), "--from", str(llama), "--devices", "32", "--json")
    assert r.code == 0, r.stderr
    assert [e["name"] for e in r.json()] == ["qwen3_32b.toml (qwen3-32b)",
                                                         "megatron_fsdp_llama3_8b.sh (llama3-8b)"]
    same = gplan("compare", "--from", str(llama), "--from", str(llama), "--json")
    assert [e["name"] for e in same.json()] == ["megatron_fsdp_llama3_8b.sh"] * 2


@pytest.mark.parametrize("backend, dispatcher", [("standard", "alltoall"), ("deepep", "flex"), ("hybridep", "flex")])
def test_torchtitans_token_exchange_is_read_and_priced(gplan, tmp_path, backend, dispatcher):
    """torchtitan's expert_parallel_comm_backend: its all-to-all, or DeepEP's / HybridEP's kernels priced as the
    flex dispatcher (their buffers beside the communicators: more memory than the all-to-all's)."""
    base = (CORPUS / "torchtitan" / "deepseek_v3_16b.toml").read_text().replace("expert_parallel_degree = 1",
                                                                                 "expert_parallel_degree = 8")
    assert "expert_parallel_comm_backend" not in base
    toml, plain_toml = tmp_path / "ds.toml", tmp_path / "plain.toml"
    toml.write_text(base.replace("[parallelism]", f'[parallelism]\nexpert_parallel_comm_backend = "{backend}"', 1))
    plain_toml.write_text(base)
    read = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    plain = gplan("estimate", "--from", str(plain_toml), "--cluster", "dgx-h100", "--devices", "8", "--json").json()
    assert read["parallel"]["ep"] == 8
    assert read["engine_options"]["moe_dispatcher"] == dispatcher
    more = read["memory_bytes_per_device_max"] - plain["memory_bytes_per_device_max"]
    assert (more > 0) if dispatcher == "flex" else more == 0


def estimated_with(gplan, tmp_path, section: str, line: str, devices: int = 16) -> tuple[dict, dict]:
    """`gplan estimate --from` of torchtitan's DeepSeek-V3 16B TOML with `line` added under `[section]`, and of the
    TOML as it is: (read, plain)."""
    base = (CORPUS / "torchtitan" / "deepseek_v3_16b.toml").read_text()
    assert not re.search(rf"^{line.split(' =')[0]}\s*=", base, re.M)  # the key is the TOML's default
    toml, plain_toml = tmp_path / "ds.toml", tmp_path / "plain.toml"
    toml.write_text(base.replace(f"[{section}]", f"[{section}]\n{line}", 1))
    plain_toml.write_text(base)
    args = ("--cluster", "dgx-h100", "--devices", str(devices), "--json")
    return (gplan("estimate", "--from", str(toml), *args).json(),
            gplan("estimate", "--from", str(plain_toml), *args).json())


@pytest.mark.parametrize("reduce, bf16", [("bfloat16", True), ("float32", False)])
def test_torchtitans_gradient_reduce_dtype_is_read_and_priced(gplan, tmp_path, reduce, bf16):
    """torchtitan's training.mixed_precision_reduce (FSDP2's reduce dtype), which its own MoE recipes set to
    bfloat16: read as --grad-reduce-in-bf16 — half the reduce-scatter's bytes, the same sharded fp32 gradients."""
    read, plain = estimated_with(gplan, tmp_path, "training", f'mixed_precision_reduce = "{reduce}"')
    assert read["parallel"]["zero"] == 3 and read["parallel"]["dp"] == 16
    assert read["engine_options"].get("grad_reduce_in_bf16", False) is bf16
    assert read["memory_bytes_per_device_max"] == plain["memory_bytes_per_device_max"]
    if bf16:
        assert read["breakdown"]["dp_comm"] < plain["breakdown"]["dp_comm"]
    else:
        assert read["step_time_s"] == plain["step_time_s"]


@pytest.mark.parametrize("compiled", [True, False])
def test_torchtitans_async_tp_is_read_and_priced_only_over_a_compiled_model(gplan, tmp_path, compiled):
    """torchtitan's async tensor parallel (its Qwen3-32B TOML at tp 2, with it switched on) was refused: read as
    --async-tp, tp's collectives pipelined with the matmuls; without the model compiled torchtitan refuses it, and
    so does gplan, naming its rule."""
    base = (CORPUS / "torchtitan" / "qwen3_32b.toml").read_text()
    assert "enable_async_tensor_parallel = false" in base and "[compile]\nenable = false" in base
    toml = tmp_path / "async.toml"
    toml.write_text(base.replace("enable_async_tensor_parallel = false", "enable_async_tensor_parallel = true")
                    .replace("[compile]\nenable = false", f"[compile]\nenable = {str(compiled).lower()}"))
    args = ("--cluster", "dgx-h100", "--devices", "16")
    if not compiled:
        r = gplan("estimate", "--from", str(toml), *args)
        assert r.code == 3 and "Async TP requires 'model' in --compile.components" in r.stderr and "hint:" in r.stderr
        return
    read = gplan("estimate", "--from", str(toml), *args, "--json").json()
    plain = gplan("estimate", "--from", str(CORPUS / "torchtitan" / "qwen3_32b.toml"), *args, "--json").json()
    assert read["engine_options"]["async_tp"] is True and read["parallel"]["tp"] == 2
    assert read["breakdown"]["tp_comm"] < plain["breakdown"]["tp_comm"] / 2


def test_an_async_tp_plan_is_written_back_into_a_toml_as_its_torchtitan_reads_it(gplan, tmp_path):
    """search --from a ≤ 0.2 TOML with --async-tp: the TOML written back switches it on where that torchtitan reads it
    ([parallelism]; 0.3 moved it to [compile]), compiles the model (a TOML array of components), and reads back as
    the plan, priced alike."""
    import tomllib

    plan_path, better = tmp_path / "plan.json", tmp_path / "better.toml"
    r = gplan("search", "--from", str(CORPUS / "torchtitan" / "qwen3_32b.toml"), "--cluster", "dgx-h100", "--devices",
              "16", "--tp", "2", "--async-tp", "--out", str(plan_path), "--out-launch", str(better))
    assert r.code == 0, r.stderr
    written = tomllib.loads(better.read_text())
    assert written["parallelism"]["enable_async_tensor_parallel"] is True
    assert written["compile"]["enable"] is True and "model" in written["compile"]["components"]
    assert "enable_async_tensor_parallel" not in written["compile"]
    back = gplan("estimate", "--from", str(better), "--cluster", "dgx-h100", "--devices", "16", "--json").json()
    assert back["engine_options"]["async_tp"] is True
    assert back["step_time_s"] == pytest.approx(json.loads(plan_path.read_text())["prediction"]["step_time_s"], rel=1e-9)


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_405b_registry_is_read_with_async_tp(gplan):
    """Its llama3_405b compiles the model with async tensor parallel (tp 8, float8): it was refused."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    registry = Path(spec.submodule_search_locations[0]) / "models" / "llama3" / "config_registry.py"
    launch = read_launch(Path(f"{registry}::llama3_405b"), None)
    assert launch.model.name == "llama3-405b" and launch.given["tp"] == 8
    assert launch.engine_options["async_tp"] is True and launch.engine_options["compiled_loss"] is True
    r = gplan("estimate", "--from", f"{registry}::llama3_405b", "--cluster", "dgx-h100", "--devices", "512")
    assert r.code == 0, r.stderr


def test_torchtitans_full_bf16_training_is_read_and_priced(gplan, tmp_path):
    """torchtitan's training.dtype = "bfloat16" (full-bf16 training, no fp32 copy: its 8×B200 long-context
    TOMLs run it): read as --pure-bf16 — the states at half their bytes, the same layout."""
    read, plain = estimated_with(gplan, tmp_path, "training", 'dtype = "bfloat16"')
    assert read["engine_options"]["pure_bf16"] is True and read["parallel"] == plain["parallel"]
    full, mixed = read["stages"][0]["memory"], plain["stages"][0]["memory"]
    for term in ("grads_bytes", "optimizer_bytes"):  # bf16 over fp32, sharded alike
        assert full[term] == pytest.approx(mixed[term] / 2, rel=1e-6)
    assert full["weights_bytes"] < mixed["weights_bytes"]
    assert read["memory_bytes_per_device_max"] < plain["memory_bytes_per_device_max"]


def test_torchtitans_optimizer_in_the_backward_is_read_priced_and_bounds_the_search(gplan, tmp_path):
    """torchtitan ≤ 0.2's optimizer.early_step_in_backward (its 8×B200 long-context TOMLs set it): read as
    --optimizer-in-backward — no gradients held; its search keeps torchtitan's rule (no pp, no ep, no
    accumulation); an export for 0.3.0, which dropped it, is refused naming that (exit 3, nothing written)."""
    read, plain = estimated_with(gplan, tmp_path, "optimizer", "early_step_in_backward = true")
    toml = tmp_path / "ds.toml"
    assert read["engine_options"]["optimizer_in_backward"] is True
    assert read["stages"][0]["memory"]["grads_bytes"] == 0 < plain["stages"][0]["memory"]["grads_bytes"]
    assert read["memory_bytes_per_device_max"] < plain["memory_bytes_per_device_max"]
    plan_path = tmp_path / "plan.json"
    found = gplan("search", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "16", "--top", "3",
                  "--out", str(plan_path), "--json")
    assert found.code == 0, found.stderr
    for ranked in found.json()["ranked"]:
        c = ranked["parallel"]
        assert c["pp"] == 1 and c["ep"] == 1 and c["dp"] * c["mbs"] == json.loads(plan_path.read_text())["training"]["gbs"]
    refused = gplan("export", str(plan_path), "--to", "torchtitan", "--out-dir", str(tmp_path / "tt"))
    assert refused.code == 3 and "early_step_in_backward" in refused.stderr and not (tmp_path / "tt").exists()


@pytest.mark.parametrize("argv, says", [
    (["--pp", "2", "--dp", "4"], "pp=2"), (["--dp", "8", "--ep", "8"], "ep=8"),
    (["--dp", "8", "--gbs", "64", "--mbs", "1"], "8 micro-batches"),
])
def test_the_optimizer_in_the_backward_where_torchtitan_refuses_it_is_refused(gplan, argv, says):
    r = gplan("estimate", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "8", "--target", "torchtitan",
              "--optimizer-in-backward", *argv)
    assert r.code == 3 and says in r.stderr and "--optimizer-in-backward" in r.stderr and "hint:" in r.stderr


@pytest.mark.parametrize("key", ["mixed_precision_reduce", "dtype"])
def test_a_training_dtype_gplan_does_not_price_is_refused_naming_it(gplan, tmp_path, key):
    toml = tmp_path / "ds.toml"
    toml.write_text((CORPUS / "torchtitan" / "deepseek_v3_16b.toml").read_text().replace(
        "[training]", f'[training]\n{key} = "float16"', 1))
    r = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 3 and f"training.{key} 'float16'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_gradient_reduce_dtype_gplan_does_not_price_is_refused_naming_it(gplan, tmp_path):
    toml = tmp_path / "ds.toml"
    toml.write_text((CORPUS / "torchtitan" / "deepseek_v3_16b.toml").read_text().replace(
        "[training]", '[training]\nmixed_precision_reduce = "float16"', 1))
    r = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 3 and "mixed_precision_reduce 'float16'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("backend, says", [("minimal_async_ep", "need expert parallelism"),
                                           ("deepep", "need expert parallelism"), ("nccl", "torchtitan's are standard")])
def test_a_token_exchange_gplan_does_not_price_is_refused_naming_it(gplan, tmp_path, backend, says):
    """An exchange torchtitan does not have, and its kernel exchanges at expert_parallel_degree 1, which its
    update_ep_token_dispatcher_config refuses: exit 3, torchtitan's rule named."""
    toml = tmp_path / "ds.toml"
    toml.write_text((CORPUS / "torchtitan" / "deepseek_v3_16b.toml").read_text().replace(
        "[parallelism]", f'[parallelism]\nexpert_parallel_comm_backend = "{backend}"', 1))
    r = gplan("estimate", "--from", str(toml), "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 3 and says in r.stderr and backend in r.stderr.lower()


def test_a_deepep_plan_exported_to_torchtitan_reads_back_with_deepep(gplan, tmp_path):
    """search --target torchtitan --moe-dispatcher flex → export (moe_comm_backend "deepep" in its config
    module) → --from gives the plan, dispatcher and step."""
    plan_path, out = tmp_path / "p.json", tmp_path / "tt"
    r = gplan("search", "deepseek-v3-16b", "--cluster", "dgx-h100", "--devices", "8", "--target", "torchtitan",
              "--moe-dispatcher", "flex", "--gbs", "64", "--seq-length", "4096", "--out", str(plan_path))
    assert r.code == 0, r.stderr
    assert gplan("export", str(plan_path), "--to", "torchtitan", "--out-dir", str(out)).code == 0
    assert "MOE_COMM_BACKEND = 'deepep'" in (out / "gplan_torchtitan.py").read_text()
    back = gplan("estimate", "--from", str(out / "torchtitan_train.sh"), "--cluster", "dgx-h100", "--json").json()
    plan = json.loads(plan_path.read_text())
    assert back["engine_options"]["moe_dispatcher"] == "flex"
    assert back["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-6)


def test_a_megatron_example_with_variables_arrays_and_branches_is_read_as_it_runs():
    """Megatron-LM's example scripts hold sizes in variables (`$(($NUM_LAYERS-1))` among them), flags in arrays
    (`"--vocab-size 102400"` one element, split where the array is expanded) and blocks behind `if` tests of
    their own variables: read as bash runs it — the fp8 and mock-data blocks its DTYPE and DATA_ARG rule out
    left out — and its model built from its flags, latent attention included."""
    launch = read_launch(CORPUS / "megatron_deepseek2_lite_h100.sh", None)
    m = launch.model
    assert launch.precision == "bf16" and launch.world_size == 8
    assert (m.num_layers, m.first_dense_layers, m.num_experts, m.top_k, m.vocab_size) == (16, 1, 64, 6, 102400)
    assert (m.q_lora_rank, m.kv_lora_rank, m.kv_channels, m.qk_rope_head_dim, m.v_head_dim) == (None, 512, 128, 64, 128)
    assert m.is_mla and m.num_kv_heads == m.num_attention_heads == 16


def test_script_variables_arithmetic_and_branches_are_expanded_as_bash_would():
    from gplan.launch_text import arguments

    text = ('N=${N:-4}\nM=$(( N * 2 + 1 ))\nMODE=fast\nif [[ "$MODE" == "slow" ]]; then\n  A=(--x 1)\nelif [[ -z "$MODE" ]]; '
            'then\n  A=(--x 2)\nelse\n  A=(--x 3)\nfi\nif [[ "$UNSET" == 1 ]]; then\n  B=(--y 7)\nfi\n'
            'run ${A[@]} ${B[@]} --n $N --m ${M} --k ${K:-5} --q $Q "--split 9,1"\n')
    args, variables = arguments(text)
    assert (variables["N"], variables["M"]) == ("4", "9")
    assert args["--x"] == ["3"]  # the branch its own MODE takes
    assert args["--y"] == ["7"]  # a test of a variable the script does not set: read, as gplan cannot decide it
    assert (args["--n"], args["--m"], args["--k"], args["--split"]) == (["4"], ["9"], ["5"], ["9,1"])
    assert args["--q"] == ["$Q"]  # unset, no default: left as written, refused where it is needed
    # a comment's trailing backslash continues nothing: the flag after it is read, the commented one is not
    args, _ = arguments("ARGS=(\n  # --log-interval 1 \\\n  --eval-iters 10 \\\n  --no-load-rng\n)\n")
    assert args == {"--eval-iters": ["10"], "--no-load-rng": []}


def test_flags_in_string_variables_run_by_eval_with_positional_arguments_are_read_as_bash_runs_them(tmp_path):
    """Pai-Megatron-Patch's launches: settings as the script's arguments ($1, ${10}), flags in quoted strings set
    in the branch those arguments choose, read where the string is expanded into the command (a `run_cmd` spanning
    lines, run by `eval`) and not where it is assigned; `[ … -gt … ]`, `$(( c ? a : b ))` and `-z` of a variable
    nothing sets decided as bash decides them. An environment prefix on the calling line reaches the script."""
    from gplan.launch_text import arguments
    from gplan.launch_text import called_script

    script = ('SIZE=$1\nTP=${2}\nif [ $SIZE = small ]; then\n  shape=" \\\n    --num-layers 4 \\\n    --hidden-size 8"\n'
              'elif [ $SIZE = big ]; then\n  shape=" \\\n    --num-layers 96 \\\n    --hidden-size 512"\nfi\n'
              'unused=" --never-run 1"\nOVERLAP=$(( ($TP > 1) ? 1 : 0 ))\n'
              'if [ $OVERLAP -eq 1 ] && [ $TP -gt 1 ]; then\n  tp_option=" --sequence-parallel"\nfi\n'
              'if [ -z ${VP} ]; then\n  vp_option=""\nelse\n  vp_option=" --vp ${VP}"\nfi\n'
              'run_cmd="torchrun pretrain.py\n ${shape} --tensor-model-parallel-size ${TP} \\\n ${tp_option} ${vp_option}"\n'
              'echo ${run_cmd}\neval ${run_cmd}\n')
    args, variables = arguments(script, ["big", "4"])
    assert args == {"--num-layers": ["96"], "--hidden-size": ["512"], "--tensor-model-parallel-size": ["4"],
                    "--sequence-parallel": []}
    assert variables["OVERLAP"] == "1"
    args, _ = arguments(script, ["small", "1"], {"VP": "2"})
    assert args == {"--num-layers": ["4"], "--hidden-size": ["8"], "--tensor-model-parallel-size": ["1"], "--vp": ["2"]}
    (tmp_path / "train.sh").write_text(script)
    (tmp_path / "job.sh").write_text("cd /somewhere\nVP=3 sh train.sh \\\n  big \\\n  8  # the job's line\n")
    found, positional, environment = called_script(tmp_path / "job.sh", (tmp_path / "job.sh").read_text())
    assert found.name == "train.sh" and positional == ["big", "8"] and environment["VP"] == "3"
    (tmp_path / "two.sh").write_text("sh train.sh big 8\nsh train.sh small 1\n")
    assert called_script(tmp_path / "two.sh", (tmp_path / "two.sh").read_text()) is None


def test_a_line_that_runs_a_script_with_its_layout_as_arguments_is_not_rewritten(gplan, tmp_path):
    """gplan rewrites flags, not a script's positional arguments: --out-launch is refused naming the script, and
    nothing is written."""
    better = tmp_path / "better.sh"
    r = gplan("search", "--from", str(CORPUS / "pai_megatron" / "pretrain_qwen3_a3b.sh"), "--cluster", "dgx-h100",
              "--devices", "32", "--out", str(tmp_path / "plan.json"), "--out-launch", str(better))
    assert r.code == 3 and "run_mcore_qwen3.sh" in r.stderr and "hint:" in r.stderr and not better.exists()


def test_a_launch_accumulating_over_runs_of_its_pipeline_schedule_pays_the_fill_and_drain_each_run(gplan, tmp_path):
    """torchtitan and NeMo AutoModel run the pipeline schedule once per local batch and accumulate gradients across
    runs: a global batch of twice the local batch on each data-parallel rank runs it twice a step, each run with its
    own fill and drain — the bubble doubles with the micro-batches' compute (one schedule over all of them, as
    gplan's exports write it, pays it once)."""
    import yaml

    recipe = yaml.safe_load((CORPUS / "nemo_automodel" / "kimi_k2_benchmark_32nodes.yaml").read_text())
    runs = {}
    for gbs in (256, 512):  # dp 32 × local 8: one run, then two
        recipe["step_scheduler"]["global_batch_size"] = gbs
        path = tmp_path / f"recipe_{gbs}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        r = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100", "--devices", "256", "--json")
        assert r.code == 0, r.stderr
        runs[gbs] = r.json()
    one, two = runs[256], runs[512]
    assert one["parallel"].get("schedule_runs", 1) == 1 and two["parallel"]["schedule_runs"] == 2
    assert two["breakdown"]["compute"] == pytest.approx(2 * one["breakdown"]["compute"], rel=1e-9)
    assert two["breakdown"]["bubble"] == pytest.approx(2 * one["breakdown"]["bubble"], rel=1e-9)
    assert two["breakdown"]["bubble"] > 0


def test_estimate_from_a_launch_refuses_a_layout_flag_it_would_drop(gplan):
    """estimate --from prices the launch's own layout: a --tp (or --zero, --mbs …) beside it was dropped without a
    word; now refused in one line naming the flag, pointing to search --from, nothing on stdout."""
    toml = CORPUS / "torchtitan" / "deepseek_v3_16b.toml"
    for flag in (["--tp", "2"], ["--zero", "1"], ["--mbs", "2"]):
        r = gplan("estimate", "--from", str(toml), "--devices", "8", "--cluster", "dgx-h100", *flag)
        assert r.code == 2 and f"{flag[0]} with --from" in r.stderr and "gplan search --from" in r.stderr, r.stderr
        assert r.stdout == "" and "Traceback" not in r.stderr


def test_estimate_from_a_launch_prices_the_engine_options_the_command_line_sets_over_it(gplan):
    """torchtitan 0.3 runs the loss in 8 chunks where a TOML (≤ 0.2) reads as 1: `--loss-chunks 8` beside --from was
    ignored; now it is priced over the launch (the whole logits no longer held) and said with the launch's value,
    as is a --gbs (more micro-batches, a longer step)."""
    toml = str(CORPUS / "torchtitan" / "deepseek_v3_16b.toml")
    base = ["estimate", "--from", toml, "--devices", "8", "--cluster", "dgx-h100", "--json"]
    plain, chunked, doubled = (json.loads(gplan(*base, *extra).stdout)["data"]
                               for extra in ([], ["--loss-chunks", "8"], ["--gbs", "128"]))
    peak = lambda d: max(s["memory_bytes"] for s in d["stages"])
    assert plain["overridden"] == {} and chunked["overridden"] == {"loss_chunks": 1}
    assert peak(chunked) < peak(plain) and chunked["engine_options"]["loss_chunks"] == 8
    assert doubled["overridden"] == {"gbs": round(plain["tokens_per_s"] * plain["step_time_s"] / 4096)}
    assert doubled["step_time_s"] > 1.8 * plain["step_time_s"]
    said = gplan(*base[:-1], "--loss-chunks", "8")
    assert said.code == 0 and "over the launch: --loss-chunks 8 (the launch's: 1)" in said.stderr + said.stdout


def test_search_from_prices_the_launch_beside_it_with_the_options_the_search_runs(gplan, tmp_path):
    """search --from --loss-chunks 8 searched with eight chunks but showed your launch priced with its TOML's one:
    the two sides of its comparison now share the command line's options."""
    toml = str(CORPUS / "torchtitan" / "deepseek_v3_16b.toml")
    peaks = []
    for extra in ([], ["--loss-chunks", "8"]):
        r = gplan("search", "--from", toml, "--devices", "8", "--cluster", "dgx-h100", "--out", str(tmp_path / "p.json"),
                  "--json", *extra)
        assert r.code == 0, r.stderr
        yours = json.loads(r.stdout)["data"]["from"]["prediction"]
        peaks.append(max(s["memory_bytes"] for s in yours["stages"]))
    assert peaks[1] < peaks[0] * 0.8


def registry_copy(tmp_path: Path) -> Path:
    """The corpus's config registry where torchtitan keeps one: models/deepseek_v3/config_registry.py."""
    folder = tmp_path / "deepseek_v3"
    folder.mkdir()
    (folder / "config_registry.py").write_text((CORPUS / "torchtitan" / "config_registry.py").read_text())
    return folder / "config_registry.py"


@pytest.mark.parametrize("function, expected", [
    ("moe_16b", {"ep": 8, "mbs": 4, "recompute": "selective", "chunks": 8, "dispatcher": "alltoall", "compiled": True}),
    ("moe_16b_deepep_full_ac", {"ep": 8, "mbs": 8, "recompute": "full", "chunks": 1, "dispatcher": "flex",
                                "compiled": True}),
    ("moe_16b_two_chunks", {"ep": 8, "mbs": 4, "recompute": "selective", "chunks": 2, "dispatcher": "alltoall",
                            "compiled": True}),
    ("moe_16b_ep1_graphed", {"ep": 1, "mbs": 4, "recompute": "selective", "chunks": 8, "dispatcher": "alltoall",
                             "compiled": True, "graphs": "full_iteration"}),
    ("moe_16b_float8", {"ep": 8, "mbs": 4, "recompute": "selective", "chunks": 8, "dispatcher": "alltoall",
                        "compiled": True}),
])
def test_a_torchtitan_03_config_registry_function_is_read_as_its_trainer_config(gplan, tmp_path, function, expected):
    """torchtitan 0.3 has no job TOMLs: `--module deepseek_v3 --config NAME` runs a function of the module's
    config_registry.py. `--from config_registry.py::NAME` reads it without importing torchtitan — its sections,
    a derived function's changes, 0.3's defaults (per-op checkpointing; the loss whole unless ChunkedLossWrapper
    chunks it, 8 by default) — and its model from the module and flavor."""
    path = registry_copy(tmp_path)
    r = gplan("estimate", "--from", f"{path}::{function}", "--cluster", "dgx-h100", "--devices", "8", "--json")
    assert r.code == 0, r.stderr
    out = r.json()
    assert out["model_from_launch"].startswith("deepseek-v3-16b")
    assert {k: out["parallel"][k] for k in ("ep", "mbs", "recompute")} == {k: expected[k] for k in ("ep", "mbs", "recompute")}
    options = out["engine_options"]
    assert options.get("loss_chunks", 8) == expected["chunks"]
    assert options["moe_dispatcher"] == expected["dispatcher"] and bool(options.get("compiled_loss")) == expected["compiled"]
    assert options.get("cuda_graphs", "none") == expected.get("graphs", "none")  # 0.3's default where it captures


def test_a_registry_converting_the_experts_to_float8_is_priced_in_the_recipe(gplan, tmp_path):
    """0.3's Float8GroupedExpertsConverter beside the linears' converter (its deepseek_v3_671b_float8): the routed
    experts' grouped GEMMs in fp8 too, faster than the same layout in bf16."""
    path = registry_copy(tmp_path)
    steps = {}
    for function in ("moe_16b", "moe_16b_float8"):
        r = gplan("estimate", "--from", f"{path}::{function}", "--cluster", "dgx-h100", "--devices", "8", "--json")
        assert r.code == 0, r.stderr
        steps[function] = r.json()["step_time_s"]
    header = " ".join(gplan("estimate", "--from", f"{path}::moe_16b_float8", "--cluster", "dgx-h100", "--devices",
                            "8").stderr.split())
    assert "= 128k tokens/step, fp8" in header and steps["moe_16b_float8"] < steps["moe_16b"]


@pytest.mark.parametrize("function, said", [
    ("moe_16b_computed_batch", "training.local_batch_size is computed (2 * 4)"),
    # the helper is followed (its body run on the config): what it adds is a module override gplan does not price
    ("moe_16b_changed_by_a_helper", "override.imports my.override: a module override gplan does not price"),
    ("moe_16b_changed_by_a_branch", "changes the config in a way gplan does not follow"),
    ("moe_16b_muon", "muon_optimizer(lr=0.0003) is not Adam"),  # its states and step are not Adam's
    ("no_such_config", "no function 'no_such_config'"),
    ("moe_16b_nvfp4", "model.converters 'nvfp4linearconverter'"),  # priced as bf16 it would be a silent answer
    ("moe_16b_graphed", "--cuda-graphs full_iteration with ep=8"),  # Trainer.Config._validate_cuda_graphs refuses it
    # float8 linears without the grouped-experts converter: the experts would train in BF16 under an fp8 price
    ("moe_16b_float8_linears_only", "routed experts stay in BF16 under fp8"),
])
def test_a_registry_function_gplan_cannot_follow_is_refused_in_one_line(gplan, tmp_path, function, said):
    path = registry_copy(tmp_path)
    r = gplan("estimate", "--from", f"{path}::{function}", "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 3 and said in r.stderr and r.stdout == "" and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1


def test_a_registry_without_a_function_named_lists_its_configs(gplan, tmp_path):
    path = registry_copy(tmp_path)
    r = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 3 and "a torchtitan 0.3 config registry" in r.stderr
    assert "moe_16b_deepep_full_ac" in r.stderr and "add_override" not in r.stderr.split("hint:")[1]


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_installed_registry_is_read():
    """The registry torchtitan 0.3.0 installs (models/qwen3/config_registry.py::qwen3_30b_a3b): FSDP over every
    rank, local batch 2 at 4096 tokens, every block checkpointed (FullAC), the loss in ChunkedLossWrapper's chunks."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    registry = Path(spec.submodule_search_locations[0]) / "models" / "qwen3" / "config_registry.py"
    launch = read_launch(Path(f"{registry}::qwen3_30b_a3b"), None)
    assert launch.model.name == "qwen3-30b-a3b" and launch.engine == "torchtitan"
    assert launch.given["recompute"] == "full" and launch.given["mbs"] == 2 and launch.seq_length == 4096
    assert launch.engine_options.get("loss_chunks", 8) == 8


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_sft_registry_is_read_past_its_sample_processor(gplan):
    """Its sft_qwen3_8b_math defines the dataset's sample processor inside the function (a `def`, which changes
    no key): read and priced — was refused as a change gplan does not follow — with the processor among the keys
    not read and its per-document (varlen) attention said as priced over the whole sequence."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    registry = Path(spec.submodule_search_locations[0]) / "models" / "qwen3" / "config_registry.py"
    launch = read_launch(Path(f"{registry}::sft_qwen3_8b_math"), None)
    assert launch.model.name == "qwen3-8b" and launch.seq_length == 2048 and launch.given["mbs"] == 1
    assert "dataloader.sample_processor" in launch.unread
    assert any(note.startswith("(model.attn_backend varlen: attention masked per document") for note in launch.unread)
    r = gplan("estimate", "--from", f"{registry}::sft_qwen3_8b_math", "--cluster", "dgx-h100", "--devices", "8")
    assert r.code == 0, r.stderr


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_float8_deepseek_registry_is_read_with_its_experts_in_fp8():
    """Its deepseek_v3_671b_float8 converts the linears and the routed experts' grouped GEMMs: read in fp8 (it was
    refused as training its experts in BF16)."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    registry = Path(spec.submodule_search_locations[0]) / "models" / "deepseek_v3" / "config_registry.py"
    launch = read_launch(Path(f"{registry}::deepseek_v3_671b_float8"), None)
    assert launch.model.name == "deepseek-v3" and launch.precision == "fp8"


def installed_deepseek_registry() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    return Path(spec.submodule_search_locations[0]) / "models" / "deepseek_v3" / "config_registry.py"


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_hybridep_registry_is_priced_with_its_capacity_and_graphs(gplan):
    """Its deepseek_v3_16b_hybridep (HybridEP at non_blocking_capacity_factor 1.0, CUDA graphs on, ep 8) was refused;
    it is priced as deepseek_v3_16b's layout with the experts' input allocated for the worst case — more memory —
    and without the host time its graphs remove."""
    registry = installed_deepseek_registry()
    runs = {name: gplan("estimate", "--from", f"{registry}::{name}", "--cluster", "dgx-h100", "--devices", "8", "--json")
            for name in ("deepseek_v3_16b", "deepseek_v3_16b_hybridep")}
    assert all(r.code == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    plain, hybrid = (runs[name].json() for name in ("deepseek_v3_16b", "deepseek_v3_16b_hybridep"))
    assert plain["parallel"] == hybrid["parallel"] and hybrid["parallel"]["ep"] == 8
    assert hybrid["engine_options"] == {**plain["engine_options"], "moe_dispatcher": "flex",
                                        "moe_dispatch_capacity": 1.0, "cuda_graphs": "full_iteration"}
    assert hybrid["memory_bytes_per_device_max"] > plain["memory_bytes_per_device_max"]
    assert hybrid["step_time_s"] < plain["step_time_s"]


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_minimal_async_ep_registry_is_read_and_run_as_its_launcher_runs_it(gplan, tmp_path):
    """Its deepseek_v3_16b_minimal_async_ep follows enable_fused_swiglu (said) and sets every degree to 1, which
    torchtitan itself refuses (MinimalAsyncEP "requires expert parallelism"): refused so, exit 3. Run as its
    launcher would — ep 8 over 8 FSDP ranks, `activation-checkpoint:full` — it is priced with MinimalAsyncEP and
    0.3's graphs; without full recompute, refused with torchtitan's rule. torchtitan's own parser reads the same
    arguments the same way (FullAC, its buffer sized for the local batch gplan prices)."""
    from torchtitan.config.manager import ConfigManager
    from torchtitan.models.common.token_dispatcher import update_ep_token_dispatcher_config

    registry = installed_deepseek_registry()
    as_written = gplan("estimate", "--from", f"{registry}::deepseek_v3_16b_minimal_async_ep", "--cluster", "dgx-h100")
    assert as_written.code == 3 and "need expert parallelism" in as_written.stderr
    arguments = ["--module", "deepseek_v3", "--config", "deepseek_v3_16b_minimal_async_ep",
                 "--parallelism.expert_parallel_degree", "8", "--parallelism.data_parallel_shard_degree", "8"]
    for recompute in ("full", "selective"):
        script = tmp_path / f"{recompute}.sh"
        script.write_text(f"#!/bin/bash\nNGPU=8 ./run_train.sh {' '.join(arguments)} activation-checkpoint:{recompute}\n")
        r = gplan("estimate", "--from", str(script), "--cluster", "dgx-h100", "--json")
        if recompute == "selective":
            assert r.code == 3 and "MinimalAsyncEP requires full recompute" in r.stderr
            continue
        assert r.code == 0, r.stderr
        priced = r.json()
        assert (priced["parallel"]["ep"], priced["parallel"]["recompute"]) == (8, "full")
        assert priced["engine_options"]["moe_dispatcher"] == "symmetric_memory"
        assert priced["engine_options"]["cuda_graphs"] == "full_iteration"
        said = " ".join(" ".join(priced["not_read"]).split())
        assert "override.imports: the dense SwiGLU and the routed experts' SwiGLU fused" in said
        config = ConfigManager().parse_args([*arguments, f"activation-checkpoint:{recompute}"])
        update_ep_token_dispatcher_config(config.model_spec.model, config)
        dispatcher = next(layer.moe.routed_experts.token_dispatcher for layer in config.model_spec.model.layers
                          if getattr(layer, "moe", None))
        assert dispatcher.num_max_tokens_per_rank == priced["parallel"]["mbs"] * 4096
        assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


@requires_engine("torchtitan", "dev")
def test_torchtitans_own_muon_registries_are_refused_naming_the_optimizer(gplan):
    """Its kimi_k2_7 registries (Moonlight 16B-A3B, Kimi K2.5) return their own Trainer.Config subclass and train with
    DistMuon: read as a Trainer.Config, they are refused for the optimizer gplan does not price (given a model
    of the shape), exit 3 — not priced as Adam."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    registry = Path(spec.submodule_search_locations[0]) / "models" / "kimi_k2_7" / "config_registry.py"
    r = gplan("estimate", "deepseek-v3-16b", "--from", f"{registry}::moonlight_16b_a3b", "--cluster", "dgx-h100",
              "--devices", "64")
    assert r.code == 3 and "_dist_muon_optimizer" in r.stderr and "is not Adam" in r.stderr


def test_a_registry_is_not_rewritten_in_place_and_nothing_is_written(gplan, tmp_path):
    path = registry_copy(tmp_path)
    r = gplan("search", "--from", f"{path}::moe_16b", "--cluster", "dgx-h100", "--devices", "8",
              "--out", str(tmp_path / "p.json"), "--out-launch", str(tmp_path / "better.py"))
    assert r.code == 3 and "config registry keeps its layout in its function" in r.stderr
    assert "gplan export PLAN --to torchtitan" in r.stderr
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "better.py").exists()


def test_a_03_launch_script_reads_its_registry_function_with_its_overrides(gplan, tmp_path, monkeypatch):
    """`MODULE=deepseek_v3 CONFIG=moe_16b ./run_train.sh --parallelism.… …` in a torchtitan checkout: the registry
    function under torchtitan/models/deepseek_v3/, the script's overrides over it, NGPU its ranks; outside a
    checkout the installed torchtitan's registry, said; without one either, the script is asked for the registry's
    function."""
    folder = tmp_path / "torchtitan" / "models" / "deepseek_v3"
    folder.mkdir(parents=True)
    (folder / "config_registry.py").write_text((CORPUS / "torchtitan" / "config_registry.py").read_text())
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nNGPU=8 MODULE=deepseek_v3 CONFIG=moe_16b ./run_train.sh "
                      "--parallelism.expert_parallel_degree 4 --training.local_batch_size 2\n")
    r = gplan("estimate", "--from", str(script), "--cluster", "dgx-h100", "--json")
    assert r.code == 0, r.stderr
    parallel = r.json()["parallel"]
    assert (parallel["ep"], parallel["mbs"], parallel["recompute"]) == (4, 2, "selective")
    assert parallel["dp"] * parallel["tp"] * parallel["pp"] * parallel["cp"] == 8
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "train.sh").write_text("torchrun --nproc_per_node 8 -m torchtitan.train --module qwen3 --config "
                                      "qwen3_30b_a3b\n")
    from gplan.engines.torchtitan import launch

    installed = launch.installed_torchtitan()
    if installed:  # torchtitan's own registry, from the installed package (its dev extra), the file said
        read = gplan("estimate", "--from", str(outside / "train.sh"), "--cluster", "dgx-h100")
        registry = installed[0] / "torchtitan" / "models" / "qwen3" / "config_registry.py"
        assert read.code == 0 and f"readfrom{registry}" in "".join(read.stderr.split()), read.stderr
    monkeypatch.setattr(launch, "installed_torchtitan", lambda: [])
    refused = gplan("estimate", "--from", str(outside / "train.sh"), "--cluster", "dgx-h100")
    assert refused.code == 3 and "config_registry.py::qwen3_30b_a3b" in refused.stderr


def test_gplans_own_03_export_is_read_with_its_module_not_as_a_registry(gplan, tmp_path):
    """gplan's torchtitan export runs `--module gplan_torchtitan --config gplan_plan` with its config module beside:
    read as before (its overrides and module constants), never looked up as a torchtitan checkout's registry."""
    from gplan.profiles.catalogue import load_model

    from gplan.planner.build import make_plan
    from gplan.profiles.catalogue import load_cluster
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.training import TrainingSpec

    plan = make_plan(load_model("qwen3-30b-a3b"), TrainingSpec(gbs=64, seq_length=4096, engine="torchtitan"),
                     load_cluster("dgx-h100", 8), ParallelConfig(dp=8, ep=8, zero=3), None)
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    assert gplan("export", str(tmp_path / "plan.json"), "--to", "torchtitan", "--out-dir", str(tmp_path / "tt")).code == 0
    assert "--module gplan_torchtitan" in (tmp_path / "tt" / "torchtitan_train.sh").read_text()
    back = gplan("estimate", "--from", str(tmp_path / "tt" / "torchtitan_train.sh"), "--cluster", "dgx-h100", "--json")
    assert back.code == 0, back.stderr
    assert back.json()["parallel"]["ep"] == 8


MF_HF_STYLE = """\
train_dataset:
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    config:
      seq_length: 4096
runner_config:
  batch_size: 1
parallel_config:
  data_parallel: 1
  model_parallel: 4
  pipeline_stage: 4
  micro_batch_num: 16
  expert_parallel: 4
  use_seq_parallel: True
parallel:
  strategy_ckpt_config:
    save_file: "./ckpt_strategy.ckpt"
    only_trainable_params: False
model:
  model_config:
    model_type: "qwen3_moe"
    vocab_size: 151936
    hidden_size: 2048
    intermediate_size: 6144
    num_hidden_layers: 48
    max_position_embeddings: 40960
    num_attention_heads: 32
    num_key_value_heads: 4
    head_dim: 128
    rms_norm_eps: 1.e-6
    tie_word_embeddings: False
    rope_theta: 1000000
    compute_dtype: "bfloat16"
    num_experts: 128
    num_experts_per_tok: 8
    moe_intermediate_size: 768
"""


def test_a_mindformers_mcore_config_states_its_model_in_hugging_faces_names(tmp_path):
    """MindFormers 1.6+'s mcore configs (its qwen3_moe/pretrain_qwen3_30b_a3b_4k.yaml, as trimmed here) give the
    model in Hugging Face's names with a model_type and the sequence in the dataset's config: read as that config.json
    would be, the model need not be retyped; a strategy checkpoint's sub-keys have no effect."""
    path = tmp_path / "pretrain_qwen3_30b_a3b_4k.yaml"
    path.write_text(MF_HF_STYLE)
    launch = read_launch(path, None)
    assert launch.engine == "mindformers" and launch.seq_length == 4096
    m = launch.model
    assert (m.num_layers, m.hidden_size, m.num_experts, m.top_k, m.expert_ffn_size, m.kv_heads) == (48, 2048, 128, 8, 768, 4)
    assert (launch.given["tp"], launch.given["pp"], launch.given["ep"]) == (4, 4, 4)
    assert "parallel.strategy_ckpt_config.save_file" in launch.no_effect


def test_a_mindformers_model_config_left_to_its_class_defaults_takes_them_and_says_which(gplan, tmp_path):
    """MindFormers builds a field its model_config leaves out at its config class's default (Qwen3MoeConfig: 32
    heads); gplan takes the same and names each one taken beside the prediction."""
    path = tmp_path / "pretrain.yaml"
    path.write_text(MF_HF_STYLE.replace("    num_attention_heads: 32\n", "").replace("    num_key_value_heads: 4\n", ""))
    r = gplan("estimate", "--from", str(path), "--cluster", "atlas-800-910b", "--devices", "16", "--json")
    assert r.code == 0, r.stderr
    said = r.json()["model_from_launch"]
    assert "num_attention_heads 32" in said and "num_key_value_heads 4" in said and "hidden_size" not in said


def test_a_mindformers_model_config_with_no_class_defaults_known_asks_for_the_model(gplan, tmp_path):
    path = tmp_path / "pretrain.yaml"
    path.write_text(MF_HF_STYLE.replace('model_type: "qwen3_moe"', 'model_type: "qwen3"')
                    .replace("    num_attention_heads: 32\n", ""))
    r = gplan("estimate", "--from", str(path), "--cluster", "atlas-800-910b", "--devices", "16")
    assert r.code == 3 and "num_attention_heads" in r.stderr and "name the model" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr


def mf_yaml(tmp_path, parallel: str = "", context: str = "", optimizer: str = "") -> Path:
    """MF_HF_STYLE with a `parallel:` section's lines, a context and an optimizer section added."""
    text = MF_HF_STYLE.replace("parallel:\n", "parallel:\n" + parallel) + context + optimizer
    path = tmp_path / "pretrain.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("scheduler, code, said, chunks", [
    ("1f1b", 0, "1F1B", 1), ("seqpipe", 0, "seq_split_num 1", 1),
    ("seqsmartvpp", 0, "pp_interleave_num 1), 1F1B", 1), ("seqvpp", 0, "pp_interleave_num 1), 1F1B", 1),
    # with chunks their order (holding less than interleaved 1F1B) is not priced
    ("seqsmartvpp", 3, "seqsmartvpp schedule with pp_interleave_num 2", 2),
    ("zero_bubble_v", 3, "zero_bubble_v pipeline schedule", 1)])
def test_mindspores_pipeline_scheduler_is_read_and_one_gplan_does_not_price_refused(gplan, tmp_path, scheduler, code,
                                                                                    said, chunks):
    path = mf_yaml(tmp_path, f"  pipeline_config:\n    pipeline_interleave: {chunks > 1}\n    pipeline_scheduler: {scheduler}\n")
    if chunks > 1:
        path.write_text(path.read_text().replace("  model_config:\n", f"  model_config:\n    pp_interleave_num: {chunks}\n"))
    r = gplan("estimate", "--from", str(path), "--cluster", "atlas-800-910b", "--json")
    assert r.code == code, r.stderr
    if code:
        assert said in r.stderr and len(r.stderr.strip().splitlines()) == 2, r.stderr
    else:
        assert said in r.json()["no_effect"]["parallel.pipeline_config.pipeline_scheduler"]
        assert r.json()["parallel"]["schedule"] == "1f1b"


def test_a_gpipe_schedule_is_read_as_gpipe_and_refused_as_mindformers_runs_only_1f1b(gplan, tmp_path):
    path = mf_yaml(tmp_path, "  pipeline_config:\n    pipeline_scheduler: gpipe\n")
    r = gplan("estimate", "--from", str(path), "--cluster", "atlas-800-910b")
    assert r.code == 3 and "gpipe" in r.stderr, r.stderr
    assert read_launch(path, None).given["schedule"] == "gpipe"


def test_an_ascend_yaml_is_priced_on_ascend_unless_the_command_line_names_a_cluster(gplan, tmp_path):
    path = mf_yaml(tmp_path, context='context:\n  device_target: "Ascend"\n')
    own = gplan("estimate", "--from", str(path))
    assert own.code == 0 and "cluster atlas-800-910b (its context.device_target: Ascend" in " ".join(own.stderr.split())
    named = gplan("estimate", "--from", str(path), "--cluster", "dgx-h100")
    assert named.code == 0 and "cluster dgx-h100;" in " ".join(named.stderr.split()), named.stderr


def test_mindformers_swapped_optimizer_is_said_with_what_it_leaves_over_priced(tmp_path):
    launch = read_launch(mf_yaml(tmp_path, optimizer="optimizer:\n  type: AdamW\n  swap: True\n"), None)
    assert "over-priced by 8 bytes a parameter" in launch.no_effect["optimizer.swap"]
    assert "optimizer.swap" not in read_launch(mf_yaml(tmp_path, optimizer="optimizer:\n  swap: False\n"), None).no_effect


@pytest.mark.parametrize("size, said", [(256, False), (-1, False), (1, False), (2, True)])
def test_an_optimizer_shard_below_the_data_parallel_ranks_is_said(tmp_path, size, said):
    """`optimizer_weight_shard_size` over fewer ranks than dp leaves optimizer memory under-priced, said; at or above
    dp (its DeepSeek-V3 recipe: 256 over dp 4) MindSpore shards over all of them, as priced."""
    text = MF_HF_STYLE.replace("data_parallel: 1", "data_parallel: 4").replace(
        "parallel:\n", f"parallel:\n  parallel_optimizer_config:\n    optimizer_weight_shard_size: {size}\n")
    path = tmp_path / "pretrain.yaml"
    path.write_text(text)
    note = read_launch(path, None).no_effect.get("parallel.parallel_optimizer_config.optimizer_weight_shard_size", "")
    assert ("under-priced 2×" in note) == said


@requires_engine("mindformers", "dev")
def test_mindformers_own_installed_moe_recipe_is_read():
    """The Qwen3-30B-A3B pretraining recipe MindFormers 2.x installs (configs/qwen3_moe), read without a model named."""
    configs = mindformers_configs()
    launch = read_launch(configs / "qwen3_moe" / "pretrain_qwen3_30b_a3b_4k.yaml", None)
    assert launch.model.num_experts == 128 and launch.given["ep"] == 4 and launch.seq_length == 4096


@requires_engine("mindformers", "dev")
def test_mindformers_own_deepseek_v3_671b_recipe_is_read_and_priced_as_it_runs(gplan):
    """Its pretrain_deepseek3_671b.yaml leaves DeepSeek-V3's shape to DeepseekV3Config's defaults (128 heads, 256
    experts, 3 dense layers first) and splits 61 layers over pp 8 × 2 chunks by per-chunk offsets: 4 layers a chunk,
    the last stage's second chunk 1 (offset -2) — read as MindFormers builds it, not refused as uneven."""
    configs = mindformers_configs()
    path = configs / "deepseek3" / "pretrain_deepseek3_671b.yaml"
    launch = read_launch(path, None)
    m = launch.model
    assert (m.num_layers, m.num_attention_heads, m.num_experts, m.top_k, m.first_dense_layers) == (61, 128, 256, 8, 3)
    assert launch.stage_sizes == [8] * 7 + [5] and launch.given["vpp"] == 2
    r = gplan("estimate", "--from", str(path), "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["parallel"] | {} and (data["parallel"]["ep"], data["parallel"]["vpp"]) == (32, 2)
    assert [s["num_layers"] for s in data["stages"]] == [8] * 7 + [5] and data["recompute_run"] == "full"
    assert "first_k_dense_replace 3" in data["model_from_launch"] and "optimizer.swap" in data["no_effect"]


@requires_engine("mindformers", "dev")
def test_mindformers_own_telechat3_moe_recipe_is_priced_with_its_schedule(gplan, tmp_path):
    """Its TeleChat3-MoE 105B recipe reads (DeepSeek-V3's blocks, MindFormers' `fusedswiglu`); MindSpore's seqsmartvpp
    with one chunk a rank and nothing split runs as 1F1B: priced as the same recipe with 1f1b is, the optimizer
    parallel's whole weights said beside it."""
    configs = mindformers_configs()
    path = configs / "telechat3_moe" / "pretrain_telechat3_105b_a4b_4k.yaml"
    r = gplan("estimate", "--from", str(path), "--json")
    assert r.code == 0, r.stderr
    one = tmp_path / "telechat3.yaml"
    one.write_text(path.read_text().replace("pipeline_scheduler: seqsmartvpp", "pipeline_scheduler: 1f1b"))
    same = gplan("estimate", "--from", str(one), "--json")
    assert r.json()["step_time_s"] == same.json()["step_time_s"] and r.json()["parallel"]["schedule"] == "1f1b"
    assert any("weights whole" in note for note in r.json()["not_read"])
    launch = read_launch(one, None)
    assert (launch.model.num_experts, launch.model.ffn_kind, launch.model.is_mla) == (192, "swiglu", True)


def test_the_modules_selective_layers_recompute_are_said_only_where_both_sides_recompute_selectively():
    """torchtitan's per-op launch against a best plan recomputing nothing: the change said is the recompute
    (`selective(op) → none`), not the modules no layer of the plan recomputes (search --from printed
    `recompute_modules op → core_attn` beside it); between two selective plans the modules are said."""
    from gplan.planner.launch import differences
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import ParallelConfig, layout_from_sizes

    model = load_model("llama3-8b")
    per_op = ParallelConfig(dp=8, recompute="selective", recompute_modules=("op",))
    plain = ParallelConfig(dp=8, recompute="none")
    changed = differences(per_op, plain, layout_from_sizes(model, [32], ["selective"]),
                          layout_from_sizes(model, [32], ["none"]))
    assert changed["recompute"] == ("selective(op)", "none") and "recompute_modules" not in changed
    core = ParallelConfig(dp=8, recompute="selective")
    assert differences(per_op, core)["recompute_modules"] == ("op", "core_attn")
