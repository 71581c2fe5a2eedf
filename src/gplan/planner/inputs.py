"""Resolve what a user typed (model reference, cluster flags, training flags) into typed specs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import ValidationError

from gplan.errors import InputError, UsageError
from gplan.profiles.catalogue import cluster_from_hardware, hardware_changes, load_cluster, load_model
from gplan.profiles.schema import MAX_DEVICES, ClusterSpec
from gplan.spec.model import ModelSpec
from gplan.spec.training import TrainingSpec

DEFAULT_CLUSTER = "dgx-a100-80g"
#: Default global batch: about 4M tokens, the scale of published LLM pre-training batches
#: (GPT-3: 3.2M; Llama 2: 4M; Llama 3: 4M–16M).
DEFAULT_BATCH_TOKENS = 2**22
#: On CPU clusters (tests, walkthroughs, trying a layout small) a few thousand tokens: a step takes
#: seconds there, not hours.
DEFAULT_CPU_BATCH_TOKENS = 2**12


@dataclass(frozen=True)
class Inputs:
    model: ModelSpec
    training: TrainingSpec
    cluster: ClusterSpec
    devices: int
    cluster_note: str = ""
    """Why the cluster is the one priced where the command line named none, said after its name in the header."""
    hardware_note: str = ""
    """What a --hardware FILE changes from the catalogue, said in the header."""
    profile: str | None = None
    """`path (sha256 prefix)` of the measured profile the cluster came from."""
    gbs_note: str = ""
    """How the global batch was chosen when the user did not give one."""


def resolve_cluster(devices: int | None, cluster: str | None, hardware: str | None,
                    devices_per_node: int | None) -> tuple[ClusterSpec, int, str]:
    if cluster and hardware:
        raise UsageError("--cluster and --hardware are exclusive", hint="name a cluster, or a hardware kind")
    if devices is not None and devices < 1:
        raise InputError(f"--devices {devices}: must be at least 1", hint="pass a positive device count")
    if devices is not None and devices > MAX_DEVICES:
        raise InputError(f"--devices {devices:,}: gplan plans clusters of up to {MAX_DEVICES:,} devices",
                         hint="pass the devices of one training job")
    note = ""
    if hardware:
        if devices is None:
            raise UsageError("--hardware needs --devices", hint="add --devices N")
        spec = cluster_from_hardware(hardware, devices, devices_per_node)
    else:
        name = cluster or DEFAULT_CLUSTER
        if not cluster:
            note = "default; choose with --cluster"
        spec = load_cluster(name, devices)
        if devices_per_node:
            raise UsageError("--devices-per-node goes with --hardware", hint="set devices_per_node in the cluster file")
    if devices is None:
        devices = spec.devices
    if devices > spec.devices:
        raise InputError(f"--devices {devices} exceeds the {spec.devices} devices of cluster '{spec.name}'",
                         hint="lower --devices or add nodes to the cluster file")
    return spec, devices, note


def default_gbs(devices: int, seq_length: int, target_tokens: int = DEFAULT_BATCH_TOKENS) -> int:
    """The target batch in sequences, rounded to the nearest multiple of `g`, the largest power of two
    that divides the device count and is not above the target: every dp that divides `g` stays
    possible, and the batch is never far from the target (within g/2 sequences, g ≤ target) — rather
    than rounded up to a multiple of the devices, which on 16,384 GPUs turned a 4M-token batch into 134M."""
    target = max(1, round(target_tokens / seq_length))
    g = 1
    while devices % (2 * g) == 0 and 2 * g <= target:
        g *= 2
    return max(g, round(target / g) * g)


def resolve_profile(path: str, devices: int | None, cluster: str | None,
                    hardware: str | None) -> tuple[ClusterSpec, int, str]:
    """The cluster of a measured profile, sized like a bundled template; and its reference."""
    import hashlib
    from pathlib import Path

    from gplan.profiles.files import read_profile

    if cluster or hardware:
        raise UsageError("--profile replaces --cluster and --hardware", hint="pass only --profile")
    file = Path(path)
    if not file.is_file():
        raise InputError(f"--profile {path}: no such file", hint="write one with gplan profile or gplan calibrate")
    spec = read_profile(file).cluster()
    devices = devices or spec.devices
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:16]
    return spec.sized(devices), devices, f"{path} (sha256 {digest})"


def check_profile_precision(spec: ClusterSpec, precision: str, path: str) -> None:
    """A profile's measured layers price only runs of their precision: refuse one of another, rather than
    silently pricing from the catalogue under a header that says "measured profile"."""
    measured = {m.precision for g in spec.node_groups for m in g.hardware.measured if m.status == "ok"}
    if measured and precision not in measured:
        raise InputError(f"--profile {path} was measured at {', '.join(sorted(measured))}; this run is {precision}",
                         hint=f"pass --precision {sorted(measured)[0]}, or profile again with --precision {precision}")


def resolve_target(target: str | None, cluster: ClusterSpec, precision: str, model: ModelSpec) -> str:
    """The engine a run is priced and searched for: the one named, else the default of the cluster's
    hardware for this precision and model (spec.targets.default_target) — decided here, once."""
    from gplan.spec.targets import default_target

    return target or default_target(cluster.primary.hardware.kind, precision, experts=model.is_moe or model.is_mla)


def with_target(inputs: Inputs) -> Inputs:
    """`inputs` with its engine resolved where it names none (inputs built by hand, not by resolve_inputs)."""
    if inputs.training.engine is not None:
        return inputs
    engine = resolve_target(None, inputs.cluster, inputs.training.precision, inputs.model)
    return replace(inputs, training=inputs.training.model_copy(update={"engine": engine}))


def resolve_inputs(model_ref: str, devices: int | None = None, cluster: str | None = None,
                   hardware: str | None = None, devices_per_node: int | None = None,
                   gbs: int | None = None, seq_length: int | None = None, precision: str | None = None,
                   memory_headroom: float = 0.1, profile: str | None = None, target: str | None = None,
                   expert_imbalance: float = 1.0, grad_reduce_in_bf16: bool = False,
                   fp8_param_gather: bool = False, moe_a2a_overlap: bool = False, pure_bf16: bool = False,
                   optimizer_in_backward: bool = False, legacy_grouped_gemm: bool = False,
                   cuda_graphs: str = "none", moe_dispatcher: str = "alltoall",
                   attention_kernel: str | None = None, bf16_loss: bool = False,
                   grad_sync_each_microbatch: bool = False, precision_aware_optimizer: bool = False,
                   adam_moments: str = "fp32", master_weights: str = "fp32", optimizer_offload: float = 0.0,
                   optimizer_offload_overlap: bool = False, moe_shared_expert_overlap: bool = False,
                   moe_pad_to_capacity: bool = False, compiled_loss: bool = False,
                   fsdp_offload: bool = False, loss_chunks: int | None = None,
                   moe_dispatch_capacity: float | None = None, tp_comm_overlap: bool = True,
                   grad_reduce_overlap: bool = True, param_gather_overlap: bool = True,
                   async_tp: bool = False) -> Inputs:
    """`target` (a backend or export target) is the engine whose memory accounting prices the run;
    default: the backend of the cluster's hardware, as `gplan search` defaults its --target."""
    from gplan.planner.space import target_name

    target = target_name(target)
    model = load_model(model_ref)
    profile_ref = None
    if profile:
        spec, devices, profile_ref = resolve_profile(profile, devices, cluster, hardware)
        note = ""
    else:
        spec, devices, note = resolve_cluster(devices, cluster, hardware, devices_per_node)
    seq = seq_length or model.seq_length
    if precision is None:
        precision = "bf16" if all("bf16" in g.hardware.peak_tflops for g in spec.node_groups) else "fp16"
    for group in spec.node_groups:
        if not group.hardware.supports(precision):
            raise InputError(f"{group.hardware.name} does not support {precision}",
                             hint=f"use --precision {'/'.join(group.hardware.peak_tflops)}")
    if profile:
        check_profile_precision(spec, precision, profile)
    gbs_note = ""
    if gbs is None:
        cpu = all(g.hardware.kind == "cpu" for g in spec.node_groups)
        batch_tokens = DEFAULT_CPU_BATCH_TOKENS if cpu else DEFAULT_BATCH_TOKENS
        gbs = default_gbs(devices, seq, batch_tokens)
        gbs_note = (f"default: the ~{batch_tokens / 2**20:g}M-token batch" if not cpu
                    else f"default on CPUs: ~{batch_tokens} tokens")
    try:
        training = TrainingSpec(gbs=gbs, seq_length=seq, precision=precision, memory_headroom=memory_headroom,
                                expert_imbalance=expert_imbalance, engine=resolve_target(target, spec, precision, model),
                                grad_reduce_in_bf16=grad_reduce_in_bf16, fp8_param_gather=fp8_param_gather,
                                pure_bf16=pure_bf16, optimizer_in_backward=optimizer_in_backward,
                                legacy_grouped_gemm=legacy_grouped_gemm,
                                moe_a2a_overlap=moe_a2a_overlap, cuda_graphs=cuda_graphs,
                                moe_dispatcher=moe_dispatcher, moe_dispatch_capacity=moe_dispatch_capacity,
                                attention_kernel=attention_kernel,
                                bf16_loss=bf16_loss, grad_sync_each_microbatch=grad_sync_each_microbatch,
                                precision_aware_optimizer=precision_aware_optimizer, adam_moments=adam_moments,
                                master_weights=master_weights, optimizer_offload=optimizer_offload,
                                optimizer_offload_overlap=optimizer_offload_overlap,
                                moe_shared_expert_overlap=moe_shared_expert_overlap,
                                moe_pad_to_capacity=moe_pad_to_capacity, compiled_loss=compiled_loss,
                                fsdp_offload=fsdp_offload, loss_chunks=loss_chunks, tp_comm_overlap=tp_comm_overlap,
                                grad_reduce_overlap=grad_reduce_overlap, param_gather_overlap=param_gather_overlap,
                                async_tp=async_tp)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}",
                         hint="see gplan --help") from exc
    check_engine_options(training, model)
    return Inputs(model=model, training=training, cluster=spec, devices=devices, cluster_note=note,
                  hardware_note=hardware_changes(hardware) if hardware else "",
                  profile=profile_ref, gbs_note=gbs_note)


