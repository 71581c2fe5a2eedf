"""MoE runs kept apart from every fit: NVIDIA's Megatron-MoE-ModelZoo Qwen3-235B-A22B tables on 256 H100, GB200
and GB300 (bench/data/moe_zoo_runs.csv, its README's step times; the GB and long-context rows' from their TFLOP/s
in the H100 rows' FLOP convention) and Megatron-LM's DeepSeek-V3 run on 256 GB200 (its optimization guide's
TFLOP/s, its reproduction guide's launch), priced by gplan as Megatron-LM runs them — the configuration each row states,
nothing fitted on them. FSDP + EP (Megatron-FSDP) rows are their own family. MXFP8 rows gather FP8
parameters and keep bf16 Adam moments under the precision-aware optimizer, as the model zoo's PR=mxfp8 and
Megatron-LM's DeepSeek-V3 guide set (`adam_moments`; the fp32 master shards stay whole under an FP8 recipe).
The zoo's Mixtral-8x22B script states two H100 figures (its comments): dropless with auxiliary-loss routing,
priced balanced (a lower bound on gplan's own price), and token dropping at capacity factor 1.0 with every
expert padded to its capacity (`capacity`), whose shape is the balanced one gplan prices. A row's gradient reduction (`grad_reduce`) is its recipe's: fp32, Megatron's default for bf16, except
the Megatron-FSDP row, whose flags the model zoo does not publish — priced with Megatron-LM's own Megatron-FSDP + EP
example script (the same ep, micro-batch and batch), which reduces in bf16; the table marks it.
torchtitan's MoE runs from a public thread (bench/data/torchtitan_moe_runs.csv) are read from their own TOML by
gplan's torchtitan reader and judged on their outcome: a recorded out-of-memory called, a completed run within its
device, its measured peak compared where stated.

    python bench/moe_zoo.py [--readme]
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from pathlib import Path

from gplan.cost_models.step import predict
from gplan.planner.inputs import resolve_inputs
from gplan.spec.parallel import ParallelConfig, layout_from_sizes, even_stage_sizes

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "bench" / "data" / "moe_zoo_runs.csv"
BEGIN, END = "<!-- moe-zoo:begin -->", "<!-- moe-zoo:end -->"


def cluster_of(row: dict) -> str:
    """A row's cluster: a catalogue name, or a cluster file of bench/data (a variant the catalogue lacks, its
    numbers cited there: h800-pai.yaml)."""
    path = ROOT / "bench" / "data" / f"{row['cluster']}.yaml"
    return str(path) if path.is_file() else row["cluster"]


def predicted_step_s(row: dict, imbalance: float = 1.0) -> float:
    return prediction(row, imbalance)[0]


def prediction(row: dict, imbalance: float = 1.0) -> tuple[float, float, float]:
    """(step seconds, the largest stage's peak GiB, the device's GiB) of a row as stated (forced balance,
    unless `imbalance` says otherwise)."""
    inputs = resolve_inputs(row["model"], int(row["gpus"]), cluster_of(row), gbs=int(row["gbs"]),
                            seq_length=int(row["seq_length"]), precision=row["precision"], target="megatron",
                            expert_imbalance=imbalance,
                            moe_dispatcher=row["dispatcher"], moe_a2a_overlap=row["a2a_overlap"] == "true",
                            cuda_graphs=row["cuda_graphs"], fp8_param_gather=row["precision"] == "mxfp8",
                            grad_reduce_in_bf16=row["grad_reduce"] == "bf16",
                            precision_aware_optimizer=row["adam_moments"] != "fp32", adam_moments=row["adam_moments"])
    modules = tuple(row["modules"].split("+")) if row["modules"] else None
    config = ParallelConfig(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), vpp=int(row["vpp"]),
                            cp=int(row["cp"]), ep=int(row["ep"]), etp=1, sp=int(row["tp"]) > 1, zero=int(row["zero"]),
                            mbs=int(row["mbs"]), recompute=row["recompute"],
                            **({"recompute_modules": modules} if modules else {}),
                            schedule="interleaved_1f1b" if int(row["vpp"]) > 1 else "1f1b")
    m = inputs.model
    layouts = layout_from_sizes(m, even_stage_sizes(m.total_layers, config.pp, config.vpp), [config.recompute] * config.pp)
    p = predict(m, inputs.training, inputs.cluster, config, layouts)
    device_GiB = inputs.cluster.node_groups[0].hardware.memory_bytes / 2**30
    return p.step_time_s, max(st.memory_bytes for st in p.stages) / 2**30, device_GiB


def table() -> str:
    rows = list(csv.DictReader(RUNS.open()))
    lines = ["| run | family | measured s | predicted s | error | predicted peak GiB (device) |",
             "|---|---|---:|---:|---:|---:|"]
    errors: dict[str, list[float]] = {}
    by_source: dict[str, list[float]] = {}
    for r in rows:
        family = "FSDP + EP" if int(r["zero"]) >= 2 else "EP, distributed optimizer"
        got, peak_GiB, device_GiB = prediction(r)
        err = got / float(r["step_s"]) - 1
        errors.setdefault(family, []).append(abs(err))
        by_source.setdefault(r["source"], []).append(abs(err))
        config = (f"{'' if r['seq_length'] == '4096' else 'seq ' + r['seq_length'] + ' '}tp{r['tp']}"
                  f"{'' if r['cp'] == '1' else ' cp' + r['cp']} pp{r['pp']} vpp{r['vpp']} ep{r['ep']} dp{r['dp']} zero{r['zero']} mbs{r['mbs']} "
                  f"{r['dispatcher']}{' +a2a overlap' if r['a2a_overlap'] == 'true' else ''}"
                  f"{' bf16 grads (assumed)' if r['grad_reduce'] == 'bf16' else ''}"
                  f"{' capacity ' + r['capacity'] if r['capacity'] else ''}")
        device = r["cluster"].removeprefix("dgx-").split("-")[0].upper()
        extras = "".join(f" {x}" for x in (r["precision"].upper() if r["precision"] != "bf16" else "",
                                           "graphs" if r["cuda_graphs"] != "none" else "") if x)
        lines.append(f"| {r['model']} {r['gpus']}×{device} {config}{extras} | {family} | {float(r['step_s']):.1f} | {got:.1f} | "
                     f"{err:+.1%} | {peak_GiB:.0f} ({device_GiB:.0f}) |")
    lines += ["", " ".join(f"{f}: median |error| {statistics.median(e):.1%} ({len(e)} rows)." for f, e in errors.items()),
              "", "By source: " + "; ".join(f"{name} {statistics.median(e):.1%} ({len(e)})" for name, e in by_source.items()) + "."]
    return "\n".join(lines + [""] + dropless_lines(rows) + [""] + automodel_lines() + [""] + torchtitan_lines())


AUTOMODEL_RUNS = ROOT / "bench" / "data" / "automodel_moe_runs.csv"


AUTOMODEL_ATTENTION = {"te": None, "sdpa": "fa2", "flex": "fa2"}
"""The recipes' `model.backend.attn` -> the attention kernel priced (engines/nemo_automodel/launch.py ATTENTION)."""


