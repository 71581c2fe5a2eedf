"""Loaders: a model.yaml or a Hugging Face config.json to a validated ModelSpec (bundled names are
resolved by `gplan.profiles.catalogue.load_model`, which owns the catalogue).

Errors are InputError with one line naming the file and the field, and a hint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gplan.errors import InputError
from gplan.io import read_data_file, validate_as
from gplan.spec.model import ModelSpec

# ---- Hugging Face config.json ------------------------------------------------------------------

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3"}
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss", "telechat3_moe"}
#: Kimi K2's config.json (model_type kimi_k2) is DeepSeek-V3's, run by DeepseekV3ForCausalLM (its `architectures`);
#: TeleChat3-MoE's (telechat3_moe) names DeepSeek-V3's fields, which MindFormers' Telechat3MoeConfigConverter maps onto
#: the same latent-attention and MoE blocks (mindformers/models/telechat3_moe/config_converter_telechat3_moe.py)
_SUPPORTED_HF = sorted(_LLAMA_LIKE | _MOE | {"gpt2", "gpt_neox"})
#: HF configs give the longest supported context, not a training length; cap the default there.
_DEFAULT_SEQ_CAP = 8192


def model_from_hf_config(config: dict[str, Any], source: str) -> ModelSpec:
    """Map a Hugging Face `config.json` of a supported family onto a ModelSpec (no hub access)."""
    model_type = config.get("model_type")
    try:
        if model_type in _LLAMA_LIKE:
            data = _from_llama_like(config, source)
        elif model_type in _MOE:
            data = {**_from_llama_like(config, source), **_experts(config, source)}
        elif model_type == "gpt2":
            data = _from_gpt2(config)
        elif model_type == "gpt_neox":
            data = _from_gpt_neox(config)
        else:
            raise InputError(
                f"{source}: unsupported Hugging Face architecture model_type={model_type!r}",
                hint=f"supported: {', '.join(_SUPPORTED_HF)}; or write a model.yaml",
            )
    except KeyError as exc:
        raise InputError(f"{source}: {model_type} config lacks {exc.args[0]!r}",
                         hint="use the config.json that ships with the checkpoint") from exc
    data["name"] = config.get("_name_or_path") or Path(source).parent.name or model_type
    return validate_as(ModelSpec, data, source)


def _head_dim(c: dict[str, Any]) -> int | None:
    """An explicit `head_dim` only where it differs from hidden / heads (Mistral-Nemo, Qwen3)."""
    given = c.get("head_dim")
    return given if given and given * c["num_attention_heads"] != c["hidden_size"] else None


def _sliding_window(c: dict[str, Any]) -> int | None:
    """Mistral's `sliding_window` (null in its later releases); Qwen2 uses it only with
    `use_sliding_window`."""
    window = c.get("sliding_window")
    if not window or (c.get("model_type") == "qwen2" and not c.get("use_sliding_window", False)):
        return None
    return int(window) if int(window) < c.get("max_position_embeddings", 1 << 62) else None


def _window_pattern(c: dict[str, Any], source: str) -> dict[str, Any]:
    """The sliding window and which layers use it: Hugging Face `layer_types` ("sliding_attention" /
    "full_attention" per layer; gpt-oss alternates them) as one full layer every N (`full_attention_every`,
    Megatron's --window-attn-skip-freq: layer i full where (i + 1) % N == 0); without `layer_types` every
    layer windowed. A pattern no N gives is refused."""
    window, types = _sliding_window(c), c.get("layer_types")
    if not window or not types:
        return {"sliding_window": window}
    full = [t == "full_attention" for t in types]
    if all(full):
        return {"sliding_window": None}
    if not any(full):
        return {"sliding_window": window}
    every = next((n for n in range(2, len(full) + 1) if full == [(i + 1) % n == 0 for i in range(len(full))]), None)
    if every is None:
        raise InputError(f"{source}: layer_types mixes sliding and full attention in a pattern other than one full "
                         "layer every N", hint="write a model.yaml with sliding_window and full_attention_every")
    return {"sliding_window": window, "full_attention_every": every}


def _from_llama_like(c: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
    act = c.get("hidden_act", "silu")
    return {
        "head_dim": _head_dim(c),
        **_window_pattern(c, source),
        "rope_theta": float(c.get("rope_theta", 10000.0)),
        "num_layers": c["num_hidden_layers"],
        "hidden_size": c["hidden_size"],
        "num_attention_heads": c["num_attention_heads"],
        "num_kv_heads": c.get("num_key_value_heads") or c["num_attention_heads"],
        "ffn_hidden_size": c["intermediate_size"],
        "ffn_kind": "swiglu" if act in ("silu", "swish") else "gelu",
        "vocab_size": c["vocab_size"],
        "seq_length": min(c.get("max_position_embeddings", 4096), _DEFAULT_SEQ_CAP),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        # Qwen2's attention has q/k/v biases and no other (modeling_qwen2: o_proj and the MLP bias=False);
        # Llama's `attention_bias` puts one on all four projections.
        "bias": bool(c.get("attention_bias", False)),
        "qkv_bias": c.get("model_type") in ("qwen2", "qwen2_moe"),
        "qk_norm": c.get("model_type") in ("qwen3", "qwen3_moe"),
    }


def _experts(c: dict[str, Any], source: str) -> dict[str, Any]:
    """The mixture-of-experts (and DeepSeek's latent attention) fields of Mixtral, Qwen2/Qwen3-MoE, gpt-oss and
    DeepSeek-V3 configs. Every layer after the leading dense ones must be an MoE layer (the stack's
    layer kinds are contiguous); DeepSeek's multi-token-prediction depths (`num_nextn_predict_layers`) run
    on the last stage."""
    kind = c["model_type"]
    if kind == "mixtral":
        return {"num_experts": c["num_local_experts"], "top_k": c["num_experts_per_tok"]}
    if kind == "gpt_oss":
        # modeling_gpt_oss: biases on q/k/v/o, the router and the experts; a learned sink per head; the
        # clamped gated unit (`swiglu_limit`); every layer an MoE layer of intermediate_size-wide experts
        return {"num_experts": c["num_local_experts"], "top_k": c.get("num_experts_per_tok") or c["experts_per_token"],
                "moe_ffn_hidden_size": c["intermediate_size"], "bias": bool(c.get("attention_bias", True)),
                "attention_sinks": True, "glu_clamp": c.get("swiglu_limit")}
    if kind in ("qwen2_moe", "qwen3_moe"):
        if c.get("decoder_sparse_step", 1) != 1 or c.get("mlp_only_layers"):
            raise InputError(f"{source}: {kind} with dense layers between MoE layers (decoder_sparse_step "
                             f"{c.get('decoder_sparse_step', 1)}, mlp_only_layers {c.get('mlp_only_layers')})",
                             hint="gplan models dense layers only before the MoE layers; write a model.yaml")
        shared = c.get("shared_expert_intermediate_size") or None
        return {"num_experts": c["num_experts"], "top_k": c["num_experts_per_tok"],
                "moe_ffn_hidden_size": c["moe_intermediate_size"], "shared_expert_ffn_hidden_size": shared,
                "num_shared_experts": 1 if shared else 0}
    if c.get("moe_layer_freq", 1) != 1:
        raise InputError(f"{source}: deepseek_v3 with moe_layer_freq {c['moe_layer_freq']}",
                         hint="gplan models dense layers only before the MoE layers (first_k_dense_replace)")
    return {"num_experts": c["n_routed_experts"], "top_k": c["num_experts_per_tok"],
            "moe_ffn_hidden_size": c["moe_intermediate_size"], "num_shared_experts": c.get("n_shared_experts") or 0,
            # the shared experts' width together, where the config says it (MindFormers' and Megatron's name)
            "shared_expert_ffn_hidden_size": c.get("moe_shared_expert_intermediate_size") or None,
            "first_dense_layers": c.get("first_k_dense_replace", 0),
            "router": "sigmoid" if c.get("scoring_func") == "sigmoid" else "softmax",
            "router_groups": c.get("n_group") if (c.get("n_group") or 1) > 1 else None,
            "router_group_topk": c.get("topk_group") if (c.get("n_group") or 1) > 1 else None,
            "router_topk_scale": c.get("routed_scaling_factor"),
            "mtp_layers": c.get("num_nextn_predict_layers") or 0,
            "q_lora_rank": c.get("q_lora_rank"), "kv_lora_rank": c["kv_lora_rank"],
            "qk_rope_head_dim": c["qk_rope_head_dim"], "v_head_dim": c["v_head_dim"],
            "head_dim": c["qk_nope_head_dim"]}


def _from_gpt2(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_layers": c["n_layer"],
        "hidden_size": c["n_embd"],
        "num_attention_heads": c["n_head"],
        "ffn_hidden_size": c.get("n_inner") or 4 * c["n_embd"],
        "ffn_kind": "gelu",
        "vocab_size": c["vocab_size"],
        "seq_length": c.get("n_positions", 1024),
        "tie_embeddings": True,
        "norm": "layernorm",
        "position_embedding": "learned",
        "dropout": c.get("resid_pdrop", 0.1),
        "bias": True,
    }


def _from_gpt_neox(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_layers": c["num_hidden_layers"],
        "hidden_size": c["hidden_size"],
        "num_attention_heads": c["num_attention_heads"],
        "ffn_hidden_size": c["intermediate_size"],
        "ffn_kind": "gelu",
        "vocab_size": c["vocab_size"],
        "seq_length": min(c.get("max_position_embeddings", 2048), _DEFAULT_SEQ_CAP),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
        "norm": "layernorm",
        "position_embedding": "rope",
        "rope_theta": float(c.get("rotary_emb_base", 10000.0)),
        "bias": True,
    }


def looks_like_hf(data: dict[str, Any]) -> bool:
    """A Hugging Face config: it names its `model_type` or `architectures`."""
    return "model_type" in data or "architectures" in data


def load_model_file(path: Path) -> ModelSpec:
    """A model from a model.yaml, or an HF config.json (file or its folder)."""
    if path.is_dir():
        path = path / "config.json"
    kind = not_a_model_file(path)
    if kind:
        raise InputError(f"{path}: {kind}, not a model file (a model is a bundled name, a model.yaml or a config.json)",
                         hint=f"an engine's launch or log goes to --from: gplan estimate --from {path} (it states its model)")
    data = read_data_file(path)
    if isinstance(data, dict) and looks_like_hf(data):
        return model_from_hf_config(data, str(path))
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    return validate_as(ModelSpec, data, str(path))


#: What a file given as MODEL is when it is an engine's launch or log (checked on its first lines).
_NOT_MODELS = (
    (re.compile(r"^#!|\b(torchrun|srun|python3? .*pretrain_\w+\.py|deepspeed|msrun)\b", re.M), "a launch script"),
    (re.compile(r"^\s*\[[\w.]+\]\s*$", re.M), "a TOML file (a torchtitan job config?)"),
    (re.compile(r"\biteration\s+\d+\s*/|\bstep:\s*\d+|elapsed time per iteration|\[rank\d+\]:|\bloss:", re.I),
     "a training log"),
)


def not_a_model_file(path: Path) -> str | None:
    """'a training log', 'a launch script', 'a TOML file …' for a file that is not a model description: said
    in one line rather than as the YAML error its first line would raise. None for anything else."""
    if path.suffix in (".yaml", ".yml", ".json") or not path.is_file():
        return None
    try:
        head = path.read_text(errors="replace")[:20000]
    except OSError:
        return None
    if path.suffix == ".log":
        return "a training log"
    if path.suffix == ".sh":
        return "a launch script"
    if path.suffix == ".toml":
        return "a TOML file (a torchtitan job config?)"
    for pattern, kind in _NOT_MODELS:
        if pattern.search(head):
            return kind
    return None

