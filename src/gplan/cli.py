"""`gplan` command line: every command parses its options, calls one library function and renders what
it returns; nothing a library user would need lives here. The console, the `--json` envelope, the error
boundary and the shared options: gplan.cli_base. Exit codes: gplan.errors."""

from __future__ import annotations

import gc

# Importing gplan and its dependencies (typer, rich, pydantic's schemas) allocates some 10^5 long-lived
# objects and next to no garbage; with the cyclic collector on they set off ~130 collections, each
# rescanning the young ones (~25 ms of a 0.3 s start-up). Paused until the module is loaded.
_COLLECTING = gc.isenabled()
gc.disable()

import sys
from pathlib import Path
from typing import Optional

import typer

from gplan import cli_base as o
from gplan.cli_base import (ClusterOpt, DevicesOpt, FromOpt, GbsOpt, HardwareOpt, HeadroomOpt, ImbalanceOpt, JsonOpt,
                            PerNodeOpt, PrecisionOpt, ProfileOpt, RecomputeOpt, ScheduleOpt, SearchTargetOpt,
                            SeqOpt, TargetOpt, WideOpt, err, guarded, inputs_of, set_wide)
from gplan.errors import EXIT_INTERRUPTED, InputError, UsageError
from gplan.io import atomic_write_text
from gplan.cli_base import read_plan

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Plan and launch parallel training of large transformers.")


@app.command()
@guarded
def estimate(
    model: Optional[str] = o.LaunchModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    dp: Optional[int] = o.EstimateDp, tp: int = o.EstimateTp, pp: int = o.EstimatePp, vpp: Optional[int] = o.EstimateVpp,
    cp: int = o.EstimateCp, ep: Optional[int] = o.EstimateEp, etp: Optional[int] = o.EstimateEtp,
    sp: Optional[bool] = o.EstimateSp, mbs: Optional[int] = o.EstimateMbs, recompute: Optional[str] = o.EstimateRecompute,
    recompute_modules: Optional[str] = o.ModulesOpt, offload_layers: Optional[int] = o.EstimateOffload,
    zero: Optional[int] = o.EstimateZero, schedule: Optional[str] = ScheduleOpt, stages: Optional[str] = o.EstimateStages,
    from_file: Optional[Path] = FromOpt, gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt,
    precision: Optional[str] = PrecisionOpt, memory_headroom: float = HeadroomOpt, profile: Optional[Path] = ProfileOpt,
    target: Optional[str] = TargetOpt, expert_imbalance: float = ImbalanceOpt, as_json: bool = JsonOpt,
    wide: bool = WideOpt, grad_reduce_in_bf16: bool = o.BF16GradsOpt, fp8_param_gather: bool = o.Fp8ParamsOpt,
    moe_a2a_overlap: bool = o.A2AOverlapOpt, cuda_graphs: str = o.CudaGraphsOpt, moe_dispatcher: str = o.DispatcherOpt,
    pure_bf16: bool = o.PureBf16Opt, optimizer_in_backward: bool = o.InBackwardOpt,
    legacy_grouped_gemm: bool = o.LegacyGemmOpt, attention_kernel: Optional[str] = o.AttentionKernelOpt,
    bf16_loss: bool = o.Bf16LossOpt, compiled_loss: bool = o.CompiledLossOpt, fsdp_offload: bool = o.FsdpOffloadOpt,
    loss_chunks: Optional[int] = o.LossChunksOpt,
    grad_sync_each_microbatch: bool = o.GradSyncOpt,
    precision_aware_optimizer: bool = o.PrecisionAwareOpt, adam_moments: str = o.AdamMomentsOpt,
    master_weights: str = o.MasterWeightsOpt, optimizer_offload: float = o.OffloadOpt,
    optimizer_offload_overlap: bool = o.OffloadOverlapOpt, moe_shared_expert_overlap: bool = o.SharedOverlapOpt,
    moe_pad_to_capacity: bool = o.PadCapacityOpt,
    moe_dispatch_capacity: Optional[float] = o.DispatchCapacityOpt, async_tp: bool = o.AsyncTpOpt):
    """Predict step time, throughput, MFU and memory of one configuration.

    What is not given (vpp, mbs, zero, sp, recompute, the split, ep/etp) is chosen as `gplan search`
    would for these degrees, and printed. MODEL may also be a plan.json: its configuration and stage
    split are re-predicted; with --from, the launch or log's own layout is priced."""
    set_wide(wide)
    from gplan import render
    from gplan.plan import is_plan_file

    o.model_or_launch(model, from_file)
    if model is not None and is_plan_file(Path(model)):
        from gplan.planner.build import repredict

        plan = read_plan(Path(model))
        prediction = repredict(plan)
        if as_json:
            return prediction.model_dump(mode="json")
        return render.prediction_summary(err, f"{plan.model.name} from {model}", plan.parallel, prediction,
                                         label=plan.label())
    options = o.engine_options(grad_reduce_in_bf16, fp8_param_gather, moe_a2a_overlap, cuda_graphs, moe_dispatcher,
                               pure_bf16, optimizer_in_backward, legacy_grouped_gemm, attention_kernel, bf16_loss,
                               grad_sync_each_microbatch, precision_aware_optimizer, adam_moments, master_weights,
                               optimizer_offload, optimizer_offload_overlap, moe_shared_expert_overlap,
                               moe_pad_to_capacity, compiled_loss, fsdp_offload, loss_chunks,
                              moe_dispatch_capacity=moe_dispatch_capacity, async_tp=async_tp)
    if from_file is not None:
        from gplan.planner.launch_files import priced_launch

        o.launch_layout_only(from_file, dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, sp=sp, mbs=mbs,
                             recompute=recompute, recompute_modules=recompute_modules, offload_layers=offload_layers,
                             zero=zero, schedule=schedule, stages=stages)
        launch, inputs, config, layouts, prediction = priced_launch(from_file, model, devices, cluster, hardware,
                                                                    devices_per_node, seq_length, memory_headroom, profile,
                                                                    target, expert_imbalance, gbs, precision, options)
        if as_json:
            return render.launch_json(launch, config, prediction, from_file, layouts)
        return render.launch_output(err, launch, inputs, config, prediction, from_file, layouts)
    from gplan.planner.complete import estimate as estimated, given_options

    inputs = inputs_of(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                       profile, target, expert_imbalance, **options)
    result = estimated(inputs, given_options(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, sp=sp, mbs=mbs,
                                             recompute=recompute, recompute_modules=recompute_modules,
                                             offload_layers=offload_layers, zero=zero, schedule=schedule), stages)
    if as_json:
        return render.estimate_json(result)
    render.estimate_output(err, result)


