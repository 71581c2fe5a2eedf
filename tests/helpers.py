"""Helpers shared by the tests (tests/ is on pytest's path through its conftest): small plans
— a tiny Llama (GQA, swiglu, RMSNorm, RoPE, untied) and a tiny GPT (gelu, LayerNorm with biases,
learned positions, tied embeddings) on the local-cpu cluster, Llama-3-8B on Atlas 800 nodes — and
random stage-split cost tables for checking the ILP against brute force."""

from __future__ import annotations

import math
import random
from pathlib import Path

from gplan.plan import Plan, write_plan
from gplan.planner.build import make_plan
from gplan.planner.table import CostTable
from gplan.profiles.catalogue import load_cluster
from gplan.profiles.catalogue import load_model
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import LayerCount, ParallelConfig, StageLayout
from gplan.spec.training import TrainingSpec

TINY_LLAMA = ModelSpec(name="tiny-llama", num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                       ffn_hidden_size=176, ffn_kind="swiglu", vocab_size=256, seq_length=32, norm="rmsnorm",
                       position_embedding="rope")
TINY_GPT = ModelSpec(name="tiny-gpt", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256,
                     seq_length=32, tie_embeddings=True, bias=True)
TINY_MOE = ModelSpec(name="tiny-moe", num_layers=3, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                     ffn_hidden_size=176, ffn_kind="swiglu", vocab_size=256, seq_length=32, norm="rmsnorm",
                     position_embedding="rope", num_experts=4, top_k=2, moe_ffn_hidden_size=48,
                     num_shared_experts=1, first_dense_layers=1)
"""A dense first layer, then two MoE layers of 4 experts (top 2) and a shared one."""
TINY_DEEPSEEK = TINY_MOE.model_copy(update=dict(
    name="tiny-deepseek", num_kv_heads=None, head_dim=16, router="sigmoid", q_lora_rank=32, kv_lora_rank=24,
    qk_rope_head_dim=8, v_head_dim=16))
"""TINY_MOE with DeepSeek-V3's attention and router: latent attention, sigmoid routing."""
SMALL_LLAMA = ModelSpec(name="small-llama", num_layers=4, hidden_size=256, num_attention_heads=8, num_kv_heads=4,
                        ffn_hidden_size=688, ffn_kind="swiglu", vocab_size=1024, seq_length=128, norm="rmsnorm",
                        position_embedding="rope")
"""Big enough that compute, not Python overhead, fills a CPU step (for timing and calibration)."""
TRAINING = TrainingSpec(gbs=8, seq_length=32, precision="fp32")


def mixed_cluster_file(path: Path, nodes: int, devices_per_node: int = 8) -> Path:
    """The README's two-group cluster (A100-80GB and V100-32GB nodes, their NVLink and network links),
    `nodes` of each, written to `path`."""
    path.write_text(
        "name: mixed\nnode_groups:\n"
        f"  - {{hardware: a100-80g, nodes: {nodes}, devices_per_node: {devices_per_node}, "
        "intra_node: {bandwidth_GBps: 300}, inter_node: {bandwidth_GBps: 25}}\n"
        f"  - {{hardware: v100-32g, nodes: {nodes}, devices_per_node: {devices_per_node}, "
        "intra_node: {bandwidth_GBps: 150}, inter_node: {bandwidth_GBps: 12.5}}\n")
    return path


def tiny_plan(path: Path, model: ModelSpec = TINY_LLAMA, stages: list[list[tuple[str, int]]] | None = None,
              training: TrainingSpec = TRAINING, cluster: str = "local-cpu", **degrees) -> Path:
    """Write a plan; `stages` gives each stage's (recompute, layers) in order, e.g. [[("none", 1)],
    [("full", 2), ("none", 1)]]; default: the uniform split. `cluster` prices it (an FP8 plan needs
    hardware with FP8 tensor cores, though the tests run it on CPUs)."""
    config = ParallelConfig(**degrees)
    cluster = load_cluster(cluster, config.world_size).sized(config.world_size)
    layouts = stage_layouts(stages, model) if stages else None
    plan: Plan = make_plan(model, training, cluster, config, layouts)
    write_plan(plan, path)
    return path


def stage_layouts(stages: list[list[tuple[str, int]]], model: ModelSpec | None = None) -> list[StageLayout]:
    """Each stage's (recompute, layers) over the model's layer sequence (its kinds in execution order;
    all `decoder` without a model)."""
    kinds = [k.name for k in model.layer_kinds() for _ in range(k.count)] if model else None
    out, at = [], 0
    for i, stage in enumerate(stages):
        counts: dict[tuple[str, str], int] = {}
        for recompute, n in stage:
            for _ in range(n):
                kind = kinds[at] if kinds else "decoder"
                counts[(kind, recompute)] = counts.get((kind, recompute), 0) + 1
                at += 1
        out.append(StageLayout(layers=[LayerCount(kind=k, recompute=r, count=n) for (k, r), n in counts.items()],
                               embedding=i == 0, head=i == len(stages) - 1))
    return out


