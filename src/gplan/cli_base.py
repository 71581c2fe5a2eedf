"""What every `gplan` command shares: the console, the `--json` envelope, the error boundary and the
options several commands take — their help written from the catalogues (spec.engines, the precisions,
the recompute options), so that a new engine or precision shows up in `--help` by itself.

Human text goes to stderr. With `--json`, stdout carries exactly one document:

    {"gplan": "<version>", "command": "<command>", "ok": true, "data": ...}
    {"gplan": "<version>", "command": "<command>", "ok": false, "error": {"message", "hint", "exit_code"}[, "data"]}

Exit codes: gplan.errors."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
import typing
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from gplan import __version__
from gplan.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, GplanError, UsageError
from gplan.engines import ENGINE_NAMES, ENGINES, LAUNCH_BACKENDS, has_part
from gplan.spec.names import RECOMPUTE_MODULES, RECOMPUTE_OPTIONS, SCHEDULES, Precision


def read_plan(path):
    """gplan.plan's reader, imported when a command reads a plan (not to write the help)."""
    from gplan.plan import read_plan as read

    return read(path)

# A terminal's own width (or $COLUMNS); 150 in a log. Tables fit it without cutting a number (render.fit).
err = Console(stderr=True, width=None if sys.stderr.isatty() or os.environ.get("COLUMNS", "").isdigit() else 150)


def envelope(command: str, data: Any = None, error: GplanError | None = None, code: int = 0,
             message: str | None = None, hint: str | None = None) -> dict:
    """The one shape of every `--json` document."""
    head = {"gplan": __version__, "command": command}
    if error is None and message is None:
        return head | {"ok": True, "data": data}
    body = {"message": message or error.message, "hint": hint if message else error.hint, "exit_code": code}
    found = data if data is not None else getattr(error, "data", None)
    return head | {"ok": False, "error": body} | ({"data": found} if found is not None else {})


def emit(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def guarded(fn: Callable) -> Callable:
    """A command's boundary: what it returns with `--json` is written in the envelope; gplan's typed
    errors become `error:`/`hint:` lines and their exit codes; anything else is an internal error
    (exit 1), with its traceback only when GPLAN_DEBUG=1."""
    command = fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            data = fn(*args, **kwargs)
            if as_json and data is not None:
                emit(envelope(command, data))
            return None
        except GplanError as exc:
            _fail(as_json, command, "error", exc.message, exc.hint, exc.code, exc)
        except KeyboardInterrupt:
            # Ctrl-C: one line that says what stopped. gplan writes every file whole or not at all (io.atomic_write_text)
            err.print(f"[yellow]interrupted:[/] gplan {command} stopped by Ctrl-C before it finished; "
                      "no file was left half-written", highlight=False)
            if as_json:
                emit(envelope(command, message=f"{command} interrupted", code=EXIT_INTERRUPTED))
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`gplan … | head`): nothing more to say to it, and no traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_INTERNAL) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            _fail(as_json, command, "internal error", f"{type(exc).__name__}: {exc}",
                  "rerun with GPLAN_DEBUG=1 for the traceback and report it", EXIT_INTERNAL, None)

    return wrapper


