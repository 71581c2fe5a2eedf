"""`gplan` command line: parse, call the library, render. Human text goes to stderr; with --json,
stdout carries exactly one JSON document. Exit codes: DESIGN.md §6 (gplan.errors)."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gplan import __version__
from gplan.errors import EXIT_INTERNAL, GplanError, InputError, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Plan and launch parallel training of large transformers.")
err = Console(stderr=True, width=None if sys.stderr.isatty() else 150)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def guarded(fn: Callable) -> Callable:
    """Turn gplan's typed errors into `error:`/`hint:` lines and exit codes; anything else is an
    internal error (exit 1), with its traceback only when GPLAN_DEBUG=1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GplanError as exc:
            if os.environ.get("GPLAN_DEBUG") == "1":
                traceback.print_exc()
            err.print(f"[red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.hint:
                err.print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if os.environ.get("GPLAN_DEBUG") == "1":
                traceback.print_exc()
            err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False, soft_wrap=True)
            err.print("[yellow]hint:[/] rerun with GPLAN_DEBUG=1 for the traceback and report it")
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper


# ---- shared options ------------------------------------------------------------------------------

ModelArg = typer.Argument(..., help="model.yaml, an HF config.json (or its folder), or a bundled name (gplan models)")
DevicesOpt = typer.Option(None, "--devices", "-n", help="devices to use (default: all of the cluster file)")
ClusterOpt = typer.Option(None, "--cluster", "-c", help="bundled cluster name or cluster.yaml (default: dgx-a100-80g)")
HardwareOpt = typer.Option(None, "--hardware", help="bundled hardware name; links of its bundled cluster")
PerNodeOpt = typer.Option(None, "--devices-per-node", help="with --hardware: devices per node")
GbsOpt = typer.Option(None, "--gbs", help="global batch in sequences (default: ~4M tokens)")
SeqOpt = typer.Option(None, "--seq-length", help="tokens per sequence (default: the model's)")
PrecisionOpt = typer.Option(None, "--precision", help="bf16 | fp16 | fp32 (default: bf16 where supported)")
HeadroomOpt = typer.Option(0.1, "--memory-headroom", help="fraction of device memory kept free")
JsonOpt = typer.Option(False, "--json", help="print one JSON document on stdout")
ProfileOpt = typer.Option(None, "--profile", help="a measured profile (gplan profile / gplan calibrate) instead of --cluster")


def _inputs(model: str, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
            profile: Optional[Path] = None):
    from gplan.inputs import resolve_inputs

    return resolve_inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
                          str(profile) if profile else None)


def _title(inputs) -> str:
    default = " (default; choose with --cluster)" if inputs.cluster_note else ""
    if inputs.profile:
        default = f" (measured profile {inputs.profile})"
    return (f"{inputs.model.name} on {inputs.devices} × {inputs.cluster.primary.hardware.name}, "
            f"cluster {inputs.cluster.name}{default}")


def _config(**degrees: Any):
    from pydantic import ValidationError

    from gplan.spec.parallel import ParallelConfig

    try:
        return ParallelConfig(**degrees)
    except ValidationError as exc:
        e = exc.errors()[0]
        message = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:
            raise InputError(message, hint="drop --schedule to let --vpp choose it") from exc
        raise InputError(f"--{e['loc'][0]}: {message}", hint="degrees are integers ≥ 1; zero is 0..3") from exc


# ---- commands ------------------------------------------------------------------------------------

@app.command()
@guarded
def estimate(
    model: str = ModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    dp: int = typer.Option(1, "--dp"), tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
    vpp: int = typer.Option(1, "--vpp"), cp: int = typer.Option(1, "--cp"),
    sp: bool = typer.Option(False, "--sp", help="Megatron sequence parallelism in the tp group"),
    mbs: int = typer.Option(1, "--mbs"), recompute: str = typer.Option("none", "--recompute", help="none | selective | full"),
    zero: int = typer.Option(0, "--zero", help="0..3"), schedule: Optional[str] = typer.Option(None, "--schedule", help="gpipe | 1f1b | interleaved_1f1b"),
    gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt, precision: Optional[str] = PrecisionOpt,
    memory_headroom: float = HeadroomOpt, profile: Optional[Path] = ProfileOpt, as_json: bool = JsonOpt,
) -> None:
    """Predict step time, throughput, MFU and memory of one configuration (no search).

    MODEL may also be a plan.json: its configuration and stage split are re-predicted."""
    from gplan.cost_models.step import predict
    from gplan.render import prediction_summary
    from gplan.spec.parallel import check_config

    from gplan.plan import is_plan_file

    if is_plan_file(Path(model)):
        _estimate_plan(Path(model), as_json)
        return
    inputs = _inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                     profile)
    sched = schedule or ("interleaved_1f1b" if vpp > 1 else "1f1b")
    config = _config(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, sp=sp, mbs=mbs, recompute=recompute, zero=zero,
                     schedule=sched)
    check_config(inputs.model, inputs.training, config, inputs.devices)
    prediction = predict(inputs.model, inputs.training, inputs.cluster, config)
    if as_json:
        emit_json({**prediction.model_dump(mode="json"), "profile": inputs.profile})
        return
    prediction_summary(err, _title(inputs), config, prediction)