def automodel_lines() -> list[str]:
    """NeMo AutoModel's published MoE pre-training steps on H100 (its performance summary; FSDP2 with ep
    borrowed from the sharded ranks, DeepEP, every block checkpointed), priced as AutoModel runs them: its
    split (`spec.targets.runs_as`), its experts' grouped kernel, the flex dispatcher, the model in the dtype it is
    built in (`model_dtype`: no recipe sets `model.torch_dtype`, so AutoModel's default bfloat16 — Adam's states
    too, no fp32 copy), the attention kernel its `attn` names (gpt-oss's FlexAttention: FlashAttention-2's class), the loss on the
    16-bit logits (`loss_fn.fp32_upcast: false`, every recipe), and with pipeline stages the schedule run once per
    local batch (`lbs`, the table's LBS: gbs / (lbs·dp) runs a step, each filling and draining the pipeline). A row gplan's AutoModel profile refuses is listed with the refusal, not priced as another
    engine."""
    from gplan.spec.targets import TARGETS, refusals, runs_as

    lines = ["| NeMo AutoModel run (FSDP + EP) | measured s | predicted s | error | predicted peak GiB (device) |",
             "|---|---:|---:|---:|---:|"]
    errors, over = [], []
    for r in csv.DictReader(AUTOMODEL_RUNS.open()):
        inputs = resolve_inputs(r["model"], int(r["gpus"]), "dgx-h100", gbs=int(r["gbs"]),
                                seq_length=int(r["seq_length"]), target="nemo-automodel", moe_dispatcher=r["dispatcher"],
                                pure_bf16=r["model_dtype"] == "bf16", attention_kernel=AUTOMODEL_ATTENTION[r["attn"]],
                                bf16_loss=r["fp32_upcast"] == "false")
        config = ParallelConfig(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), vpp=int(r["vpp"]), ep=int(r["ep"]),
                                etp=1, zero=int(r["zero"]), mbs=int(r["mbs"]), recompute=r["recompute"],
                                schedule_runs=int(r["gbs"]) // (int(r["lbs"]) * int(r["dp"])) if int(r["pp"]) > 1 else 1,
                                schedule="interleaved_1f1b" if int(r["vpp"]) > 1 else "1f1b")
        m, target = inputs.model, TARGETS["nemo-automodel"]
        layouts = runs_as(target, m, config, layout_from_sizes(
            m, even_stage_sizes(m.total_layers, config.pp, config.vpp), [config.recompute] * config.pp))
        label = (f"{r['model']} {r['gpus']}×H100 pp{r['pp']} vpp{r['vpp']} ep{r['ep']} dp{r['dp']} zero{r['zero']} "
                 f"mbs{r['mbs']}{' ' + r['attn'] if r['attn'] != 'te' else ''}"
                 f"{f' ×{config.schedule_runs} schedules' if config.schedule_runs > 1 else ''}")
        refused = refusals(target, m, config, config.microbatches_for(int(r["gbs"])), layouts, "bf16")
        if refused:
            lines.append(f"| {label} | {float(r['step_s']):.2f} | not priced: {refused[0].detail} | | |")
            continue
        p = predict(m, inputs.training, inputs.cluster, config, layouts)
        err = p.step_time_s / float(r["step_s"]) - 1
        errors.append(abs(err))
        device, peak = inputs.cluster.node_groups[0].hardware.memory_bytes / 2**30, max(s.memory_bytes for s in p.stages) / 2**30
        if peak > device:  # a run that completed, priced above its device's memory: an error, as a missed OOM
            over.append(r["model"])
        lines.append(f"| {label} | {float(r['step_s']):.2f} | {p.step_time_s:.2f} | {err:+.1%} | {peak:.0f} ({device:.0f}) |")
    return lines + ["", f"NeMo AutoModel, FSDP + EP: median |error| {statistics.median(errors):.1%} ({len(errors)} rows "
                        f"priced); completed runs priced above their device's memory: {len(over)}"
                        f"{' (' + ', '.join(over) + ')' if over else ''}."]


