"""Mixture-of-experts and latent-attention inputs: bundled models and Hugging Face configs, with their total
and active parameter counts against the published ones (to the precision they are published at: 2%)."""

from __future__ import annotations

import json

import pytest

from gplan.profiles.catalogue import load_model
from gplan.spec.loaders import model_from_hf_config
from gplan.spec.model import ModelSpec

#: (bundled name, total B, active B, the active count's convention: with the input embedding or not, the
#: precision the total is published at)
PUBLISHED = [
    ("mixtral-8x7b", 46.7, 12.9, True, 0.02),      # Mistral AI, "Mixtral of experts" (2023-12-11)
    ("mixtral-8x22b", 141.0, 39.0, True, 0.02),    # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17)
    ("qwen3-30b-a3b", 30.5, 3.3, True, 0.02),      # Qwen/Qwen3-30B-A3B model card
    ("qwen3-235b-a22b", 235.0, 22.0, True, 0.02),  # Qwen/Qwen3-235B-A22B model card
    ("deepseek-v3", 671.0, 37.0, False, 0.02),     # DeepSeek-AI 2024, arXiv 2412.19437, abstract
    ("kimi-k2", 1000.0, 32.0, False, 0.05),        # moonshotai/Kimi-K2-Instruct model card: "1T", one figure
]


@pytest.mark.parametrize("name, total_b, active_b, with_lookup, total_rel", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_bundled_moe_models_have_their_published_sizes(name, total_b, active_b, with_lookup, total_rel):
    model = load_model(name)
    assert model.total_params() / 1e9 == pytest.approx(total_b, rel=total_rel)
    assert model.active_params(input_embedding=with_lookup) / 1e9 == pytest.approx(active_b, rel=0.02)


def test_latent_attention_without_a_query_rank():
    """DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json: no q_lora_rank) is published at
    15.7B total, 2.4B activated (its model card)."""
    lite = ModelSpec(name="v2-lite", num_layers=27, hidden_size=2048, num_attention_heads=16, head_dim=128,
                     ffn_hidden_size=10944, moe_ffn_hidden_size=1408, num_experts=64, top_k=6, num_shared_experts=2,
                     first_dense_layers=1, kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
                     ffn_kind="swiglu", norm="rmsnorm", position_embedding="rope")
    assert lite.total_params() / 1e9 == pytest.approx(15.7, rel=0.02)
    assert lite.active_params(input_embedding=False) / 1e9 == pytest.approx(2.4, rel=0.03)
    assert [(k.name, k.count) for k in lite.layer_kinds()] == [("decoder", 1), ("moe_decoder", 26)]


#: The fields of the released config.json files that gplan reads.
HF = {
    "mixtral-8x7b": {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 14336, "hidden_act": "silu", "vocab_size": 32000,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6,
                     "max_position_embeddings": 32768, "sliding_window": None},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
                      "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "hidden_act": "silu", "vocab_size": 151936, "rope_theta": 1e6, "max_position_embeddings": 40960},
    "deepseek-v3": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "moe_layer_freq": 1, "scoring_func": "sigmoid", "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
                    "vocab_size": 129280, "max_position_embeddings": 163840, "num_nextn_predict_layers": 1},
    # model_type kimi_k2 on DeepseekV3ForCausalLM: DeepSeek-V3's schema, one expert group
    "kimi-k2": {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61,
                "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "intermediate_size": 18432,
                "moe_intermediate_size": 2048, "n_routed_experts": 384, "n_shared_experts": 1,
                "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1,
                "topk_group": 1, "scoring_func": "sigmoid", "routed_scaling_factor": 2.827, "q_lora_rank": 1536,
                "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                "hidden_act": "silu", "vocab_size": 163840, "max_position_embeddings": 131072, "rope_theta": 50000.0,
                "num_nextn_predict_layers": 0},
}


@pytest.mark.parametrize("name", sorted(HF))
def test_hugging_face_moe_configs_load_as_the_bundled_models(name):
    # the bundled DeepSeek-V3 is the model without its multi-token-prediction depth (as the Bridge tables
    # of "w/o MTP" runs price it); its config.json's depth is read (tests/backends/test_moe_export.py)
    loaded = model_from_hf_config({**HF[name], "num_nextn_predict_layers": 0}, f"{name}/config.json")
    bundled = load_model(name)
    assert loaded.total_params() == bundled.total_params()
    assert loaded.active_params() == bundled.active_params()
    assert [(k.name, k.count) for k in loaded.layer_kinds()] == [(k.name, k.count) for k in bundled.layer_kinds()]