def _fail(as_json: bool, command: str, label: str, message: str, hint: str | None, code: int,
          error: GplanError | None) -> None:
    if os.environ.get("GPLAN_DEBUG") == "1":
        traceback.print_exc()
    err.print(f"[red]{label}:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        err.print(f"[yellow]hint:[/] {escape(hint)}", highlight=False, soft_wrap=True)
    if as_json:
        emit(envelope(command, error=error, code=code) if error is not None else
             envelope(command, message=f"{label}: {message}", hint=hint, code=code))
    raise typer.Exit(code) from None


def set_wide(wide: bool) -> None:
    """--wide: no column is dropped to fit the terminal; long lines run on."""
    if wide:
        from gplan.render import WIDE

        err.width = WIDE


def choices(names: typing.Iterable[str]) -> str:
    return " | ".join(names)


PRECISIONS = typing.get_args(Precision)

# ---- options several commands share -------------------------------------------------------------------

ModelArg = typer.Argument(..., help="model.yaml, an HF config.json (or its folder), or a bundled name (gplan models)")
LaunchModelArg = typer.Argument(None, help="model.yaml, an HF config.json (or its folder), or a bundled name (gplan "
                                "models); with --from, optional: the launch's own model")


LAYOUT_FLAGS = {"dp": "--dp", "tp": "--tp", "pp": "--pp", "vpp": "--vpp", "cp": "--cp", "ep": "--ep", "etp": "--etp",
                "sp": "--sp", "mbs": "--mbs", "recompute": "--recompute", "recompute_modules": "--recompute-modules",
                "offload_layers": "--offload-layers", "zero": "--zero", "schedule": "--schedule", "stages": "--stages"}
"""estimate's layout options, which --from takes from the launch itself."""


def launch_layout_only(from_file, **given) -> None:
    """estimate --from prices the launch's own layout: a layout option beside it (tp, pp and cp count when not 1,
    their default) would be dropped without a word, so it is refused, pointing to what does what the user meant."""
    said = [LAYOUT_FLAGS[k] for k, v in given.items() if v is not None and not (k in ("tp", "pp", "cp") and v == 1)]
    if said:
        raise UsageError(f"{said[0]} with --from: estimate prices the layout {from_file} runs, not another",
                         hint=f"change it in the launch, or search around the launch: gplan search --from {from_file} "
                              f"{said[0]} …")


def model_or_launch(model: str | None, from_file) -> None:
    """MODEL may be left out only where --from states it."""
    if model is None and from_file is None:
        raise UsageError("MODEL is missing", hint="name a model (gplan models lists them), or price a launch: --from FILE")
DevicesOpt = typer.Option(None, "--devices", "-n", help="devices to use (default: all of the cluster file)")
ClusterOpt = typer.Option(None, "--cluster", "-c", help="bundled cluster name or cluster.yaml (default: dgx-a100-80g)")
HardwareOpt = typer.Option(None, "--hardware", help="bundled hardware name, or your own hardware.yaml (base: a bundled name, and the numbers it changes); links of the base's bundled cluster")
PerNodeOpt = typer.Option(None, "--devices-per-node", help="with --hardware: devices per node")
GbsOpt = typer.Option(None, "--gbs", help="global batch in sequences (default: ~4M tokens)")
SeqOpt = typer.Option(None, "--seq-length", help="tokens per sequence (default: the model's)")
PrecisionOpt = typer.Option(None, "--precision", help=f"{choices(PRECISIONS)} (default: bf16 where supported); "
                            "low-precision recipes keep BF16 weights, attention and the loss")
HeadroomOpt = typer.Option(0.1, "--memory-headroom", help="fraction of device memory kept free")
ImbalanceOpt = typer.Option(1.0, "--expert-imbalance", help="mixtures of experts: the busiest device's routed tokens "
                            "over the balanced share (1.0: balanced, what the published runs force; ~1.8 priced the model "
                            "zoo's dropless Qwen3-235B runs at ep 8, docs/moe.md)")
JsonOpt = typer.Option(False, "--json", help="print one JSON document on stdout (gplan, command, ok, data)")
WideOpt = typer.Option(False, "--wide", help="show every table column, however wide the terminal")
ProfileOpt = typer.Option(None, "--profile", help="a measured profile (gplan profile / gplan calibrate) instead of --cluster")
TargetOpt = typer.Option(None, "--target", help=f"the engine that runs it, whose memory accounting prices it: "
                         f"{choices(ENGINE_NAMES)} (default: the hardware's backend; Megatron-LM for FP8 and experts "
                         "on GPUs)")
SearchTargetOpt = typer.Option(None, "--target", help=f"only plans this runs as priced: {choices(ENGINE_NAMES)} "
                               "(default: the hardware's backend; Megatron-LM for FP8 and experts on GPUs)")
FromOpt = typer.Option(None, "--from", help="an engine's launch (Megatron-LM script, torchtitan TOML or script, "
                       "Megatron-DeepSpeed script, MindFormers YAML, a gplan SLURM/k8s export) or training log")
RecomputeOpt = typer.Option(",".join(RECOMPUTE_OPTIONS), "--recompute",
                            help=f"recompute options the ILP may give each layer: {choices(RECOMPUTE_OPTIONS)}")
ModulesOpt = typer.Option(None, "--recompute-modules", help=f"what a selective layer recomputes (Megatron's "
                          f"--recompute-modules; op: torchtitan's per-op AC): {','.join(RECOMPUTE_MODULES)}, or none "
                          "(default: the attention core; a search for Megatron tries the sets its recipes run, one "
                          "for torchtitan its per-op AC; gplan's torch worker runs op too)")
BF16GradsOpt = typer.Option(False, "--grad-reduce-in-bf16", help="keep and reduce the main gradients in bf16, not fp32 "
                            "(Megatron-LM's flag; Megatron-Bridge's performance recipes run it); for torchtitan, FSDP's reduce-scatter "
                            "in bf16 (its training.mixed_precision_reduce)")
PureBf16Opt = typer.Option(False, "--pure-bf16", help="keep the weights, gradients and optimizer states in bf16, "
                           "no fp32 master copy (torchtitan's training.dtype = \"bfloat16\")")
InBackwardOpt = typer.Option(False, "--optimizer-in-backward", help="step the optimizer per parameter in the "
                             "backward, freeing each gradient (torchtitan ≤ 0.2's optimizer.early_step_in_backward; "
                             "no accumulation, pp or ep)")
LegacyGemmOpt = typer.Option(False, "--legacy-grouped-gemm", help="run the experts' GEMMs as one grouped kernel "
                              "(Megatron's --moe-use-legacy-grouped-gemm: no launch per local expert)")
Bf16LossOpt = typer.Option(False, "--bf16-loss", help="the cross-entropy on the 16-bit logits, no fp32 upcast "
                           "(NeMo AutoModel's loss_fn.fp32_upcast: false)")
CompiledLossOpt = typer.Option(False, "--compiled-loss", help="the loss compiled by torch.compile, its fp32 upcast "
                               "fused into the cross-entropy: no fp32 copy of the logits (torchtitan's compile.components "
                               "with \"loss\")")
FsdpOffloadOpt = typer.Option(False, "--fsdp-offload", help="FSDP's CPU offload: sharded weights, gradients and "
                              "Adam's states in host memory, the optimizer stepped on the host — its speed assumed, "
                              "not measured (torchtitan's training.enable_cpu_offload; zero 3)")
AsyncTpOpt = typer.Option(False, "--async-tp", help="torch's asynchronous tensor parallelism: tp's all-gathers and "
                          "reduce-scatters pipelined with the matmuls beside them (torchtitan's "
                          "compile.enable_async_tensor_parallel, which compiles the model)")
LossChunksOpt = typer.Option(None, "--loss-chunks", min=1, help="the loss over the sequence in N chunks, one "
                             "chunk's logits at a time (torchtitan 0.3's ChunkedLossWrapper: 8 by default there; 1: "
                             "the whole sequence's logits at once, as ≤ 0.2 and every other engine run it)")
GradSyncOpt = typer.Option(False, "--grad-sync-each-microbatch", help="sharded data parallel without stages "
                           "reduce-scatters every micro-batch, where the engine defers to a step's last (NeMo "
                           "AutoModel's distributed.defer_fsdp_grad_sync: false)")
AttentionKernelOpt = typer.Option(None, "--attention-kernel", help="the attention kernel, where the engine runs more "
                                  "than one: fused (cuDNN's) or fa2 (FlashAttention-2's class: torch SDPA, FlexAttention; "
                                  "NeMo AutoModel's model.backend.attn sdpa or flex) (default: the engine's own)")
PrecisionAwareOpt = typer.Option(False, "--precision-aware-optimizer", help="keep Adam's states as Transformer "
                                 "Engine's FusedAdam does (Megatron-LM's --use-precision-aware-optimizer, on the "
                                 "distributed optimizer): a bf16 run's master weights as their 16-bit remainders")
AdamMomentsOpt = typer.Option("fp32", "--adam-moments", help="Adam's moments in fp32, bf16, fp16 or fp8 (Megatron-LM's "
                              "--exp-avg-dtype and --exp-avg-sq-dtype; needs --precision-aware-optimizer)")
MasterWeightsOpt = typer.Option("fp32", "--master-weights", help="the master weights in fp32 or fp16 (Megatron-LM's "
                                "--main-params-dtype; needs --precision-aware-optimizer)")
PadCapacityOpt = typer.Option(False, "--moe-pad-to-capacity", help="MoE with an expert capacity: pad every "
                              "expert's input to it (Megatron-core's --moe-pad-expert-input-to-capacity)")
SharedOverlapOpt = typer.Option(False, "--moe-shared-expert-overlap", help="MoE: run the shared experts beside the "
                                "dispatch and combine all-to-alls (Megatron-core's flag; the alltoall dispatcher only)")
OffloadOpt = typer.Option(0.0, "--optimizer-offload", help="the share of the optimizer's states kept and stepped on "
                          "the host, 0 to 1 (Megatron-LM's --optimizer-cpu-offload with --optimizer-offload-fraction; "
                          "needs --precision-aware-optimizer)")
OffloadOverlapOpt = typer.Option(False, "--optimizer-offload-overlap", help="overlap the offloaded optimizer's copies "
                                 "with its host step (Megatron-LM's --overlap-cpu-optimizer-d2h-h2d)")
Fp8ParamsOpt = typer.Option(False, "--fp8-param-gather", help="keep the layers' weights only in the low-precision "
                            "format (Megatron-LM's flag; Megatron-Bridge's FP8 and MXFP8 recipes run it)")


def version_callback(value: bool) -> None:
    if value:
        from gplan import __version__

        sys.stdout.write(f"gplan {__version__}\n")
        raise typer.Exit()


VersionOpt = typer.Option(False, "--version", callback=version_callback, is_eager=True, help="print the version")
A2AOverlapOpt = typer.Option(False, "--moe-a2a-overlap", help="MoE: overlap the experts' all-to-all with another "
                             "micro-batch's compute (Megatron-LM's --overlap-moe-expert-parallel-comm)")
CudaGraphsOpt = typer.Option("none", "--cuda-graphs", help="what CUDA graphs capture: none, moe_router (attention, "
                             "router, permutation) or full_iteration (Megatron-LM's --cuda-graph-impl/-scope); an MoE "
                             "layer exposes host time outside a graph")
DispatcherOpt = typer.Option("alltoall", "--moe-dispatcher", help="MoE: the token dispatcher, alltoall, allgather, "
                             "flex (DeepEP, HybridEP; Megatron-LM's --moe-token-dispatcher-type) or symmetric_memory "
                             "(torchtitan's MinimalAsyncEP): its buffers and traffic")
DispatchCapacityOpt = typer.Option(None, "--moe-dispatch-capacity", help="MoE, flex: HybridEP's output sized for this "
                                   "share (0-1] of the worst case, without a host sync (torchtitan's "
                                   "non_blocking_capacity_factor)")
ScheduleOpt = typer.Option(None, "--schedule", help=f"allowed schedules: {','.join(SCHEDULES)}")


def inputs_of(model: str, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
              profile=None, target: Optional[str] = None, expert_imbalance: float = 1.0, **engine_options):
    """The run's inputs; `engine_options`: TrainingSpec's engine switches (`engine_options`)."""
    from gplan.planner.inputs import resolve_inputs

    return resolve_inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
                          str(profile) if profile else None, target, expert_imbalance, **engine_options)


