"""What each backend and export target runs exactly as priced — capabilities as data.

`gplan search --target T` searches only plans T runs as priced; `gplan launch` refuses, before any
process starts, a plan its backend cannot run, naming the capability and the search option that
avoids it. The rules are the engines' own (cited per field) or the limits of gplan's workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gplan.engines import ENGINES, LAUNCH_BACKENDS, has_part  # noqa: F401 - LAUNCH_BACKENDS read from here too
from gplan.engines.profile import Capabilities
from gplan.spec.model import ModelSpec
from gplan.spec.parallel import (DEFAULT_RECOMPUTE_MODULES, LayerCount, ParallelConfig, StageLayout, even_sizes,
                                 graphs_refused)
from gplan.spec.training import LOW_PRECISION, TrainingSpec

TARGETS: dict[str, Capabilities] = {name: engine.capabilities for name, engine in ENGINES.items()}
"""Every engine's capabilities (spec.engines, one file per engine): what `--target` takes."""


@dataclass(frozen=True)
class Refusal:
    capability: str
    detail: str
    avoid: str
    """The search option that avoids it."""

    def hint(self, target: str, planned_for: str | None = None) -> str:
        """What to do: run the plan where it was searched for (`planned_for`, the plan's target, when that
        is another), search for this target, or use the option that avoids the capability."""
        if planned_for and planned_for != target:
            there = f"the plan was searched for {planned_for}: {how_to_run(planned_for)}"
            return there if self.capability == "experts" else f"{there}; or {self.hint(target)}"
        if self.capability == "experts":  # no search makes a dense worker run experts
            return "run it through Megatron-LM: gplan export PLAN --to megatron"
        also = f" (or {self.avoid})" if self.avoid != f"--target {target}" else ""
        return f"search again with --target {target}{also}"




def how_to_run(target: str) -> str:
    """The command that hands a plan to `target`."""
    if target in LAUNCH_BACKENDS:
        return f"gplan launch PLAN --backend {target}"
    if has_part(target, "export"):
        return f"gplan export PLAN --to {target}"
    return f"{ENGINES[target].title}'s own launcher, with the plan's degrees (gplan writes no {target} files)"


def expert_family(model: ModelSpec) -> str:
    """The mixture-of-experts shape as engines' model code names it: `deepseek_v3` (latent attention,
    shared experts of the routed width, leading dense layers), `gpt_oss` (attention sinks and the clamped gated
    unit, every layer routed, no shared expert), `qwen3_moe` (grouped-query attention with QK norm, every layer
    routed, no shared expert), `mixtral` (the same without QK norm: experts and attention as a dense Llama has
    them), else `other`."""
    shared_routed_width = model.shared_expert_ffn_hidden_size in (None, model.num_shared_experts * model.expert_ffn_size)
    if model.is_mla and model.num_shared_experts and shared_routed_width:
        return "deepseek_v3"
    plain = not model.is_mla and not model.num_shared_experts and not model.first_dense_layers
    if plain and model.attention_sinks and model.glu_clamp is not None:
        return "gpt_oss"
    if model.qk_norm and plain:
        return "qwen3_moe"
    if plain and model.router == "softmax":
        return "mixtral"
    return "other"


def overlaps_tp_comm(training: TrainingSpec, config: ParallelConfig, domain_devices: int) -> bool:
    """Whether the run's engine hides tp's collectives behind the GEMMs — one switch for the whole job,
    so the cost model, the export and the search's summary all ask here: the run asks for it
    (`TrainingSpec.tp_comm_overlap`), its engine does it at this precision (`Capabilities.tp_comm_overlap`),
    with sequence parallelism (Megatron asserts "Tensor parallel communication/GEMM overlap can happen
    only when sequence parallelism is enabled") and the tp group inside the smallest scale-up domain of
    the cluster (the userbuffers exchange over NVLink) — or torch's asynchronous tp (`TrainingSpec.async_tp`, its
    symmetric memory inside the domain too) where its engine runs it."""
    target = TARGETS.get(training.engine or "")
    asked = (training.tp_comm_overlap and target is not None and training.precision in target.tp_comm_overlap) or (
        training.async_tp and target is not None and target.async_tp)  # torch's micro-pipelined tp, over NVLink too
    return asked and config.sp and 1 < config.tp <= domain_devices