ASCEND_SHAPES = {
    "dp_only": dict(dp=8),
    "tp_only": dict(tp=8),
    "dp_x_tp": dict(dp=4, tp=2),
    "dp_x_tp_sp": dict(dp=2, tp=4, sp=True),
    "pp_uneven": dict(dp=2, tp=2, pp=2, stages=[[("full", 14)], [("none", 18)]]),
    "pp_interleaved_uneven": dict(dp=2, tp=2, pp=2, vpp=2, stages=[[("none", 15)], [("none", 17)]]),
}
"""Plan shapes the Ascend side is checked on: Llama-3-8B (32 layers) on Atlas 800 nodes."""


def ascend_plan(stages: list[list[tuple[str, int]]] | None = None, **degrees) -> Plan:
    """Llama-3-8B on Atlas 800 (910B) nodes; `stages` as in `tiny_plan`."""
    config = ParallelConfig(**degrees)
    cluster = load_cluster("atlas-800-910b", config.world_size)
    layouts = stage_layouts(stages) if stages else None
    return make_plan(load_model("llama3-8b"), TrainingSpec(gbs=64, seq_length=4096), cluster, config, layouts)


def meta_405b_plan() -> Plan:
    """Meta's Llama 3.1 405B layout as the search finds it for Megatron-LM held to its degrees (tp 8, pp 16,
    vpp 8, cp 1, mbs 1) on 2048 H100 at gbs 2048: 126 layers as 7/8/…/8/7, interleaved chunks of unequal
    size (the first the embedding alone, the last the loss alone)."""
    from gplan.planner import plan
    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.space import SearchLimits

    limits = SearchLimits(tp=[8], pp=[16], vpp=[8], cp=[1], mbs=[1], allow_fewer_devices=False,
                          recompute_modules=[("core_attn",)])  # Megatron's default: its uneven chunks the one difference
    return plan(resolve_inputs("llama3-405b", 2048, "dgx-h100", gbs=2048, target="megatron"), limits).plan


OPTIONS = ["none", "selective", "full"]


def random_table(rng: random.Random, layers: list[int], pp: int, groups: int = 1, equal: bool = False) -> CostTable:
    """Recompute options are slower and lighter, as in reality; budgets from tight to loose."""
    G = list(range(groups))
    kinds = [f"k{q}" for q in range(len(layers))]
    time, act = {}, {}
    for q in range(len(layers)):
        base = rng.uniform(0.5, 2.0)
        for g in G:
            speed = rng.uniform(0.5, 1.5)
            for k in range(3):
                time[q, k, g] = base * speed * (1 + 0.15 * k + rng.uniform(0, 0.1))
        for k in range(3):
            act[q, k] = rng.uniform(1, 3) * (3 - k)
    in_flight = [float(pp - i) for i in range(pp)]
    state = [rng.uniform(1, 4) for _ in layers]
    fixed_t = {(i, g): rng.uniform(0, 1.5) * ((i == 0) + (i == pp - 1)) for i in range(pp) for g in G}
    fixed_m = {(i, g): rng.uniform(0, 5) for i in range(pp) for g in G}
    loose = sum(layers) * (max(state) + pp * 9)
    budgets = [rng.uniform(0.15, 0.8) * loose for _ in G]
    # backward working sets: full recompute recreates a layer's activations, the loss sits on the last stage
    transient = {(q, k): rng.uniform(0, 2) * (1 + 2 * (k == 2)) for q in range(len(layers)) for k in range(3)}
    loss = {i: rng.uniform(0, 4) * (i == pp - 1) for i in range(pp)}
    return CostTable(kinds=kinds, layers_per_kind=layers, options=OPTIONS, groups=G,
                     group_stage_capacity=[rng.randint(1, pp) if groups > 1 else pp for _ in G], pp=pp,
                     vpp=2 if equal else 1, num_microbatches=rng.randint(pp, 4 * pp), layer_time_s=time,
                     layer_state_bytes=state, layer_activation_bytes=act, in_flight=in_flight,
                     fixed_time_s=fixed_t, fixed_memory_bytes=fixed_m, budget_bytes=budgets, equal_layers=equal,
                     layer_transient_bytes=transient, stage_transient_bytes=loss)


# ---- optional engines ------------------------------------------------------------------------------

ENGINE_SKIP = "needs the optional engine"
"""Every skip for a missing engine says this; with GPLAN_REQUIRE_ENGINES=1 (CI) such a skip fails."""


