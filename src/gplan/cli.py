"""`gplan` command line: parse, call the library, render. Human text goes to stderr; with --json,
stdout carries exactly one JSON document. Exit codes: gplan.errors.

Every command parses its options, calls one library function and renders what it returns; nothing a
library user would need lives here."""

from __future__ import annotations

import gc

# Importing gplan and its dependencies (typer, rich, pydantic's schemas) allocates some 10^5 long-lived
# objects and next to no garbage; with the cyclic collector on they set off ~130 collections, each
# rescanning the young ones (~25 ms of a 0.3 s start-up). Paused until the module is loaded.
_COLLECTING = gc.isenabled()
gc.disable()

import functools
import json
import os
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from gplan import __version__
from gplan.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, GplanError, InputError, UsageError
from gplan.io import atomic_write_text
from gplan.plan import read_plan

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Plan and launch parallel training of large transformers.")
# A terminal's own width (or $COLUMNS); 150 in a log. Tables fit it without cutting a number (render.fit).
err = Console(stderr=True, width=None if sys.stderr.isatty() or os.environ.get("COLUMNS", "").isdigit() else 150)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def emit_error(command: str, message: str, hint: Optional[str], code: int) -> None:
    """With --json, a failure is still one JSON document on stdout (the `error:` lines go to stderr)."""
    emit_json({"gplan": __version__, "command": command, "ok": False,
               "error": {"message": message, "hint": hint, "exit_code": code}})