def _int_list(value: Optional[str], flag: str) -> Optional[list[int]]:
    if not value:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{flag} {value!r}: expected comma-separated integers", hint=f"for example {flag} 1,2,4,8") from None
    if any(i < 0 for i in items) or (flag != "--zero" and any(i < 1 for i in items)):
        raise InputError(f"{flag} {value!r}: degrees are integers ≥ 1", hint=f"for example {flag} 1,2,4")
    return items


@app.command()
@guarded
def search(
    model: str = ModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt, precision: Optional[str] = PrecisionOpt,
    memory_headroom: float = HeadroomOpt,
    tp: Optional[str] = typer.Option(None, "--tp", help="allowed tp degrees, e.g. 1,2,4,8"),
    pp: Optional[str] = typer.Option(None, "--pp", help="allowed pp degrees"),
    dp: Optional[str] = typer.Option(None, "--dp", help="allowed dp degrees"),
    cp: Optional[str] = typer.Option(None, "--cp", help="allowed cp degrees"),
    mbs: Optional[str] = typer.Option(None, "--mbs", help="allowed micro-batch sizes (default 1,2,4,8)"),
    vpp: Optional[str] = typer.Option(None, "--vpp", help="allowed virtual stages per rank (default 1,2,4)"),
    zero: Optional[str] = typer.Option(None, "--zero", help="allowed optimizer sharding levels (default 0,1,3)"),
    recompute: str = typer.Option("none,selective,full", "--recompute", help="recompute options the ILP may give each layer"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="allowed schedules: gpipe,1f1b,interleaved_1f1b"),
    all_devices: bool = typer.Option(False, "--all-devices", help="never use fewer devices than given"),
    time_limit: float = typer.Option(10.0, "--time-limit", help="seconds per ILP solve"),
    top: int = typer.Option(5, "--top", help="plans to show"),
    out: Path = typer.Option(Path("plan.json"), "--out", "-o", help="where to write the best plan"),
    profile: Optional[Path] = ProfileOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Search degrees, micro-batch, recompute, optimizer sharding, stage split and placement; write the best plan."""
    from gplan.plan import write_plan
    from gplan.planner.build import make_plan
    from gplan.planner.search import search as run_search
    from gplan.planner.search import search_record
    from gplan.planner.space import SearchLimits
    from gplan.render import search_table

    inputs = _inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                     profile)
    options = [o.strip() for o in recompute.split(",") if o.strip()]
    bad = [o for o in options if o not in ("none", "selective", "full")]
    if bad or not options:
        raise InputError(f"--recompute {recompute!r}: unknown option {bad[0] if bad else ''!r}".rstrip(),
                         hint="choose from none,selective,full")
    schedules = [x.strip() for x in schedule.split(",")] if schedule else None
    if schedules and any(x not in ("gpipe", "1f1b", "interleaved_1f1b") for x in schedules):
        raise InputError(f"--schedule {schedule!r}: unknown schedule", hint="choose from gpipe,1f1b,interleaved_1f1b")
    limits = SearchLimits(tp=_int_list(tp, "--tp"), pp=_int_list(pp, "--pp"), dp=_int_list(dp, "--dp"),
                          cp=_int_list(cp, "--cp"), mbs=_int_list(mbs, "--mbs"), vpp=_int_list(vpp, "--vpp"),
                          zero=_int_list(zero, "--zero"), recompute=options, schedule=schedules,
                          allow_fewer_devices=not all_devices)
    result = run_search(inputs.model, inputs.training, inputs.cluster, inputs.devices, limits, top=top,
                        time_limit_s=time_limit)
    best = result.best
    plan_cluster = inputs.cluster if inputs.cluster.is_heterogeneous else inputs.cluster.sized(best.config.world_size)
    plan = make_plan(inputs.model, inputs.training, plan_cluster, best.config, best.layouts, best.solver,
                     devices_given=inputs.devices, profile=inputs.profile, search=search_record(result, limits))
    write_plan(plan, out)
    if as_json:
        emit_json({"plan": str(out), "candidates": result.candidates, "ilps_solved": result.solved,
                   "search_time_s": result.time_s,
                   "ranked": [{"parallel": c.config.model_dump(mode="json"),
                               "stage_layers": [[lc.model_dump() for lc in s.layers] for s in c.layouts],
                               "solver": c.solver.model_dump(), "prediction": c.prediction.model_dump(mode="json")}
                              for c in result.ranked]})
        return
    err.print(search_table(_title(inputs), result))
    used = best.config.world_size
    if used < inputs.devices:
        err.print(f"[yellow]note:[/] the best plan uses {used} of the {inputs.devices} devices (faster than any layout of all of them)")
    err.print(f"searched {result.candidates} configurations, solved {result.solved} ILPs "
              f"({result.pruned} pruned by bounds) in {result.time_s:.2f} s; "
              f"best solved by {best.solver.name} ({best.solver.status})")
    err.print(f"[green]wrote[/] {out}")


def _estimate_plan(path: Path, as_json: bool) -> None:
    from gplan.plan import read_plan
    from gplan.planner.build import repredict
    from gplan.render import prediction_summary

    plan = read_plan(path)
    prediction = repredict(plan)
    if as_json:
        emit_json(prediction.model_dump(mode="json"))
        return
    prediction_summary(err, f"{plan.model.name} from {path}", plan.parallel, prediction)


def _parse_config(text: str, devices: int):
    """'tp=8,pp=4,mbs=1' -> ParallelConfig; dp fills the devices when omitted."""
    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise InputError(f"--config {text!r}: expected key=value pairs", hint='for example --config "tp=8,pp=4,mbs=1"')
        key = key.strip()
        values[key] = value.strip() if key in ("recompute", "schedule") else (value.strip().lower() in ("1", "true", "yes") if key == "sp" else _int_value(key, value, text))
    if "dp" not in values:
        other = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        values["dp"] = max(1, devices // other)
    return _config(**values)


def _int_value(key: str, value: str, text: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--config {text!r}: {key}={value!r} is not an integer", hint='for example --config "tp=8,pp=4"') from None


@app.command()
@guarded
def compare(
    items: list[str] = typer.Argument(..., help="plan.json files, or one MODEL followed by --config options"),
    config: list[str] = typer.Option([], "--config", help='a configuration, e.g. "tp=8,pp=4,mbs=1" (repeat)'),
    devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt, hardware: Optional[str] = HardwareOpt,
    devices_per_node: Optional[int] = PerNodeOpt, gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt,
    precision: Optional[str] = PrecisionOpt, memory_headroom: float = HeadroomOpt, as_json: bool = JsonOpt,
) -> None:
    """Compare plans (or configurations of one model) side by side; the best value of each row is
    highlighted and the term that grew most is named."""
    from gplan.cost_models.step import predict
    from gplan.plan import read_plan
    from gplan.render import compare_table, explain_differences
    from gplan.spec.parallel import check_config

    entries = []
    if config:
        if len(items) != 1:
            raise InputError("--config compares configurations of one model", hint="pass exactly one MODEL")
        inputs = _inputs(items[0], devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom)
        for text in config:
            cfg = _parse_config(text, inputs.devices)
            check_config(inputs.model, inputs.training, cfg, inputs.devices)
            entries.append((text, predict(inputs.model, inputs.training, inputs.cluster, cfg)))
    else:
        if len(items) < 2:
            raise InputError("compare needs two or more plans, or one MODEL with --config", hint="gplan compare a.json b.json")
        for item in items:
            plan = read_plan(Path(item))
            entries.append((item, plan.prediction))
    if as_json:
        emit_json([{"name": name, "prediction": p.model_dump(mode="json")} for name, p in entries])
        return
    err.print(compare_table(entries))
    for line in explain_differences(entries):
        err.print(line, highlight=False)


@app.command()
@guarded
def explain(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    what_if: list[str] = typer.Option([], "--what-if", help='e.g. "inter_node_bandwidth=2x", "devices=128", '
                                      '"memory=1.5x", "gbs=1024" (repeat to combine)'),
    svg: Optional[Path] = typer.Option(None, "--svg", help="also draw the pipeline schedule into this SVG file"),
    width: int = typer.Option(100, "--width", help="columns of the terminal schedule picture"),
    as_json: bool = JsonOpt,
) -> None:
    """Why this plan: per-stage time and memory, what binds, why the runner-ups lost, what-ifs, and a
    picture of the pipeline schedule."""
    from dataclasses import asdict

    from gplan.cost_models import timeline
    from gplan.plan import read_plan
    from gplan.planner import explain as ex
    from gplan.planner.build import repredict

    plan = read_plan(plan_file)
    changes = [ex.parse_what_if(text) for text in what_if]
    if width < 20:
        raise UsageError(f"--width {width}: too narrow for a picture", hint="use --width 60 or more")
    prediction = repredict(plan)
    findings = ex.findings(plan)
    losers, source = ex.runner_ups(plan)
    scenario = ex.what_if(plan, changes) if changes else None
    c = plan.parallel
    shown = timeline.shown_microbatches(c.pp, prediction.num_microbatches)
    split = [timeline.stage_split_s(s.forward_s, s.backward_s, s.time_s) for s in prediction.stages]
    ops = timeline.simulate([f for f, _ in split], [b for _, b in split], shown, c.schedule, c.vpp)
    simulated = timeline.simulate([f for f, _ in split], [b for _, b in split], prediction.num_microbatches,
                                  c.schedule, c.vpp) if prediction.num_microbatches <= 4096 else None
    if svg:
        from gplan.svg import timeline_svg

        title = (f"{plan.model.name}: {c.label()} schedule={c.schedule}, "
                 f"first {shown} of {prediction.num_microbatches} micro-batches")
        _write_text(svg, timeline_svg(ops, c.pp, title))
    if as_json:
        emit_json({
            "plan": str(plan_file), "step_time_s": prediction.step_time_s,
            "simulated_pipeline_s": timeline.makespan_s(simulated) if simulated else None,
            "findings": [asdict(f) for f in findings],
            "runner_ups": {"source": source, "plans": [asdict(lo) for lo in losers]},
            "what_if": _what_if_json(scenario) if scenario else None,
            "svg": str(svg) if svg else None,
        })
        return
    _render_explain(plan, prediction, findings, losers, source, scenario, ops, shown, simulated, width)
    if svg:
        err.print(f"[green]wrote[/] {svg}")


def _write_text(path: Path, text: str) -> None:
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}", hint="choose a writable path") from None


def _render_explain(plan, prediction, findings, losers, source, scenario, ops, shown, simulated, width) -> None:
    from gplan.cost_models import pipeline, timeline
    from gplan.render import (compare_table, findings_table, plan_stage_table, prediction_summary,
                              runner_up_table, timeline_text)

    c = plan.parallel
    prediction_summary(err, f"{plan.model.name}: {c.label()}", c, prediction, stages=False)
    err.print(plan_stage_table(plan, prediction))
    err.print(findings_table(findings))
    err.print(f"[bold]pipeline schedule[/] ({c.schedule}, first {shown} of {prediction.num_microbatches} micro-batches; "
              "digits are micro-batches: [white on blue] forward [/] [black on green] backward [/] · waiting)")
    for line in timeline_text(ops, c.pp, width):
        err.print(line)
    if simulated:
        formula_s = pipeline.pipeline_time_s([s.time_s for s in prediction.stages], prediction.num_microbatches, c.vpp)
        err.print(f"simulated pipeline: {timeline.makespan_s(simulated):.3f} s; the cost model's formula: "
                  f"{formula_s:.3f} s", highlight=False)
    if losers:
        err.print(runner_up_table(losers, source))
    if scenario:
        title = ", ".join(map(str, scenario.changes))
        entries = [("this plan now", prediction)]
        if scenario.this_plan is not None:
            entries.append((f"this plan, {title}", scenario.this_plan))
        entries.append((f"best, {title}", scenario.best.prediction))
        err.print(f"[bold]what if {title}[/] ({scenario.devices} devices)")
        if scenario.this_plan_note:
            err.print(f"this plan cannot run: {scenario.this_plan_note}", highlight=False)
        err.print(f"best plan then: {scenario.best.config.label()}", highlight=False)
        err.print(compare_table(entries))


def _what_if_json(scenario) -> dict:
    return {
        "changes": [str(x) for x in scenario.changes], "devices": scenario.devices,
        "this_plan": scenario.this_plan.model_dump(mode="json") if scenario.this_plan else None,
        "this_plan_note": scenario.this_plan_note,
        "best": {"parallel": scenario.best.config.model_dump(mode="json"),
                 "prediction": scenario.best.prediction.model_dump(mode="json")},
    }


@app.command()
@guarded
def launch(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    backend: str = typer.Option("torch", "--backend", help="torch (torchrun) | mindspore (msrun)"),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", help="processes per node (default: the plan's devices per node)"),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="nodes (default: world size / processes per node)"),
    node_rank: int = typer.Option(0, "--node-rank", help="this node's rank (several nodes)"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 (several nodes)"),
    rdzv_id: str = typer.Option("gplan", "--rdzv-id", help="rendezvous id shared by the nodes of one job"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print every node's command and exit"),
    slurm: Optional[Path] = typer.Option(None, "--slurm", help="write a SLURM batch script to this file and exit"),
    validate_only: bool = typer.Option(False, "--validate", help="build the sharded model on the meta device with a fake "
                                       "process group of the plan's world size; compare parameter bytes with the plan"),
    steps: int = typer.Option(10, "--steps", help="optimizer steps"),
    warmup_steps: int = typer.Option(2, "--warmup-steps", help="steps left out of the measured step time"),
    layers: Optional[int] = typer.Option(None, "--layers", help="run a scaled-down model: this many layers"),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="scaled-down hidden size"),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", help="scaled-down sequence length"),
    gbs: Optional[int] = typer.Option(None, "--gbs", help="global batch (sequences)"),
    data: Optional[Path] = typer.Option(None, "--data", help="token file: a flat uint16 (uint32 for vocabularies > 65536) array"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir", help="write and resume checkpoints here"),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="checkpoint every K steps"),
    resume: bool = typer.Option(False, "--resume", help="continue from the latest checkpoint in --checkpoint-dir"),
    run_dir: Path = typer.Option(Path("gplan-run"), "--run-dir", help="logs, the plan that ran, run_report.json"),
    lr: float = typer.Option(3e-3, "--lr", help="AdamW learning rate"),
    seed: int = typer.Option(0, "--seed", help="seed of the weights and the synthetic data"),
    as_json: bool = JsonOpt,
) -> None:
    """Run a plan: torchrun with DeviceMesh, tensor/sequence parallel, pipelining, FSDP2; report
    measured versus predicted."""
    from gplan.backends.base import BACKENDS
    from gplan.backends.scale import scaled_plan
    from gplan.backends.torch import launcher
    from gplan.plan import read_plan, write_plan

    plan = read_plan(plan_file)
    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r} is not available in this gplan", hint="use --backend torch or mindspore")
    impl = BACKENDS[backend]()
    _check_launch_flags(steps, warmup_steps, data, checkpoint_dir, checkpoint_every, resume, device)
    if validate_only:
        if backend == "mindspore":
            _validate_strategies(impl, plan, as_json)
        else:
            _validate_launch(impl, plan, as_json)
        return
    plan = scaled_plan(plan, layers, hidden, seq_length, gbs)
    options = launcher.LaunchOptions(
        run_dir=run_dir.resolve(), nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, steps=steps, warmup_steps=warmup_steps, lr=lr, seed=seed,
        data=data.resolve() if data else None, device=device,
        checkpoint_dir=checkpoint_dir.resolve() if checkpoint_dir else None, checkpoint_every=checkpoint_every,
        resume=resume)
    plan_path = options.run_dir / "plan.json"
    spec = impl.render(plan, plan_path, options)
    for note in spec.notes:
        err.print(f"[yellow]note:[/] {note}")
    if not dry_run:
        options.run_dir.mkdir(parents=True, exist_ok=True)
    if slurm:
        _write_text(slurm, impl.slurm_script(plan, plan_path, options))
        write_plan(plan, plan_path)
        err.print(f"[green]wrote[/] {slurm} and {plan_path}; submit with: sbatch {slurm}")
        return
    if dry_run:
        if as_json:
            emit_json({"nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node, "env": spec.env,
                       "nodes": [{"node_rank": n.node_rank, "argv": n.argv} for n in spec.nodes], "notes": spec.notes})
            return
        for node in spec.nodes:
            sys.stdout.write(f"# node {node.node_rank}\n{launcher.shell_line(node.argv, spec.env)}\n")
        return
    _require_framework(backend)
    write_plan(plan, plan_path)
    impl.run(spec, options, echo=lambda line: sys.stderr.write(line + "\n"))
    _print_run_report(options.run_dir / "run_report.json", plan, as_json)


def _check_launch_flags(steps, warmup_steps, data, checkpoint_dir, checkpoint_every, resume, device) -> None:
    if steps < 1 or warmup_steps < 0:
        raise InputError(f"--steps {steps} --warmup-steps {warmup_steps}: steps ≥ 1, warm-up ≥ 0", hint="for example --steps 10")
    if data is not None and not data.is_file():
        raise InputError(f"--data {data}: no such file", hint="a flat binary array of token ids")
    if (checkpoint_every or resume) and checkpoint_dir is None:
        raise InputError("--checkpoint-every and --resume need --checkpoint-dir", hint="add --checkpoint-dir DIR")
    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device {device!r}", hint="auto | cpu | cuda")


def _require_framework(backend: str) -> None:
    import importlib.util

    from gplan.errors import BackendError

    if importlib.util.find_spec(backend) is None:
        raise BackendError(f"the {backend} backend needs {backend} installed", hint=f"pip install -e '.[{backend}]'")


def _validate_launch(impl, plan, as_json: bool) -> None:
    from dataclasses import asdict

    from gplan.errors import BackendError
    from gplan.render import validation_table

    _require_framework("torch")
    from gplan.backends.torch.validate import TOLERANCE

    rows = impl.validate(plan)
    if as_json:
        emit_json([asdict(r) for r in rows])
    else:
        err.print(validation_table(rows, plan.world_size))
    worst = max(rows, key=lambda r: abs(r.error))
    if abs(worst.error) > TOLERANCE:
        raise BackendError(f"stage {worst.stage}: built parameters differ from the plan by {worst.error:+.1%}",
                           hint="the cost model's parameter count and the torch model disagree; report it")


def _validate_strategies(impl, plan, as_json: bool) -> None:
    rows = impl.validate(plan)
    if as_json:
        emit_json(rows)
        return
    table = Table(title=f"MindSpore strategies: every operator over the {plan.world_size // plan.parallel.pp} devices "
                        f"of a stage ({plan.parallel.pp} stages)", title_justify="left")
    for col in ("operator", "strategy", "device matrix"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["operator"], str(tuple(map(tuple, row["strategy"]))), str(row["device_matrix"]))
    err.print(table)


def _print_run_report(path: Path, plan, as_json: bool) -> None:
    from gplan.render import run_report_table
    from gplan.report import read_report

    report = read_report(path)
    if as_json:
        emit_json(report.model_dump(mode="json"))
        return
    err.print(run_report_table(report, plan))
    err.print(f"[green]wrote[/] {path}")


@app.command()
@guarded
def export(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    to: str = typer.Option(..., "--to", help="megatron | torchtitan | deepspeed | mindformers | k8s | slurm"),
    out_dir: Path = typer.Option(Path("."), "--out-dir", "-o", help="where to write the exported files"),
    as_json: bool = JsonOpt,
) -> None:
    """Write the plan as another engine takes it: Megatron-LM arguments, torchtitan overrides, a
    DeepSpeed config, a Kubeflow PyTorchJob, a SLURM script."""
    from gplan.backends.exporters import targets
    from gplan.plan import read_plan

    plan = read_plan(plan_file)
    exporters = targets()
    if to not in exporters:
        raise InputError(f"--to {to!r}: unknown target", hint="choose from " + ", ".join(exporters))
    result = exporters[to](plan)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in result.files.items():
        _write_text(out_dir / name, text)
        written.append(str(out_dir / name))
    if as_json:
        emit_json({"target": to, "files": written, "notes": result.notes})
        return
    for path in written:
        err.print(f"[green]wrote[/] {path}", highlight=False)
    for note in result.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


@app.command()
@guarded
def profile(
    model: str = typer.Option(..., "--model", "-m", help="the model whose layers to measure (file or bundled name)"),
    out: Path = typer.Option(Path("profile.yaml"), "--out", "-o", help="profile to write (resumed when it exists)"),
    backend: str = typer.Option("torch", "--backend", help="torch (CUDA or CPU) | mindspore (Ascend or CPU)"),
    nproc: int = typer.Option(1, "--nproc", help="processes for the link measurement (devices of this node)"),
    nnodes: int = typer.Option(1, "--nnodes", help="nodes for the link measurement"),
    node_rank: int = typer.Option(0, "--node-rank"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 (several nodes)"),
    mbs: str = typer.Option("1,2,4", "--mbs", help="micro-batch sizes to measure"),
    tp: str = typer.Option("1,2", "--tp", help="tp shard widths to measure"),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", help="default: the model's"),
    precision: Optional[str] = typer.Option(None, "--precision", help="default: bf16 on GPUs, fp32 on CPUs"),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", help="largest message (default 256 MiB on GPUs, 16 MiB on CPUs)"),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda"),
) -> None:
    """Measure this machine: the model's layers (forward, backward, activations per micro-batch and tp
    width) and its links (collectives over message sizes); write a profile for --profile."""
    from rich.progress import Progress

    from gplan.profiles.measure import profile as measure
    from gplan.spec.loaders import load_model

    if backend not in ("torch", "mindspore"):
        raise InputError(f"--backend {backend!r}: gplan profiles with torch or mindspore", hint="use --backend torch")
    _require_framework(backend)
    mbs_list, tp_list = _int_list(mbs, "--mbs"), _int_list(tp, "--tp")
    spec = load_model(model)
    bad = [t for t in tp_list if spec.num_attention_heads % t or spec.kv_heads % t or spec.ffn_size % t]
    if bad:
        raise InputError(f"--tp {bad[0]} does not divide the heads, kv heads and MLP width of {spec.name}",
                         hint="choose divisors of the kv heads")
    found_device, hardware_name = measure.detect_device(device, backend)
    accelerator = hardware_name != "cpu"
    precision = precision or ("bf16" if accelerator else "fp32")
    max_bytes = max_bytes or (256 if accelerator else 16) * 2**20
    current = measure.start_profile(out, hardware_name, nproc, nnodes, str(found_device), backend)
    total = len(mbs_list) * len(tp_list) * 3
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("layers", total=total)

        def progress(message: str) -> None:
            bar.update(task, advance=1, description=message)

        current = measure.profile_layers(current, out, spec, seq_length or spec.seq_length, precision, mbs_list,
                                         tp_list, found_device, progress, backend)
    measure.write_profile(current, out)
    current = measure.profile_links(current, out, nproc, nnodes, node_rank, rdzv_endpoint, max_bytes,
                                    lambda message: err.print(message, highlight=False), backend)
    measure.write_profile(current, out)
    group = current.node_groups[0]
    err.print(f"gemm efficiency {group.hardware.efficiency.gemm:.3f}, launch per layer "
              f"{group.hardware.efficiency.layer_overhead_s * 1e6:.0f} µs, intra-node {group.intra_node.bandwidth_GBps:.2f} GB/s "
              f"+ {group.intra_node.latency_us:.0f} µs", highlight=False)
    err.print(f"[green]wrote[/] {out}: {len(group.hardware.measured)} layer shapes, {len(current.links)} link points")


@app.command()
@guarded
def calibrate(
    reports: list[Path] = typer.Argument(..., help="run_report.json files of gplan launch (their plan.json beside them)"),
    held_out: list[Path] = typer.Option([], "--held-out", help="reports to predict but not fit (repeat)"),
    out: Path = typer.Option(Path("profile.yaml"), "--out", "-o", help="the calibrated profile"),
    as_json: bool = JsonOpt,
) -> None:
    """Fit compute efficiency, per-layer and per-step overhead and link efficiency to measured runs;
    report the error per run before and after, leave-one-out, and on held-out runs."""
    from gplan.planner import calibrate as cal
    from gplan.render import calibration_table

    runs = [_run_of(path) for path in reports]
    held = [_run_of(path) for path in held_out]
    if len(runs) < 2:
        raise InputError("calibration needs two or more run reports", hint="launch a few different plans first")
    names = {r.plan.cluster.primary.hardware.name for r in runs + held}
    if len(names) > 1:
        raise InputError(f"the runs used different hardware ({', '.join(sorted(names))})", hint="calibrate one hardware at a time")
    fit = cal.calibrate(runs)
    start = cal.prior(runs[0].plan.cluster)
    held_before = [cal.predict_s(r, start) / r.measured_step_s - 1 for r in held]
    held_after = [cal.predict_s(r, fit.theta) / r.measured_step_s - 1 for r in held]
    # The profile keeps the widest run's node shape (devices per node), so that sizing it again for
    # any of the runs gives the links that run had.
    widest = max(runs + held, key=lambda r: r.plan.cluster.primary.devices_per_node).plan
    profile = cal.as_profile(widest, fit, runs, held, held_before, held_after)
    from gplan.profiles.measure.profile import write_profile

    write_profile(profile, out)
    if as_json:
        emit_json({"profile": str(out), **profile.calibration})
        return
    err.print(calibration_table(runs, fit, held, held_before, held_after))
    err.print(f"[green]wrote[/] {out}")


def _run_of(path: Path):
    from gplan.planner.calibrate import Run
    from gplan.plan import read_plan
    from gplan.report import read_report

    report = read_report(path)
    plan_path = path.with_name("plan.json")
    plan = read_plan(plan_path)
    if plan.digest != report.plan_digest:
        raise InputError(f"{plan_path} is not the plan {path} ran (digest {plan.digest} ≠ {report.plan_digest})",
                         hint="keep run_report.json beside the plan.json of its run directory")
    return Run(str(path), plan, report.step_time_s)


@app.command()
@guarded
def models(as_json: bool = JsonOpt) -> None:
    """List the bundled models."""
    from gplan.spec.loaders import load_model
    from gplan.profiles.catalogue import bundled_models

    specs = [load_model(name) for name in bundled_models()]
    if as_json:
        emit_json([{"name": m.name, "params": m.total_params(), **m.model_dump(mode="json")} for m in specs])
        return
    table = Table(title="bundled models", title_justify="left")
    for col in ("name", "params", "layers", "hidden", "heads (kv)", "ffn", "vocab", "seq"):
        table.add_column(col, justify="right" if col != "name" else "left")
    for m in specs:
        layers = f"{m.num_encoder_layers}+{m.num_layers}" if m.is_encoder_decoder else str(m.num_layers)
        table.add_row(m.name, f"{m.total_params() / 1e9:.2f} B", layers, str(m.hidden_size),
                      f"{m.num_attention_heads} ({m.kv_heads})", f"{m.ffn_size} {m.ffn_kind}",
                      str(m.vocab_size), str(m.seq_length))
    err.print(table)


@app.command()
@guarded
def hardware(as_json: bool = JsonOpt) -> None:
    """List the bundled hardware and clusters."""
    from gplan.profiles.catalogue import bundled_clusters, hardware_entry, bundled_hardware
    from gplan.profiles.schema import DeviceSpec

    devices = [DeviceSpec.model_validate(hardware_entry(n)) for n in bundled_hardware()]
    clusters = bundled_clusters()
    if as_json:
        emit_json({"hardware": [d.model_dump(mode="json") for d in devices], "clusters": clusters})
        return
    table = Table(title="bundled hardware (dense peak)", title_justify="left")
    for col in ("name", "kind", "memory", "bf16", "fp16", "fp32", "HBM", "gemm eff", "attn eff"):
        table.add_column(col, justify="left" if col in ("name", "kind") else "right")
    for d in devices:
        peak = lambda p: f"{d.peak_tflops[p]:g} TF" if p in d.peak_tflops else "—"  # noqa: E731
        table.add_row(d.name, d.kind, f"{d.memory_GiB:g} GiB", peak("bf16"), peak("fp16"), peak("fp32"),
                      f"{d.hbm_bandwidth_GBps:g} GB/s", f"{d.efficiency.gemm:.2f}", f"{d.efficiency.attention:.2f}")
    err.print(table)
    ctable = Table(title="bundled clusters (node templates; --devices sets the node count)", title_justify="left")
    for col in ("name", "hardware", "devices/node", "intra-node GB/s", "inter-node GB/s"):
        ctable.add_column(col)
    for name, c in clusters.items():
        g = c["node_groups"][0]
        ctable.add_row(name, g["hardware"], str(g["devices_per_node"]), f"{g['intra_node']['bandwidth_GBps']:g}",
                       f"{g['inter_node']['bandwidth_GBps']:g}")
    err.print(ctable)


@app.command()
@guarded
def validate(file: Path = typer.Argument(..., help="a model.yaml, HF config.json, cluster.yaml or plan.json"),
             as_json: bool = JsonOpt) -> None:
    """Check a model, cluster or plan file; exit 3 with the first problem."""
    from gplan.spec.loaders import load_yaml_file

    data = load_yaml_file(file)
    if isinstance(data, dict) and "schema_version" in data:
        kind, name = "plan", _validate_plan(file)
    elif isinstance(data, dict) and "node_groups" in data:
        from gplan.profiles.catalogue import load_cluster

        kind, name = "cluster", load_cluster(str(file)).name
    else:
        from gplan.spec.loaders import load_model

        kind, name = "model", load_model(str(file)).name
    if as_json:
        emit_json({"file": str(file), "kind": kind, "name": name, "valid": True})
    else:
        err.print(f"[green]ok:[/] {file} is a valid {kind} ({name})")


def _validate_plan(file: Path) -> str:
    """A plan is valid when it parses, its configuration is consistent, and re-predicting it with
    this gplan gives the prediction it carries."""
    from gplan.plan import inputs_digest, read_plan
    from gplan.planner.build import repredict
    from gplan.spec.parallel import check_config

    plan = read_plan(file)
    check_config(plan.model, plan.training, plan.parallel, plan.world_size)
    if inputs_digest(plan.model, plan.cluster, plan.training) != plan.digest:
        raise InputError(f"{file}: digest does not match the plan's inputs (edited by hand?)",
                         hint="regenerate the plan with gplan search")
    if len(plan.placement.rank_to_device) != plan.world_size:
        raise InputError(f"{file}: placement has {len(plan.placement.rank_to_device)} ranks, world size is {plan.world_size}",
                         hint="regenerate the plan")
    fresh = repredict(plan)
    if abs(fresh.step_time_s - plan.prediction.step_time_s) > 1e-9 * max(1.0, fresh.step_time_s):
        raise InputError(f"{file}: its prediction ({plan.prediction.step_time_s:.6g} s) differs from this gplan's "
                         f"({fresh.step_time_s:.6g} s)", hint="regenerate the plan with this gplan version")
    return f"{plan.model.name}, {plan.parallel.label()}"


def version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"gplan {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                       help="print the version")) -> None:
    """Plan and launch parallel training of large transformers."""


def main() -> None:
    app()


if __name__ == "__main__":
    main()