TORCHTITAN_RUNS = ROOT / "bench" / "data" / "torchtitan_moe_runs.csv"


def with_overrides(launch: Path, overrides: str, folder: Path) -> Path:
    """The TOML `launch` with `section.key=value` overrides (';'-separated) written over its lines, as
    torchtitan's own command-line overrides would set them; the file itself when there are none."""
    if not overrides:
        return launch
    text = launch.read_text()
    for override in overrides.split(";"):
        dotted, value = override.split("=", 1)
        key = dotted.rsplit(".", 1)[1]
        text, count = re.subn(rf"^{key}\s*=.*$", f"{key} = {value}", text, count=1, flags=re.MULTILINE)
        assert count == 1, f"{launch.name} has no {dotted} to override"
    out = folder / launch.name
    out.write_text(text)
    return out


def option_of(text: str) -> tuple[str, object]:
    """`loss_chunks=8` -> ("loss_chunks", 8): an engine option the row's source states and its TOML cannot."""
    key, value = text.split("=", 1)
    return key, int(value) if value.isdigit() else value


def torchtitan_lines() -> list[str]:
    """torchtitan's MoE runs from public threads, each TOML read by gplan's own torchtitan reader (`--from`) and
    priced as torchtitan runs it; a recorded out-of-memory must be called (peak above the device's memory),
    a completed run must not be, and its measured peak and step are compared where the thread states them. A
    setting the thread leaves unstated is taken as the row's `assumed` says, and the table marks it."""
    import tempfile

    from gplan.planner.launch_files import priced_launch

    lines = ["| torchtitan MoE run (FSDP; ep borrowed where set) | outcome | measured s | predicted s | "
             "measured peak GiB | predicted peak GiB (device) | verdict |", "|---|---|---:|---:|---:|---:|---|"]
    wrong, memory_errors, step_errors, by_source = [], [], [], {}
    for r in csv.DictReader(TORCHTITAN_RUNS.open()):
        device_name = r["cluster"].removeprefix("dgx-").upper()
        changed = "; ".join(x for x in (r["overrides"], r["options"]) if x)
        label = (f"{Path(r['launch']).stem} {r['gpus']}×{device_name} {changed or 'as written'}"
                 f"{' (assumed: ' + r['assumed'].split(':')[0] + ')' if r['assumed'] else ''}")
        with tempfile.TemporaryDirectory() as folder:
            launch = with_overrides(ROOT / "bench" / "data" / r["launch"], r["overrides"], Path(folder))
            options = dict(option_of(o) for o in r["options"].split(";") if o)
            _, inputs, _, _, p = priced_launch(launch, None, int(r["gpus"]), r["cluster"], None, None, None, 0.1,
                                               None, None, 1.0, options=options)
        device = inputs.cluster.node_groups[0].hardware.memory_bytes / 2**30
        peak = max(s.memory_bytes for s in p.stages) / 2**30
        called_oom = peak > device
        verdict = "OOM called" if called_oom and r["outcome"] == "oom" else (
            "missed OOM" if r["outcome"] == "oom" else "completed run priced above its memory" if called_oom else "fits, as it ran")
        if verdict in ("missed OOM", "completed run priced above its memory"):
            wrong.append(label)
        if r["measured_peak_GiB"]:
            memory_errors.append(peak / float(r["measured_peak_GiB"]) - 1)
            verdict += f"; peak {memory_errors[-1]:+.1%}"
        if r["step_s"]:
            step_errors.append(p.step_time_s / float(r["step_s"]) - 1)
            by_source.setdefault(r["source"], []).append(abs(step_errors[-1]))
            verdict += f"; step {step_errors[-1]:+.1%}"
        measured_s = f"{float(r['step_s']):.2f}" if r["step_s"] else "—"
        predicted_s = f"{p.step_time_s:.2f}" if r["outcome"] == "completed" else "—"
        measured = f"{float(r['measured_peak_GiB']):.1f}" if r["measured_peak_GiB"] else "—"
        lines.append(f"| {label} | {r['outcome']} | {measured_s} | {predicted_s} | {measured} | {peak:.1f} ({device:.0f}) | {verdict} |")
    return lines + ["", f"torchtitan MoE: {len(wrong)} outcome{'s' if len(wrong) != 1 else ''} missed"
                        f"{' (' + ', '.join(wrong) + ')' if wrong else ''}; measured peaks "
                        + (", ".join(f"{e:+.1%}" for e in memory_errors) or "none") + "; steps "
                        + (", ".join(f"{e:+.1%}" for e in step_errors) or "none") + "."] + ([
        "", f"torchtitan MoE steps: median |error| {statistics.median(abs(e) for e in step_errors):.1%} "
            f"({len(step_errors)} rows; nothing fitted on them). By source: "
            + "; ".join(f"{source} {statistics.median(errors):.1%} ({len(errors)})" for source, errors in by_source.items())
            + "."] if step_errors else [])


def dropless_lines(rows: list[dict]) -> list[str]:
    """The rows measured both force-balanced and dropless (real routing): the slowdown dropless costs, and
    the `--expert-imbalance` at which gplan prices the same slowdown over its own forced-balance prediction
    (bisection) — a published value to state for dropless runs of that kind."""
    lines = ["| run | dropless / forced balance, measured | `--expert-imbalance` that prices it |", "|---|---:|---:|"]
    for r in (r for r in rows if r["dropless_step_s"]):
        slowdown = float(r["dropless_step_s"]) / float(r["step_s"])
        balanced, low, high = predicted_step_s(r), 1.0, 4.0
        for _ in range(24):
            middle = (low + high) / 2
            low, high = (middle, high) if predicted_step_s(r, middle) / balanced < slowdown else (low, middle)
        lines.append(f"| {r['model']} seq {r['seq_length']} ep{r['ep']} | {slowdown:.3f} | {(low + high) / 2:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    from readme_section import table_main

    return table_main(__doc__.splitlines()[0], table, BEGIN, END, argv)


if __name__ == "__main__":
    sys.exit(main())