@app.command()
@guarded
def search(
    model: Optional[str] = o.LaunchModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt, gbs: Optional[int] = GbsOpt,
    seq_length: Optional[int] = SeqOpt, precision: Optional[str] = PrecisionOpt, memory_headroom: float = HeadroomOpt,
    expert_imbalance: float = ImbalanceOpt, tp: Optional[str] = o.SearchTp, pp: Optional[str] = o.SearchPp,
    dp: Optional[str] = o.SearchDp, cp: Optional[str] = o.SearchCp, ep: Optional[str] = o.SearchEp,
    etp: Optional[str] = o.SearchEtp, mbs: Optional[str] = o.SearchMbs, vpp: Optional[str] = o.SearchVpp,
    zero: Optional[str] = o.SearchZero, recompute: str = RecomputeOpt, recompute_modules: Optional[str] = o.ModulesOpt,
    schedule: Optional[str] = ScheduleOpt, all_devices: bool = o.AllDevicesOpt, target: Optional[str] = SearchTargetOpt,
    time_limit: float = o.TimeLimitOpt, top: int = o.TopOpt, out: Path = o.OutPlanOpt, profile: Optional[Path] = ProfileOpt,
    from_file: Optional[Path] = o.SearchFromOpt, out_launch: Optional[Path] = o.OutLaunchOpt,
    report: Optional[Path] = o.ReportOpt, what_if_lost: Optional[str] = o.WhatIfLostOpt, as_json: bool = JsonOpt,
    wide: bool = WideOpt, grad_reduce_in_bf16: bool = o.BF16GradsOpt, fp8_param_gather: bool = o.Fp8ParamsOpt,
    moe_a2a_overlap: bool = o.A2AOverlapOpt, cuda_graphs: str = o.CudaGraphsOpt, moe_dispatcher: str = o.DispatcherOpt,
    pure_bf16: bool = o.PureBf16Opt, optimizer_in_backward: bool = o.InBackwardOpt,
    legacy_grouped_gemm: bool = o.LegacyGemmOpt, attention_kernel: Optional[str] = o.AttentionKernelOpt,
    bf16_loss: bool = o.Bf16LossOpt, compiled_loss: bool = o.CompiledLossOpt, fsdp_offload: bool = o.FsdpOffloadOpt,
    loss_chunks: Optional[int] = o.LossChunksOpt,
    grad_sync_each_microbatch: bool = o.GradSyncOpt,
    precision_aware_optimizer: bool = o.PrecisionAwareOpt, adam_moments: str = o.AdamMomentsOpt,
    master_weights: str = o.MasterWeightsOpt, optimizer_offload: float = o.OffloadOpt,
    optimizer_offload_overlap: bool = o.OffloadOverlapOpt, moe_shared_expert_overlap: bool = o.SharedOverlapOpt,
    moe_pad_to_capacity: bool = o.PadCapacityOpt,
    moe_dispatch_capacity: Optional[float] = o.DispatchCapacityOpt, async_tp: bool = o.AsyncTpOpt):
    """Search degrees, micro-batch, recompute, optimizer sharding, stage split and placement; write the best plan."""
    set_wide(wide)
    from gplan import render
    from gplan.plan import write_plan
    from gplan.planner import plan as make_best_plan
    from gplan.planner.space import int_list, limits_from_options
    # what --from, --out-launch, --report and --what-if-lost need is imported when they are given (start-up)

    o.model_or_launch(model, from_file)
    if top < 1:
        raise InputError(f"--top {top}: show at least one plan", hint="for example --top 5")
    lost = int_list(what_if_lost, "--what-if-lost")
    if out.is_dir():
        raise InputError(f"--out {out}: is a directory", hint=f"name a file, e.g. --out {out / 'plan.json'}")
    if out_launch is not None and from_file is None:
        raise UsageError("--out-launch rewrites the launch of --from", hint="add --from train.sh")
    mine, own_cluster, options = None, None, o.engine_options(grad_reduce_in_bf16, fp8_param_gather, moe_a2a_overlap, cuda_graphs, moe_dispatcher,
                              pure_bf16, optimizer_in_backward, legacy_grouped_gemm, attention_kernel, bf16_loss,
                              grad_sync_each_microbatch, precision_aware_optimizer, adam_moments, master_weights,
                              optimizer_offload, optimizer_offload_overlap, moe_shared_expert_overlap,
                              moe_pad_to_capacity, compiled_loss, fsdp_offload, loss_chunks,
                               moe_dispatch_capacity=moe_dispatch_capacity, async_tp=async_tp)
    if from_file is not None:  # the launch's devices, batch, sequence, precision and engine, unless said otherwise
        from gplan.planner.launch_files import launch_cluster, launch_defaults, priced_launch

        mine = priced_launch(from_file, model, devices, cluster, hardware, devices_per_node, seq_length, memory_headroom,
                             profile, target, expert_imbalance, gbs, precision, options)  # yours, as the search prices
        devices, gbs, target, seq_length, precision, options = launch_defaults(mine, gbs, target, seq_length, precision,
                                                                               options)
        model = model or mine[1].model
        own_cluster = launch_cluster(mine[0], cluster, hardware, profile)
        cluster = own_cluster[0] if own_cluster else cluster  # the launch's devices (an Ascend YAML's), said so
    inputs = inputs_of(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                       profile, target, expert_imbalance, **options)
    if own_cluster:
        import dataclasses

        inputs = dataclasses.replace(inputs, cluster_note=mine[1].cluster_note)
    limits = limits_from_options(tp, pp, dp, cp, mbs, vpp, zero, recompute, schedule, all_devices, ep, etp,
                                 recompute_modules)
    with render.SearchProgress(err) as progress:
        planned = make_best_plan(inputs, limits, top=top, time_limit_s=time_limit, progress=progress)
    # prepared before anything is written: a launch it cannot rewrite writes nothing
    rewritten, page = {}, None
    if out_launch is not None:
        from gplan.backends.exporters.write_back import write_back

        rewritten = write_back(planned.plan, mine[0].engine, from_file, out_launch)
    if report is not None:
        from gplan.html_report import report_page

        page = report_page(planned.plan)
    write_plan(planned.plan, out)
    if page is not None:
        atomic_write_text(report, page)
        err.print(f"[green]wrote[/] {report} (the report: open it in a browser)", highlight=False)
    for path, text in rewritten.items():
        atomic_write_text(path, text)
        err.print(f"[green]wrote[/] {path} (your launch, its layout the best plan's)", highlight=False)
    versus, losses = None, None
    if mine:
        from gplan.planner.launch_files import launch_versus

        versus = launch_versus(mine, planned)
    if lost:
        from gplan.planner.replan import failure_table

        losses = failure_table(planned.plan, lost)
    if as_json:
        return render.search_json(out, planned.search) | ({"from": versus} if versus else {}) | (
            {"what_if_lost": [render.lost_row_json(row) for row in losses]} if losses else {}) | (
            {"report": str(report)} if report is not None else {})
    render.search_output(err, inputs, planned, mine, versus, out)
    if losses:
        err.print(render.failure_table(losses, planned.plan, err.width))