def guarded(fn: Callable) -> Callable:
    """Turn gplan's typed errors into `error:`/`hint:` lines and exit codes; anything else is an
    internal error (exit 1), with its traceback only when GPLAN_DEBUG=1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except GplanError as exc:
            if os.environ.get("GPLAN_DEBUG") == "1":
                traceback.print_exc()
            err.print(f"[red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.hint:
                err.print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
            if as_json:
                emit_error(fn.__name__, exc.message, exc.hint, exc.code)
            raise typer.Exit(exc.code) from None
        except KeyboardInterrupt:
            # Ctrl-C: one line that says what stopped. gplan writes every file whole or not at all (io.atomic_write_text)
            err.print(f"[yellow]interrupted:[/] gplan {fn.__name__} stopped by Ctrl-C before it finished; "
                      "no file was left half-written", highlight=False)
            if as_json:
                emit_error(fn.__name__, f"{fn.__name__} interrupted", None, EXIT_INTERRUPTED)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`gplan … | head`): nothing more to say to it, and no traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_INTERNAL) from None
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if os.environ.get("GPLAN_DEBUG") == "1":
                traceback.print_exc()
            err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False, soft_wrap=True)
            err.print("[yellow]hint:[/] rerun with GPLAN_DEBUG=1 for the traceback and report it")
            if as_json:
                emit_error(fn.__name__, f"internal error: {type(exc).__name__}: {exc}",
                           "rerun with GPLAN_DEBUG=1 for the traceback and report it", EXIT_INTERNAL)
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
PrecisionOpt = typer.Option(None, "--precision", help="bf16 | fp16 | fp32 | fp8 | mxfp8 | nvfp4 (default: bf16 where "
                            "supported); FP8 recipes keep BF16 weights, attention and the loss")
HeadroomOpt = typer.Option(0.1, "--memory-headroom", help="fraction of device memory kept free")
ImbalanceOpt = typer.Option(1.0, "--expert-imbalance", help="mixtures of experts: the busiest device's routed tokens "
                            "over the balanced share (1.0: balanced, what the published runs force)")
JsonOpt = typer.Option(False, "--json", help="print one JSON document on stdout")
WideOpt = typer.Option(False, "--wide", help="show every table column, however wide the terminal")


def set_wide(wide: bool) -> None:
    """--wide: no column is dropped to fit the terminal; long lines run on."""
    if wide:
        from gplan.render import WIDE

        err.width = WIDE
ProfileOpt = typer.Option(None, "--profile", help="a measured profile (gplan profile / gplan calibrate) instead of --cluster")


TargetOpt = typer.Option(None, "--target", help="the engine that runs it, whose memory accounting prices it: torch | "
                         "mindspore | megatron | torchtitan | deepspeed | mindformers (default: the hardware's backend)")


def _inputs(model: str, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
            profile: Optional[Path] = None, target: Optional[str] = None, expert_imbalance: float = 1.0):
    from gplan.planner.inputs import resolve_inputs

    return resolve_inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, headroom,
                          str(profile) if profile else None, target, expert_imbalance)


# ---- commands ------------------------------------------------------------------------------------

@app.command()
@guarded
def estimate(
    model: str = ModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    dp: Optional[int] = typer.Option(None, "--dp", help="default: the devices over tp·pp·cp"),
    tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
    vpp: Optional[int] = typer.Option(None, "--vpp"), cp: int = typer.Option(1, "--cp"),
    ep: Optional[int] = typer.Option(None, "--ep", help="expert parallelism (MoE models)"),
    etp: Optional[int] = typer.Option(None, "--etp", help="expert tensor parallelism (MoE models)"),
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Megatron sequence parallelism in the tp group"),
    mbs: Optional[int] = typer.Option(None, "--mbs"),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="none | selective | full for every layer"),
    zero: Optional[int] = typer.Option(None, "--zero", help="0..3"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="gpipe | 1f1b | interleaved_1f1b"),
    stages: Optional[str] = typer.Option(None, "--stages", help="layers per pipeline stage, e.g. 7,8,8,8,8,8,8,6"),
    from_file: Optional[Path] = typer.Option(None, "--from", help="price the layout of an engine's launch or log "
                                             "(Megatron-LM, torchtitan, Megatron-DeepSpeed, MindFormers; its model "
                                             "checked against MODEL)"),
    gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt, precision: Optional[str] = PrecisionOpt,
    memory_headroom: float = HeadroomOpt, profile: Optional[Path] = ProfileOpt, target: Optional[str] = TargetOpt,
    expert_imbalance: float = ImbalanceOpt, as_json: bool = JsonOpt, wide: bool = WideOpt,
) -> None:
    """Predict step time, throughput, MFU and memory of one configuration.

    What is not given (vpp, mbs, zero, sp, recompute, the split, ep/etp) is chosen as `gplan search`
    would for these degrees, and printed. MODEL may also be a plan.json: its configuration and stage
    split are re-predicted."""
    set_wide(wide)
    from gplan.plan import is_plan_file
    from gplan.planner.build import repredict
    from gplan.planner.complete import complete, config_of, given_options, stage_sizes_option, target_refusals
    from gplan.render import chosen_line, prediction_summary, title
    from gplan.spec.parallel import check_config

    if is_plan_file(Path(model)):
        plan = read_plan(Path(model))
        prediction = repredict(plan)
        if as_json:
            emit_json(prediction.model_dump(mode="json"))
        else:
            prediction_summary(err, f"{plan.model.name} from {model}", plan.parallel, prediction)
        return
    if from_file is not None:
        return estimate_launch(from_file, model, devices, cluster, hardware, devices_per_node, seq_length, memory_headroom,
                               profile, target, expert_imbalance, as_json)
    inputs = _inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                     profile, target, expert_imbalance)
    given = given_options(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, sp=sp, mbs=mbs, recompute=recompute,
                          zero=zero, schedule=schedule)
    first = config_of(given, inputs.devices)
    check_config(inputs.model, inputs.training, first, inputs.devices)
    sizes = stage_sizes_option(inputs.model, first, stages)
    done = complete(inputs, given, sizes)
    refused, runners = target_refusals(inputs, done.config, done.layouts)
    if as_json:
        return emit_json({**done.prediction.model_dump(mode="json"), "parallel": done.config.model_dump(mode="json"),
                          "chosen": done.chosen, "chosen_by": "search" if done.by_search else "defaults",
                          "profile": inputs.profile, "target": inputs.training.engine, "target_runs_it": not refused,
                          "target_refusals": [r.detail for r in refused], "targets_that_run_it": runners})
    prediction_summary(err, title(inputs), done.config, done.prediction)
    err.print(chosen_line(done), highlight=False)
    for r in refused:
        err.print(f"note: {inputs.training.engine} would not run this as written: {r.detail}"
                  + (f"; {', '.join(runners)} would (--target {runners[0]})" if runners else ""), highlight=False)


def estimate_launch(from_file, model, devices, cluster, hardware, devices_per_node, seq_length, headroom, profile,
                    target, expert_imbalance, as_json) -> None:
    from gplan.planner.launch_files import priced_launch
    from gplan.render import prediction_summary, title

    launch, inputs, config, _, prediction = priced_launch(from_file, model, devices, cluster, hardware, devices_per_node,
                                                          seq_length, headroom, profile, target, expert_imbalance)
    if as_json:
        return emit_json({**prediction.model_dump(mode="json"), "parallel": config.model_dump(mode="json"),
                          "from": str(from_file), "engine": launch.engine, "not_read": launch.unread})
    prediction_summary(err, title(inputs) + f"; read from {from_file}", config, prediction)
    if launch.unread:
        err.print(f"not read (no effect on the layout or its cost): {', '.join(launch.unread)}", highlight=False)


@app.command()
@guarded
def search(
    model: str = ModelArg, devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt,
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt, precision: Optional[str] = PrecisionOpt,
    memory_headroom: float = HeadroomOpt, expert_imbalance: float = ImbalanceOpt,
    tp: Optional[str] = typer.Option(None, "--tp", help="allowed tp degrees, e.g. 1,2,4,8"),
    pp: Optional[str] = typer.Option(None, "--pp", help="allowed pp degrees"),
    dp: Optional[str] = typer.Option(None, "--dp", help="allowed dp degrees"),
    cp: Optional[str] = typer.Option(None, "--cp", help="allowed cp degrees"),
    ep: Optional[str] = typer.Option(None, "--ep", help="allowed expert-parallel degrees (MoE; default: powers of "
                                     "two dividing the experts)"),
    etp: Optional[str] = typer.Option(None, "--etp", help="allowed expert tensor-parallel degrees (MoE; default 1)"),
    mbs: Optional[str] = typer.Option(None, "--mbs", help="allowed micro-batch sizes (default 1,2,4,8)"),
    vpp: Optional[str] = typer.Option(None, "--vpp", help="allowed virtual stages per rank (default: every chunking "
                                      "of a stage's layers the target runs)"),
    zero: Optional[str] = typer.Option(None, "--zero", help="allowed optimizer sharding levels (default 0,1,2,3; "
                                       "0,1 with experts)"),
    recompute: str = typer.Option("none,selective,full", "--recompute", help="recompute options the ILP may give each layer"),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="allowed schedules: gpipe,1f1b,interleaved_1f1b"),
    all_devices: bool = typer.Option(False, "--all-devices", help="never use fewer devices than given"),
    target: Optional[str] = typer.Option(None, "--target", help="only plans this runs as priced: torch | mindspore | "
                                         "megatron | torchtitan | deepspeed | mindformers (default: the backend of the "
                                         "cluster's hardware)"),
    time_limit: float = typer.Option(10.0, "--time-limit", help="seconds per ILP solve (heterogeneous clusters; one node group is split exactly by dynamic programming)"),
    top: int = typer.Option(5, "--top", help="plans to show"),
    out: Path = typer.Option(Path("plan.json"), "--out", "-o", help="where to write the best plan"),
    profile: Optional[Path] = ProfileOpt,
    from_file: Optional[Path] = typer.Option(None, "--from", help="an engine's launch or log (Megatron-LM, "
                                             "torchtitan, Megatron-DeepSpeed, MindFormers): search its batch, "
                                             "precision and engine, and show its layout beside the best plan"),
    out_launch: Optional[Path] = typer.Option(None, "--out-launch", help="with --from: write the launch back here "
                                              "with only its layout flags changed to the best plan's"),
    as_json: bool = JsonOpt, wide: bool = WideOpt,
) -> None:
    """Search degrees, micro-batch, recompute, optimizer sharding, stage split and placement; write the best plan."""
    set_wide(wide)
    from gplan.plan import layouts_of, write_plan
    from gplan.planner import plan as make_best_plan
    from gplan.planner.space import limits_from_options
    from gplan.render import SearchProgress, overlap_lines, search_json, search_summary, search_table, title

    if top < 1:
        raise InputError(f"--top {top}: show at least one plan", hint="for example --top 5")
    if out.is_dir():
        raise InputError(f"--out {out}: is a directory", hint=f"name a file, e.g. --out {out / 'plan.json'}")
    from gplan.planner.launch_files import launch_versus, priced_launch

    mine = None
    if out_launch is not None and from_file is None:
        raise UsageError("--out-launch rewrites the launch of --from", hint="add --from train.sh")
    if from_file is not None:  # the launch's batch, sequence, precision and engine, unless said otherwise
        mine = priced_launch(from_file, model, devices, cluster, hardware, devices_per_node, seq_length, memory_headroom,
                             profile, target, expert_imbalance)
        launch, launch_inputs = mine[0], mine[1]
        devices, gbs, target = launch_inputs.devices, gbs or launch_inputs.training.gbs, target or launch.engine
        seq_length, precision = seq_length or launch_inputs.training.seq_length, precision or launch.precision
    inputs = _inputs(model, devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                     profile, target, expert_imbalance)
    limits = limits_from_options(tp, pp, dp, cp, mbs, vpp, zero, recompute, schedule, all_devices, target, ep, etp)
    with SearchProgress(err) as progress:
        planned = make_best_plan(inputs, limits, top=top, time_limit_s=time_limit, progress=progress)
    if out_launch is not None:  # prepared before anything is written: a launch it cannot rewrite writes nothing
        from gplan.backends.exporters.write_back import write_back

        rewritten = write_back(planned.plan, mine[0].engine, from_file, out_launch)
    write_plan(planned.plan, out)
    if out_launch is not None:
        for path, text in rewritten.items():
            atomic_write_text(path, text)
            err.print(f"[green]wrote[/] {path} (your launch, its layout the best plan's)", highlight=False)
    versus = launch_versus(mine, planned) if mine else None
    if as_json:
        return emit_json(search_json(out, planned.search) | ({"from": versus} if versus else {}))
    err.print(search_table(title(inputs), planned.search, err.width))
    for line in search_summary(planned.search, inputs.devices) + overlap_lines(planned.plan):
        err.print(line)
    if versus:
        from gplan.render import compare_table, setup_rows

        launch, launch_inputs, config, layouts, prediction = mine
        t = launch_inputs.training
        err.print(compare_table([(f"your launch ({from_file.name})", prediction), ("best plan", planned.plan.prediction)],
                                err.width, [setup_rows(config, t.gbs, t.seq_length, layouts),
                                            setup_rows(planned.plan.parallel, t.gbs, t.seq_length,
                                                       layouts_of(planned.plan))]))
        changes = ", ".join(f"{k} {a} → {b}" for k, (a, b) in versus["differences"].items()) or "nothing"
        err.print(f"the best plan changes {changes}: {versus['gain']:+.1%} tokens/s over your launch", highlight=False)
    err.print(f"[green]wrote[/] {out}")


@app.command()
@guarded
def compare(
    items: list[str] = typer.Argument(..., help="plan.json files, or one MODEL followed by --config or --from options"),
    config: list[str] = typer.Option([], "--config", help='a configuration, e.g. "tp=8,pp=4,mbs=1" (repeat)'),
    from_files: list[Path] = typer.Option([], "--from", help="an engine's launch or log of MODEL, priced as it runs (repeat)"),
    devices: Optional[int] = DevicesOpt, cluster: Optional[str] = ClusterOpt, hardware: Optional[str] = HardwareOpt,
    devices_per_node: Optional[int] = PerNodeOpt, gbs: Optional[int] = GbsOpt, seq_length: Optional[int] = SeqOpt,
    precision: Optional[str] = PrecisionOpt, memory_headroom: float = HeadroomOpt, target: Optional[str] = TargetOpt,
    as_json: bool = JsonOpt, wide: bool = WideOpt,
) -> None:
    """Compare plans (or configurations of one model) side by side; the best value of each row is
    highlighted and the term that grew most is named."""
    set_wide(wide)
    from gplan.plan import layouts_of
    from gplan.planner.complete import complete, config_of, target_refusals
    from gplan.planner.launch_files import priced_launch
    from gplan.render import chosen_line, compare_table, explain_differences, setup_rows
    from gplan.spec.parallel import check_config, parse_config_values

    entries, notes, setups = [], {}, []
    if from_files:
        if len(items) != 1:
            raise InputError("--from compares launches of one model", hint="pass exactly one MODEL")
        for path in from_files:
            launch, launch_inputs, cfg, layouts, prediction = priced_launch(
                path, items[0], devices, cluster, hardware, devices_per_node, seq_length, memory_headroom, None,
                target, 1.0)
            entries.append((path.name, prediction))
            setups.append(setup_rows(cfg, launch_inputs.training.gbs, launch_inputs.training.seq_length, layouts))
    if config:
        if len(items) != 1:
            raise InputError("--config compares configurations of one model", hint="pass exactly one MODEL")
        inputs = _inputs(items[0], devices, cluster, hardware, devices_per_node, gbs, seq_length, precision, memory_headroom,
                         target=target)
        for text in config:
            given = parse_config_values(text)
            check_config(inputs.model, inputs.training, config_of(given, inputs.devices), inputs.devices)
            done = complete(inputs, given)
            entries.append((text, done.prediction))
            setups.append(setup_rows(done.config, inputs.training.gbs, inputs.training.seq_length, done.layouts))
            notes[text] = [r.detail for r in target_refusals(inputs, done.config, done.layouts)[0]]
            if done.chosen:
                notes.setdefault("chosen", []).append(f"{text}: {chosen_line(done)}")
    elif not from_files:
        if len(items) < 2:
            raise InputError("compare needs two or more plans, or one MODEL with --config or --from",
                             hint="gplan compare a.json b.json")
        plans = [read_plan(Path(item)) for item in items]
        names = [Path(item).name for item in items]
        names = names if len(set(names)) == len(names) else list(items)  # short names unless they collide
        entries = [(name, p.prediction) for name, p in zip(names, plans)]
        setups = [setup_rows(p.parallel, p.training.gbs, p.training.seq_length, layouts_of(p)) for p in plans]
    if as_json:
        return emit_json([{"name": name, "prediction": p.model_dump(mode="json"), "configuration": setup}
                          | ({"target_refusals": notes[name]} if name in notes else {})
                          for (name, p), setup in zip(entries, setups)])
    err.print(compare_table(entries, err.width, setups))
    for line in explain_differences(entries):
        err.print(line, highlight=False)
    for line in notes.pop("chosen", []):
        err.print(line, highlight=False)
    for name, details in notes.items():
        for detail in details:
            err.print(f"note: {inputs.training.engine} would not run {name!r} as written: {detail}", highlight=False)


@app.command()
@guarded
def explain(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    what_if: list[str] = typer.Option([], "--what-if", help='e.g. "inter_node_bandwidth=2x", "devices=128", '
                                      '"memory=1.5x", "gbs=1024" (repeat to combine)'),
    svg: Optional[Path] = typer.Option(None, "--svg", help="also draw the pipeline schedule into this SVG file"),
    width: int = typer.Option(100, "--width", help="columns of the terminal schedule picture"),
    as_json: bool = JsonOpt, wide: bool = WideOpt,
) -> None:
    """Why this plan: per-stage time and memory, what binds, why the runner-ups lost, what-ifs, and a
    picture of the pipeline schedule."""
    set_wide(wide)
    from gplan.planner import explain as ex
    from gplan.render import explain_json, explain_output

    plan = read_plan(plan_file)
    changes = [ex.parse_what_if(text) for text in what_if]
    if width < 20:
        raise UsageError(f"--width {width}: too narrow for a picture", hint="use --width 60 or more")
    explanation = ex.explain(plan, changes)
    if svg:
        from gplan.svg import timeline_svg

        c = plan.parallel
        title = (f"{plan.model.name}: {c.label()} schedule={c.schedule}, "
                 f"first {explanation.shown} of {explanation.prediction.num_microbatches} micro-batches")
        atomic_write_text(svg, timeline_svg(explanation.shown_ops, c.pp, title))
    if as_json:
        return emit_json(explain_json(plan_file, explanation, svg))
    explain_output(err, plan, explanation, width)
    if svg:
        err.print(f"[green]wrote[/] {svg}")


@app.command()
@guarded
def launch(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    backend: Optional[str] = typer.Option(None, "--backend", help="torch (torchrun) | mindspore (msrun); default: "
                                          "the plan's target if it is one of them, else mindspore on Ascend, torch "
                                          "elsewhere"),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", help="processes per node (default: the plan's devices per node)"),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="nodes (default: world size / processes per node)"),
    node_rank: int = typer.Option(0, "--node-rank", help="this node's rank (several nodes)"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 (several nodes)"),
    rdzv_id: str = typer.Option("gplan", "--rdzv-id", help="rendezvous id of a c10d launch (--slurm uses the job id; "
                                "--node-rank launches use the static rendezvous, which has none)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print every node's command and exit"),
    slurm: Optional[Path] = typer.Option(None, "--slurm", help="write a SLURM batch script to this file and exit"),
    validate_only: bool = typer.Option(False, "--validate", help="build the layout without running a step (torch: the "
                                       "sharded model on the meta device with a fake process group; MindSpore: the "
                                       "operator strategies) and compare it with the plan"),
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
    """Run a plan: torchrun with DeviceMesh, tensor/sequence parallel, pipelining, FSDP2 (or msrun with
    MindSpore's semi-automatic parallelism); report measured versus predicted."""
    from gplan.backends.base import backend as backend_named, default_backend, require_framework
    from gplan.backends.launch import LaunchOptions, check_launch_flags, shell_line
    from gplan.plan import write_plan
    from gplan.planner.scale import scaled_plan
    from gplan.render import run_report_table, validation_table
    from gplan.report import read_report

    plan = read_plan(plan_file)
    if backend is None:
        backend, why = default_backend(plan)
        if not as_json:
            err.print(f"note: launching with the {backend} backend ({why}; choose with --backend)", highlight=False)
    impl = backend_named(backend)
    check_launch_flags(steps, warmup_steps, data, checkpoint_dir, checkpoint_every, resume, device)
    if validate_only:
        report = impl.validate(plan)
        if as_json:
            emit_json(asdict(report) | {"ok": report.ok})
        else:
            err.print(validation_table(report, err.width))
        report.raise_if_failed()
        return
    plan = scaled_plan(plan, layers, hidden, seq_length, gbs)
    options = LaunchOptions(
        run_dir=run_dir.resolve(), nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, steps=steps, warmup_steps=warmup_steps, lr=lr, seed=seed,
        data=data.resolve() if data else None, device=device,
        checkpoint_dir=checkpoint_dir.resolve() if checkpoint_dir else None, checkpoint_every=checkpoint_every,
        resume=resume)
    plan_path = options.run_dir / "plan.json"
    # A SLURM script takes its rendezvous from the allocation: render only for the checks and notes.
    spec = impl.render(plan, plan_path, replace(options, rdzv_endpoint=options.rdzv_endpoint or "slurm-head:0") if slurm else options)
    for note in spec.notes:
        err.print(f"[yellow]note:[/] {escape(note)}")
    if slurm:
        script = impl.slurm_script(plan, plan_path, options)
        options.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(slurm, script)
        write_plan(plan, plan_path)
        err.print(f"[green]wrote[/] {slurm} and {plan_path}; submit with: sbatch {slurm}")
        return
    if dry_run:
        if as_json:
            emit_json({"backend": backend, "nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node,
                       "env": spec.env, "nodes": [{"node_rank": n.node_rank, "argv": n.argv} for n in spec.nodes],
                       "notes": spec.notes})
            return
        for node in spec.nodes:
            sys.stdout.write(f"# node {node.node_rank}\n{shell_line(node.argv, spec.env)}\n")
        return
    require_framework(backend)
    options.run_dir.mkdir(parents=True, exist_ok=True)
    write_plan(plan, plan_path)
    impl.run(spec, options, echo=lambda line: sys.stderr.write(line + "\n"))
    report_path = options.run_dir / "run_report.json"
    if spec.nnodes > 1 and options.node_rank != 0 and not report_path.exists():
        # rank 0 gathers every rank and writes the report on node 0 (here only if the run dir is shared)
        if as_json:
            return emit_json({"node_rank": options.node_rank, "finished": True, "run_report": None})
        err.print(f"[green]node {options.node_rank} finished[/]; node 0 writes run_report.json into its run directory")
        return
    result = read_report(report_path)
    if as_json:
        return emit_json(result.model_dump(mode="json"))
    err.print(run_report_table(result, plan, err.width))
    err.print(f"[green]wrote[/] {options.run_dir / 'run_report.json'}")


@app.command()
@guarded
def export(
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="a plan.json"),
    to: str = typer.Option(..., "--to", help="megatron | torchtitan | deepspeed | mindformers | k8s | slurm"),
    out_dir: Path = typer.Option(Path("."), "--out-dir", "-o", help="where to write the exported files"),
    image: Optional[str] = typer.Option(None, "--image", help="k8s: the container image the pods run (gplan and torch installed)"),
    target_version: Optional[str] = typer.Option(None, "--target-version",
                                                 help="the engine version to write for (torchtitan: 0.3 | main)"),
    as_json: bool = JsonOpt,
) -> None:
    """Write the plan as another engine takes it: a Megatron-LM script, a torchtitan config and script,
    a DeepSpeed config with a Megatron-DeepSpeed script, MindFormers' parallel sections, a Kubeflow
    PyTorchJob and TrainJob, a SLURM script. A split the engine runs differently is re-priced; one
    that would not fit is refused."""
    from gplan.backends.exporters import export_files
    from gplan.planner.build import reprice_split

    written, notes = export_files(read_plan(plan_file), to, out_dir, plan_path=plan_file, image=image,
                                  version=target_version, reprice=reprice_split)
    if as_json:
        return emit_json({"target": to, "files": [str(p) for p in written], "notes": notes})
    for path in written:
        err.print(f"[green]wrote[/] {path}", highlight=False)
    for note in notes:
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

    from gplan.backends.base import measurer
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


