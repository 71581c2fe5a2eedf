"""Megatron arguments as a YAML map, and the launch line that fills one: the format of NVIDIA's
Megatron-MoE-ModelZoo (github.com/yanring/Megatron-MoE-ModelZoo).

A model config there (`model_configs/benchmarking/<MODEL>.yaml`) maps each Megatron flag to its value under
`MODEL_ARGS` (`true`: the switch is given, `false`: left out) with `${TP}`-style variables, and a run is a
launch line: `MODEL=Qwen3-235B-A22B TP=2 PP=8 … bash sbatch_benchmarking.sh --extra-flags`. What
`sbatch_benchmarking.sh` does with it, read from that script and `runtime_configs/benchmarking/runtime.conf`:

  - variables the line leaves out come from runtime.conf's row for MODEL (`TP PP EP CP VPP MBS GBS LAYERS
    DISPATCHER GROUPED_GEMM NNODES …`); LAYERS_PER_VP = NUM_LAYERS / PP / VPP when VPP > 1 (else false),
    PP_FIRST / PP_LAST only when PP does not divide NUM_LAYERS;
  - the map's values are substituted (envsubst), `false` entries dropped, `true` ones given bare;
  - VPP > 1 without a layout flag adds `--num-virtual-stages-per-pipeline-rank VPP`; an uneven PP adds
    `--decoder-first/last-pipeline-num-layers`; DISPATCHER (default deepep) adds the dispatcher flags; PR
    (bf16, fp8, mxfp8) the precision flags; A2A_OVERLAP=1 `--overlap-moe-expert-parallel-comm`;
    OPTIMIZER_OFFLOAD=1 `--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d`; the flags after the script
    name come last;
  - NNODES nodes of 8 GPUs (4 with GB200_CLUSTER=1, or, left unset, with NVLINK_DOMAIN_SIZE=72 exported, as the
    zoo's GB200/GB300 scripts do).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gplan.errors import InputError
from gplan.launch_text import arguments

SCRIPT = "sbatch_benchmarking.sh"
VARIABLE = re.compile(r"\$\{(\w+)\}")


def zoo_arguments(path: Path, text: str) -> tuple[dict[str, list[str]], dict[str, str]] | None:
    """(Megatron arguments, world-size variables) of a model-zoo YAML map or of a launch line that runs
    `sbatch_benchmarking.sh`; None for any other file."""
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
        if not isinstance(data, dict) or "MODEL_ARGS" not in data:
            return None
        return map_arguments(data["MODEL_ARGS"], {}, path, launch=None), {}
    if SCRIPT not in text:
        return None
    runs = [i + 1 for i, line in enumerate(text.splitlines())
            if re.search(rf"(^|\s)(bash\s+|\./)\S*{re.escape(SCRIPT)}", line) and not line.lstrip().startswith("#")]
    if len(runs) > 1:
        raise InputError(f"--from {path}: {len(runs)} launch lines run {SCRIPT} (lines {', '.join(map(str, runs))}); "
                         "gplan prices one launch", hint="copy the line you run (with its exports) into a file of its own")
    extra, variables = arguments(text)
    model = variables.get("MODEL")
    if not model:
        raise InputError(f"--from {path}: it runs {SCRIPT} without MODEL=…", hint="name the model config: "
                         f"MODEL=Qwen3-235B-A22B … bash {SCRIPT}")
    config = next((c for c in (path.parent / "model_configs" / "benchmarking" / f"{model}.yaml",
                               path.parent / f"{model}.yaml") if c.is_file()), None)
    if config is None:
        raise InputError(f"--from {path}: it runs the model zoo's {model}.yaml, which is neither in "
                         "model_configs/benchmarking/ nor beside it", hint=f"put {model}.yaml beside {path.name}")
    import yaml

    env = runtime_defaults(path.parent, model) | variables
    env |= derived(env)
    args = map_arguments((yaml.safe_load(config.read_text()) or {}).get("MODEL_ARGS") or {}, env, config, launch=path)
    args |= script_flags(args, env)
    args |= extra
    trays = gb200_trays(env)
    said = {ZOO_NOTE: "(NNODES read as 4-GPU GB200 trays: the launch exports NVLINK_DOMAIN_SIZE=72 and sets no "
                      "GB200_CLUSTER)"} if trays and "GB200_CLUSTER" not in env else {}
    return args, {"NNODES": env.get("NNODES", "1"), "GPUS_PER_NODE": "4" if trays else "8", **said}


ZOO_NOTE = "(zoo note)"
"""The world-size variables' key for what the launch reader says beside the prediction."""


def gb200_trays(env: dict[str, str]) -> bool:
    """sbatch_benchmarking.sh runs 4 tasks a node where GB200_CLUSTER=1 (its cluster config, a file of the user's
    own, sets it); left unset, a launch that exports NVLINK_DOMAIN_SIZE=72 — as the zoo's GB200 and GB300 scripts do,
    and as the script itself sets it only for GB200 clusters — runs on those 4-GPU trays."""
    if "GB200_CLUSTER" in env:
        return env["GB200_CLUSTER"] == "1"
    return env.get("NVLINK_DOMAIN_SIZE") == "72"