def test_qwen2_moe_shared_expert_width_is_read():
    config = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
              "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
              "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "vocab_size": 151936}
    model = model_from_hf_config(config, "qwen1.5-moe/config.json")
    assert model.shared_expert_params() == 3 * 2048 * 5632
    # Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated (its model card); its shared-expert gate (h per layer) aside
    assert model.total_params() / 1e9 == pytest.approx(14.3, rel=0.02)
    assert model.active_params() / 1e9 == pytest.approx(2.7, rel=0.03)


def test_dense_layers_between_moe_layers_are_refused(gplan, tmp_path):
    config = dict(HF["qwen3-30b-a3b"], decoder_sparse_step=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = gplan("estimate", str(path), "--devices", "8", "--dp", "8")
    assert r.code == 3 and "decoder_sparse_step" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("fields, message", [
    ({"top_k": 2}, "top_k needs num_experts"),
    ({"num_experts": 8}, "top_k must be given"),
    ({"num_experts": 8, "top_k": 9}, "at most num_experts"),
    ({"num_experts": 8, "top_k": 2, "first_dense_layers": 4}, "at least one MoE layer"),
    ({"q_lora_rank": 64}, "needs kv_lora_rank"),
    ({"kv_lora_rank": 64}, "needs qk_rope_head_dim"),
    ({"moe_layer_freq": 2}, "first_dense_layers"),
])
def test_inconsistent_expert_fields_are_one_clear_error(gplan, tmp_path, fields, message):
    path = tmp_path / "model.yaml"
    base = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512}
    path.write_text(json.dumps({**base, **fields}))
    r = gplan("estimate", str(path), "--devices", "1")
    assert r.code == 3 and message in r.stderr and "Traceback" not in r.stderr


def test_gplan_models_lists_experts_and_active_parameters(gplan):
    models = {m["name"]: m for m in gplan("models", "--json").json()}
    assert models["deepseek-v3"]["num_experts"] == 256
    assert models["deepseek-v3"]["active_params"] < models["deepseek-v3"]["params"] / 10


def test_profile_refuses_a_model_its_workers_would_build_dense(gplan, tmp_path):
    """The workers build dense layers with standard attention: measuring deepseek-v3 with them would record
    numbers of another model."""
    r = gplan("profile", "--model", "deepseek-v3", "--out", str(tmp_path / "p.yaml"), "--device", "cpu")
    assert r.code == 3 and "routed experts" in r.stderr and not (tmp_path / "p.yaml").exists()


def test_a_moe_plan_validates_for_megatron_and_the_torch_launcher_refuses_it(gplan, tmp_path):
    """Without --target a mixture of experts is searched for Megatron-LM; a plan the torch worker cannot
    run as written (its experts run at zero 0, tp = etp = 1) stops before any process starts, naming the
    capability."""
    out = tmp_path / "plan.json"
    r = gplan("search", "mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "16", "--gbs", "256",
              "--seq-length", "4096", "--out", str(out))
    assert r.code == 0, r.stderr
    plan = json.loads(out.read_text())
    assert plan["training"]["engine"] == "megatron" and plan["parallel"]["ep"] > 1
    assert gplan("validate", str(out)).code == 0
    r = gplan("launch", str(out), "--dry-run")
    assert plan["parallel"]["zero"] >= 1 or plan["parallel"]["tp"] > 1  # Megatron's best is not the worker's
    assert r.code == 3 and "(expert_" in r.stderr and "--target torch" in r.stderr and "Traceback" not in r.stderr


def test_expert_imbalance_is_shown_and_slows_the_step(gplan):
    """The routing assumption changes the answer, so it is a flag the header names, never a silent default."""
    args = ["estimate", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--devices", "16", "--dp", "16", "--ep", "16",
            "--zero", "1", "--gbs", "256", "--json"]
    balanced = gplan(*args).json()["step_time_s"]
    skewed = gplan(*args, "--expert-imbalance", "1.5").json()["step_time_s"]
    assert skewed > 1.1 * balanced
    shown = gplan(*args[:-1])
    assert "routing balanced (choose with --expert-imbalance)" in " ".join(shown.stderr.split())
    r = gplan(*args, "--expert-imbalance", "0.5")
    assert r.code == 3 and "--expert-imbalance" in r.stderr and "Traceback" not in r.stderr