def requires_engine(module: str, extra: str):
    """A pytest mark: skip, naming the missing engine and the extra that installs it, unless it imports."""
    import importlib.util

    import pytest

    try:  # a dotted name imports its parents: `megatron.core` without `megatron` raises, it is not None
        missing = importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        missing = True
    return pytest.mark.skipif(missing, reason=f"{ENGINE_SKIP} {module} (pip install -e '.[{extra}]')")


def requires_program(program: str, extra: str):
    """A pytest mark: skip, naming the missing program and the extra that installs it, unless it is on PATH."""
    import shutil

    import pytest

    return pytest.mark.skipif(shutil.which(program) is None, reason=f"{ENGINE_SKIP} {program} (pip install -e '.[{extra}]')")


def engine_skip_as_failure(report, require: bool) -> None:
    """Turn a test report skipped for a missing engine into a failure when `require` (CI sets
    GPLAN_REQUIRE_ENGINES=1): CI must run every engine test, and a broken test install must not pass
    as skips."""
    if require and report.skipped and ENGINE_SKIP in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"engine test skipped where engines are required: {report.longrepr}"


# ---- random small planning cases (the plan contract's property test and bench/contract.py) ---------

def random_case(rng: random.Random) -> dict:
    """A small model, a CPU cluster size and search limits, drawn so that a search usually has a few
    candidates: what `gplan search` gets from a user, at a size a CPU can run."""
    heads = rng.choice([2, 4, 8])
    kv = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    head_dim = rng.choice([8, 16])
    model = ModelSpec(name="random", num_layers=rng.randint(2, 8), hidden_size=heads * head_dim,
                      num_attention_heads=heads, num_kv_heads=kv, ffn_hidden_size=rng.choice([2, 4]) * heads * head_dim,
                      ffn_kind=rng.choice(["swiglu", "gelu"]), vocab_size=rng.choice([128, 256, 512]),
                      seq_length=rng.choice([16, 32, 64]), norm=rng.choice(["rmsnorm", "layernorm"]),
                      position_embedding=rng.choice(["rope", "learned"]), tie_embeddings=rng.random() < 0.3)
    devices = rng.choice([1, 2, 4, 8])
    limits = {"mbs": rng.choice([None, [1], [1, 2]]), "pp": rng.choice([None, None, [1], [2]]),
              "cp": rng.choice([None, None, [1, 2]]),
              "recompute": rng.choice([["none", "selective", "full"], ["none"], ["full"]])}
    return {"model": model, "devices": devices, "gbs": rng.choice([None, 4, 8, 16, 32]), "limits": limits}


def ranked_plans(case: dict, top: int = 3) -> list[Plan]:
    """Every plan `gplan search` ranks for a random case, as plans (empty when nothing fits)."""
    from gplan.errors import InfeasibleError
    from gplan.planner import plan as best_plan
    from gplan.planner.inputs import DEFAULT_CPU_BATCH_TOKENS, Inputs, default_gbs
    from gplan.planner.space import SearchLimits

    model, devices = case["model"], case["devices"]
    gbs = case["gbs"] or default_gbs(devices, model.seq_length, DEFAULT_CPU_BATCH_TOKENS)
    inputs = Inputs(model, TrainingSpec(gbs=gbs, seq_length=model.seq_length), load_cluster("local-cpu", devices),
                    devices)
    try:
        planned = best_plan(inputs, SearchLimits(**case["limits"]), top=top)
    except InfeasibleError:
        return []
    return [planned.plan] + [make_plan(inputs.model, planned.plan.training, c.cluster, c.config, c.layouts, c.solver)
                             for c in planned.search.ranked[1:]]


def cli_json(stdout: str, command: str | None = None):
    """The data of a `gplan … --json` document, its envelope checked: gplan's version, the command, and
    `ok` (a failed command's whole document is returned: its `error`, and `data` where it has some)."""
    import json

    from gplan import __version__

    document = json.loads(stdout)
    assert document["gplan"] == __version__ and set(document) >= {"command", "ok"}, document
    assert command is None or document["command"] == command, document["command"]
    return document["data"] if document["ok"] else document


def squared_log_misfit(equations: list[dict], key: str) -> float:
    """Σ log(1 + error)² over a calibration report's equations (runs, traced stages): what `gplan calibrate`
    minimises, so the fitted value (`error_after`) is never above the catalogue's (`error_before`)."""
    return sum(math.log(1 + e[key]) ** 2 for e in equations)


def mindformers_configs() -> Path:
    """The recipes MindFormers installs (its `configs/` folder, beside the package in site-packages)."""
    import importlib.util

    return Path(importlib.util.find_spec("mindformers").origin).parents[1] / "configs"