def overlaps_param_gather(engine: str | None, precision: str) -> bool:
    """Whether the parameter all-gather after the optimizer hides behind the next forward (zero 1/2)."""
    target = TARGETS.get(engine or "")
    return target is None or precision not in target.no_param_gather_overlap


def dp_overlaps(training: TrainingSpec, config: ParallelConfig) -> tuple[bool, bool]:
    """(the gradient reduction behind the backward, the parameter gather behind the forward) as the run asks
    (`TrainingSpec.grad_reduce_overlap`, `param_gather_overlap`) — except where its engine turns them on whatever
    the switches say (`Capabilities.sharded_dp_overlaps`: Megatron-LM's validate_args for Megatron-FSDP's
    optim_grads, zero 2: the reduction, and optim_grads_params, zero 3: both). The gather still follows `overlaps_param_gather`'s precision rule."""
    reduced, gathered = sharded_overlaps(TARGETS.get(training.engine or ""), config.zero)
    return (training.grad_reduce_overlap or reduced,
            (training.param_gather_overlap or gathered) and overlaps_param_gather(training.engine, training.precision))


def sharded_overlaps(capabilities: Capabilities | None, zero: int) -> tuple[bool, bool]:
    """(the gradient reduction, the parameter gather) an engine's sharded data parallel overlaps at `zero` whatever
    the run's switches (`Capabilities.sharded_dp_overlaps`): zero 2 the reduction, zero 3 both."""
    on = capabilities is not None and capabilities.sharded_dp_overlaps and zero >= 2
    return on, on and zero >= 3


ENGINE_OPTIONS = {"grad_reduce_in_bf16": "--grad-reduce-in-bf16", "fp8_param_gather": "--fp8-param-gather",
                  "pure_bf16": "--pure-bf16", "optimizer_in_backward": "--optimizer-in-backward",
                  "legacy_grouped_gemm": "--legacy-grouped-gemm",
                  "moe_a2a_overlap": "--moe-a2a-overlap", "cuda_graphs": "--cuda-graphs",
                  "moe_dispatcher": "--moe-dispatcher",
                  "moe_dispatch_capacity": "--moe-dispatch-capacity", "attention_kernel": "--attention-kernel",
                  "bf16_loss": "--bf16-loss", "compiled_loss": "--compiled-loss", "fsdp_offload": "--fsdp-offload",
                  "loss_chunks": "--loss-chunks", "async_tp": "--async-tp",
                  "grad_sync_each_microbatch": "--grad-sync-each-microbatch",
                  "precision_aware_optimizer": "--precision-aware-optimizer", "adam_moments": "--adam-moments",
                  "master_weights": "--master-weights", "optimizer_offload": "--optimizer-offload",
                  "optimizer_offload_overlap": "--optimizer-offload-overlap",
                  "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
                  "moe_pad_to_capacity": "--moe-pad-to-capacity"}
"""TrainingSpec's engine switches, each a capability of the same name, and its flag."""


def has_option(caps, option: str, value) -> bool:
    """Whether an engine with capabilities `caps` runs the engine switch `option` at `value`: a capability
    that lists values (the MoE dispatchers) holds it; a yes/no capability is yes."""
    have = getattr(caps, option)
    return value in have if isinstance(have, frozenset) else bool(have)


def switch_default(option: str):
    """An engine switch's value when it is off (TrainingSpec's default: False, "none", or None: the engine's own)."""
    return TrainingSpec.model_fields[option].default


