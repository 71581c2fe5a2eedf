"""Complete a configuration a user gave in part, as the search would.

`gplan estimate --tp 8 --pp 4` and `gplan compare --config "tp=8,pp=4"` name some options and leave the
rest. Filling the rest with fixed defaults (zero 0, no sp, recompute none, the even split) priced a search
row's degrees at 196.9 GiB where the search had found 71.2 GiB: the same degrees, two answers. Here what
the user did not say is chosen by the search itself, restricted to what they did say — the same
candidates, split solver and re-pricing — so a row's degrees give the row's numbers, and every choice
is returned to be shown. Where the search finds no plan (nothing fits, or the target would not run the
degrees) the configuration is still priced, with gplan's stated defaults, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gplan.cost_models import step
from gplan.errors import InfeasibleError, InputError
from gplan.plan import Prediction
from gplan.planner.inputs import Inputs
from gplan.planner.space import SearchLimits
from gplan.spec.parallel import (DEFAULT_RECOMPUTE_MODULES, ParallelConfig, StageLayout, check_config,
                                 config_from_options, layout_from_sizes, recompute_mix, split_text)
from gplan.spec.targets import check_recompute_modules

#: The options a configuration has; the degrees dp tp pp cp are the user's (dp fills the devices).
KNOBS = ("vpp", "ep", "etp", "mbs", "zero", "sp", "recompute", "recompute_modules", "offload_layers", "schedule")


@dataclass(frozen=True)
class Completed:
    config: ParallelConfig
    layouts: list[StageLayout] | None
    """The stage split priced (None: the even split)."""
    prediction: Prediction
    chosen: dict[str, str]
    """What the user did not give, and the value taken for it."""
    by_search: bool
    """True when the search chose them; False when gplan's defaults were taken (`why`)."""
    why: str = ""


def complete(inputs: Inputs, given: dict[str, Any], stage_sizes: list[int] | None = None) -> Completed:
    """The configuration of `given` (keys of ParallelConfig; dp defaults to the devices over tp·pp·cp),
    its other options chosen as `gplan search` would, priced. `stage_sizes` fixes the split (uniform
    recompute); otherwise the search's split and per-layer recompute are taken."""
    degrees = degrees_of(given, inputs.devices)
    if "recompute_modules" in given:
        given = {**given, "recompute_modules": config_from_options(recompute_modules=given["recompute_modules"]).recompute_modules}
        check_recompute_modules(inputs.model, inputs.training.engine, given["recompute_modules"])
    limits = SearchLimits(
        **{axis: [v] for axis, v in degrees.items()},
        **{k: [given[k]] for k in ("vpp", "ep", "etp", "mbs", "zero") if k in given},
        **({"recompute": [given["recompute"]]} if "recompute" in given else
           {"recompute": ["none"]} if given.get("offload_layers") else {}),  # Megatron offloads without recompute
        **({"recompute_modules": [given["recompute_modules"]]} if "recompute_modules" in given else {}),
        schedule=[given["schedule"]] if "schedule" in given else None,
        allow_fewer_devices=False)
    try:
        best = _search_best(inputs, limits, _world(degrees))
    except InfeasibleError as exc:
        return _with_defaults(inputs, given, degrees, stage_sizes, why=exc.message)
    config, layouts = best.config, best.layouts
    if "sp" in given and given["sp"] != config.sp:  # the search runs sp whenever tp > 1
        config = config.model_copy(update={"sp": given["sp"]})
    if given.get("offload_layers"):  # the search does not offload: the user's layers, on its best choices
        config = config_from_options(**{**config.model_dump(), "offload_layers": given["offload_layers"]})
        check_config(inputs.model, inputs.training, config, config.world_size)
    if stage_sizes is not None:
        layouts = layout_from_sizes(inputs.model, stage_sizes, [given.get("recompute", "none")] * config.pp)
    config = _stating_its_recompute(config, layouts)
    prediction = step.predict(inputs.model, inputs.training, best.cluster, config, layouts)
    return Completed(config, layouts, prediction, chosen_text(config, layouts, given, stage_sizes), True)


def _stating_its_recompute(config: ParallelConfig, layouts) -> ParallelConfig:
    """The search's configuration carries the option it seeded the split with; the split's layers say
    what runs. Where every layer recomputes alike, the configuration says that (`rc=full`, not `rc=none`
    beside a priced full recompute); a mix stays in the layouts (`recompute_mix`)."""
    kinds = {c.recompute for stage in layouts or [] for c in stage.layers if c.count}
    return config.model_copy(update={"recompute": kinds.pop()}) if len(kinds) == 1 else config