def engine_options(grad_reduce_in_bf16: bool, fp8_param_gather: bool, moe_a2a_overlap: bool, cuda_graphs: str,
                   moe_dispatcher: str, pure_bf16: bool = False, optimizer_in_backward: bool = False,
                   legacy_grouped_gemm: bool = False, attention_kernel: Optional[str] = None,
                   bf16_loss: bool = False, grad_sync_each_microbatch: bool = False,
                   precision_aware_optimizer: bool = False, adam_moments: str = "fp32",
                   master_weights: str = "fp32", optimizer_offload: float = 0.0,
                   optimizer_offload_overlap: bool = False, moe_shared_expert_overlap: bool = False,
                   moe_pad_to_capacity: bool = False, compiled_loss: bool = False,
                   fsdp_offload: bool = False, loss_chunks: Optional[int] = None,
                   moe_dispatch_capacity: Optional[float] = None, async_tp: bool = False) -> dict:
    """The engine switches of estimate and search, by TrainingSpec field."""
    return {"grad_reduce_in_bf16": grad_reduce_in_bf16, "fp8_param_gather": fp8_param_gather, "pure_bf16": pure_bf16,
            "optimizer_in_backward": optimizer_in_backward, "legacy_grouped_gemm": legacy_grouped_gemm,
            "moe_a2a_overlap": moe_a2a_overlap, "cuda_graphs": cuda_graphs, "moe_dispatcher": moe_dispatcher,
            "attention_kernel": attention_kernel, "bf16_loss": bf16_loss,
            "grad_sync_each_microbatch": grad_sync_each_microbatch,
            "precision_aware_optimizer": precision_aware_optimizer, "adam_moments": adam_moments,
            "master_weights": master_weights, "optimizer_offload": optimizer_offload,
            "optimizer_offload_overlap": optimizer_offload_overlap,
            "moe_shared_expert_overlap": moe_shared_expert_overlap, "moe_pad_to_capacity": moe_pad_to_capacity,
            "compiled_loss": compiled_loss, "fsdp_offload": fsdp_offload, "loss_chunks": loss_chunks,
            "moe_dispatch_capacity": moe_dispatch_capacity, "async_tp": async_tp}