def check_engine_options(training: TrainingSpec, model: ModelSpec) -> None:
    """Megatron's engine switches need an engine that has them, --fp8-param-gather a low-precision recipe,
    --moe-a2a-overlap and --moe-dispatcher a model with experts (and the overlap a dispatcher it overlaps)."""
    from gplan.spec.targets import ENGINE_OPTIONS, TARGETS, has_option, lacked_options, switch_default
    from gplan.spec.training import LOW_PRECISION

    lacked = lacked_options(training, training.engine)
    if lacked:
        option, flag = lacked[0], ENGINE_OPTIONS[lacked[0]]
        value = getattr(training, option)
        runners = [name for name, other in TARGETS.items() if has_option(other, option, value)]
        shown = f"{flag} {value}" if isinstance(value, str) else flag
        raise InputError(f"{shown}: {training.engine} has no such option (capability {option})",
                         hint=f"--target {' or '.join(runners)}, or leave {flag} out")
    for option, flag in (("moe_a2a_overlap", "--moe-a2a-overlap"), ("moe_dispatcher", "--moe-dispatcher"),
                         ("moe_dispatch_capacity", "--moe-dispatch-capacity"),
                         ("legacy_grouped_gemm", "--legacy-grouped-gemm"),
                         ("moe_shared_expert_overlap", "--moe-shared-expert-overlap")):
        if getattr(training, option) != switch_default(option) and not model.is_moe:
            raise InputError(f"{flag} is about the routed experts (their tokens or GEMMs): {model.name} has no experts",
                             hint=f"leave {flag} out")
    if training.moe_a2a_overlap and training.moe_dispatcher == "allgather":  # Megatron-core's TransformerConfig:
        # "overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher"
        raise InputError("--moe-a2a-overlap overlaps the all-to-all or flex dispatcher's traffic, not the all-gather's",
                         hint="use --moe-dispatcher alltoall or flex, or leave --moe-a2a-overlap out")
    if training.moe_pad_to_capacity and model.capacity_factor is None:  # Megatron-core: the padding needs a capacity
        raise InputError(f"--moe-pad-to-capacity pads the experts' inputs to their capacity: {model.name} sets no "
                         "capacity_factor (it routes dropless)", hint="set capacity_factor in the model file, or "
                         "leave --moe-pad-to-capacity out")
    if training.moe_pad_to_capacity and training.moe_dispatcher == "flex":  # Megatron-core's TransformerConfig:
        # "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity"
        raise InputError("--moe-pad-to-capacity: the flex dispatcher's DeepEP backend does not pad the experts' inputs",
                         hint="use --moe-dispatcher alltoall or allgather, or leave --moe-pad-to-capacity out")
    if training.moe_shared_expert_overlap:  # Megatron-core's TransformerConfig.__post_init__
        if not model.shared_expert_ffn_size:
            raise InputError(f"--moe-shared-expert-overlap overlaps the shared experts: {model.name} has none",
                             hint="leave --moe-shared-expert-overlap out")
        if training.moe_dispatcher != "alltoall":
            raise InputError("--moe-shared-expert-overlap only works with the alltoall token dispatcher",
                             hint="use --moe-dispatcher alltoall, or leave --moe-shared-expert-overlap out")
        if training.moe_a2a_overlap:
            raise InputError("--moe-shared-expert-overlap cannot run with --moe-a2a-overlap (Megatron: \"disable "
                             "moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm\")",
                             hint="leave one of them out")
    if training.pure_bf16 and training.precision != "bf16":
        raise InputError(f"--pure-bf16 keeps everything in bf16; the run trains in {training.precision}",
                         hint="use --precision bf16, or leave --pure-bf16 out")
    for option, flag in (("adam_moments", "--adam-moments"), ("master_weights", "--master-weights")):
        if getattr(training, option) != "fp32" and not training.precision_aware_optimizer:
            # Megatron-core's OptimizerConfig: "exp_avg_dtype can only be fp32 when not using precision-aware optimizer"
            raise InputError(f"{flag} {getattr(training, option)}: Megatron keeps Adam's states in fp32 except under "
                             "its precision-aware optimizer", hint=f"add --precision-aware-optimizer, or leave {flag} out")
    if training.optimizer_offload and not training.precision_aware_optimizer:  # Megatron-LM's validate_args:
        # "The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`"
        raise InputError("--optimizer-offload: Megatron offloads the optimizer through its precision-aware optimizer only",
                         hint="add --precision-aware-optimizer, or leave --optimizer-offload out")
    if training.optimizer_offload and training.fp8_param_gather:  # "... must be used in conjunction with
        # `--fp8-recipe delayed`" — gplan's FP8 recipes are current-scaling and block-scaled ones
        raise InputError("--optimizer-offload with --fp8-param-gather runs on FP8 delayed scaling only, which gplan "
                         "does not price", hint="leave --fp8-param-gather out (the model zoo's offloaded recipes do)")
    if training.optimizer_offload_overlap and not training.optimizer_offload:
        raise InputError("--optimizer-offload-overlap overlaps the offloaded optimizer's copies: nothing is offloaded",
                         hint="add --optimizer-offload 1.0, or leave --optimizer-offload-overlap out")
    if training.precision_aware_optimizer and training.precision == "fp32":
        raise InputError("--precision-aware-optimizer lowers a mixed-precision run's Adam states; the run trains in fp32",
                         hint="use --precision bf16, or leave --precision-aware-optimizer out")
    if training.fp8_param_gather and training.precision not in LOW_PRECISION:
        raise InputError(f"--fp8-param-gather keeps the weights in a low-precision format; {training.precision} has none",
                         hint="use --precision fp8 or mxfp8, or leave --fp8-param-gather out")
