"""Loaders: model.yaml, Hugging Face config.json, bundled names — each to a validated ModelSpec.

Errors are InputError with one line naming the file and the field, and a hint.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gplan.errors import InputError
from gplan.spec.model import ModelSpec

M = TypeVar("M", bound=BaseModel)

#: Keys gplan knows it does not model yet; a clearer message than "unknown key".
_UNSUPPORTED_KEYS = {
    "num_experts": "mixture-of-experts models are not modelled yet",
    "top_k": "mixture-of-experts models are not modelled yet",
    "moe_layer_freq": "mixture-of-experts models are not modelled yet",
}


def load_yaml_file(path: Path) -> Any:
    """Read YAML (or JSON, a subset) with a one-line error on a missing or malformed file."""
    if not path.is_file():
        raise InputError(f"{path}: no such file", hint="check the path, or use a bundled name (gplan models)")
    try:
        text = path.read_text()
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}", hint="fix the JSON syntax") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(f"{where}: malformed YAML: {problem}", hint="fix the YAML syntax") from exc


def validate_as(model_cls: type[M], data: Any, source: str) -> M:
    """Validate `data` as `model_cls`; turn the first pydantic error into one clear line."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping of keys to values, got {type(data).__name__}",
                         hint="the file must be a YAML/JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, model_cls, source) from exc


def _input_error(exc: ValidationError, model_cls: type[BaseModel], source: str) -> InputError:
    # A typo'd key explains the "missing" error it causes: report it first.
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = ".".join(str(part) for part in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        if key in _UNSUPPORTED_KEYS:
            return InputError(f"{source}: '{key}': {_UNSUPPORTED_KEYS[key]}", hint=f"remove '{key}'")
        known = list(model_cls.model_fields)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        return InputError(f"{source}: unknown key '{loc}'", hint=hint)
    if kind == "missing":
        return InputError(f"{source}: missing required key '{loc}'", hint=f"add '{loc}: <value>'")
    message = err["msg"].removeprefix("Value error, ")
    where = f"'{loc}': " if loc else ""
    return InputError(f"{source}: {where}{message}", hint="see DESIGN.md §4 for the input format")


# ---- Hugging Face config.json ------------------------------------------------------------------

_LLAMA_LIKE = {"llama", "mistral", "qwen2"}
_SUPPORTED_HF = sorted(_LLAMA_LIKE | {"gpt2", "gpt_neox"})
#: HF configs give the longest supported context, not a training length; cap the default there.
_DEFAULT_SEQ_CAP = 8192


def model_from_hf_config(config: dict[str, Any], source: str) -> ModelSpec:
    """Map a Hugging Face `config.json` of a supported family onto a ModelSpec (no hub access)."""
    model_type = config.get("model_type")
    try:
        if model_type in _LLAMA_LIKE:
            data = _from_llama_like(config)
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


def _from_llama_like(c: dict[str, Any]) -> dict[str, Any]:
    act = c.get("hidden_act", "silu")
    return {
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
        "bias": c.get("model_type") == "qwen2" or bool(c.get("attention_bias", False)),
    }


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
        "bias": True,
    }


def _looks_like_hf(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def load_model(ref: str) -> ModelSpec:
    """A model from a bundled name, a model.yaml, or an HF config.json (file or its folder)."""
    from gplan.profiles.catalogue import bundled_models

    models = bundled_models()
    if ref in models:
        return validate_as(ModelSpec, {"name": ref, **models[ref]}, f"bundled model {ref}")
    path = Path(ref)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and path.suffix not in (".yaml", ".yml", ".json"):
        close = difflib.get_close_matches(ref, list(models), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "list them with: gplan models"
        raise InputError(f"unknown model '{ref}': neither a bundled name nor a file", hint=hint)
    data = load_yaml_file(path)
    if isinstance(data, dict) and _looks_like_hf(data):
        return model_from_hf_config(data, str(path))
    if isinstance(data, dict) and "name" not in data:
        data = {"name": path.stem, **data}
    return validate_as(ModelSpec, data, str(path))