def degrees_of(given: dict[str, Any], devices: int) -> dict[str, int]:
    tp, pp, cp = (int(given.get(axis, 1)) for axis in ("tp", "pp", "cp"))
    return {"dp": int(given.get("dp") or max(1, devices // (tp * pp * cp))), "tp": tp, "pp": pp, "cp": cp}


def _world(degrees: dict[str, int]) -> int:
    return degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees["cp"]


def _search_best(inputs: Inputs, limits: SearchLimits, devices: int):
    from gplan.planner.search import search

    return search(inputs.model, inputs.training, inputs.cluster, devices, limits, top=1).best


def _with_defaults(inputs: Inputs, given: dict[str, Any], degrees: dict[str, int], stage_sizes, why: str) -> Completed:
    """gplan's stated defaults for what was not given: sp with tp > 1 (as the search), the rest at their
    plainest (mbs 1, zero 0, no recompute, one chunk per stage, no expert parallelism)."""
    values = {**degrees, "sp": degrees["tp"] > 1, **{k: v for k, v in given.items() if k not in degrees}}
    config = config_from_options(**values)
    layouts = (layout_from_sizes(inputs.model, stage_sizes, [config.recompute] * config.pp)
               if stage_sizes is not None else engine_default_layouts(inputs, config))
    prediction = step.predict(inputs.model, inputs.training, inputs.cluster, config, layouts)
    return Completed(config, layouts, prediction, chosen_text(config, layouts, given, stage_sizes), False, why)


def engine_default_layouts(inputs: Inputs, config):
    """The even split as the pricing engine cuts it (`spec.targets.runs_as`: Megatron's accounting for the
    embedding and loss where it runs uneven chunks, an even share per rank where it splits only evenly); None
    without an engine (the cost model's own even split)."""
    from gplan.spec.parallel import uniform_layout
    from gplan.spec.targets import TARGETS, runs_as

    engine = inputs.training.engine
    if not engine or config.pp == 1:
        return None
    return runs_as(TARGETS[engine], inputs.model, config,
                   uniform_layout(inputs.model, config.pp, config.recompute, config.vpp))


def chosen_text(config: ParallelConfig, layouts, given: dict[str, Any], stage_sizes) -> dict[str, str]:
    values = {"vpp": str(config.vpp), "mbs": str(config.mbs), "zero": str(config.zero),
              "sp": "on" if config.sp else "off", "schedule": config.schedule,
              "recompute": recompute_mix(layouts, config.recompute_modules) if layouts else config.recompute}
    if config.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        values["recompute_modules"] = ",".join(config.recompute_modules) or "none"
    if config.ep > 1 or config.etp > 1 or "ep" in given or "etp" in given:
        values |= {"ep": str(config.ep), "etp": str(config.etp)}
    if stage_sizes is None:
        values["split"] = split_text(layouts) if layouts else "even"
    return {k: v for k, v in values.items() if k not in given and not (k == "schedule" and "vpp" in given)}


def given_options(**options: Any) -> dict[str, Any]:
    """The options a user set (None: not said)."""
    return {k: v for k, v in options.items() if v is not None}


def stage_sizes_option(model, config, text: str | None) -> list[int] | None:
    """`--stages 7,8,8,...`: one layer count per pipeline stage (None: the search's split), kept to the
    split rules (`spec.parallel.split_violations`)."""
    from gplan.planner.space import int_list
    from gplan.spec.parallel import split_violations

    sizes = int_list(text, "--stages")
    if sizes is None:
        return None
    broken = split_violations(model, config, sizes)
    if broken:
        raise InputError(f"--stages {text!r}: {broken[0].message}", hint=broken[0].hint)
    return sizes


def target_refusals(inputs, config, layouts) -> tuple[list, list[str]]:
    """What the pricing target would not run of this configuration and split, and the targets that would
    run it as written: an estimate is a what-if and prices it anyway, but says so."""
    from gplan.spec.parallel import uniform_layout
    from gplan.spec.targets import TARGETS, refusals

    layouts = layouts or engine_default_layouts(inputs, config) or uniform_layout(inputs.model, config.pp,
                                                                                   config.recompute, config.vpp)
    m = config.microbatches_for(inputs.training.gbs)

    def refused(name: str) -> list:
        return refusals(TARGETS[name], inputs.model, config, m, layouts, inputs.training.precision)

    engine = inputs.training.engine
    found = refused(engine) if engine else []
    return found, [name for name in TARGETS if found and name != engine and not refused(name)]


def config_of(given: dict, devices: int):
    """The configuration as given, the rest at ParallelConfig's defaults (sp with tp > 1): for the rules'
    check, which the user's own values must pass before anything is chosen for them."""
    degrees = degrees_of(given, devices)
    return config_from_options(**{"sp": degrees["tp"] > 1, **given, **degrees})  # sp with tp, as the search


# ---- the commands' library functions: estimate and compare, whole --------------------------------------

@dataclass(frozen=True)
class Estimate:
    """`gplan estimate`: a configuration given in part, completed and priced, with what its target says."""

    inputs: Inputs
    done: Completed
    refused: list
    """What the pricing target would not run as written (spec.targets.Refusal)."""
    runners: list[str]
    """The targets that would."""


def estimate(inputs: Inputs, given: dict[str, Any], stages: str | None = None, what_if: bool = False) -> Estimate:
    """The user's own values checked against the rules first (nothing is chosen for a configuration
    that cannot run), then completed as the search would, the `--stages` split kept.

    A configuration the named target would not run as written is refused with that engine's rule
    (a user who names torchtitan is told what torchtitan would stop on, not handed a number for a
    launch that never starts); `what_if` prices it anyway with the refusal attached, as `compare` does."""
    from gplan.spec.parallel import RULES, SHARDING_RULES, check_config

    first = config_of(given, inputs.devices)
    # a zero left open is chosen below, where the rules that read it are asked, not judged here at its default
    rules = RULES if "zero" in given else tuple(r for r in RULES if r not in SHARDING_RULES)
    check_config(inputs.model, inputs.training, first, inputs.devices, rules)
    done = complete(inputs, given, stage_sizes_option(inputs.model, first, stages))
    refused, runners = target_refusals(inputs, done.config, done.layouts)
    if refused and not what_if:
        raise target_refusal_error(inputs.training.engine, refused[0].detail, runners)
    return Estimate(inputs, done, refused, runners)


def target_refusal_error(engine: str, detail: str, runners: list[str]) -> InputError:
    runs = f"--target {runners[0]} runs it as written; " if runners else ""
    return InputError(f"{engine} would not run this configuration: {detail}",
                      f"{runs}change the layout to one {engine} runs, or price it anyway with `gplan compare "
                      f"--target {engine} --config ...` (a what-if, the refusal noted)")


@dataclass(frozen=True)
class Entry:
    """One column of `gplan compare`."""

    name: str
    prediction: Prediction
    config: ParallelConfig
    gbs: int
    seq_length: int
    layouts: list[StageLayout] | None
    refusals: list[str]
    """What the pricing target would not run as written."""
    chosen: dict[str, str]
    """What was completed for a configuration given in part."""
    completed: Completed | None = None
    target: str | None = None
    """The engine it is priced as (a plan's recorded target; the inputs' engine)."""


def compare_configs(inputs: Inputs, texts: list[str]) -> list[Entry]:
    """`compare MODEL --config "tp=8,pp=4" …`: each configuration completed and priced as `estimate` does."""
    from gplan.spec.parallel import parse_config_values

    entries = []
    for text in texts:
        e = estimate(inputs, parse_config_values(text), what_if=True)
        entries.append(Entry(text, e.done.prediction, e.done.config, inputs.training.gbs, inputs.training.seq_length,
                             e.done.layouts, [r.detail for r in e.refused], e.done.chosen, e.done,
                             target=inputs.training.engine))
    return entries


def compare_plans(paths: list[str]) -> list[Entry]:
    """`compare a.json b.json …`: the plans as written, named by file (by path where names collide)."""
    from pathlib import Path

    from gplan.plan import layouts_of, read_plan

    plans = [read_plan(Path(item)) for item in paths]
    names = [Path(item).name for item in paths]
    names = names if len(set(names)) == len(names) else list(paths)
    return [Entry(name, p.prediction, p.parallel, p.training.gbs, p.training.seq_length, layouts_of(p), [], {},
                  target=p.training.engine)
            for name, p in zip(names, plans)]