def lacked_options(training: TrainingSpec, engine: str | None, config: ParallelConfig | None = None) -> list[str]:
    """The engine switches `training` sets that `engine` does not have (all of them without an engine), and, for
    `config`, CUDA graphs where the engine captures only a step that never waits on the host
    (`Capabilities.cuda_graphs_host_free`: torchtitan 0.3 runs pipeline stages and expert parallel without them)."""
    caps = TARGETS.get(engine or "")
    uncaptured = caps is not None and config is not None and graphs_refused(caps, training, config)
    return [option for option in ENGINE_OPTIONS if getattr(training, option) != switch_default(option)
            and (caps is None or not has_option(caps, option, getattr(training, option))
                 or (option == "cuda_graphs" and uncaptured))]


def as_engine_runs(training: TrainingSpec, engine: str, config: ParallelConfig | None = None) -> TrainingSpec:
    """`training` run by `engine` (with `config`): the switches it lacks at their defaults (an export to another
    engine runs without Megatron's CUDA graphs or bf16 gradient reduction)."""
    dropped = {option: switch_default(option) for option in lacked_options(training, engine, config)}
    return training.model_copy(update={"engine": engine, **dropped})


def default_target(hardware_kind: str, precision: str | None = None, experts: bool = False) -> str:
    """The backend of the cluster's hardware: MindSpore on Ascend NPUs (MindFormers for mixtures of
    experts), torch elsewhere — Megatron-LM for FP8 recipes and for mixtures of experts on GPUs
    (Transformer Engine and Megatron-core's MoE layer run them; gplan's torch worker runs only a subset)."""
    if hardware_kind == "npu":
        return "mindformers" if experts else "mindspore"  # MindFormers' MoE models; gplan's worker is dense
    if precision == "fp8-rowwise":
        return "torch"  # torchao's recipe; Transformer Engine has none by that name
    return "megatron" if precision in ("fp8", "mxfp8", "nvfp4") or experts else "torch"


