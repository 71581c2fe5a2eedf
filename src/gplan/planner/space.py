"""The candidate space (docs/design.md, "Search"): degree tuples, micro-batch, optimizer sharding, schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterator

from gplan.profiles.schema import ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.errors import InputError
from gplan.spec.parallel import (BATCH_RULES, canonical_modules, cp_splits, expert_grid_folds, expert_width_split,
                                 experts_split, DEFAULT_RECOMPUTE_MODULES, DEGREE_RULES, EXPERT_RULES,
                                 PER_OP_MODULES, RECOMPUTE_MODULES,
                                 RECOMPUTE_OPTIONS, RECOMPUTE_RULES, SCHEDULES, SHARDING_RULES, ParallelConfig,
                                 keeps_rules)
from gplan.spec.targets import TARGETS, config_refusals
from gplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class SearchLimits:
    """User limits; None = gplan's defaults."""

    tp: list[int] | None = None
    """Default: divisors of the heads up to the devices per node (tp across nodes is never worth it)."""
    pp: list[int] | None = None
    dp: list[int] | None = None
    cp: list[int] | None = None
    """Default: every power of two that leaves each cp rank at least `MIN_CP_CHUNK_TOKENS` tokens and
    splits the sequence into 2·cp causal chunks; the bounds prune those that cannot pay."""
    mbs: list[int] | None = None
    """Default: 1, 2, 4, 8."""
    vpp: list[int] | None = None
    """Default: every chunking of a stage's layers (each v dividing L/pp), when the micro-batches divide
    into pp; for a target that runs uneven chunks, every v dividing ⌊L/pp⌋ or ⌈L/pp⌉ and every v
    with L + 2 a multiple of pp·v (the embedding and the loss a chunk each: `vpp_options`)."""
    ep: list[int] | None = None
    """Default (MoE models): every power of two dividing the experts and a stage's dp·tp·cp ranks."""
    etp: list[int] | None = None
    """Default: 1 (Megatron-Bridge's MoE recipes; etp > 1 on request)."""
    zero: list[int] | None = None
    """Default: 0, 1, 2, 3."""
    recompute: list[str] = field(default_factory=lambda: list(RECOMPUTE_OPTIONS))
    """Options the ILP may give each layer."""
    recompute_modules: list[tuple[str, ...]] | None = None
    """What `selective` recomputes: the sets tried (`module_options`; default: the attention core, and for a
    target that names modules — Megatron — the sets its recipes run, as far as the model has the modules)."""
    schedule: list[str] | None = None
    allow_fewer_devices: bool = True

    def record(self) -> dict:
        """The limits as a plan keeps them (`SearchRecord.limits`): module sets written `layernorm+mlp`."""
        data = asdict(self)
        if self.recompute_modules is not None:
            data["recompute_modules"] = ["+".join(m) or "none" for m in self.recompute_modules]
        return data

    @classmethod
    def from_record(cls, data: dict) -> "SearchLimits":
        modules = data.get("recompute_modules")
        if modules is not None:
            data = {**data, "recompute_modules": [module_set_list(m)[0] for m in modules]}
        # plans before the target was held once kept it here too: it is the plan's engine
        return cls(**{k: v for k, v in data.items() if k != "target"})


def int_list(value: str | None, flag: str) -> list[int] | None:
    """`"1,2,4"` -> [1, 2, 4]; None or empty -> None (gplan's default)."""
    if not value:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{flag} {value!r}: expected comma-separated integers", hint=f"for example {flag} 1,2,4,8") from None
    if any(i < 0 for i in items) or (flag != "--zero" and any(i < 1 for i in items)):
        raise InputError(f"{flag} {value!r}: degrees are integers ≥ 1", hint=f"for example {flag} 1,2,4")
    if flag == "--zero" and any(i > 3 for i in items):
        raise InputError(f"--zero {value!r}: levels are 0..3", hint="for example --zero 0,1,3")
    return items


def word_list(value: str | None, flag: str, allowed: tuple[str, ...]) -> list[str] | None:
    if value is None:
        return None
    items = [o.strip() for o in value.split(",") if o.strip()]
    bad = [o for o in items if o not in allowed]
    if bad or not items:
        raise InputError(f"{flag} {value!r}: unknown option {bad[0] if bad else ''!r}".rstrip(),
                         hint=f"choose from {','.join(allowed)}")
    return items