def map_arguments(mapping: dict, env: dict[str, str], source: Path, launch: Path | None) -> dict[str, list[str]]:
    """A `--flag: value` map as argparse would see it: `true` bare, `false` left out, `${VAR}` filled from
    `env`; a variable nothing sets is refused, naming it, where the flag is one gplan reads or one that may
    change the layout (paths and names left unfilled are kept as written)."""
    from gplan.engines.megatron.flags import LAYOUT_FLAGS, MEGATRON_LAYOUT_LIKE, MODEL_FLAGS, MODEL_SWITCHES

    read = LAYOUT_FLAGS | MODEL_FLAGS.keys() | MODEL_SWITCHES
    args: dict[str, list[str]] = {}
    missing: set[str] = set()
    for flag, item in mapping.items():
        if not str(flag).startswith("--"):
            continue
        items = item if isinstance(item, list) else [item]
        texts = []
        for one in items:
            text = "true" if one is True else "false" if one is False else str(one).strip()
            if str(flag) in read or MEGATRON_LAYOUT_LIKE.search(str(flag)):
                missing |= {name for name in VARIABLE.findall(text) if name not in env}
            texts.append(VARIABLE.sub(lambda m: env.get(m.group(1), m.group(0)), text))
        if texts == ["false"]:
            continue
        args[str(flag)] = [] if texts == ["true"] else [w for t in texts for w in t.split()]
    if missing:
        where = f"the launch {launch.name}" if launch else "a launch line"
        raise InputError(f"--from {source}: {', '.join('${' + m + '}' for m in sorted(missing))} "
                         f"{'is' if len(missing) == 1 else 'are'} not set by {where}",
                         hint=f"pass the line that runs it ({' '.join(sorted(missing))}=… bash {SCRIPT}) as --from")
    return args


def runtime_defaults(folder: Path, model: str) -> dict[str, str]:
    """runtime.conf's row for `model`, by its header's column names (TP, PP, …, LAYERS as NUM_LAYERS)."""
    conf = folder / "runtime_configs" / "benchmarking" / "runtime.conf"
    if not conf.is_file():
        conf = folder / "runtime.conf"
    if not conf.is_file():
        return {}
    text = conf.read_text()
    header = re.search(r"#\s*MODEL:\s*(.+)", text)
    row = re.search(rf"\[{re.escape(model)}\]=\"([^\"]*)\"", text)
    if not header or not row:
        return {}
    names = [{"LAYERS": "NUM_LAYERS", "DISPATCHER": "MOE_TOKEN_DISPATCHER", "GROUPED_GEMM": "MOE_GROUPED_GEMM",
              "SLEN": "SEQ_LEN"}.get(n, n) for n in header.group(1).replace("[", " ").replace("]", " ").split()]
    return dict(zip(names, row.group(1).split()))


def derived(env: dict[str, str]) -> dict[str, str]:
    """runtime.conf's derived variables: LAYERS_PER_VP, and PP_FIRST / PP_LAST set only for an uneven PP."""
    found: dict[str, str] = {}
    layers, pp, vpp = (_int(env.get(k)) for k in ("NUM_LAYERS", "PP", "VPP"))
    if "LAYERS_PER_VP" not in env:
        found["LAYERS_PER_VP"] = str(layers // pp // vpp) if layers and pp and vpp and vpp > 1 else "false"
    if layers and pp and layers % pp == 0:
        found["PP_FIRST"] = found["PP_LAST"] = "false"
    return found


def script_flags(args: dict[str, list[str]], env: dict[str, str]) -> dict[str, list[str]]:
    """The flags sbatch_benchmarking.sh adds from the variables."""
    added: dict[str, list[str]] = {}
    layout = {"--pipeline-model-parallel-layout", "--num-virtual-stages-per-pipeline-rank",
              "--num-layers-per-virtual-pipeline-stage"}
    vpp, layers, pp = _int(env.get("VPP")) or 1, _int(env.get("NUM_LAYERS")), _int(env.get("PP")) or 1
    if vpp > 1 and not layout & args.keys():
        added["--num-virtual-stages-per-pipeline-rank"] = [str(vpp)]
    if layers and layers % pp and "--pipeline-model-parallel-layout" not in args:
        added["--decoder-first-pipeline-num-layers"] = [env.get("PP_FIRST", "")]
        added["--decoder-last-pipeline-num-layers"] = [env.get("PP_LAST", "")]
    offload = env.get("OPTIMIZER_OFFLOAD", "0") == "1"
    if offload:
        added |= {"--optimizer-cpu-offload": [], "--overlap-cpu-optimizer-d2h-h2d": []}
    dispatcher = env.get("DISPATCHER", "deepep")
    added |= {"alltoall": {"--moe-token-dispatcher-type": ["alltoall"]},
              "deepep": {"--moe-token-dispatcher-type": ["flex"], "--moe-flex-dispatcher-backend": ["deepep"]},
              "hybridep": {"--moe-token-dispatcher-type": ["flex"], "--moe-flex-dispatcher-backend": ["hybridep"]},
              }.get(dispatcher, {})
    precision = env.get("PR", "bf16")
    if precision == "bf16":
        added["--tp-comm-overlap"] = []
    elif precision in ("fp8", "mxfp8"):
        added |= {"--fp8-recipe": ["blockwise" if precision == "fp8" else "mxfp8"], "--fp8-format": ["e4m3"],
                  "--use-precision-aware-optimizer": [], "--main-grads-dtype": ["fp32"],
                  "--main-params-dtype": ["fp32"], "--exp-avg-dtype": ["bf16"], "--exp-avg-sq-dtype": ["bf16"]}
        if not offload:
            added["--fp8-param-gather"] = []
    if env.get("A2A_OVERLAP", "0") == "1":
        added |= {"--delay-wgrad-compute": [], "--overlap-moe-expert-parallel-comm": []}
    return added


def _int(text: Any) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None