def config_refusals(target: Capabilities, model: ModelSpec, config: ParallelConfig,
                    num_microbatches: int, precision: str | None = None) -> list[Refusal]:
    """What `target` cannot run in a configuration, before any stage split."""
    t, c, found = target.name, config, []
    if not target.tensor_parallel and c.tp > 1:
        found.append(Refusal("tensor_parallel", f"{t} shards data parallel alone, no tensor parallelism (tp={c.tp})",
                             "--tp 1"))
    if not target.pipeline and c.pp > 1:
        found.append(Refusal("pipeline", f"{t} runs no pipeline stages (pp={c.pp})", "--pp 1"))
    if (model.is_moe and not target.experts) or (model.is_mla and not target.latent_attention):
        what = "routed experts" if model.is_moe and not target.experts else "latent attention"
        found.append(Refusal("experts", f"{t} builds dense models with standard attention here, not "
                             f"{model.name}'s {what}", "--target megatron"))
    if model.is_mla and target.latent_attention and not target.latent_attention_split and (c.tp > 1 or c.cp > 1):
        found.append(Refusal("latent_attention", f"{t} runs latent attention at tp = cp = 1 (tp={c.tp} cp={c.cp})",
                             "--tp 1 --cp 1"))
    if model.is_moe and target.experts:
        if (c.tp > 1 or c.etp > 1) and target.expert_tp == "none":
            found.append(Refusal("expert_tp", f"{t} runs experts with tp = etp = 1 (tp={c.tp} etp={c.etp})",
                                 "--tp 1 --etp 1"))
        if c.tp > 1 and target.expert_tp == "etp":
            found.append(Refusal("expert_tp", f"{t} runs experts with tp = 1 (tp={c.tp}; etp may be > 1)", "--tp 1"))
        if c.etp > 1 and target.expert_tp == "etp1":
            found.append(Refusal("expert_tp", f"{t} never tp-shards experts (etp={c.etp})", "--etp 1"))
        if target.expert_tp == "follows_tp" and c.etp != (c.tp if c.ep == 1 else 1):
            want = c.tp if c.ep == 1 else 1
            found.append(Refusal("expert_tp", f"{t} shards experts over tp without ep and over ep alone with it: etp "
                                 f"must be {want} at ep={c.ep} tp={c.tp}, not {c.etp}", f"--etp {want}"))
        if target.ep_within_fsdp and c.zero == 0 and (c.cp * c.tp) % c.ep:
            found.append(Refusal("expert_zero", f"{t} folds ep into its FSDP·cp·tp ranks; zero 0 keeps dp as "
                                 f"replicas, so ep={c.ep} must divide cp·tp={c.cp * c.tp}", "--zero 1"))
        if target.expert_families is not None and expert_family(model) not in target.expert_families:
            found.append(Refusal("experts", f"{t} builds the MoE shapes {', '.join(sorted(target.expert_families))}, "
                                 f"not {model.name}'s ({expert_family(model)})", "--target megatron"))
        if c.pp > 1 and not target.experts_with_pp:
            found.append(Refusal("experts", f"{t} runs MoE layers without pipeline stages (pp={c.pp})", "--pp 1"))
        if model.capacity_factor is not None and not target.token_dropping:
            found.append(Refusal("experts", f"{t} routes dropless; {model.name} sets capacity_factor "
                                 f"{model.capacity_factor}", "--target megatron"))
        if c.zero not in target.expert_zero:
            found.append(Refusal("expert_zero", f"{t} runs experts with zero {sorted(target.expert_zero)}, not {c.zero}",
                                 "--zero " + ",".join(map(str, sorted(target.expert_zero)))))
    elif c.ep > 1 or c.etp > 1:
        found.append(Refusal("ep", f"{t}: ep={c.ep} etp={c.etp} without experts", "--ep 1"))
    if target.selective and (refused := modules_refusal(target, c.recompute_modules)):
        # an engine with no selective recompute runs selective layers fully (`runs_as`), modules and all
        found.append(refused)
    if c.offload_layers and not target.activation_offload:
        found.append(Refusal("activation_offload", f"{t} does not offload activations to host memory "
                             f"(offload_layers={c.offload_layers})", "--target megatron, or offload_layers=0"))
    if model.mtp_layers and not target.mtp:
        found.append(Refusal("mtp", f"{t} builds no multi-token-prediction module (the model has {model.mtp_layers})",
                             "--target megatron, or mtp_layers: 0 in the model file"))
    if precision is not None and precision not in target.precisions:
        runners = [name for name, other in TARGETS.items() if precision in other.precisions]
        found.append(Refusal("precision", f"{t} trains {', '.join(sorted(target.precisions))}, not {precision}",
                             (f"--target {' or '.join(runners)}, or " if runners else "") + "--precision bf16"))
    elif precision in LOW_PRECISION and model.is_moe and not target.low_precision_experts:
        found.append(Refusal("precision", f"{t} runs the routed experts in BF16 under {precision}, which gplan "
                             "prices in the low-precision recipe", "--target megatron --precision fp8, or --precision bf16"))
    elif precision in LOW_PRECISION and c.tp > 1 and not target.low_precision_tp and precision == "mxfp8":
        found.append(Refusal("precision", f"{t} runs {precision} layers at tp = 1 (torchao's MXFP8Linear takes no "
                             "tensor-parallel weights)", "--tp 1, or --precision fp8-rowwise"))
    if c.pp > 1 and c.schedule not in target.schedules:
        found.append(Refusal("schedule", f"{t} runs {', '.join(sorted(target.schedules))}, not {c.schedule}",
                             "--schedule " + ",".join(sorted(target.schedules))))
    if c.pp > 1 and target.microbatches_at_least_stages and num_microbatches < c.pp:
        found.append(Refusal("microbatches", f"{t}'s pipeline schedule needs at least pp={c.pp} micro-batches, the "
                             f"plan has {num_microbatches}", "a larger --gbs or smaller --mbs"))
    if c.cp > 1 and not target.cp:
        found.append(Refusal("cp", f"{t} does not run context parallelism (cp={c.cp})", "--cp 1"))
    if c.vpp > 1 and model.total_layers % (c.pp * c.vpp) and not target.uneven_interleaved:
        found.append(Refusal("uneven_interleaved", f"{t} runs interleaved chunks of equal size; {model.total_layers} "
                             f"layers do not split into pp·vpp = {c.pp * c.vpp}", "--vpp dividing L/pp"))
    if (c.vpp > 1 and target.interleaved_by_layers_per_stage
            and layers_per_stage_cut(model.total_layers, c.pp, c.vpp) is None):
        found.append(Refusal("uneven_interleaved", f"{t} cuts virtual stages from one layers-per-stage count; none "
                             f"cuts {model.total_layers} layers into pp·vpp = {c.pp * c.vpp}", "another --vpp"))
    if model.tie_embeddings and c.pp > 1 and not target.tied_embeddings_across_stages:
        found.append(Refusal("tied_embeddings", f"{t} does not tie the embedding and head across pipeline stages",
                             "--pp 1, or untie the embeddings (tie_embeddings: false)"))
    if c.zero not in (target.zero_with_pp if c.pp > 1 else target.zero):
        allowed = sorted(target.zero_with_pp if c.pp > 1 else target.zero)
        found.append(Refusal("zero", f"{t} runs zero {allowed}{' with pipeline stages' if c.pp > 1 else ''}, "
                             f"not zero {c.zero}", "--zero " + ",".join(map(str, allowed))))
    # a family the target builds with its own attention and gated unit (torchtitan's gpt_oss) has them there
    own = model.is_moe and expert_family(model) in target.family_features
    if model.sliding_window and not target.sliding_window and not own:
        found.append(Refusal("sliding_window", f"{t} runs full attention, not a {model.sliding_window}-token "
                             "sliding window", "--target megatron"))
    if model.attention_sinks and not target.attention_sinks and not own:
        found.append(Refusal("attention_sinks", f"{t} builds no learned attention sinks ({model.name} has them)",
                             "--target megatron"))
    if model.glu_clamp and not target.clamped_glu and not own:
        found.append(Refusal("clamped_glu", f"{t} runs a plain SwiGLU, not {model.name}'s gated unit clamped at "
                             f"{model.glu_clamp:g}", "--target megatron"))
    if model.num_encoder_layers and not target.encoder_decoder:
        found.append(Refusal("encoder_decoder", f"{t} runs decoder-only models", "--target megatron (export)"))
    if target.llama_family_only and not own and ((model.ffn_kind, model.norm, model.position_embedding) != ("swiglu", "rmsnorm", "rope")
                                     or model.bias or model.qkv_bias
                                     or (model.tie_embeddings and not target.tied_embeddings)):
        head = "" if target.tied_embeddings else ", untied head"
        found.append(Refusal("model", f"{t} runs the Llama family (swiglu, RMSNorm, RoPE, no biases{head})",
                             "--target torch"))
    return found


