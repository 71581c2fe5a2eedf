"""Read the launch a team already runs (`--from FILE`): which engine's reader takes a file, a file no reader
takes refused with what it is, and the launch priced as its engine runs it — beside the best plan.

Each engine's reader is its folder's `launch.py` (gplan.engines): `claims(path, text)` says a file is its
launch, `read(path, model, text)` reads it, and `read_log(path, model, text, strict)` reads its training
log (whose log a text is: its `logs.is_log`). Readers are asked in their PRECEDENCE order, after the logs.
A launch states its layout flags, which become the configuration priced; a flag gplan does not read is
listed, one that would change the layout or its cost is refused (exit 3), never ignored silently.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gplan.engines import engine_part, engine_parts
from gplan.errors import InputError
from gplan.launch_text import file_and_member
from gplan.planner.launch import Launch, differences, launch_batch, launch_config, launch_layouts
from gplan.spec.model import ModelSpec


def family(text: str) -> str | None:
    """Whose training log `text` is, by each format's own mark (its engine's `logs.is_log`); None for
    anything else (a launch file, or a log no reader takes)."""
    return next((name for name, logs in engine_parts("logs").items()
                 if hasattr(logs, "is_log") and logs.is_log(text)), None)


def read_log_launch(path: Path, model: ModelSpec | None, text: str, strict: bool = False) -> Launch:
    """The configuration an engine's log says it ran, as a launch with the log's steady speed (its step, or
    tokens/s per device); `strict` (calibrate): a log with no steady step is refused, not read without one."""
    engine = family(text)
    if engine is None:
        raise InputError(f"{path}: not a training log gplan reads (no Megatron-LM arguments block, torchtitan "
                         "config or step lines, MindFormers step lines)", hint="pass an engine's training log")
    return engine_part(engine, "launch").read_log(path, model, text, strict)


def readers() -> list:
    """The engines' launch readers in the order they are asked."""
    return sorted((m for m in engine_parts("launch").values() if hasattr(m, "claims")), key=lambda m: m.PRECEDENCE)


def read_launch(path: Path, model: ModelSpec | None) -> Launch:
    """The launch in `path`, by the first engine whose reader claims it (an engine's log by its log
    reader); checked against `model`, or (None) its model read from the launch itself."""
    file = file_and_member(path)[0]  # `file::member`: a function of a config registry (torchtitan 0.3)
    if not file.is_file():
        raise InputError(f"--from {path}: no such file", hint="pass a Megatron-LM or torchtitan launch")
    text = file.read_text(errors="replace")
    if family(text):
        return read_log_launch(path, model, text)
    reader = next((r for r in readers() if r.claims(path, text)), None)
    if reader is None:
        what, hint = not_a_launch(path, text)
        raise InputError(f"--from {path}: {what}", hint=hint)
    return reader.read(path, model, text)


def not_a_launch(path: Path, text: str) -> tuple[str, str]:
    """(what the file is, what gplan reads instead) for a file no reader claims: a Python recipe or config
    module, a DeepSpeed JSON alone, a MaxText or NeMo YAML, another file."""
    reads = "gplan reads " + "; ".join(m.READS for m in engine_parts("launch").values()) + "; and the engines' logs"
    if path.suffix == ".py":
        return ("a Python file (a Megatron-Bridge or NeMo recipe, or a module that is no torchtitan 0.3 config "
                "registry), not a launch", "pass the script or command line that runs it; " + reads)
    if path.suffix == ".json":
        kind = "a DeepSpeed config, read with the script that names it (--deepspeed_config)" if re.search(
            r'"(train_batch_size|zero_optimization|train_micro_batch_size_per_gpu)"', text) else "a JSON file"
        return (kind + ", not a launch", "pass the launch script that runs it; " + reads)
    if path.suffix in (".yaml", ".yml"):
        if re.search(r"^\s*(ici|dcn)_\w+_parallelism\s*:", text, re.MULTILINE):
            return "a MaxText config: gplan does not read MaxText's configs", "price its layout with gplan estimate " \
                   "MODEL --tp … --pp …, or pass a Megatron-LM or torchtitan launch"
        if re.search(r"^trainer\s*:", text, re.MULTILINE) and "tensor_model_parallel_size" in text:
            return "a NeMo YAML config: gplan does not read NeMo's YAML", "pass the pretrain_gpt.py command line it " \
                   "runs, or price its layout with gplan estimate MODEL --tp … --pp …"
        return "a YAML file that is neither a MindFormers config nor a Megatron YAML map (MODEL_ARGS)", reads
    return "no launch gplan reads", reads


