"""ParallelConfig (the degrees dp tp pp vpp cp ep and per-step options) and the stage layout (layers per
pipeline stage); the rules a configuration must keep are RULES, read through `config_violations`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from gplan.errors import InputError
from gplan.spec.model import ModelSpec
from gplan.spec.names import (DEFAULT_RECOMPUTE_MODULES, PER_OP_MODULES, RECOMPUTE_MODULES,  # noqa: F401 - the names
                              RECOMPUTE_OPTIONS, SCHEDULES, Recompute, Schedule)  # a configuration is written in
from gplan.spec.training import TrainingSpec

def canonical_modules(names) -> tuple[str, ...]:
    """Module names in the catalogue's order, each once: how a configuration keeps them (so that two
    configurations recomputing the same modules are equal, however they were named)."""
    return tuple(n for n in RECOMPUTE_MODULES if n in names)





class ParallelConfig(BaseModel):
    """Degrees and per-step options of one parallel configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    vpp: int = Field(default=1, ge=1)
    """Virtual stages (model chunks) per pipeline rank; > 1 means the interleaved 1F1B schedule."""
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    """Expert parallelism: an MoE layer's routed experts split over ep ranks, tokens dispatched to them
    and combined back by all-to-all."""
    etp: int = Field(default=1, ge=1)
    """Expert tensor parallelism: each routed expert's FFN split over etp ranks. The expert side of a
    stage, etp × ep × edp, folds the same dp·tp·cp ranks as the attention side's tp × cp × dp
    (Megatron-core's MoE parallel folding, Liu et al. 2025, arXiv 2504.14960); 1 as in Megatron-Bridge's
    MoE recipes."""
    sp: bool = False
    """Megatron sequence parallelism inside the tp group."""
    zero: int = Field(default=0, ge=0, le=3)
    """0: replicated; 1: optimizer state sharded (distributed optimizer); 2: + gradients; 3: + weights (FSDP)."""
    mbs: int = Field(default=1, ge=1)
    schedule: Schedule = "1f1b"
    recompute: Recompute = "none"
    """Default recompute of every layer; a stage layout may recompute only some layers."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """What a `selective` layer recomputes (`RECOMPUTE_MODULES`; Megatron's `--recompute-modules`,
    whose default is the attention core alone). Empty: selective layers recompute nothing."""

    schedule_runs: int = Field(default=1, ge=1)
    """Times the pipeline schedule runs in one step, each over its share of the micro-batches, gradients
    accumulated across the runs: torch.distributed.pipelining engines run it once per local batch (torchtitan's
    `train_step` loops `gradient_accumulation_steps` times over `pp_schedule.step`, NeMo AutoModel's recipe once
    per batch its step scheduler yields), so each run fills and drains the pipeline again. 1: one schedule over
    every micro-batch (Megatron-LM; gplan's own plans and exports)."""

    offload_layers: int = Field(default=0, ge=0)
    """Layers whose activations wait in host memory between their forward and backward (Megatron-core's
    `cpu_offloading_num_layers` with `cpu_offloading`: the first N layers of the model, moved while the next
    layers compute). 0: none."""

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _known_modules(cls, value: Any) -> tuple[str, ...]:
        """Known names, in the catalogue's order, each once (a comma- or plus-separated string is read too;
        `none`, as --recompute-modules offers it, is the empty set)."""
        names = [n.strip() for n in re.split(r"[,+ ]", value)] if isinstance(value, str) else list(value or [])
        names = [n for n in names if n and n != "none"]
        unknown = [n for n in names if n not in RECOMPUTE_MODULES]
        if unknown:
            raise ValueError(f"unknown recompute module {unknown[0]!r}")
        return canonical_modules(names)

    @model_serializer(mode="wrap")
    def _leave_default_modules_out(self, handler):
        """Plans written before the modules existed, and plans at Megatron's default, read the same."""
        data = handler(self)
        if isinstance(data, dict) and tuple(data.get("recompute_modules", ())) == DEFAULT_RECOMPUTE_MODULES:
            data.pop("recompute_modules")
        if isinstance(data, dict) and data.get("offload_layers") == 0:
            data.pop("offload_layers")
        if isinstance(data, dict) and data.get("schedule_runs") == 1:
            data.pop("schedule_runs")
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_schedule(cls, data: Any) -> Any:
        """vpp > 1 means the interleaved schedule unless one is named."""
        if isinstance(data, dict) and data.get("vpp", 1) > 1 and "schedule" not in data:
            return {**data, "schedule": "interleaved_1f1b"}
        return data

    @model_validator(mode="after")
    def _schedule_matches_vpp(self) -> "ParallelConfig":
        if (self.vpp > 1) != (self.schedule == "interleaved_1f1b"):
            raise ValueError(f"schedule {self.schedule} with vpp={self.vpp}: interleaved_1f1b goes with vpp > 1, "
                             "gpipe and 1f1b with vpp = 1")
        return self

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def per_op(self) -> bool:
        """Its selective layers recompute torchtitan's per-operator policy (the module `op`)."""
        return self.recompute_modules == PER_OP_MODULES

    @property
    def edp(self) -> int:
        """Expert data parallelism: the ranks holding the same experts, a stage's dp·tp·cp over etp·ep
        (Megatron's `expert_data_parallel_size`); expert gradients are reduced over these."""
        return max(1, self.dp * self.tp * self.cp // (self.ep * self.etp))

    def microbatches_for(self, gbs: int) -> int:
        return gbs // (self.mbs * self.dp)

    def label(self, recompute: bool | str = True) -> str:
        """`dp=8 tp=2 pp=1 mbs=1 zero=1 rc=none sp`; `recompute=False` leaves out rc, the option the
        search seeded the split with (a plan's stages say what each layer recomputes); a text gives rc
        that value (a plan's own mix: `Plan.label`)."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        parts += [f"{axis}={getattr(self, axis)}" for axis in ("ep", "etp") if getattr(self, axis) > 1]
        rc = recompute if isinstance(recompute, str) else self.recompute
        parts += [f"mbs={self.mbs}", f"zero={self.zero}"] + ([f"rc={rc.replace(' ', '')}"] if recompute else [])
        if self.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
            parts.append("modules=" + ("+".join(self.recompute_modules) or "none"))
        if self.offload_layers:
            parts.append(f"offload={self.offload_layers}")
        if self.sp:
            parts.append("sp")
        if self.schedule_runs > 1:  # the schedule run once per local batch: its fill and drain paid each run
            parts.append(f"runs={self.schedule_runs}")
        return " ".join(parts)


def config_from_options(**values: Any) -> ParallelConfig:
    """A ParallelConfig from what a user typed; the first broken rule as one InputError line. A
    schedule left out (None) is ParallelConfig's default for the vpp given."""
    values = {k: v for k, v in values.items() if v is not None}
    try:
        return ParallelConfig(**values)
    except ValidationError as exc:
        e = exc.errors()[0]
        message = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:
            raise InputError(message, hint="drop --schedule to let --vpp choose it") from exc
        field = str(e["loc"][0])
        hint = ("choose from " + ",".join(RECOMPUTE_MODULES) if field == "recompute_modules"
                else "degrees are integers ≥ 1; zero is 0..3")
        raise InputError(f"--{field.replace('_', '-')}: {message}", hint=hint) from exc


def parse_config_values(text: str) -> dict[str, Any]:
    """`"tp=8,pp=4,sp=1,recompute=full"` -> {"tp": 8, "pp": 4, "sp": True, "recompute": "full"} (modules joined
    by `+`: `recompute_modules=moe_act+layernorm`): what the user said, and nothing else (planner.complete
    chooses the rest)."""
    values: dict[str, Any] = {}
    fields = set(ParallelConfig.model_fields)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise InputError(f"--config {text!r}: expected key=value pairs", hint='for example --config "tp=8,pp=4,mbs=1"')
        if key not in fields:
            raise InputError(f"--config {text!r}: unknown option {key!r}", hint="options: " + ", ".join(sorted(fields)))
        if key in ("recompute", "schedule", "recompute_modules"):
            values[key] = value
        elif key == "sp":
            values[key] = value.lower() in ("1", "true", "yes", "on")
        else:
            try:
                values[key] = int(value)
            except ValueError:
                raise InputError(f"--config {text!r}: {key}={value!r} is not an integer",
                                 hint='for example --config "tp=8,pp=4"') from None
    return values


def parse_config_text(text: str, devices: int) -> ParallelConfig:
    """`"tp=8,pp=4,mbs=1"` -> ParallelConfig, the rest at its defaults; dp fills the devices when omitted."""
    values = parse_config_values(text)
    if "dp" not in values:
        other = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        values["dp"] = max(1, devices // other)
    return config_from_options(**values)


class LayerCount(BaseModel):
    """`count` consecutive layers of one kind with one recompute option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    recompute: Recompute
    count: int = Field(ge=0)


class StageLayout(BaseModel):
    """What one pipeline stage (all its virtual chunks together) holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: list[LayerCount]
    embedding: bool
    head: bool
    node_group: int = 0
    """Index of the cluster node group whose devices run this stage."""

    @property
    def num_layers(self) -> int:
        return sum(c.count for c in self.layers)


@lru_cache(maxsize=None)
def empty_stage(embedding: bool, head: bool, node_group: int = 0) -> StageLayout:
    """A stage with no layers (its embedding and head only): the planner prices one per candidate and
    stage, so the frozen layout is built once and shared."""
    return StageLayout(layers=[], embedding=embedding, head=head, node_group=node_group)


@dataclass(frozen=True)
class Violation:
    """A rule a configuration (or a stage split) breaks: which, in words, and what keeps it."""

    rule: str
    message: str
    hint: str


Rule = Callable[[ModelSpec, TrainingSpec, ParallelConfig, int], "Violation | None"]


# ---- predicates the rules and the search space share (each written once, here) -------------------------

def experts_split(model: ModelSpec, ep: int) -> bool:
    """ep divides the routed experts (Megatron's validate_args)."""
    return model.num_experts % ep == 0


def expert_width_split(model: ModelSpec, etp: int) -> bool:
    """etp divides the expert FFN width."""
    return model.expert_ffn_size % etp == 0


def expert_grid_folds(stage_ranks: int, ep: int, etp: int) -> bool:
    """The expert grid etp·ep folds into a stage's dp·tp·cp ranks."""
    return stage_ranks % (ep * etp) == 0


def cp_splits(seq_length: int, cp: int) -> bool:
    """The load-balanced causal split of context parallelism: 2·cp chunks of the sequence."""
    return seq_length % (2 * cp) == 0


def _world(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if c.world_size != devices:
        return Violation("world_size", f"dp·tp·pp·cp = {c.dp}·{c.tp}·{c.pp}·{c.cp} = {c.world_size} ≠ {devices} devices",
                         "make the product of the degrees equal --devices")
    return None


def _tp(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron splits attention by heads and the MLP by columns (`ModelSpec.tp_divides`)."""
    if model.tp_divides(c.tp):
        return None
    if not model.tp_divides_heads(c.tp):
        return Violation("tp", f"tp={c.tp} does not divide the model's heads ({model.num_attention_heads} attention, "
                               f"{model.kv_heads} kv)", "choose tp among the common divisors of the attention and kv "
                               "head counts")
    return Violation("tp", f"tp={c.tp} does not divide ffn_hidden_size {model.ffn_size}",
                     "choose a tp that divides the MLP width")


def _dense_experts(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if not model.is_moe and (c.ep > 1 or c.etp > 1):
        return Violation("ep", f"ep={c.ep} etp={c.etp}: expert parallelism needs a mixture-of-experts model",
                         "use ep=1 etp=1 (num_experts in the model file makes it an MoE)")
    return None


def _ep_divides(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron's validate_args: "Number of experts should be a multiple of expert model parallel_size"."""
    if model.is_moe and not experts_split(model, c.ep):
        return Violation("ep", f"ep={c.ep} does not divide the {model.num_experts} experts",
                         "choose ep dividing num_experts")
    return None


def _etp_divides(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if model.is_moe and not expert_width_split(model, c.etp):
        return Violation("etp", f"etp={c.etp} does not divide the expert FFN width {model.expert_ffn_size}",
                         "choose etp dividing moe_ffn_hidden_size")
    return None


def _expert_grid(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """The expert grid etp·ep folds into a stage's dp·tp·cp ranks."""
    if model.is_moe and not expert_grid_folds(c.dp * c.tp * c.cp, c.ep, c.etp):
        return Violation("ep", f"the expert grid etp·ep = {c.etp}·{c.ep} does not fold into a stage's "
                               f"dp·tp·cp = {c.dp * c.tp * c.cp} ranks", "choose ep·etp dividing dp·tp·cp")
    return None


def _moe_sp(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron's validate_args: "When using MoE and tensor parallelism, sequence parallelism must be used"."""
    if model.is_moe and c.tp > 1 and not c.sp:
        return Violation("sp", "a mixture of experts with tp > 1 needs sequence parallelism (Megatron asserts it)",
                         "add sp (sp=true in --config, --sp)")
    return None


def _ep_fp16(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron's validate_args: "Expert parallelism is not supported with fp16 training"."""
    if model.is_moe and c.ep > 1 and training.precision == "fp16":
        return Violation("ep", "expert parallelism does not train in fp16 (Megatron asserts it)",
                         "use --precision bf16")
    return None


def _pp_layers(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if c.pp > model.total_layers:
        return Violation("pp", f"pp={c.pp} exceeds the model's {model.total_layers} layers", "use pp ≤ number of layers")
    return None


def _vpp_chunks(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Every chunk holds a layer, except that the first may hold only the embedding and the last only the
    loss (`min_stage_layers`)."""
    if c.vpp > 1 and model.total_layers < c.pp * c.vpp - 2:
        return Violation("vpp", f"vpp={c.vpp}: {model.total_layers} layers do not fill pp·vpp = {c.pp * c.vpp} chunks "
                                "(the first may hold only the embedding, the last only the loss)",
                         "choose vpp so that every chunk holds a layer")
    return None


def _batch(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if training.gbs % (c.mbs * c.dp):
        return Violation("gbs", f"gbs={training.gbs} is not a multiple of mbs·dp = {c.mbs}·{c.dp}",
                         "choose gbs, mbs and dp so that mbs·dp divides gbs")
    return None


def _interleaved_microbatches(model: ModelSpec, training: TrainingSpec, c: ParallelConfig,
                              devices: int) -> Violation | None:
    """Megatron's interleaved schedule runs the micro-batches in groups of pp."""
    if c.vpp > 1 and not training.gbs % (c.mbs * c.dp) and c.microbatches_for(training.gbs) % c.pp:
        return Violation("vpp", f"the interleaved schedule needs micro-batches ({c.microbatches_for(training.gbs)}) "
                                f"to be a multiple of pp={c.pp}", "change gbs or mbs, or use vpp=1")
    return None


def _cp_chunks(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """The load-balanced causal split of context parallelism: 2·cp chunks."""
    if c.cp > 1 and not cp_splits(training.seq_length, c.cp):
        return Violation("cp", f"seq_length {training.seq_length} does not split into 2·cp = {2 * c.cp} chunks (the "
                               "load-balanced causal split of context parallelism)",
                         "choose cp so that 2·cp divides the sequence length")
    return None


def _seq_split(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    if training.seq_length % (c.cp * (c.tp if c.sp else 1)):
        return Violation("seq_length", f"seq_length {training.seq_length} does not split over cp·(tp if sp) ranks",
                         "choose cp (and tp with sp) dividing the sequence length")
    return None


def _loss_chunks(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig, devices: int) -> Violation | None:
    """torchtitan 0.3's ChunkedLossWrapper: "sequence length must be divisible by num_chunks", on each cp rank's
    share of the sequence."""
    if training is None or training.loss_chunks_run == 1 or training.seq_length % (c.cp * training.loss_chunks_run) == 0:
        return None
    chunks = training.loss_chunks_run
    return Violation("loss_chunks", f"the loss in {chunks} chunks: a cp rank's {training.seq_length / c.cp:g} tokens "
                     f"do not split into {chunks}", "choose cp, or --loss-chunks, so that cp·chunks divides the sequence")


_MODULE_PARTS: dict[str, Callable[[ModelSpec], bool]] = {
    "mlp": lambda m: any(not k.moe for k in m.layer_kinds()), "moe": lambda m: m.is_moe,
    "moe_act": lambda m: m.is_moe, "shared_experts": lambda m: m.is_moe and m.shared_expert_ffn_size > 0,
    "mla_up_proj": lambda m: m.is_mla}
"""Whether the model has the part a recompute module names (the modules not listed are in every layer); asked
only for the modules a configuration names (the search asks ~10^4 times)."""


def _modules_exist(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """A recompute module names a part of the model (Megatron-core refuses `mla_up_proj` without latent
    attention, TransformerConfig.__post_init__; a module with nothing to recompute is a mistake too)."""
    missing = next((m for m in c.recompute_modules if m in _MODULE_PARTS and not _MODULE_PARTS[m](model)), None)
    if missing is None:
        return None
    return Violation("recompute_modules", f"recompute module {missing} ({RECOMPUTE_MODULES[missing]}): "
                                          f"{model.name} has none", "leave it out of --recompute-modules")


def _op_alone(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """`op` is a policy over the whole block (torchtitan applies one AC policy per block), not a part of it
    to add other modules to."""
    if "op" in c.recompute_modules and c.recompute_modules != PER_OP_MODULES:
        return Violation("recompute_modules", "recompute module op (torchtitan's per-operator policy) covers the "
                         "whole layer, not beside " + ",".join(m for m in c.recompute_modules if m != "op"),
                         "--recompute-modules op alone")
    return None


def _offload(model: ModelSpec, training: TrainingSpec, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron-core's TransformerConfig.__post_init__: "Currently there is no support for Pipeline parallelism
    with CPU offloading", "CPU offloading does not work when activation recomputation is enabled", and the
    offloaded layers fewer than the model's."""
    if not c.offload_layers:
        return None
    if c.pp > 1:
        return Violation("offload_layers", f"activation offloading with pp={c.pp}: Megatron offloads without pipeline "
                                           "stages only", "use pp=1, or offload_layers=0")
    if c.recompute != "none":
        return Violation("offload_layers", f"activation offloading with recompute {c.recompute}: Megatron offloads "
                                           "without recomputation only", "use recompute=none, or offload_layers=0")
    if c.offload_layers >= model.total_layers:
        return Violation("offload_layers", f"offload_layers={c.offload_layers}: at most {model.total_layers - 1} of "
                                           f"the model's {model.total_layers} layers", "offload fewer layers")
    return None


def _optimizer_in_backward(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig,
                           devices: int) -> Violation | None:
    """torchtitan ≤ 0.2's build_optimizers: "Optimizers in backward is not supported with Expert Parallel" and
    "... with Pipeline Parallel"; and it steps in every backward, so no gradient accumulation."""
    if training is None or not training.optimizer_in_backward:
        return None
    hint = "leave --optimizer-in-backward out"
    for degree, value in (("pp", c.pp), ("ep", c.ep)):
        if value > 1:
            return Violation("optimizer_in_backward", f"--optimizer-in-backward with {degree}={value}: torchtitan steps "
                             "in the backward without pipeline stages or expert parallel only", f"use {degree}=1, or {hint}")
    if c.microbatches_for(training.gbs) > 1:
        return Violation("optimizer_in_backward", f"--optimizer-in-backward steps after every backward: the "
                         f"{c.microbatches_for(training.gbs)} micro-batches of a step would each step",
                         f"use a batch of dp·mbs sequences, or {hint}")
    return None


def _cuda_graphs(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig, devices: int) -> Violation | None:
    """torchtitan 0.3's Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet",
    and "support only expert parallel token dispatcher configurations without CPU synchronization" (its all-to-all
    and DeepEP read the splits back; HybridEP's non-blocking capacity and MinimalAsyncEP do not: `host_waits`)."""
    if training is None or not graphs_refused(training.profile.capabilities, training, c):
        return None
    degree, value = host_waits(c, training)[0]
    return Violation("cuda_graphs", f"--cuda-graphs {training.cuda_graphs} with {degree}={value}: "
                     f"{training.profile.title} captures a step without pipeline stages or a host-synced "
                     "expert exchange only", f"use {degree}=1, --moe-dispatcher symmetric_memory or "
                                             "--moe-dispatch-capacity, or leave --cuda-graphs out (torchtitan: "
                                             "--training.disable_cuda_graphs)")


def host_waits(c: ParallelConfig, training: TrainingSpec | None = None) -> list[tuple[str, int]]:
    """The degrees that make a step wait on the host, so that an engine capturing only a host-free step
    (`Capabilities.cuda_graphs_host_free`) runs it without CUDA graphs: pipeline stages (their sends and
    receives), and expert parallel where its exchange reads the tokens per expert back — not where it is sized
    without the host (`TrainingSpec.moe_rows_capacity`: MinimalAsyncEP, HybridEP's non-blocking capacity)."""
    host_free_exchange = training is not None and training.moe_rows_capacity is not None
    return [(degree, value) for degree, value in (("pp", c.pp), ("ep", c.ep))
            if value > 1 and not (degree == "ep" and host_free_exchange)]


def _dispatch_capacity(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig,
                       devices: int) -> Violation | None:
    """HybridEP's non-blocking capacity sizes the flex dispatcher's output (torchtitan's make_token_dispatcher_config
    hands it to HybridEP only), and one under the balanced share drops tokens every step: refused, naming the least."""
    capacity = training.moe_dispatch_capacity if training is not None and model.is_moe else None
    if capacity is None:
        return None
    if training.moe_dispatcher != "flex":
        return Violation("moe_dispatch_capacity", "--moe-dispatch-capacity sizes HybridEP's (the flex dispatcher's) "
                         f"output: the dispatcher is {training.moe_dispatcher}", "use --moe-dispatcher flex, or leave "
                                                                                 "--moe-dispatch-capacity out")
    if c.ep > 1 and model.worst_case_routed_share(c.ep) * capacity < 1:
        return Violation("moe_dispatch_capacity", f"--moe-dispatch-capacity {capacity:g} at ep={c.ep} sizes HybridEP's "
                         f"output under the {model.top_k} copies of each token balanced routing sends: it would drop "
                         "tokens every step", f"use a capacity ≥ {1 / model.worst_case_routed_share(c.ep):.3g} at this "
                                              "ep (hybridep.py: tokens·ep·min(E/ep, k)·capacity rows), or a larger ep")
    return None


def graphs_refused(capabilities, training: TrainingSpec, c: ParallelConfig) -> bool:
    """Whether an engine with `capabilities` runs `c` without the CUDA graphs `training` asks: it captures only a step
    that never waits on the host (`Capabilities.cuda_graphs_host_free`), and this one does (`host_waits`)."""
    return (training.cuda_graphs != "none" and capabilities.cuda_graphs_host_free
            and bool(host_waits(c, training)))


def captured_graphs(training: TrainingSpec, c: ParallelConfig) -> str:
    """The CUDA graphs `c` runs with: those asked, save where its engine refuses them (`graphs_refused`) —
    torchtitan 0.3 then refuses its default graphs, and gplan's search prices such a layout without them, as its
    export runs it (`--training.disable_cuda_graphs`)."""
    return "none" if graphs_refused(training.profile.capabilities, training, c) else training.cuda_graphs


def _kernel_dispatch(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig,
                     devices: int) -> Violation | None:
    """torchtitan 0.3's rules for its kernel dispatchers: update_ep_token_dispatcher_config's "requires expert
    parallelism (expert_parallel_degree > 1)" for DeepEP, HybridEP and MinimalAsyncEP
    (`Capabilities.kernel_dispatch_needs_ep`), and minimal_async_ep/api.py's "MinimalAsyncEP requires full
    recompute"."""
    if training is None or not model.is_moe or training.moe_dispatcher not in KERNEL_DISPATCHERS:
        return None
    dispatcher = training.moe_dispatcher
    named = f"--moe-dispatcher {dispatcher} ({KERNEL_DISPATCHERS[dispatcher]})"
    if c.ep == 1 and training.profile.capabilities.kernel_dispatch_needs_ep:
        return Violation("moe_dispatcher", f"{named} with ep=1: {training.profile.title}'s DeepEP, HybridEP and "
                         "MinimalAsyncEP dispatchers need expert parallelism", "use ep > 1, or --moe-dispatcher alltoall")
    if dispatcher == "symmetric_memory" and c.recompute != "full":
        return Violation("moe_dispatcher", f"{named} with rc={c.recompute}: MinimalAsyncEP requires full recompute",
                         "use recompute=full (torchtitan: activation-checkpoint:full), or --moe-dispatcher alltoall")
    return None


KERNEL_DISPATCHERS = {"flex": "DeepEP or HybridEP", "symmetric_memory": "torchtitan's minimal_async_ep"}
"""The dispatchers that run kernels of their own, as the engines name them."""


def _precision_aware_optimizer(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig,
                               devices: int) -> Violation | None:
    """Megatron-core's OptimizerConfig: "--use-precision-aware-optimizer only supported with distributed optimizer"."""
    if training is None or not training.precision_aware_optimizer or c.zero >= 1:
        return None
    return Violation("precision_aware_optimizer", "--precision-aware-optimizer runs on the distributed optimizer: "
                     "zero is 0", "use zero ≥ 1, or leave --precision-aware-optimizer out")


def _fsdp_offload(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig, devices: int) -> Violation | None:
    """FSDP's CPU offload lives inside FSDP — torchtitan hands its CPUOffloadPolicy to apply_fsdp, which runs where
    dp_shard·cp shards (`ParallelDims.fsdp_enabled`) — and gplan prices it resharding after the forward (zero 3)."""
    if training is None or not training.fsdp_offload:
        return None
    if c.zero < 3:
        return Violation("fsdp_offload", f"--fsdp-offload with zero {c.zero}: gplan prices FSDP's CPU offload with "
                         "the weights resharded after the forward (zero 3) only", "use zero 3, or leave --fsdp-offload out")
    if c.dp * c.cp == 1:
        return Violation("fsdp_offload", "--fsdp-offload offloads FSDP's shards: dp·cp is 1, nothing is sharded",
                         "use dp·cp > 1, or leave --fsdp-offload out")
    return None


def _shared_expert_overlap(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig,
                           devices: int) -> Violation | None:
    """Megatron-core's TransformerConfig.__post_init__: "shared_experts recompute cannot work with
    --moe-shared-expert-overlap"."""
    if training is None or not training.moe_shared_expert_overlap:
        return None
    if c.recompute == "selective" and "shared_experts" in c.recompute_modules:
        return Violation("moe_shared_expert_overlap", "--moe-shared-expert-overlap cannot replay the shared experts "
                         "(the shared_experts recompute module)", "recompute other modules, or leave "
                         "--moe-shared-expert-overlap out")
    return None


def _a2a_overlap(model: ModelSpec, training: TrainingSpec | None, c: ParallelConfig, devices: int) -> Violation | None:
    """Megatron-core's TransformerConfig.__post_init__ for `overlap_moe_expert_parallel_comm`: "only supported
    with expert model parallelism", vpp "must be specified when pipeline_model_parallel_size > 1", "disable
    full recomputation", "disable moe in recompute_modules", a bf16 or fp16 model."""
    if training is None or not training.moe_a2a_overlap:
        return None
    hint = "leave --moe-a2a-overlap out"
    if c.ep == 1:
        return Violation("moe_a2a_overlap", "--moe-a2a-overlap overlaps the expert-parallel all-to-all: ep is 1",
                         f"use ep > 1, or {hint}")
    if c.pp > 1 and c.vpp == 1:
        return Violation("moe_a2a_overlap", f"--moe-a2a-overlap with pp={c.pp} runs on the interleaved schedule only",
                         f"use vpp > 1, or {hint}")
    if c.recompute == "full" or (c.recompute == "selective" and "moe" in c.recompute_modules):
        return Violation("moe_a2a_overlap", "--moe-a2a-overlap cannot replay the MoE layer (full recompute or the "
                                            "moe module)", f"recompute selectively without moe, or {hint}")
    if training.precision == "fp32":
        return Violation("moe_a2a_overlap", "--moe-a2a-overlap needs a bf16 or fp16 model", f"use bf16, or {hint}")
    return None


RULES: tuple[Rule, ...] = (_world, _tp, _dense_experts, _ep_divides, _etp_divides, _expert_grid, _moe_sp,
                           _ep_fp16, _pp_layers, _vpp_chunks, _batch, _interleaved_microbatches, _cp_chunks, _seq_split,
                           _precision_aware_optimizer, _modules_exist, _op_alone, _offload, _a2a_overlap,
                           _shared_expert_overlap, _optimizer_in_backward, _cuda_graphs, _dispatch_capacity,
                           _kernel_dispatch, _fsdp_offload, _loss_chunks)
"""The rules every configuration keeps, in the order they are reported: the one rule set that
`check_config`, the search space (planner.space), `--stages` and the plan check read."""
DEGREE_RULES: tuple[Rule, ...] = (_world, _tp, _pp_layers, _cp_chunks, _seq_split, _loss_chunks)
"""The rules that read only the degrees dp tp pp cp (and sp = tp > 1)."""
BATCH_RULES: tuple[Rule, ...] = (_vpp_chunks, _batch, _interleaved_microbatches)
"""The rules that read the degrees with mbs and vpp."""
SHARDING_RULES: tuple[Rule, ...] = (_precision_aware_optimizer, _fsdp_offload)
"""The rules that read zero: the precision-aware optimizer's and FSDP's CPU offload's (which zero runs routed experts is each engine's,
`Capabilities.expert_zero`: Megatron-FSDP and torchtitan's FSDP shard them over the expert data-parallel ranks,
others stop at the distributed optimizer)."""
EXPERT_RULES: tuple[Rule, ...] = (_dense_experts, _ep_divides, _etp_divides, _expert_grid, _moe_sp, _ep_fp16)
"""The rules that read ep and etp. The search asks each group at the loop that sets what it reads, so a
degree tuple, a batch split or a sharding level that breaks a rule is left before its options are built;
the five groups are RULES, each rule once (tests/spec: test_rule_groups_are_the_rules)."""
RECOMPUTE_RULES: tuple[Rule, ...] = (_modules_exist, _op_alone, _offload, _a2a_overlap, _shared_expert_overlap,
                                     _optimizer_in_backward, _dispatch_capacity, _kernel_dispatch)
"""The rules that read the recompute modules, activation offloading, the MoE all-to-all and shared-expert overlaps
the optimizer in the backward and torchtitan's kernel dispatchers (asked last: they read the whole configuration).
Not torchtitan's CUDA-graph rule (PRICED_RULES)."""
PRICED_RULES: tuple[Rule, ...] = (_cuda_graphs,)
"""The rules a search prices instead of filtering by: asked for CUDA graphs, it prices a layout torchtitan cannot
capture without them (`captured_graphs`), as torchtitan's export runs it; an estimate of that layout with graphs, or
a launch, is refused (RULES)."""


def config_violations(model: ModelSpec, training: TrainingSpec, config: ParallelConfig,
                      devices: int | None = None, rules: tuple[Rule, ...] = RULES) -> list[Violation]:
    """Every rule of `rules` `config` breaks on `devices` (default: its own world size)."""
    devices = config.world_size if devices is None else devices
    return [v for rule in rules if (v := rule(model, training, config, devices)) is not None]


def keeps_rules(model: ModelSpec, training: TrainingSpec, config: ParallelConfig,
                rules: tuple[Rule, ...] = RULES) -> bool:
    """Whether `config` breaks none of `rules` on its own world size (stops at the first it breaks: the
    search asks this of every candidate, ~10^4 times: a plain loop, the world size taken once)."""
    devices = config.world_size
    for rule in rules:
        if rule(model, training, config, devices):
            return False
    return True


def check_config(model: ModelSpec, training: TrainingSpec, config: ParallelConfig, devices: int,
                 rules: tuple[Rule, ...] = RULES) -> None:
    """Reject a configuration that cannot run, with the first rule (of `rules`) it breaks."""
    found = config_violations(model, training, config, devices, rules)
    if found:
        raise InputError(found[0].message, hint=found[0].hint)


def split_violations(model: ModelSpec, config: ParallelConfig, sizes: list[int]) -> list[Violation]:
    """What a stage split breaks: one count per stage, the model's layers in all, each stage filling its
    chunks (`min_stage_layers`)."""
    found = []
    if len(sizes) != config.pp:
        found.append(Violation("stages", f"{len(sizes)} stages for pp={config.pp}", f"give pp={config.pp} counts"))
    if sum(sizes) != model.total_layers:
        found.append(Violation("stages", f"the stages hold {sum(sizes)} of the model's {model.total_layers} layers",
                               f"give counts summing to {model.total_layers}"))
    for i, n in enumerate(sizes):
        if n < min_stage_layers(i, len(sizes), config.vpp):
            found.append(Violation("stages", f"stage {i}: {n} layers do not fill vpp={config.vpp} chunks",
                                   f"each stage holds ≥ vpp={config.vpp} layers (the first and last one fewer: "
                                   "their end chunks may hold only the embedding or the loss)"))
    return found


def min_stage_layers(stage: int, pp: int, vpp: int) -> int:
    """Layers a stage must hold: one per virtual chunk, except that with interleaving the first chunk
    of the first stage may hold only the embedding and the last chunk of the last stage only the loss
    (Megatron's pipeline layout; Llama 3.1 405B's 126 layers on pp 16 × vpp 8)."""
    if vpp == 1:
        return 1
    return vpp - int(stage == 0) - int(stage == pp - 1)


def chunk_sizes(layers: int, vpp: int, first: bool = False, last: bool = False) -> list[int]:
    """A stage's layers over its vpp virtual chunks, as even as possible (the split Megatron's
    `--pipeline-model-parallel-layout` is written with when L does not divide into pp·vpp): extra
    layers on the later chunks of the first stage (its first chunk holds the embedding), on the earlier
    chunks of any other (the last stage's last chunk holds the loss)."""
    sizes = even_sizes(layers, vpp)
    return sizes[::-1] if first and not last else sizes


def even_stage_sizes(layers: int, pp: int, vpp: int = 1) -> list[int]:
    """Megatron's even split; with interleaving that pp·vpp does not divide, the embedding and the loss
    counted as one layer each (`account_for_embedding_in_pipeline_split`, `..._loss_...`): the first
    and last stages one layer fewer — DeepSeek-V3's 61 layers on pp 8 come out 7/8/8/8/8/8/8/6, its
    published layout."""
    if vpp == 1 or pp == 1 or layers % (pp * vpp) == 0:
        return even_sizes(layers, pp)
    sizes = even_sizes(layers + 2, pp)
    sizes[0] -= 1
    sizes[-1] -= 1
    return sizes


def even_sizes(total: int, parts: int) -> list[int]:
    """Megatron's split of `total` layers: as even as possible, extra layers on the earliest stages."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def uniform_layout(model: ModelSpec, pp: int, recompute: Recompute, vpp: int = 1) -> list[StageLayout]:
    """Megatron's default split: layers as even as possible, extra layers on the earliest stages
    (`even_stage_sizes`); the embedding on stage 0, the head on the last."""
    return layout_from_sizes(model, even_stage_sizes(model.total_layers, pp, vpp), [recompute] * pp)


def layout_from_sizes(model: ModelSpec, sizes: list[int], recompute: list[Recompute]) -> list[StageLayout]:
    """Cut the execution-order layer sequence into consecutive stages of the given sizes."""
    sequence = [k.name for k in model.layer_kinds() for _ in range(k.count)]
    stages, start = [], 0
    for i, size in enumerate(sizes):
        chunk = sequence[start:start + size]
        start += size
        counts = [LayerCount(kind=k, recompute=recompute[i], count=chunk.count(k))
                  for k in dict.fromkeys(chunk)]
        stages.append(StageLayout(layers=counts, embedding=i == 0, head=i == len(sizes) - 1))
    return stages


# ---- in words ----------------------------------------------------------------------------------

def recompute_mix(layouts, modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES) -> str:
    """'none' / 'full' when uniform, else counts per option, e.g. 'none 62 · full 18'; selective names its
    modules where they are not Megatron's default ('selective(moe_act+layernorm) 48')."""
    totals: dict[str, int] = {}
    selective = "selective" if modules == DEFAULT_RECOMPUTE_MODULES else f"selective({'+'.join(modules) or 'none'})"
    for stage in layouts:
        for c in stage.layers:
            key = selective if c.recompute == "selective" else c.recompute
            totals[key] = totals.get(key, 0) + c.count
    totals = {k: v for k, v in totals.items() if v}
    if len(totals) == 1:
        return next(iter(totals))
    return " · ".join(f"{k} {v}" for k, v in totals.items())


def split_text(layouts) -> str:
    """Layers per stage: `4×20` (4 stages of 20) when even, else stage by stage with runs counted the same
    way (`7/14×8/7`: Llama 3.1 405B's split on pp 16); past eight runs, the range (`10–12 uneven`)."""
    sizes = [s.num_layers for s in layouts]
    if len(set(sizes)) == 1:
        return f"{len(sizes)}×{sizes[0]}"
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    if len(runs) > 8:
        return f"{min(sizes)}–{max(sizes)} uneven"
    return "/".join(f"{count}×{size}" if count > 1 else str(size) for size, count in runs)
