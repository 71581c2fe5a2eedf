"""gpt-oss: a Hugging Face config with per-layer attention types (`layer_types`), learned attention sinks,
biased experts and a clamped gated unit — read, counted, priced and handed to the engine that runs it."""

from __future__ import annotations

import json

import pytest

from gplan.cost_models import compute
from gplan.cost_models.compute import Shard
from gplan.profiles.catalogue import load_model

LAYER_TYPES = ["sliding_attention", "full_attention"] * 18
GPT_OSS_120B_HF = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "intermediate_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
    "num_experts_per_tok": 4, "experts_per_token": 4, "attention_bias": True, "hidden_act": "silu",
    "layer_types": LAYER_TYPES, "sliding_window": 128, "swiglu_limit": 7.0, "max_position_embeddings": 131072,
    "rope_theta": 150000, "tie_word_embeddings": False, "vocab_size": 201088,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
}


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_the_config_reads_as_the_bundled_model_and_counts_the_model_cards_parameters(tmp_path):
    """OpenAI's gpt-oss model card (2025-08-05, Table 1): 116.83B parameters, 5.13B active per token without
    the embedding; 20.91B and 3.61B for gpt-oss-20b — biases on attention, router and experts and a sink
    per head included."""
    read = load_model(write(tmp_path, GPT_OSS_120B_HF))
    bundled = load_model("gpt-oss-120b")
    fields = ("num_experts", "top_k", "moe_ffn_hidden_size", "bias", "sliding_window", "full_attention_every",
              "attention_sinks", "glu_clamp", "head_dim", "num_kv_heads", "vocab_size")
    assert {f: getattr(read, f) for f in fields} == {f: getattr(bundled, f) for f in fields}
    assert (read.full_attention_every, read.sliding_window, read.attention_sinks, read.glu_clamp) == (2, 128, True, 7.0)
    assert round(read.total_params() / 1e7) == 11683 and round(read.active_params(input_embedding=False) / 1e7) == 513
    small = load_model("gpt-oss-20b")
    assert round(small.total_params() / 1e7) == 2091 and round(small.active_params(input_embedding=False) / 1e7) == 361


def test_layer_types_all_full_mean_no_window_and_an_irregular_pattern_is_refused(tmp_path, gplan):
    full = {**GPT_OSS_120B_HF, "layer_types": ["full_attention"] * 36}
    assert load_model(write(tmp_path, full)).sliding_window is None
    windowed = {**GPT_OSS_120B_HF, "layer_types": ["sliding_attention"] * 36}
    m = load_model(write(tmp_path, windowed))
    assert (m.sliding_window, m.full_attention_every) == (128, None)
    every_fourth = {**GPT_OSS_120B_HF, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 9}
    assert load_model(write(tmp_path, every_fourth)).full_attention_every == 4
    odd = {**GPT_OSS_120B_HF, "layer_types": ["full_attention"] + ["sliding_attention"] * 35}
    r = gplan("search", write(tmp_path, odd, "odd.json"), "--devices", "8", "--out", str(tmp_path / "p.json"))
    assert r.code == 3 and "layer_types" in r.stderr and "full_attention_every" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "p.json").exists()


def test_the_attention_core_is_the_mean_of_its_windowed_and_full_layers():
    """One layer kind carries the model's mean: half the layers see 128 keys, half the causal triangle."""
    oss = load_model("gpt-oss-120b")
    shard = Shard(batch=1, seq=4096, kv_seq=4096, tp=1, sp=False)
    kind = oss.layer_kinds()[0]
    every = compute.attention_core_flops(oss.model_copy(update={"full_attention_every": None}), kind, shard, True)
    none = compute.attention_core_flops(oss.model_copy(update={"sliding_window": None, "full_attention_every": None}),
                                        kind, shard, True)
    assert compute.attention_core_flops(oss, kind, shard, True) == pytest.approx((every + none) / 2)
    assert every < none / 10  # 128 keys of 4096


@pytest.mark.parametrize("target, capability", [("torch", "sliding window"), ("deepspeed", "gpt-oss-120b")])
def test_engines_without_its_attention_or_gated_unit_refuse_it_and_name_megatron(gplan, tmp_path, target, capability):
    r = gplan("search", "gpt-oss-120b", "--devices", "64", "--cluster", "dgx-h100", "--target", target,
              "--out", str(tmp_path / "p.json"))
    assert r.code in (3, 4) and capability in r.stderr and "--target megatron" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_torchtitan_runs_gpt_oss_as_its_own_model_and_no_other_windowed_one(gplan, tmp_path):
    """torchtitan 0.3's gpt_oss model has the window, the sinks, the biases and the clamped unit (its family's own,
    `Capabilities.family_features`); its llama3 has none, so a dense windowed Llama is still refused; and its
    builder makes one attention shape, so a gpt-oss of another window is priced but not exported."""
    from gplan.spec.parallel import ParallelConfig
    from gplan.spec.targets import TARGETS, config_refusals

    plan = tmp_path / "p.json"
    assert gplan("search", "gpt-oss-20b", "--devices", "8", "--cluster", "dgx-h100", "--target", "torchtitan",
                 "--gbs", "64", "--out", str(plan)).code == 0
    assert json.loads(plan.read_text())["training"]["engine"] == "torchtitan"
    windowed_llama = load_model("llama3-8b").model_copy(update={"sliding_window": 4096})
    refused = config_refusals(TARGETS["torchtitan"], windowed_llama, ParallelConfig(dp=8, zero=3), 8, "bf16")
    assert [r.capability for r in refused] == ["sliding_window"]
    wider = tmp_path / "wider.json"
    wider.write_text(json.dumps({**GPT_OSS_120B_HF, "sliding_window": 256, "num_hidden_layers": 4,
                                 "layer_types": LAYER_TYPES[:4]}))
    assert gplan("search", str(wider), "--devices", "8", "--cluster", "dgx-h100", "--target", "torchtitan",
                 "--gbs", "64", "--out", str(plan)).code == 0
    r = gplan("export", str(plan), "--to", "torchtitan", "-o", str(tmp_path / "out"))
    assert r.code == 3 and "torchtitan's gpt_oss builder makes" in r.stderr and "'sliding_window': 256" in r.stderr