# ---- estimate -----------------------------------------------------------------------------------------

EstimateDp = typer.Option(None, "--dp", help="default: the devices over tp·pp·cp")
EstimateTp, EstimatePp, EstimateCp = typer.Option(1, "--tp"), typer.Option(1, "--pp"), typer.Option(1, "--cp")
EstimateVpp, EstimateMbs = typer.Option(None, "--vpp"), typer.Option(None, "--mbs")
EstimateEp = typer.Option(None, "--ep", help="expert parallelism (MoE models)")
EstimateEtp = typer.Option(None, "--etp", help="expert tensor parallelism (MoE models)")
EstimateSp = typer.Option(None, "--sp/--no-sp", help="Megatron sequence parallelism in the tp group")
EstimateRecompute = typer.Option(None, "--recompute", help=f"{choices(RECOMPUTE_OPTIONS)} for every layer")
EstimateZero = typer.Option(None, "--zero", help="0..3")
EstimateOffload = typer.Option(None, "--offload-layers", help="layers whose activations wait in host memory "
                               "(Megatron's --cpu-offloading-num-layers; pp 1, no recompute)")
EstimateStages = typer.Option(None, "--stages", help="layers per pipeline stage, e.g. 7,8,8,8,8,8,8,6")

# ---- search -------------------------------------------------------------------------------------------

