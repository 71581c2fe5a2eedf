"""`gplan replan | launch | export | profile | calibrate`: the commands that run a plan, hand it to another
engine, or measure and fit — registered on gplan.cli's app in the order `gplan --help` lists them. Each
parses its options, calls one library function and renders what it returns (as gplan.cli's)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from gplan import cli_base as o
from gplan.cli_base import HardwareOpt, JsonOpt, PerNodeOpt, WideOpt, err, guarded, set_wide
from gplan.errors import GplanError, InputError, UsageError
from gplan.cli_base import read_plan

COMMANDS = ("replan", "launch", "export", "profile", "calibrate")


@guarded
def replan(
    plan_file: Path = o.PlanArg, devices: Optional[int] = o.ReplanDevicesOpt, lost_nodes: Optional[int] = o.LostNodesOpt,
    optimizer_reshardable: bool = o.OptimizerReshardableOpt, out: Path = o.ReplanOutOpt,
    export_to: Optional[str] = o.ReplanExportOpt, export_dir: Path = o.ReplanExportDirOpt,
    time_limit: float = o.TimeLimitOpt, as_json: bool = JsonOpt, wide: bool = WideOpt):
    """The best plan on the devices left after losing nodes, among the layouts the plan's checkpoint
    can be loaded into; writes it (resume with gplan launch NEW --resume-from RUN_DIR)."""
    set_wide(wide)
    from gplan.plan import write_plan
    from gplan.planner.replan import devices_left, replan as replanned
    from gplan.recovery import export_replanned
    from gplan.render import replan_json, replan_output

    plan = read_plan(plan_file)
    if (devices is None) == (lost_nodes is None):
        raise UsageError("say how many devices are left: --devices N or --lost-nodes K",
                         hint=f"e.g. --lost-nodes 1 (this plan's nodes have {plan.cluster.primary.devices_per_node} "
                              "devices)")
    if out.resolve() == plan_file.resolve():
        raise InputError(f"--out {out}: the plan being replanned", hint="write the new plan beside it, e.g. "
                         "--out replan.json")
    result = replanned(plan, devices if lost_nodes is None else devices_left(plan, lost_nodes), optimizer_reshardable,
                       time_limit)
    written = export_replanned(result, export_to, export_dir, out) if export_to else []
    write_plan(result.new, out)
    if as_json:
        return replan_json(result, out) | {"exported": [str(p) for p in written]}
    replan_output(err, result, out, written)


@guarded
def launch(
    plan_file: Path = o.PlanArg, backend: Optional[str] = o.BackendOpt, nproc_per_node: Optional[int] = o.NprocOpt,
    nnodes: Optional[int] = o.NnodesOpt, node_rank: int = o.NodeRankOpt, rdzv_endpoint: Optional[str] = o.EndpointOpt,
    rdzv_id: str = o.RdzvIdOpt, dry_run: bool = o.DryRunOpt, slurm: Optional[Path] = o.SlurmOpt,
    validate_only: bool = o.ValidateOpt, steps: int = o.StepsOpt, warmup_steps: int = o.WarmupOpt,
    layers: Optional[int] = o.LayersOpt, hidden: Optional[int] = o.HiddenOpt, seq_length: Optional[int] = o.ScaledSeqOpt,
    gbs: Optional[int] = o.LaunchGbsOpt, data: Optional[Path] = o.DataOpt, device: str = o.DeviceOpt,
    checkpoint_dir: Optional[Path] = o.CheckpointDirOpt, checkpoint_every: int = o.CheckpointEveryOpt,
    resume: bool = o.ResumeOpt, run_dir: Path = o.RunDirOpt, lr: float = o.LrOpt, seed: int = o.SeedOpt,
    trace_steps: bool = o.LaunchProfileOpt, resume_from: Optional[Path] = o.ResumeFromOpt,
    elastic: bool = o.ElasticOpt, as_json: bool = JsonOpt):
    """Run a plan: torchrun with DeviceMesh, tensor/sequence parallel, pipelining, FSDP2 (or msrun with
    MindSpore's semi-automatic parallelism); report measured versus predicted."""
    from gplan import render
    from gplan.backends.registry import backend as backend_named, default_backend
    from gplan.backends.launch import check_launch_flags, launch_plan
    from gplan.backends.protocol import LaunchOptions
    from gplan.planner.scale import scaled_plan

    plan = read_plan(plan_file)
    if backend is None:
        backend, why = default_backend(plan)
        if not as_json:
            err.print(f"note: launching with the {backend} backend ({why}; choose with --backend)", highlight=False)
    check_launch_flags(steps, warmup_steps, data, checkpoint_dir, checkpoint_every, resume, device, trace_steps)
    if trace_steps and not backend_named(backend).writes_traces:
        raise UsageError(f"--profile: the {backend} backend writes no profiler trace yet",
                         hint="launch with --backend torch, or without --profile")
    options = LaunchOptions(
        run_dir=run_dir.resolve(), nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, steps=steps, warmup_steps=warmup_steps, lr=lr, seed=seed,
        data=data.resolve() if data else None, device=device,
        checkpoint_dir=checkpoint_dir.resolve() if checkpoint_dir else None, checkpoint_every=checkpoint_every,
        resume=resume, profile=trace_steps)
    note = lambda line: err.print(f"[yellow]note:[/] {escape(line)}", highlight=False)  # noqa: E731
    scale = lambda p: scaled_plan(p, layers, hidden, seq_length, gbs)  # noqa: E731
    if resume_from is not None:  # checked before any process starts: a refusal starts nothing
        from gplan.recovery import resume_options

        options = resume_options(scale(plan), options, resume_from, resume, backend, note)

    def run(plan_to_run, run_options):
        return launch_plan(plan_to_run, backend, run_options, validate_only=validate_only, slurm=slurm, dry_run=dry_run,
                           scale=scale, note=note, echo=lambda line: sys.stderr.write(line + "\n"))

    if not (validate_only or slurm):
        from gplan.planner.scale import cpu_step_note

        slow = cpu_step_note(scale(plan), device)
        if slow:
            note(slow)
    if elastic:
        from gplan.recovery import check_elastic, launch_elastic, record

        check_elastic(options, nnodes)
        outcome, survived = launch_elastic(plan, run, options, note)
        if survived and outcome.report_path is not None:
            record(outcome.report_path, survived)
    else:
        outcome = run(plan, options)
    if outcome.kind == "validated":
        report = outcome.validation
        if not report.ok:
            try:
                report.raise_if_failed()
            except GplanError as exc:
                exc.data = asdict(report) | {"ok": False}
                if not as_json:
                    err.print(render.validation_table(report, err.width))
                raise
        return asdict(report) | {"ok": True} if as_json else err.print(render.validation_table(report, err.width))
    if as_json and outcome.kind != "slurm":
        return render.launch_outcome_json(outcome)
    render.launch_outcome(err, outcome)


@guarded
def export(
    plan_file: Path = o.PlanArg, to: str = o.ToOpt, out_dir: Path = o.OutDirOpt, image: Optional[str] = o.ImageOpt,
    target_version: Optional[str] = o.TargetVersionOpt, over_budget: bool = o.OverBudgetOpt, as_json: bool = JsonOpt):
    """Write the plan as another engine takes it: a Megatron-LM script, a torchtitan config and script,
    a DeepSpeed config with a Megatron-DeepSpeed script, MindFormers' parallel sections, a Kubeflow
    PyTorchJob and TrainJob, a SLURM script. A split the engine runs differently is re-priced; one
    that would not fit is refused."""
    from gplan.backends.exporters import export_files
    from gplan.planner.build import reprice_split

    written, notes = export_files(read_plan(plan_file), to, out_dir, plan_path=plan_file, image=image,
                                  version=target_version, reprice=reprice_split, over_budget=over_budget)
    if as_json:
        return {"target": to, "files": [str(p) for p in written], "notes": notes}
    for path in written:
        err.print(f"[green]wrote[/] {path}", highlight=False)
    for note in notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


@guarded
def profile(
    model: str = o.ProfileModelOpt, out: Path = o.ProfileOutOpt, backend: str = o.ProfileBackendOpt,
    nproc: int = o.NprocLinksOpt, nnodes: int = o.NnodesLinksOpt, node_rank: int = typer.Option(0, "--node-rank"),
    rdzv_endpoint: Optional[str] = o.EndpointOpt, mbs: str = o.ProfileMbsOpt, tp: str = o.ProfileTpOpt,
    seq_length: Optional[int] = o.ProfileSeqOpt, precision: Optional[str] = o.ProfilePrecisionOpt,
    max_bytes: Optional[int] = o.MaxBytesOpt, device: str = o.DeviceOpt):
    """Measure this machine: the model's layers (forward, backward, activations per micro-batch and tp
    width) and its links (collectives over message sizes); write a profile for --profile."""
    from rich.progress import Progress

    from gplan.backends.registry import measurer
    from gplan.calibration.profile import ProfileRequest, check_request, profile_machine
    from gplan.planner.space import int_list
    from gplan.profiles.catalogue import load_model
    from gplan.render import profile_summary

    request = ProfileRequest(load_model(model), out, nproc, nnodes, node_rank, rdzv_endpoint, int_list(mbs, "--mbs"),
                             int_list(tp, "--tp"), seq_length, precision, max_bytes, device)
    check_request(request)  # the model and options first: a refusal needs no framework installed
    tool = measurer(backend)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("layers", total=len(request.mbs) * len(request.tp) * 3)
        result = profile_machine(tool, request, lambda m: bar.update(task, advance=1, description=m),
                                 lambda m: err.print(m, highlight=False))
    for line in profile_summary(result, out):
        err.print(line, highlight=False)


@guarded
def calibrate(
    reports: list[Path] = o.RunsArg, held_out: list[Path] = o.HeldOutOpt, out: Path = o.CalibratedOutOpt,
    cluster: Optional[str] = o.LogClusterOpt, hardware: Optional[str] = HardwareOpt,
    devices_per_node: Optional[int] = PerNodeOpt, as_json: bool = JsonOpt):
    """Fit compute efficiency, per-layer and per-step overhead and link efficiency to measured runs;
    report the error per run before and after, leave-one-out, and on held-out runs."""
    from gplan.calibration.runs import calibrate_runs, read_any_run
    from gplan.profiles.files import write_profile
    from gplan.render import calibration_output

    c = calibrate_runs([read_any_run(p, cluster, hardware, devices_per_node) for p in reports],
                       [read_any_run(p, cluster, hardware, devices_per_node) for p in held_out])
    write_profile(c.profile, out)
    if as_json:
        return {"profile": str(out), **c.profile.calibration}
    calibration_output(err, c, out)