# ---- pricing a launch, and beside the best plan ---------------------------------------------------

def priced_launch(from_file: Path, model: str | None, devices, cluster, hardware, devices_per_node, seq_length, headroom,
                  profile, target, expert_imbalance, gbs: int | None = None, precision: str | None = None,
                  options: dict | None = None):  # noqa: PLR0913 - the CLI's options, passed through
    """A launch file read, its inputs resolved (its batch, sequence and precision; priced as its engine runs
    it unless --target says otherwise) and its configuration priced: (launch, inputs, config, layouts, prediction).
    `gbs`, `precision` and the engine `options` the command line sets (a switch off: not set) are priced over
    the launch's own, and recorded in `Launch.overridden`."""
    from gplan.cost_models.step import predict
    from gplan.planner.inputs import resolve_inputs
    from gplan.profiles.catalogue import load_model
    from gplan.spec.parallel import check_config

    launch = read_launch(from_file, load_model(model) if model else None)
    if not model and launch.model is not None:
        from gplan.profiles.catalogue import bundled_models

        kind = "the bundled model of that shape" if launch.model.name in bundled_models() else "built from its flags"
        own = f"; {launch.model_from_launch}" if launch.model_from_launch else ""  # what the reader took, and from where
        launch = dataclasses.replace(launch, model_from_launch=f"{launch.model.name}, read from the launch ({kind}){own}")
    if launch.plan is not None:  # gplan's own worker runs the plan it names, as written, priced as it runs it
        from gplan.plan import layouts_of
        from gplan.planner.inputs import Inputs

        p = launch.plan
        training = p.training.model_copy(update={"engine": launch.engine})
        config, layouts = p.parallel.to_config(), layouts_of(p)
        return (launch, Inputs(model=p.model, training=training, cluster=p.cluster, devices=p.world_size), config,
                layouts, predict(p.model, training, p.cluster, config, layouts))
    devices = devices or launch.world_size
    if devices is None:
        raise InputError(f"--from {from_file}: the launch does not say how many GPUs it runs on",
                         hint="pass --devices N")
    spec = launch.model or load_model(model)
    launch = over_the_launch(launch, launch_batch(launch, launch_config(launch, spec, devices)), gbs, precision, options)
    own_cluster = launch_cluster(launch, cluster, hardware, profile)
    inputs = resolve_inputs(spec, devices, own_cluster[0] if own_cluster else cluster, hardware, devices_per_node,
                            launch.gbs, seq_length or launch.seq_length, launch.precision, headroom,
                            str(profile) if profile else None, target or launch.engine, expert_imbalance,
                            **launch.engine_options)
    if own_cluster:
        inputs = dataclasses.replace(inputs, cluster_note=f"{own_cluster[1]}; choose with --cluster")
    config = launch_config(launch, inputs.model, inputs.devices)
    check_config(inputs.model, inputs.training, config, inputs.devices)
    refuse_what_its_engine_does_not_run(from_file, launch, inputs, config)
    layouts = launch_layouts(launch, inputs.model, config, inputs.cluster)
    return launch, inputs, config, layouts, predict(inputs.model, inputs.training, inputs.cluster, config, layouts)


def over_the_launch(launch: Launch, its_gbs: int, gbs: int | None, precision: str | None, options: dict | None) -> Launch:
    """The launch with what the command line sets over it: a global batch, a precision, engine switches that
    are on (`switch_default`: off is not said); each option set records the launch's own value."""
    from gplan.spec.targets import switch_default

    overridden: dict = {}
    if gbs is not None and gbs != its_gbs:
        overridden["gbs"] = its_gbs
    if precision is not None and precision != launch.precision:
        overridden["precision"] = launch.precision
    engine_options = dict(launch.engine_options)
    for key, value in (options or {}).items():
        if value != switch_default(key) and value != engine_options.get(key, switch_default(key)):
            overridden[key] = engine_options.get(key, switch_default(key))
            engine_options[key] = value
    return dataclasses.replace(launch, gbs=gbs or its_gbs, precision=precision or launch.precision,
                               engine_options=engine_options, overridden=overridden)