SearchTp = typer.Option(None, "--tp", help="allowed tp degrees, e.g. 1,2,4,8")
SearchPp = typer.Option(None, "--pp", help="allowed pp degrees")
SearchDp = typer.Option(None, "--dp", help="allowed dp degrees")
SearchCp = typer.Option(None, "--cp", help="allowed cp degrees")
SearchEp = typer.Option(None, "--ep", help="allowed expert-parallel degrees (MoE; default: powers of two dividing the "
                        "experts)")
SearchEtp = typer.Option(None, "--etp", help="allowed expert tensor-parallel degrees (MoE; default 1)")
SearchMbs = typer.Option(None, "--mbs", help="allowed micro-batch sizes (default 1,2,4,8)")
SearchVpp = typer.Option(None, "--vpp", help="allowed virtual stages per rank (default: every chunking of a stage's "
                         "layers the target runs)")
SearchZero = typer.Option(None, "--zero", help="allowed optimizer sharding levels (default: 0..3 as the rules and the "
                          "target allow; 0,1 with experts)")
AllDevicesOpt = typer.Option(False, "--all-devices", help="never use fewer devices than given")
TimeLimitOpt = typer.Option(10.0, "--time-limit", help="seconds per ILP solve (heterogeneous clusters; one node group "
                            "is split exactly by dynamic programming)")
TopOpt = typer.Option(5, "--top", help="plans to show")
OutPlanOpt = typer.Option(Path("plan.json"), "--out", "-o", help="where to write the best plan")
SearchFromOpt = typer.Option(None, "--from", help="an engine's launch or log (Megatron-LM, torchtitan, "
                             "Megatron-DeepSpeed, MindFormers): search its batch, precision and engine, and show its "
                             "layout beside the best plan")
OutLaunchOpt = typer.Option(None, "--out-launch", help="with --from: write the launch back here with only its layout "
                            "flags changed to the best plan's")

# ---- launch -------------------------------------------------------------------------------------------

PlanArg = typer.Argument(..., metavar="PLAN", help="a plan.json")
BackendOpt = typer.Option(None, "--backend", help=f"{choices(LAUNCH_BACKENDS)}; default: the plan's target if gplan "
                          "launches it, else the hardware's backend")
NprocOpt = typer.Option(None, "--nproc-per-node", help="processes per node (default: the plan's devices per node)")
NnodesOpt = typer.Option(None, "--nnodes", help="nodes (default: world size / processes per node)")
NodeRankOpt = typer.Option(0, "--node-rank", help="this node's rank (several nodes)")
EndpointOpt = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 (several nodes)")
RdzvIdOpt = typer.Option("gplan", "--rdzv-id", help="rendezvous id of a c10d launch (--slurm uses the job id; "
                         "--node-rank launches use the static rendezvous, which has none)")
