"""MindFormers' launches and logs read: its training YAML (`parallel_config`, `parallel`, `recompute_config`,
`model_config`, `runner_config`, as MindFormers 2.1's trainer reads them), and a log with the YAML beside it.
"""

from __future__ import annotations

from pathlib import Path

from gplan.engines.mindformers import logs
from gplan.engines.mindformers.flags import CHUNKED_SCHEDULERS, MF_READ, mindformers_class
from gplan.errors import InputError
from gplan.planner.launch import with_speed, Launch, classified, exported_model, flatten
from gplan.spec.loaders import looks_like_hf, model_from_hf_config
from gplan.spec.model import ModelSpec

def read_mindformers_launch(path: Path, model: ModelSpec | None) -> Launch:
    """A MindFormers training YAML (its `parallel_config`, `parallel`, `recompute_config`, `model_config`
    and `runner_config`, as MindFormers 2.1's trainer reads them — the rules gplan's MindFormers export
    writes by): the degrees, the batch (with stages `batch_size × data_parallel × micro_batch_num`, without
    them `× gradient_accumulation_steps`), the per-stage `offset` split and recompute counts."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    pc, par = data.get("parallel_config") or {}, data.get("parallel") or {}
    mc = ((data.get("model") or {}).get("model_config")) or {}
    runner = data.get("runner_config") or {}
    defaults = (class_defaults_said(mc, "model_config") if model is None and looks_like_hf(mc)
                and not exported_model(path) else None)
    model = (exported_model(path) or mindformers_model(mc, data, path)) if model is None else model
    check_model(path, mc, model, "model_config")
    for key in ("data_parallel", "model_parallel", "pipeline_stage"):
        if key not in pc:
            raise InputError(f"--from {path}: parallel_config.{key} is missing",
                             hint="the layout must be complete to be priced; gplan does not guess it")
    dp, tp, pp = int(pc["data_parallel"]), int(pc["model_parallel"]), int(pc["pipeline_stage"])
    mbs = int(runner.get("batch_size", 1))
    steps = int(pc.get("micro_batch_num", 1)) if pp > 1 else int(runner.get("gradient_accumulation_steps", 1))
    options = par.get("parallel_optimizer_config") or {}
    # optimizer parallel slices weights and states; sliced accumulated gradients make it zero 3 (engines/mindformers)
    zero = (3 if options.get("gradient_accumulation_shard") else 1) if par.get("enable_parallel_optimizer") else 0
    vpp = int(mc.get("pp_interleave_num", 1) or 1)
    given = {"tp": tp, "pp": pp, "cp": int(pc.get("context_parallel", 1)), "sp": bool(pc.get("use_seq_parallel")),
             "mbs": mbs, "zero": zero, "vpp": vpp, "ep": int(pc.get("expert_parallel", 1)), "etp": 1,
             "recompute": "none"}
    offsets = mc.get("offset", 0)
    sizes = None
    if isinstance(offsets, list) and vpp == 1 and pp > 1:
        sizes = [model.num_layers // pp + int(o) for o in offsets]
    elif isinstance(offsets, list) and offsets and isinstance(offsets[0], list) and pp > 1:  # (vpp, pp) rows
        sizes = [sum(model.num_layers // (pp * vpp) + int(row[r]) for row in offsets) for r in range(pp)]
    rc = data.get("recompute_config") or {}
    keys = {k: v for k, v in flatten({"parallel_config": pc, "recompute_config": rc, "parallel": par}).items()
            if k not in MF_READ}
    shard = "parallel.parallel_optimizer_config.optimizer_weight_shard_size"
    size = int(keys.pop(shard, -1))
    scheduler_key = "parallel.pipeline_config.pipeline_scheduler"
    scheduler = str(keys.get(scheduler_key, "1f1b"))
    if scheduler in CHUNKED_SCHEDULERS and vpp > 1:
        raise InputError(f"--from {path}: MindSpore's {scheduler} schedule with pp_interleave_num {vpp}: the order it "
                         "runs chunks in (to hold less than interleaved 1F1B) is not priced",
                         hint="price it with pipeline_scheduler 1f1b, or pp_interleave_num 1")
    unread, no_effect = classified(path, keys, mindformers_class)
    if 0 < size < dp:  # said, not refused: the run this reader was built on sets it (above dp: all of them)
        no_effect[shard] = (f"optimizer state sharded over {size} of the {dp} data-parallel ranks: "
                            f"priced over all of them (its optimizer memory is under-priced {dp // size}×)")
    if scheduler == "gpipe" and pp > 1:
        given["schedule"] = "gpipe"
    no_effect.update(swapped_optimizer(data))
    if zero == 1 and dp * tp > 1:  # said where it is read: a search header or a plan that does not fit must show why
        unread.append("(optimizer parallel without gradient_accumulation_shard: priced as zero 1 with the weights "
                      "whole — MindSpore slices them with the optimizer states and gathers them before use, so the "
                      "weights' memory is over-priced, up to their bf16 bytes on each device)")
    return Launch(source=str(path), engine="mindformers", unread=unread, no_effect=no_effect, given=given, gbs=mbs * dp * steps,
                  seq_length=mc.get("seq_length") or dataset_seq_length(data), precision={"bfloat16": "bf16", "float16": "fp16"}.get(
                      str(mc.get("compute_dtype", "bfloat16")), "fp32"),
                  stage_sizes=sizes, recompute_layers=None, world_size=dp * tp * pp * given["cp"], model=model,
                  model_from_launch=defaults,
                  per_stage_recompute=(_counts(rc.get("recompute"), pp), _counts(rc.get("select_recompute"), pp)),
                  default_cluster=ASCEND_CLUSTER if str((data.get("context") or {}).get("device_target")) == "Ascend" else None)


ASCEND_CLUSTER = ("atlas-800-910b", "its context.device_target: Ascend, the 910B MindFormers' parallel_core models train on")
"""The bundled cluster a YAML that targets Ascend is priced on when the command line names none."""


def swapped_optimizer(data: dict) -> dict[str, str]:
    """MindFormers' AdamW `swap` (its optimizer's moments in host memory, `Parameter(device='CPU')`,
    mindformers/core/optim/adamw.py): read, not priced — said with what it leaves over-priced."""
    if not (data.get("optimizer") or {}).get("swap"):
        return {}
    return {"optimizer.swap": "Adam's two fp32 moments swapped to host memory: priced on the device (its memory "
                              "over-priced by 8 bytes a parameter of the device's optimizer shard; the swaps' time not priced)"}


def check_model(path: Path, mc: dict, model: ModelSpec, section: str) -> None:
    """A model named beside the YAML must be the one its model section states, where it states one."""
    for key, of in (("num_layers", lambda m: m.num_layers), ("num_hidden_layers", lambda m: m.num_layers),
                    ("hidden_size", lambda m: m.hidden_size),
                    ("num_heads", lambda m: m.num_attention_heads), ("num_attention_heads", lambda m: m.num_attention_heads),
                    ("n_kv_heads", lambda m: m.kv_heads), ("intermediate_size", lambda m: m.ffn_size if not m.is_moe else None),
                    ("num_experts", lambda m: m.num_experts), ("n_routed_experts", lambda m: m.num_experts)):
        given = mc.get(key)
        if given is not None and of(model) is not None and int(given) != of(model):
            raise InputError(f"--from {path}: {section}.{key} {given}, but {model.name} has {of(model)}",
                             hint="name the model the launch trains")


def dataset_seq_length(data: dict, loader_key: str = "data_loader") -> int | None:
    """The sequence its Megatron-style dataset returns (`train_dataset.data_loader.config.seq_length`: the mcore
    configs MindFormers 1.6+ ships state it there, not in `model_config`; its PyNative trainer's `dataloader`)."""
    loader = ((data.get("train_dataset") or {}).get(loader_key) or {})
    length = (loader.get("config") or {}).get("seq_length")
    return int(length) if length else None


CLASS_DEFAULTS: dict[str, dict] = {
    # MindFormers 2.1's DeepseekV3Config.__init__ (mindformers/models/deepseek3/configuration_deepseek_v3.py):
    # DeepSeek-V3 671B's shape, which its own pretrain_deepseek3_671b.yaml leaves to the class (its
    # num_key_value_heads, 128, is not taken: latent attention gives every head its own keys and values)
    "deepseek_v3": {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                    "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
                    "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
                    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
                    "first_k_dense_replace": 3, "hidden_act": "silu",
                    "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False},
    # its Qwen3MoeConfig.__init__ (mindformers/models/qwen3_moe/configuration_qwen3_moe.py), Hugging Face's defaults
    "qwen3_moe": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
                  "num_attention_heads": 32, "num_key_value_heads": 4, "hidden_act": "silu",
                  "max_position_embeddings": 32768, "tie_word_embeddings": False, "rope_theta": 10000.0,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128},
}
"""What MindFormers' own config class of a `model_type` builds for a field its YAML's model_config leaves out: the
shape it trains, said beside the prediction (`class_defaults_said`)."""


SWIGLU_NAMES = ("swiglu", "fusedswiglu")
"""MindFormers' SwiGLU (always gated: parallel_core/transformer_config.py sets gated_linear_unit for both)."""


def class_defaults_said(mc: dict, section: str) -> str | None:
    """The fields of `CLASS_DEFAULTS` a model section leaves to its class, with the values taken, as said beside the
    prediction; None where it leaves none."""
    taken = {k: v for k, v in CLASS_DEFAULTS.get(mc.get("model_type"), {}).items() if k not in mc}
    return (f"{section}'s {mc['model_type']} class defaults for what it leaves out: "
            + ", ".join(f"{k} {v}" for k, v in taken.items())) if taken else None


def mindformers_model(mc: dict, data: dict, path: Path, section: str = "model_config") -> ModelSpec:
    """The model a MindFormers YAML's `model_config` states: in Hugging Face's names where it gives a `model_type`
    (the mcore configs MindFormers 1.6+ ships — qwen3_moe, deepseek_v3 …: read as that config.json would be), else
    the dense Llama family in MindFormers 2.1's LlamaConfig names (num_layers, hidden_size, num_heads, n_kv_heads,
    intermediate_size, vocab_size, seq_length, rms_norm_eps, theta); experts there (`moe_config`) need the model
    named."""
    if looks_like_hf(mc):
        if mc.get("hidden_act") in SWIGLU_NAMES:  # its own names of the gated unit Hugging Face calls silu
            mc = {**mc, "hidden_act": "silu"}
        if mc.get("model_type") == "deepseek_v3":  # its DeepseekV3Config drops scoring_func, routes by its own key
            mc = {**mc, "scoring_func": mc.get("moe_router_score_function", "sigmoid")}
        try:
            return model_from_hf_config({**CLASS_DEFAULTS.get(mc.get("model_type"), {}), **mc},
                                        section).model_copy(update={"name": path.stem})
        except InputError as exc:  # a field left to MindFormers' own config class's default, an unsupported family
            raise InputError(f"--from {path}: no MODEL given, and its {exc.message}",
                             hint="name the model: gplan estimate MODEL --from FILE (a bundled name, model.yaml or "
                                  "config.json)") from None
    missing = [k for k in ("num_layers", "hidden_size", "num_heads", "vocab_size", "intermediate_size") if not mc.get(k)]
    if missing or data.get("moe_config"):
        what = f"its model_config has no {', '.join(missing)}" if missing else "its experts (moe_config) are not read"
        raise InputError(f"--from {path}: no MODEL given, and {what}",
                         hint="name the model: gplan estimate MODEL --from FILE (a bundled name, model.yaml or config.json)")
    fields = {"name": path.stem, "num_layers": mc["num_layers"], "hidden_size": mc["hidden_size"],
              "num_attention_heads": mc["num_heads"], "num_kv_heads": mc.get("n_kv_heads") or mc["num_heads"],
              "ffn_hidden_size": mc["intermediate_size"], "ffn_kind": "swiglu", "vocab_size": mc["vocab_size"],
              "seq_length": mc.get("seq_length") or 4096, "norm": "rmsnorm", "position_embedding": "rope",
              "rope_theta": float(mc.get("theta") or 10000)}
    try:
        return ModelSpec.model_validate(fields)
    except ValueError as exc:
        raise InputError(f"--from {path}: its model_config does not make a model: {str(exc).splitlines()[0]}",
                         hint="name the model: gplan estimate MODEL --from FILE") from None


def _counts(item, pp: int) -> list[int] | bool:
    """MindFormers' recompute value: False, True (every layer) or per-stage counts."""
    if isinstance(item, list):
        return [int(n) for n in item] + [0] * (pp - len(item))
    return bool(item)


# ---- the reader's part (planner.launch_files) ---------------------------------------------------------

READS = "MindFormers YAMLs"

FROM_READS = (
    "a training YAML, or its log with the YAML beside it")
"""What `--from` reads (docs/bring-your-own-runs.md's table, from bench/engine_tables.py)."""
CALIBRATE_READS = (
    "its log with the YAML beside it")
"""What `gplan calibrate` reads (— : nothing)."""
"""What this reader takes, as gplan says when a file is no launch it reads."""
PRECEDENCE = 0


def claims(path: Path, text: str) -> bool:
    """A training YAML with a `parallel_config`."""
    return path.suffix in (".yaml", ".yml") and "parallel_config:" in text


def read(path: Path, model: ModelSpec | None, text: str) -> Launch:
    return read_mindformers_launch(path, model)


def read_log(path: Path, model: ModelSpec | None, text: str, strict: bool = False) -> Launch:
    """A MindFormers log as a launch: the training YAML beside it (its model from the YAML's model_config),
    with the log's steady step; `strict` (calibrate): a log with no steady step is refused."""
    yaml_path = logs.config_beside(path)
    if strict:  # calibrate's model of the YAML, as it read it before --from read logs (logs.model_of)
        model = model if model is not None else logs.model_of(yaml_path)
    launch = read_mindformers_launch(yaml_path, model)
    return with_speed(launch, lambda: {"measured_step_s": logs.steady_step_s(path)}, strict)