def runs_as(target: Capabilities, model: ModelSpec, config: ParallelConfig,
            layouts: list[StageLayout]) -> list[StageLayout]:
    """The stage split `target`'s engine runs when given `layouts`: layers re-cut evenly where it
    splits only evenly, recomputation re-dealt at its granularity. A split it runs exactly comes back
    equal (`same_split`); the difference is what an export re-prices."""
    if target.uneven_split:
        sizes = [s.num_layers for s in layouts]
    else:
        sizes = even_sizes(model.total_layers, len(layouts))
    options = [_recompute_list(s) for s in layouts]
    if not runs_selective(target, config.recompute_modules):
        options = [["full" if o == "selective" else o for o in opts] for opts in options]
    if target.recompute in ("block", "every_layer"):
        options = _engine_recompute(target.recompute, options, sizes, config.vpp)
    elif sizes != [s.num_layers for s in layouts]:
        options = _spread(options, sizes)
    return [StageLayout(layers=_counts(model, start, size, opts), embedding=s.embedding, head=s.head,
                        node_group=s.node_group)
            for s, start, size, opts in zip(layouts, _starts(sizes), sizes, options)]


def runs_selective(target: Capabilities, modules: tuple[str, ...]) -> bool:
    """Whether `target` recomputes selective layers as planned: the default set (the attention core) where
    it recomputes the attention core alone (`selective`); another set where it names every module of it
    (torchtitan's per-op policy; Megatron's modules). An engine without selective recompute runs the layers
    fully; one with it refuses a set it lacks (`modules_refusal`)."""
    if modules == DEFAULT_RECOMPUTE_MODULES:
        return target.selective
    return set(modules) <= target.recompute_modules