@app.command()
@guarded
def compare(
    items: Optional[list[str]] = typer.Argument(None, help="plan.json files, or one MODEL followed by --config or "
                                                "--from options (with --from only, MODEL may be left out)"),
    config: list[str] = typer.Option([], "--config", help='a configuration, e.g. "tp=8,pp=4,mbs=1" (repeat)'),
    from_files: list[Path] = typer.Option([], "--from", help="an engine's launch or log of MODEL, priced as it runs "
                                          "(repeat)"),
    devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt, hardware: Optional[str] = HardwareOpt,
    devices_per_node: Optional[int] = PerNodeOpt, gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt,
    precision: Optional[str] = PrecisionOpt, memory_headroom: float = HeadroomOpt, target: Optional[str] = TargetOpt,
    as_json: bool = JsonOpt, wide: bool = WideOpt,
):
    """Compare plans (or configurations of one model) side by side; the best value of each row is
    highlighted and the term that grew most is named."""
    set_wide(wide)
    from gplan import render
    from gplan.planner.complete import compare_configs, compare_plans
    from gplan.planner.launch_files import compare_launches

    items = items or []
    if from_files and not config and not items:
        items = [None]  # each launch's own model
    if (config or from_files) and len(items) != 1:
        raise InputError(f"{'--config' if config else '--from'} compares {'configurations' if config else 'launches'} "
                         "of one model", hint="pass exactly one MODEL")
    if not (config or from_files) and len(items) < 2:
        raise InputError("compare needs two or more plans, or one MODEL with --config or --from",
                         hint="gplan compare a.json b.json")
    entries, engine = [], None
    if from_files:
        entries += compare_launches(from_files, items[0], devices, cluster, hardware, devices_per_node, seq_length,
                                    memory_headroom, target)
    if config:
        inputs = inputs_of(items[0], devices, cluster, hardware, devices_per_node, gbs, seq_length, precision,
                           memory_headroom, target=target)
        entries, engine = entries + compare_configs(inputs, config), inputs.training.engine
    if not entries:
        entries = compare_plans(items)
    if as_json:
        return render.compare_json(entries)
    render.compare_output(err, entries, engine)