def limits_from_options(tp: str | None = None, pp: str | None = None, dp: str | None = None, cp: str | None = None,
                        mbs: str | None = None, vpp: str | None = None, zero: str | None = None,
                        recompute: str = ",".join(RECOMPUTE_OPTIONS), schedule: str | None = None,
                        all_devices: bool = False, ep: str | None = None,
                        etp: str | None = None, recompute_modules: str | None = None) -> SearchLimits:
    """SearchLimits from the command line's comma-separated lists (exit 3 with a hint when malformed)."""
    return SearchLimits(tp=int_list(tp, "--tp"), pp=int_list(pp, "--pp"), dp=int_list(dp, "--dp"),
                        recompute_modules=module_set_list(recompute_modules),
                        cp=int_list(cp, "--cp"), mbs=int_list(mbs, "--mbs"), vpp=int_list(vpp, "--vpp"),
                        zero=int_list(zero, "--zero"), recompute=word_list(recompute, "--recompute", RECOMPUTE_OPTIONS),
                        schedule=word_list(schedule, "--schedule", SCHEDULES),
                        allow_fewer_devices=not all_devices,
                        ep=int_list(ep, "--ep"), etp=int_list(etp, "--etp"))


def module_set_list(value: str | None) -> list[tuple[str, ...]] | None:
    """`--recompute-modules moe_act,layernorm` -> [("moe_act", "layernorm")] (in the catalogue's order); `none`
    or an empty value -> [()], selective layers recomputing nothing; None -> the search's sets."""
    if value is None:
        return None
    names = [n.strip() for n in value.replace("+", ",").split(",") if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if unknown:
        raise InputError(f"--recompute-modules: unknown recompute module {unknown[0]!r}",
                         hint="choose from " + ",".join(RECOMPUTE_MODULES))
    return [canonical_modules(names)]



def searched_modules(model: ModelSpec) -> tuple[str, ...]:
    """The module set a search for a target that names modules gives its selective option: a middle point
    between recomputing nothing and everything, from what Megatron-Bridge's recipes recompute (`other_settings`
    of the shared Bridge table: DeepSeek-V3's `mla_up_proj`, Nemotron 3's `moe_act, layernorm`) — the norms,
    the experts' activation, latent attention's up-projections; a dense model's MLP. Cheap to replay, and
    together a large share of an MoE layer's activations."""
    names = ["layernorm"] + (["moe_act"] if model.is_moe else []) + (["mla_up_proj"] if model.is_mla else [])
    if any(not k.moe for k in model.layer_kinds()) and not model.is_moe:
        names.append("mlp")
    return canonical_modules(names)


def module_options(model: ModelSpec, limits: SearchLimits, engine: str | None,
                   flash_attention: bool = True) -> list[tuple[str, ...]]:
    """The recompute module sets to search: the user's; torchtitan's per-operator policy for torchtitan (the
    attention core alone it would run fully); for a target that names modules (Megatron) the one set
    `searched_modules` — alone under fused attention, where recomputing the attention core saves no memory and
    costs its replay, so that the default set is dominated by recomputing nothing — else the default set (the
    attention core) alone, so that a default search's plan exports everywhere (gplan's torch worker runs `op`
    where it is named). One set keeps the search as fast as before the modules."""
    if limits.recompute_modules is not None:
        return limits.recompute_modules
    target = TARGETS[engine] if engine else None
    if "selective" not in limits.recompute or target is None:
        return [DEFAULT_RECOMPUTE_MODULES]
    if not target.selective and set(PER_OP_MODULES) <= target.recompute_modules:
        return [PER_OP_MODULES]  # torchtitan: its per-op policy is its only selective recompute
    if not set(searched_modules(model)) <= target.recompute_modules:
        return [DEFAULT_RECOMPUTE_MODULES]  # gplan's workers: the attention core (the torch worker's op when named)
    chosen = searched_modules(model)  # Megatron's modules
    return [chosen] if flash_attention else [DEFAULT_RECOMPUTE_MODULES, chosen]


def target_name(value: str | None) -> str | None:
    if value is not None and value not in TARGETS:
        raise InputError(f"--target {value!r}: unknown target", hint="choose from " + ", ".join(TARGETS))
    return value


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, in O(√n)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def device_counts(cluster: ClusterSpec, devices: int, limits: SearchLimits) -> list[int]:
    """The given count, and (when allowed, homogeneous clusters) the largest power of two and the
    largest whole-node count below it: awkward counts (say 1000) can factor badly."""
    counts = [devices]
    if limits.allow_fewer_devices and not cluster.is_heterogeneous:
        power = 1 << (devices.bit_length() - 1)
        whole_nodes = devices - devices % cluster.primary.devices_per_node
        counts += [n for n in (power, whole_nodes) if 0 < n < devices]
    return sorted(set(counts), reverse=True)


def tp_options(model: ModelSpec, cluster: ClusterSpec, limits: SearchLimits) -> list[int]:
    per_node = min(g.devices_per_node for g in cluster.node_groups)
    pool = limits.tp or [t for t in divisors(per_node)]
    return [t for t in pool if model.tp_divides(t)]


#: Below this many tokens per cp rank the attention block is too small for the ring's exchange to hide
#: behind it (Megatron's own cp runs start at 2·4096-token sequences); a stated cut of the default space.
MIN_CP_CHUNK_TOKENS = 1024


def cp_options(training: TrainingSpec, limits: SearchLimits) -> list[int]:
    """The user's cp list, else every power of two cp with seq/cp ≥ MIN_CP_CHUNK_TOKENS and 2·cp | seq."""
    if limits.cp:
        return limits.cp
    out, cp = [1], 2
    while training.seq_length // cp >= MIN_CP_CHUNK_TOKENS and cp_splits(training.seq_length, cp):
        out.append(cp)
        cp *= 2
    return out


def vpp_options(layers: int, pp: int, limits: SearchLimits, uneven: bool = False) -> list[int]:
    """The user's vpp list, else 1 and every v > 1 that divides each stage's L/pp layers into equal
    chunks; with `uneven` (a target running chunks of different sizes) every v dividing the even
    split's stage sizes ⌊L/pp⌋ or ⌈L/pp⌉, and every v for which the embedding and the loss counted as
    a layer each fill pp·v equal chunks (L + 2 a multiple of pp·v; Llama 3.1 405B's 126 layers on pp 16
    × vpp 8, the first and last stage one layer fewer). A stated cut: DeepSeek-V3's 61 layers on pp 8
    take vpp 1, 2, 4 or 7."""
    if limits.vpp:
        return limits.vpp
    if pp == 1:
        return [1]
    if not uneven:
        return [1] if layers % pp else divisors(layers // pp)
    low, high = layers // pp, -(-layers // pp)
    whole = {v for v in set(divisors(low)) | set(divisors(high)) if v <= low}
    accounted = {v for v in divisors((layers + 2) // pp) if (layers + 2) % (pp * v) == 0 and v > 1}
    return sorted(whole | accounted)


def uneven_interleaved(engine: str | None) -> bool:
    """Whether the search may give interleaved stages different layer counts: only for a target that
    runs them (a plan without a target launches on gplan's workers, which run equal chunks)."""
    return bool(engine and TARGETS[engine].uneven_interleaved)


def expert_options(model: ModelSpec, per_stage: int, limits: SearchLimits, tp: int = 1,
                   engine: str | None = None) -> Iterator[tuple[int, int]]:
    """(ep, etp) pairs: (1, 1) for dense models; else the user's lists or the defaults, each etp·ep
    folding into a stage's dp·tp·cp ranks and dividing the experts and their width. A target whose
    experts follow tp (torchtitan) has one etp per ep, tp at ep 1, else 1, unless the user lists etp: an
    estimate prices the user's etp as given and its target's check names the rule it breaks."""
    if not model.is_moe:
        yield 1, 1
        return
    follows = bool(engine and TARGETS[engine].expert_tp == "follows_tp") and not limits.etp
    ep_pool = limits.ep or [1 << i for i in range(model.num_experts.bit_length()) if (1 << i) <= per_stage]
    pairs = ([(ep, tp if ep == 1 else 1) for ep in ep_pool] if follows
             else [(ep, etp) for etp in limits.etp or [1] for ep in ep_pool])
    for ep, etp in pairs:
        if experts_split(model, ep) and expert_width_split(model, etp) and expert_grid_folds(per_stage, ep, etp):
            yield ep, etp


def candidates(model: ModelSpec, training: TrainingSpec, cluster: ClusterSpec, devices: int,
               limits: SearchLimits) -> Iterator[ParallelConfig]:
    """Every configuration the user's limits and the target (`training.engine`: the engine the run is priced
    as is the one it is planned for, held once) allow that keeps the rules
    (`spec.parallel.RULES`, the one rule set): degrees whose product is a device count, then
    micro-batch, chunking, sharding and the expert grid generated, each configuration kept only when no
    rule refuses it."""
    for n in device_counts(cluster, devices, limits):
        for tp in tp_options(model, cluster, limits):
            for cp in cp_options(training, limits):
                if n % (tp * cp):
                    continue
                for pp in divisors(n // (tp * cp)):
                    if limits.pp and pp not in limits.pp:
                        continue
                    dp = n // (tp * cp * pp)
                    if limits.dp and dp not in limits.dp:
                        continue
                    if cluster.is_heterogeneous and not _fits_groups(cluster, dp * tp * cp, pp):
                        continue
                    degrees = ParallelConfig.model_construct(dp=dp, tp=tp, pp=pp, cp=cp, sp=tp > 1)
                    if keeps_rules(model, training, degrees, DEGREE_RULES):
                        yield from _per_degrees(model, training, limits, degrees)


def _fits_groups(cluster: ClusterSpec, per_stage: int, pp: int) -> bool:
    return sum(g.devices // per_stage for g in cluster.node_groups) >= pp


def _per_degrees(model: ModelSpec, training: TrainingSpec, limits: SearchLimits,
                 degrees: ParallelConfig) -> Iterator[ParallelConfig]:
    dp, tp, pp, cp = degrees.dp, degrees.tp, degrees.pp, degrees.cp
    uneven = uneven_interleaved(training.engine)
    module_sets = module_options(model, limits, training.engine, training.flash_attention)
    if not module_sets:
        return
    target = TARGETS[training.engine] if training.engine else None
    # one recompute option allowed: the candidates are seeded with it, as the rules that read it see it
    seeded = {"recompute": limits.recompute[0]} if len(limits.recompute) == 1 else {}
    for mbs in limits.mbs or [1, 2, 4, 8]:
        for vpp in vpp_options(model.total_layers, pp, limits, uneven):
            if vpp > 1 and (pp == 1 or (model.total_layers % (pp * vpp) and not uneven)):
                continue  # the chunkings vpp_options offers: equal chunks unless the target runs uneven ones
            schedule = "interleaved_1f1b" if vpp > 1 else "1f1b"
            if limits.schedule and schedule not in limits.schedule:
                if not (vpp == 1 and "gpipe" in limits.schedule):
                    continue
                schedule = "gpipe"
            # valid field by field by construction (the generators' values), so not re-validated: the search
            # builds ~10^4 of these (a copy of the degrees' config: ~5× cheaper than model_construct, with the first
            # recompute-module set already, often the only one), and only the rules (each group at the loop that
            # sets what it reads) and the target decide which it keeps
            batch = degrees.model_copy(update={"vpp": vpp, "mbs": mbs, "schedule": schedule,
                                               "recompute_modules": module_sets[0], **seeded})
            if not keeps_rules(model, training, batch, BATCH_RULES):
                continue
            for zero in limits.zero or [0, 1, 2, 3]:
                if zero > 0 and dp * cp == 1:
                    continue  # nothing to shard over
                # a copy only where a field changes from the one before (the search makes ~10^4 of these)
                sharded = batch.model_copy(update={"zero": zero}) if zero else batch
                if not keeps_rules(model, training, sharded, SHARDING_RULES):
                    continue
                for ep, etp in expert_options(model, dp * tp * cp, limits, tp, training.engine):
                    experts = sharded.model_copy(update={"ep": ep, "etp": etp}) if (ep, etp) != (1, 1) else sharded
                    if not keeps_rules(model, training, experts, EXPERT_RULES):
                        continue
                    for modules in module_sets:
                        config = experts if modules == experts.recompute_modules else \
                            experts.model_copy(update={"recompute_modules": modules})
                        if not keeps_rules(model, training, config, RECOMPUTE_RULES):
                            continue
                        if target and config_refusals(target, model, config, config.microbatches_for(training.gbs),
                                                      training.precision):
                            continue
                        yield config