def same_split(a: list[StageLayout], b: list[StageLayout]) -> bool:
    """Equal stages: the same layers and recompute counts (in any order), ends and node groups."""
    return [_key(s) for s in a] == [_key(s) for s in b]


def _key(stage: StageLayout) -> tuple:
    counts: dict[tuple[str, str], int] = {}
    for c in stage.layers:
        counts[(c.kind, c.recompute)] = counts.get((c.kind, c.recompute), 0) + c.count
    return (tuple(sorted((k, n) for k, n in counts.items() if n)), stage.embedding, stage.head, stage.node_group)


def _recompute_list(stage: StageLayout) -> list[str]:
    """A stage's recompute options, the heavier first (the order engines recompute the first layers in)."""
    rank = {"full": 0, "selective": 1, "none": 2}
    return sorted((c.recompute for c in stage.layers for _ in range(c.count)), key=rank.__getitem__)


def _engine_recompute(granularity: str, options: list[list[str]], sizes: list[int], vpp: int) -> list[list[str]]:
    """block (Megatron): with any full layer, the first N layers of every chunk recompute fully, N the
    largest number of recomputed layers (full or selective) any chunk has — so no stage keeps more
    activations than planned; else, with any selective layer, every layer selectively.
    every_layer (torchtitan): full everywhere when any layer is full, else selective everywhere when any
    is selective."""
    flat = {o for opts in options for o in opts}
    if "full" in flat and granularity == "block":
        per_chunk = max(-(-sum(o != "none" for o in opts) // vpp) for opts in options)
        return [["full"] * min(size, per_chunk * vpp) + ["none"] * max(0, size - per_chunk * vpp) for size in sizes]
    option = "full" if "full" in flat else ("selective" if "selective" in flat else "none")
    return [[option] * size for size in sizes]


def _spread(options: list[list[str]], sizes: list[int]) -> list[list[str]]:
    """Per-layer options carried over to re-cut stages: each new stage takes the heaviest options of the
    layers it now holds, in execution order."""
    flat = [o for opts in options for o in opts]
    out, start = [], 0
    for size in sizes:
        out.append(flat[start:start + size])
        start += size
    return out


def _starts(sizes: list[int]) -> list[int]:
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at += size
    return starts


def _counts(model: ModelSpec, start: int, size: int, options: list[str]) -> list[LayerCount]:
    """LayerCounts of layers [start, start + size) with one recompute option each, in execution order."""
    sequence = [k.name for k in model.layer_kinds() for _ in range(k.count)][start:start + size]
    counts: dict[tuple[str, str], int] = {}
    for kind, option in zip(sequence, options):
        counts[(kind, option)] = counts.get((kind, option), 0) + 1
    return [LayerCount(kind=k, recompute=o, count=n) for (k, o), n in counts.items()]


def layers_per_stage_cut(layers: int, pp: int, vpp: int) -> tuple[int, str | None] | None:
    """(layers per stage n, rounding) that cut `layers` into exactly pp·vpp virtual stages where an engine takes
    ceil(layers / n) stages rounded `down` or `up` to a multiple of pp (None: no rounding needed), or None where
    no n does (`Capabilities.interleaved_by_layers_per_stage`)."""
    stages = pp * vpp
    if layers % stages == 0:
        return layers // stages, None
    for per_stage in (layers // stages, layers // stages + 1):
        if per_stage < 1:
            continue
        cut = -(-layers // per_stage)
        if cut == stages:
            return per_stage, None
        for rounding, rounded in (("down", cut - cut % pp), ("up", cut + (-cut) % pp)):
            if rounded == stages:
                return per_stage, rounding
    return None


def split_refusals(target: Capabilities, model: ModelSpec, config: ParallelConfig,
                   layouts: list[StageLayout]) -> list[Refusal]:
    """What `target` runs differently in a stage split (uneven layers, its recompute granularity)."""
    t, found = target.name, []
    sizes = [s.num_layers for s in layouts]
    if config.vpp > 1 and len(set(sizes)) > 1 and not target.uneven_interleaved:
        return [Refusal("uneven_interleaved", f"{t} runs interleaved stages of equal size; the plan has "
                        f"{'/'.join(map(str, sizes))}", "--target " + t)]
    engine = runs_as(target, model, config, layouts)
    if [s.num_layers for s in engine] != [s.num_layers for s in layouts]:
        found.append(Refusal("uneven_split", f"{t} splits layers evenly; the plan has "
                             f"{'/'.join(str(s.num_layers) for s in layouts)}", "--target " + t))
    elif not same_split(engine, layouts):
        found.append(Refusal("recompute", f"{t} recomputes {_describe(engine)} where the plan has {_describe(layouts)}",
                             "--target " + t))
    return found


def _describe(layouts: list[StageLayout]) -> str:
    """Per stage, the recomputed layers: `2f+1s/3f/0`."""
    def one(s: StageLayout) -> str:
        full = sum(c.count for c in s.layers if c.recompute == "full")
        sel = sum(c.count for c in s.layers if c.recompute == "selective")
        return "+".join([f"{full}f"] * bool(full) + [f"{sel}s"] * bool(sel)) or "0"
    return "/".join(one(s) for s in layouts)


def refusals(target: Capabilities, model: ModelSpec, config: ParallelConfig, num_microbatches: int,
             layouts: list[StageLayout], precision: str | None = None) -> list[Refusal]:
    """Both checks, each capability named once (unequal interleaved chunks show in the configuration and
    again in its split)."""
    found = config_refusals(target, model, config, num_microbatches, precision)
    named = {r.capability for r in found}
    return found + [r for r in split_refusals(target, model, config, layouts) if r.capability not in named]


def check_recompute_modules(model: ModelSpec, target: str | None, modules: tuple[str, ...]) -> None:
    """Modules a user named: each in the model (`spec.parallel` RECOMPUTE_RULES) and recomputable by the
    target's engine; the first that is not, as one InputError line naming the capability."""
    from gplan.errors import InputError
    from gplan.spec.parallel import RECOMPUTE_RULES

    probe = ParallelConfig(recompute_modules=modules)
    for rule in RECOMPUTE_RULES:
        broken = rule(model, None, probe, 1)
        if broken:
            raise InputError(broken.message, hint=broken.hint)
    refused = modules_refusal(TARGETS[target], modules) if target else None
    if refused:
        raise InputError(f"{refused.detail} (capability {refused.capability})", hint=refused.avoid)


def modules_refusal(target: Capabilities, modules: tuple[str, ...]) -> Refusal | None:
    """A module set other than Megatron's default that `target` cannot recompute, with the targets that can."""
    lacking = [m for m in modules if m not in target.recompute_modules]
    if not lacking or modules == DEFAULT_RECOMPUTE_MODULES:
        return None
    runners = [name for name, other in TARGETS.items() if set(modules) <= other.recompute_modules]
    return Refusal("recompute_modules", f"{target.name} cannot recompute the module {lacking[0]} selectively (it "
                   "recomputes " + (", ".join(sorted(target.recompute_modules)) or "no module alone") + ")",
                   (f"--target {' or '.join(runners)}, or " if runners else "") + "--recompute-modules core_attn")