@app.command()
@guarded
def explain(
    plan_file: Path = o.PlanArg, what_if: list[str] = o.WhatIfOpt, svg: Optional[Path] = o.SvgOpt,
    trace: Optional[Path] = o.TraceOpt, trace_ranks: str = o.TraceRanksOpt, against: Optional[Path] = o.AgainstOpt,
    report: Optional[Path] = o.ReportOpt, width: Optional[int] = o.PictureWidthOpt, as_json: bool = JsonOpt,
    wide: bool = WideOpt):
    """Why this plan: per-stage time and memory, what binds, why the runner-ups lost, what-ifs, and a
    picture of the pipeline schedule; the predicted step as a trace, beside a profiled run's."""
    set_wide(wide)
    from gplan.planner import explain as ex
    from gplan.render import explain_json, explain_output

    if svg is not None:  # its hand-drawn picture is gone: charts are drawn by plotly (--report)
        raise UsageError(f"--svg {svg}: gplan no longer draws the schedule by hand as an SVG",
                         hint=f"--report {svg.with_suffix('.html')} draws it with plotly (offline), --trace F.json "
                              "opens the step in Perfetto")
    if width is not None and width < 20:
        raise UsageError(f"--width {width}: too narrow for a picture", hint="use --width 60 or more")
    if trace_ranks not in ("stages", "all"):
        raise UsageError(f"--trace-ranks {trace_ranks}: expected stages or all", hint="--trace-ranks all")
    plan = read_plan(plan_file)
    measured = None
    if against is not None:  # read before anything is written: a bad run directory writes nothing
        from gplan.calibration.measured import against_plan

        measured = against_plan(plan, against)
    explanation = ex.explain(plan, [ex.parse_what_if(text) for text in what_if])
    from gplan.html_report import report_page
    from gplan.planner.trace import trace_json

    written = []
    for path, page in ((trace, lambda: trace_json(plan, trace_ranks == "all")), (report, lambda: report_page(plan, explanation))):
        if path:
            atomic_write_text(path, page())
            written.append(path)
    if as_json:
        return explain_json(plan_file, explanation) | {"written": [str(p) for p in written]} | (
            {"against": measured.as_json()} if measured else {})
    explain_output(err, plan, explanation, width or min(err.width, 100), measured, written)