def refuse_what_its_engine_does_not_run(path: Path, launch: Launch, inputs, config) -> None:
    """A launch priced as its own engine runs it, in a layout that engine refuses (an expert grid its FSDP
    cannot fold, experts tp-sharded where it forbids it, a zero it does not run with experts …): exit 3,
    naming the engine's rule (spec.targets.config_refusals)."""
    from gplan.spec.targets import TARGETS, config_refusals

    engine = inputs.training.engine
    if engine != launch.engine or engine not in TARGETS:
        return
    microbatches = inputs.training.gbs // (config.mbs * config.dp)
    found = config_refusals(TARGETS[engine], inputs.model, config, microbatches, inputs.training.precision)
    if found:
        raise InputError(f"--from {path}: {engine} does not run this layout ({found[0].capability}): {found[0].detail}",
                         hint=f"fix the launch ({found[0].avoid}), or price it as another engine runs it: --target ENGINE")


def launch_cluster(launch: Launch, cluster, hardware, profile) -> tuple[str, str] | None:
    """The bundled cluster the launch names its devices by (`Launch.default_cluster`: (name, why)), where the command
    line names no cluster, hardware or profile."""
    return launch.default_cluster if not (cluster or hardware or profile) else None


def launch_defaults(mine, gbs, target, seq_length, precision, options: dict):
    """What `search --from` takes from the priced launch (`priced_launch`'s tuple) unless the command line
    says otherwise: (devices, gbs, target, seq_length, precision, engine options) — an engine switch the
    command line leaves at its default (False, "none") is the launch's, and so are the overlaps a launch states
    (Megatron-LM's --tp-comm-overlap, --overlap-grad-reduce and --overlap-param-gather: no command-line switch)."""
    from gplan.spec.targets import switch_default

    launch, training = mine[0], mine[1].training
    options = {key: given if given != switch_default(key) else getattr(training, key) for key, given in options.items()}
    for key in ("tp_comm_overlap", "grad_reduce_overlap", "param_gather_overlap"):
        if key in launch.engine_options:  # no command-line switch: the launch's (Megatron's flags, read)
            options[key] = getattr(training, key)
    return (mine[1].devices, gbs or training.gbs, target or launch.engine, seq_length or training.seq_length,
            precision or launch.precision, options)


def launch_versus(mine, planned) -> dict:
    """The user's launch beside the best plan: its configuration and prediction, what differs, the gain."""
    from gplan.plan import layouts_of

    launch, _, config, layouts, prediction = mine
    best = planned.plan.prediction
    return {"source": launch.source, "engine": launch.engine, "parallel": config.model_dump(mode="json"),
            "prediction": prediction.model_dump(mode="json"), "not_read": launch.unread,
            "differences": differences(config, planned.plan.parallel, layouts, layouts_of(planned.plan)),
            "gain": best.tokens_per_s / prediction.tokens_per_s - 1}


def compare_launches(paths: list[Path], model: str, devices, cluster, hardware, devices_per_node, seq_length,
                     headroom, target):
    """`compare MODEL --from a.sh --from b.toml …`: each launch priced as its engine runs it; launches of
    different models (no MODEL given) are named with their model, since their steps are not one job's."""
    from gplan.planner.complete import Entry

    entries, models = [], []
    for path in paths:
        launch, inputs, config, layouts, prediction = priced_launch(path, model, devices, cluster, hardware,
                                                                    devices_per_node, seq_length, headroom, None,
                                                                    target, 1.0)
        models.append(inputs.model.name)
        entries.append(Entry(path.name, prediction, config, inputs.training.gbs, inputs.training.seq_length, layouts,
                             [], {}, target=inputs.training.engine))
    if len(set(models)) > 1:
        entries = [dataclasses.replace(entry, name=f"{entry.name} ({name})") for entry, name in zip(entries, models)]
    return entries