DryRunOpt = typer.Option(False, "--dry-run", help="print every node's command and exit")
SlurmOpt = typer.Option(None, "--slurm", help="write a SLURM batch script to this file and exit")
ValidateOpt = typer.Option(False, "--validate", help="build the layout without running a step (torch: the sharded "
                           "model on the meta device with a fake process group; MindSpore: the operator strategies) "
                           "and compare it with the plan")
StepsOpt = typer.Option(10, "--steps", help="optimizer steps")
WarmupOpt = typer.Option(2, "--warmup-steps", help="steps left out of the measured step time")
LayersOpt = typer.Option(None, "--layers", help="run a scaled-down model: this many layers")
HiddenOpt = typer.Option(None, "--hidden", help="scaled-down hidden size")
ScaledSeqOpt = typer.Option(None, "--seq-length", help="scaled-down sequence length")
LaunchGbsOpt = typer.Option(None, "--gbs", help="global batch (sequences)")
DataOpt = typer.Option(None, "--data", help="token file: a flat uint16 (uint32 for vocabularies > 65536) array")
DeviceOpt = typer.Option("auto", "--device", help="auto | cpu | cuda")
CheckpointDirOpt = typer.Option(None, "--checkpoint-dir", help="write and resume checkpoints here")
CheckpointEveryOpt = typer.Option(0, "--checkpoint-every", help="checkpoint every K steps")
ResumeOpt = typer.Option(False, "--resume", help="continue from the latest checkpoint in --checkpoint-dir")
ReplanDevicesOpt = typer.Option(None, "--devices", help="devices left")
LostNodesOpt = typer.Option(None, "--lost-nodes", help="nodes lost (of the plan's cluster's node size)")
OptimizerReshardableOpt = typer.Option(False, "--optimizer-reshardable", help="the run saved its optimizer state in "
                                       "the engine's fully reshardable format (Megatron: "
                                       "--dist-ckpt-optim-fully-reshardable)")
ReplanExportOpt = typer.Option(None, "--export", help="also write the new plan's launch files for this engine "
                               "(as gplan export --to) and RESUME.md: how to load the old checkpoint into them")
ReplanExportDirOpt = typer.Option(Path("replan-export"), "--export-dir", help="where --export writes")
ReplanOutOpt = typer.Option(Path("replan.json"), "--out", "-o", help="where to write the new plan")
WhatIfLostOpt = typer.Option(None, "--what-if-lost", help="also show the best layout after losing these numbers of "
                             "nodes, e.g. 1,2")
ResumeFromOpt = typer.Option(None, "--resume-from", help="continue another run (its RUN_DIR, or its checkpoint "
                             "directory) from its last complete checkpoint, resharded into this plan's layout")
ElasticOpt = typer.Option(False, "--elastic", help="when a worker is lost, re-plan for the devices left and resume "
                          "from the last checkpoint (needs --checkpoint-dir and --checkpoint-every)")
LaunchProfileOpt = typer.Option(False, "--profile", help="trace the steps after the warm-up with torch.profiler "
                                "(RUN_DIR/profile/rank*.json; compare with gplan explain PLAN --against RUN_DIR)")
RunDirOpt = typer.Option(Path("gplan-run"), "--run-dir", help="logs, the plan that ran, run_report.json")
LrOpt = typer.Option(3e-3, "--lr", help="AdamW learning rate")
SeedOpt = typer.Option(0, "--seed", help="seed of the weights and the synthetic data")

# ---- export, profile, calibrate, validate -------------------------------------------------------------


def export_choices() -> str:
    from gplan.backends.deployments import DEPLOYMENTS

    return choices([n for n in ENGINES if has_part(n, "export")] + list(DEPLOYMENTS))


ToOpt = typer.Option(..., "--to", help=f"{export_choices()}")
OutDirOpt = typer.Option(Path("."), "--out-dir", "-o", help="where to write the exported files")
ImageOpt = typer.Option(None, "--image", help="k8s: the container image the pods run (gplan and torch installed)")
OverBudgetOpt = typer.Option(False, "--over-budget", help="write it even where the engine's own memory accounting puts "
                             "a stage over its budget (refused otherwise, exit 3)")
TargetVersionOpt = typer.Option(None, "--target-version", help="the engine version to write for (torchtitan: 0.3 | "
                                "main)")