from gplan import cli_run  # noqa: E402  (its commands use this module's start-up settings)

for _name in cli_run.COMMANDS:
    app.command()(getattr(cli_run, _name))


@app.command()
@guarded
def models(as_json: bool = JsonOpt, wide: bool = WideOpt):
    """List the bundled models."""
    set_wide(wide)
    from gplan.profiles.catalogue import bundled_models, load_model
    from gplan.render import models_json, models_table

    specs = [load_model(name) for name in bundled_models()]
    return models_json(specs) if as_json else err.print(models_table(specs, err.width))


@app.command()
@guarded
def hardware(as_json: bool = JsonOpt, wide: bool = WideOpt):
    """List the bundled hardware and clusters."""
    set_wide(wide)
    from gplan.profiles.catalogue import bundled_clusters, bundled_hardware, hardware_entry
    from gplan.profiles.schema import DeviceSpec
    from gplan.render import hardware_tables

    devices = [DeviceSpec.model_validate(hardware_entry(n)) for n in bundled_hardware()]
    if as_json:
        return {"hardware": [d.model_dump(mode="json") for d in devices], "clusters": bundled_clusters()}
    for table in hardware_tables(devices, bundled_clusters(), err.width):
        err.print(table)


@app.command()
@guarded
def validate(file: Path = o.ValidateFileArg, refresh: bool = o.RefreshOpt, as_json: bool = JsonOpt):
    """Check a model, cluster or plan file; exit 3 with the first problem."""
    from gplan.planner.check import validate_file
    from gplan.render import validated_json, validated_line

    found = validate_file(file, refresh)
    return validated_json(file, found) if as_json else err.print(validated_line(file, found), highlight=False)


@app.callback()
def _root(version: bool = o.VersionOpt) -> None:
    """Plan and launch parallel training of large transformers."""


def main() -> None:
    gc.disable()
    asked = o.help_asked(app, sys.argv[1:])
    if asked is not None:
        sys.stdout.write(asked + "\n")
        return
    if not {"--help", "--version"} & set(sys.argv[1:]):  # help and the version need no numpy
        o.load_numpy_single_threaded()
    # what is loaded now lives as long as the process: out of the collector's reach, so that no later
    # collection rescans it (the search pauses the collector anyway; launch and profile run long)
    gc.freeze()
    if _COLLECTING:
        gc.enable()
    try:
        app()
    except KeyboardInterrupt:  # between commands' own handling (start-up, argument parsing): still one line
        sys.stderr.write("interrupted: gplan stopped by Ctrl-C before it finished; no file was left half-written\n")
        sys.exit(EXIT_INTERRUPTED)


if _COLLECTING:
    gc.enable()

if __name__ == "__main__":
    main()
