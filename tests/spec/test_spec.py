"""Loaders: model.yaml, HF config.json families, bundled names; clusters; validation messages."""

from __future__ import annotations

import json

import pytest

from gplan.errors import InputError
from gplan.profiles.catalogue import bundled_models, load_cluster
from gplan.profiles.catalogue import load_model

LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "hidden_act": "silu", "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else data)
    return path


def test_hf_llama_matches_the_bundled_model(tmp_path):
    path = write(tmp_path, "config.json", LLAMA3_8B_HF)
    hf = load_model(str(path))
    bundled = load_model("llama3-8b")
    assert hf.total_params() == bundled.total_params() == 8_030_261_248
    assert load_model(str(tmp_path)).total_params() == hf.total_params()  # the folder works too


@pytest.mark.parametrize("config,params", [
    ({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024},
     124_439_808),  # GPT-2 small: 124M
    ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768},
     7_241_732_096),  # Mistral 7B: 7.24B
    ({"model_type": "gpt_neox", "hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8,
      "num_hidden_layers": 6, "vocab_size": 50304, "max_position_embeddings": 2048}, 70_426_624),  # Pythia-70m
])
def test_hf_families_give_published_parameter_counts(tmp_path, config, params):
    model = load_model(str(write(tmp_path, "config.json", config)))
    assert model.total_params() == pytest.approx(params, rel=2e-3)


MISTRAL_NEMO_HF = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 5120, "head_dim": 128,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "vocab_size": 131072, "max_position_embeddings": 1024000, "rope_theta": 1000000.0, "tie_word_embeddings": False,
}


def test_hf_head_dim_and_rope_base_are_honoured(tmp_path):
    """Mistral-Nemo's 32 heads of 128 project 5120 to 4096: 12,247,782,400 parameters (its Hugging Face
    model card's 12.2B), not the 12.77B a head width of 5120/32 gives."""
    model = load_model(str(write(tmp_path, "config.json", MISTRAL_NEMO_HF)))
    assert (model.head_dim, model.kv_channels, model.q_hidden_size) == (128, 128, 4096)
    assert model.total_params() == 12_247_782_400
    assert model.rope_theta == 1e6
    assert load_model("llama3-8b").rope_theta == 500000
    # a head_dim equal to hidden / heads is not recorded: such a model keeps its digest
    llama = load_model(str(write(tmp_path, "config.json", {**LLAMA3_8B_HF, "head_dim": 128})))
    assert llama.head_dim is None


def test_a_sliding_window_is_read_and_only_megatron_runs_it(tmp_path, gplan):
    mistral = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
               "max_position_embeddings": 32768, "sliding_window": 4096}
    path = write(tmp_path, "config.json", mistral)
    assert load_model(str(path)).sliding_window == 4096
    qwen = {**LLAMA3_8B_HF, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}
    assert load_model(str(write(tmp_path, "q.json", qwen))).sliding_window is None
    r = gplan("search", str(path), "--devices", "8", "--cluster", "dgx-h100", "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "sliding window" in r.stderr and "--target megatron" in r.stderr
    r = gplan("search", str(path), "--devices", "8", "--cluster", "dgx-h100", "--target", "megatron",
              "--out", str(tmp_path / "p.json"))
    assert r.code == 0, r.stderr
    r = gplan("export", str(tmp_path / "p.json"), "--to", "megatron", "-o", str(tmp_path / "mg"))
    assert r.code == 0 and "--window-size 4096,0" in (tmp_path / "mg" / "megatron_pretrain_gpt.sh").read_text()


def test_added_fields_at_their_default_leave_the_inputs_digest_as_it_was():
    from gplan.spec.model import ModelSpec

    model = load_model("llama2-7b")
    assert "rope_theta" not in model.digest_dump() and "head_dim" not in model.digest_dump()
    assert ModelSpec(**{**model.model_dump(), "rope_theta": 500000.0}).digest_dump()["rope_theta"] == 500000.0


def test_qwen2_has_qkv_bias_only(tmp_path):
    """Qwen2.5-7B's config.json: q, k and v carry biases, o_proj and the MLP none (modeling_qwen2) — its
    model card's 7.61B parameters (7,615,616,512 in its safetensors index) to the parameter."""
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0, "sliding_window": 131072,
            "use_sliding_window": False, "hidden_act": "silu", "tie_word_embeddings": False}
    model = load_model(str(write(tmp_path, "config.json", qwen)))
    assert model.qkv_bias and not model.bias
    assert model.total_params() == 7_615_616_512


def test_model_yaml_defaults(tmp_path):
    path = write(tmp_path, "m.yaml", "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 100\n")
    model = load_model(str(path))
    assert (model.name, model.kv_heads, model.ffn_size) == ("m", 4, 256)


def test_every_bundled_model_loads():
    for name in bundled_models():
        assert load_model(name).total_params() > 0


@pytest.mark.parametrize("text,fragment", [
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n", "missing required key 'vocab_size'"),
    ("num_layer: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n", "unknown key 'num_layer'"),
    ("num_layers: -2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n", "'num_layers'"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 5\nvocab_size: 10\n", "not divisible"),
    ("num_layers: [2\n", "malformed YAML"),
    ("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\nnum_experts: 8\n", "top_k must be given"),
])
def test_bad_model_files_name_the_problem(tmp_path, text, fragment):
    with pytest.raises(InputError, match=fragment.replace("[", r"\[")) as info:
        load_model(str(write(tmp_path, "bad.yaml", text)))
    assert info.value.hint


def test_typo_gets_a_suggestion(tmp_path):
    with pytest.raises(InputError) as info:
        load_model(str(write(tmp_path, "m.yaml", "num_layer: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 10\n")))
    assert "num_layers" in info.value.hint


def test_unsupported_hf_architecture(tmp_path):
    with pytest.raises(InputError, match="unsupported Hugging Face architecture"):
        load_model(str(write(tmp_path, "config.json", {"model_type": "mamba", "hidden_size": 8})))


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{\"model_type\": ")
    with pytest.raises(InputError, match="malformed JSON"):
        load_model(str(path))


def test_unknown_bundled_name_suggests():
    with pytest.raises(InputError) as info:
        load_model("llama3-8")
    assert "llama3-8b" in info.value.hint


def test_bundled_clusters_are_templates():
    cluster = load_cluster("dgx-h100", 1024)
    assert (cluster.devices, cluster.primary.nodes, cluster.primary.hardware.name) == (1024, 128, "h100-sxm")
    assert load_cluster("local-cpu", 2).devices == 2


def test_heterogeneous_cluster_file(tmp_path):
    path = write(tmp_path, "c.yaml", """
name: mixed
node_groups:
  - {hardware: a100-80g, nodes: 4, devices_per_node: 8, intra_node: {bandwidth_GBps: 300}, inter_node: {bandwidth_GBps: 25}}
  - {hardware: v100-32g, nodes: 4, devices_per_node: 8, intra_node: {bandwidth_GBps: 150}, inter_node: {bandwidth_GBps: 12.5}}
""")
    cluster = load_cluster(str(path))
    assert cluster.devices == 64 and cluster.is_heterogeneous


def test_unknown_hardware_in_cluster_file(tmp_path):
    path = write(tmp_path, "c.yaml", "node_groups:\n  - {hardware: a100-90g, devices_per_node: 8, "
                 "intra_node: {bandwidth_GBps: 1}, inter_node: {bandwidth_GBps: 1}}\n")
    with pytest.raises(InputError, match="unknown hardware 'a100-90g'"):
        load_cluster(str(path))