ProfileModelOpt = typer.Option(..., "--model", "-m", help="the model whose layers to measure (file or bundled name)")
ProfileOutOpt = typer.Option(Path("profile.yaml"), "--out", "-o", help="profile to write (resumed when it exists)")
ProfileBackendOpt = typer.Option("torch", "--backend", help=f"{choices(LAUNCH_BACKENDS)} (CUDA, Ascend or CPU)")
NprocLinksOpt = typer.Option(1, "--nproc", help="processes for the link measurement (devices of this node)")
NnodesLinksOpt = typer.Option(1, "--nnodes", help="nodes for the link measurement")
ProfileMbsOpt = typer.Option("1,2,4", "--mbs", help="micro-batch sizes to measure")
ProfileTpOpt = typer.Option("1,2", "--tp", help="tp shard widths to measure")
ProfileSeqOpt = typer.Option(None, "--seq-length", help="default: the model's")
ProfilePrecisionOpt = typer.Option(None, "--precision", help="default: bf16 on GPUs, fp32 on CPUs")
MaxBytesOpt = typer.Option(None, "--max-bytes", help="largest message (default 256 MiB on GPUs, 16 MiB on CPUs)")
RunsArg = typer.Argument(..., help="run_report.json files of gplan launch (their plan.json beside them), or engines' "
                         "training logs (Megatron-LM, Megatron-DeepSpeed, torchtitan, MindFormers)")
HeldOutOpt = typer.Option([], "--held-out", help="reports to predict but not fit (repeat)")
CalibratedOutOpt = typer.Option(Path("profile.yaml"), "--out", "-o", help="the calibrated profile")
LogClusterOpt = typer.Option(None, "--cluster", "-c", help="the cluster the engines' logs ran on (a log does not name "
                             "its hardware)")
ValidateFileArg = typer.Argument(..., help="a model.yaml, HF config.json, cluster.yaml or plan.json")
RefreshOpt = typer.Option(False, "--refresh", help="plan.json edited on purpose: rebuild what follows from its "
                          "inputs, degrees and split (ranges, ranks, prediction, digest)")

# ---- explain ------------------------------------------------------------------------------------------

WhatIfOpt = typer.Option([], "--what-if", help='e.g. "inter_node_bandwidth=2x", "devices=128", "memory=1.5x", '
                         '"gbs=1024" (repeat to combine)')
SvgOpt = typer.Option(None, "--svg", hidden=True,
                      help="gone: the schedule is a plotly chart in --report FILE.html (gplan draws no chart by hand)")
PictureWidthOpt = typer.Option(None, "--width", help="columns of the terminal schedule picture (default: the "
                               "terminal's)")
TraceOpt = typer.Option(None, "--trace", help="write the predicted step as a trace (Trace Event JSON: open it in "
                        "Perfetto or chrome://tracing)")
TraceRanksOpt = typer.Option("stages", "--trace-ranks", help="stages: one process per pipeline stage (its first "
                             "rank); all: every rank")
AgainstOpt = typer.Option(None, "--against", help="a run directory of `gplan launch --profile`: measured beside "
                          "predicted, per stage and term")
ReportOpt = typer.Option(None, "--report", help="also write a self-contained HTML report (charts, schedule, table)")


# ---- start-up -----------------------------------------------------------------------------------------

def load_numpy_single_threaded() -> None:
    """Load numpy with one OpenBLAS thread: gplan's arrays are tiny (the split DP's, placement's), and the
    thread pool numpy's OpenBLAS starts on import costs a start-up of 30-50 ms on 2 cores and does
    nothing here. The variable is set only while numpy loads, so the processes gplan launches inherit
    the user's environment unchanged; a user's own setting is kept."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def help_asked(app: typer.Typer, argv: list[str]) -> str | None:
    """The help text `argv` asks for (`gplan`, `gplan --help`, `gplan COMMAND --help …`), written by click's
    own formatter from the command typer builds — without parsing the other arguments, which in typer ≥ 0.29
    builds a pydantic adapter for each option's value (~0.1 s of a 0.2 s help). None: not a help request, or
    one typer answers itself (an unknown command: its error names it)."""
    if argv and "--help" not in argv:
        return None
    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="gplan")
    command = group
    for token in argv:
        if token.startswith("-"):
            break
        found = command.get_command(context, token) if hasattr(command, "get_command") else None
        if found is None:
            return None
        context, command = found.context_class(found, info_name=token, parent=context), found
    return command.get_help(context)