@app.command()
@guarded
def calibrate(
    reports: list[Path] = typer.Argument(..., help="run_report.json files of gplan launch (their plan.json beside "
                                         "them), or engines' training logs (Megatron-LM, Megatron-DeepSpeed, torchtitan, MindFormers)"),
    held_out: list[Path] = typer.Option([], "--held-out", help="reports to predict but not fit (repeat)"),
    out: Path = typer.Option(Path("profile.yaml"), "--out", "-o", help="the calibrated profile"),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="the cluster the engines' logs ran on (a log "
                                          "does not name its hardware)"),
    hardware: Optional[str] = HardwareOpt, devices_per_node: Optional[int] = PerNodeOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Fit compute efficiency, per-layer and per-step overhead and link efficiency to measured runs;
    report the error per run before and after, leave-one-out, and on held-out runs."""
    from gplan.calibration.runs import calibrate_runs, read_log_run, read_run
    from gplan.profiles.files import write_profile
    from gplan.render import calibration_table

    def read(path: Path):  # a run report is JSON; anything else is an engine's log (planner.logs)
        if path.suffix == ".json":
            return read_run(path)
        return read_log_run(path, cluster, hardware, devices_per_node)

    c = calibrate_runs([read(p) for p in reports], [read(p) for p in held_out])
    write_profile(c.profile, out)
    if as_json:
        return emit_json({"profile": str(out), **c.profile.calibration})
    err.print(calibration_table(c.runs, c.fit, c.held, c.held_before, c.held_after, err.width))
    kept = [k for k in c.fit.theta if k not in c.fit.fitted]
    if kept:
        err.print(f"[yellow]note:[/] {len(c.runs)} runs fit {len(c.fit.fitted)} of {len(c.fit.theta)} parameters "
                  f"({', '.join(c.fit.fitted)}); kept at the catalogue's: {', '.join(kept)} — add runs to fit them",
                  highlight=False)
    err.print(f"[green]wrote[/] {out}")


@app.command()
@guarded
def models(as_json: bool = JsonOpt, wide: bool = WideOpt) -> None:
    """List the bundled models."""
    set_wide(wide)
    from gplan.profiles.catalogue import bundled_models, load_model
    from gplan.render import models_table

    specs = [load_model(name) for name in bundled_models()]
    if as_json:
        return emit_json([{"name": m.name, "params": m.total_params(), "active_params": m.active_params(),
                           **m.model_dump(mode="json")} for m in specs])
    err.print(models_table(specs, err.width))


@app.command()
@guarded
def hardware(as_json: bool = JsonOpt, wide: bool = WideOpt) -> None:
    """List the bundled hardware and clusters."""
    set_wide(wide)
    from gplan.profiles.catalogue import bundled_clusters, bundled_hardware, hardware_entry
    from gplan.profiles.schema import DeviceSpec
    from gplan.render import hardware_tables

    devices = [DeviceSpec.model_validate(hardware_entry(n)) for n in bundled_hardware()]
    if as_json:
        return emit_json({"hardware": [d.model_dump(mode="json") for d in devices], "clusters": bundled_clusters()})
    for table in hardware_tables(devices, bundled_clusters(), err.width):
        err.print(table)


@app.command()
@guarded
def validate(file: Path = typer.Argument(..., help="a model.yaml, HF config.json, cluster.yaml or plan.json"),
             refresh: bool = typer.Option(False, "--refresh", help="plan.json edited on purpose: rebuild what follows "
                                          "from its inputs, degrees and split (ranges, ranks, prediction, digest)"),
             as_json: bool = JsonOpt) -> None:
    """Check a model, cluster or plan file; exit 3 with the first problem."""
    from gplan.io import read_data_file
    from gplan.profiles.catalogue import load_cluster, load_model
    from gplan.render import model_facts, model_size_text

    data = read_data_file(file)
    if isinstance(data, dict) and "schema_version" in data:
        from gplan.plan import write_plan
        from gplan.planner.check import check_prediction, refreshed

        plan = refreshed(read_plan(file, check=False)) if refresh else read_plan(file)
        check_prediction(plan, str(file))
        if refresh:
            write_plan(plan, file)
        kind, name = "plan", f"{plan.model.name}, {plan.parallel.label()}"
    elif refresh:
        raise UsageError("--refresh rewrites a plan.json", hint="drop --refresh for model and cluster files")
    elif isinstance(data, dict) and "node_groups" in data:
        kind, name = "cluster", load_cluster(str(file)).name
    else:
        spec = load_model(str(file))
        kind, name, facts = "model", spec.name, model_facts(spec)
    if as_json:
        emit_json({"file": str(file), "kind": kind, "name": name, "valid": True, "refreshed": refresh}
                  | ({"model": facts} if kind == "model" else {}))
    else:
        size = f": {model_size_text(spec)}" if kind == "model" else ""
        err.print(f"[green]{'refreshed' if refresh else 'ok'}:[/] {file} is a valid {kind} ({name}{size})", highlight=False)


def version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"gplan {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                       help="print the version")) -> None:
    """Plan and launch parallel training of large transformers."""


def main() -> None:
    gc.disable()
    _load_numpy_single_threaded()
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


def _load_numpy_single_threaded() -> None:
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


if _COLLECTING:
    gc.enable()

if __name__ == "__main__":
    main()
