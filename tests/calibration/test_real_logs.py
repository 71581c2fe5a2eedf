"""Real engine logs (tests/data/logs, sources in its SOURCES.md): the configuration gplan reads from each
is the one stated beside it, exactly — degrees, batch, sequence, precision, recompute, the model's shape
— and what the log cannot support (iterations all skipped) is refused, not guessed."""

from __future__ import annotations

import re
from pathlib import Path

from gplan.calibration.runs import launch_plan
from gplan.cost_models.step import StepModel
from gplan.planner.launch_files import read_launch, read_log_launch
from gplan.planner.logs.megatron import arguments_block, model_from_args
from gplan.plan import layouts_of
from gplan.profiles.catalogue import load_model

LOGS = Path(__file__).parents[1] / "data" / "logs"
MEGATRON_2021 = LOGS / "megatron_gpt_13b_tp2_pp4_fp16_2021.log"


def stated_degrees(text: str) -> dict[str, int]:
    """The degrees Megatron states on its first line, beside the arguments block."""
    found = re.search(r"using world size: (\d+), data-parallel-size: (\d+), tensor-model-parallel size: (\d+), "
                      r"pipeline-model-parallel size: (\d+)", text)
    return dict(zip(("world", "dp", "tp", "pp"), map(int, found.groups())))


def stated_parameters(text: str) -> dict[int, set[int]]:
    """Parameters per pipeline stage, as Megatron counted them on each (tensor, pipeline) rank."""
    counts: dict[int, set[int]] = {}
    for _tp, pp, n in re.findall(r"model parallel rank \((\d+), (\d+)\): (\d+)", text):
        counts.setdefault(int(pp), set()).add(int(n))
    return counts


def test_a_2021_megatron_log_gives_the_configuration_it_states():
    text = MEGATRON_2021.read_text()
    args = arguments_block(text, MEGATRON_2021)
    model = model_from_args(args, "logged")
    launch = read_log_launch(MEGATRON_2021, model, text)
    plan = launch_plan(launch, model, "dgx-a100-80g", None, None)
    c, t = plan.parallel, plan.training
    assert {"world": plan.world_size, "dp": c.dp, "tp": c.tp, "pp": c.pp} == stated_degrees(text)
    assert (c.cp, c.vpp, c.sp, c.mbs, c.zero, t.gbs, t.seq_length) == (1, 1, False, 1, 0, 1024, 2048)
    assert t.precision == "fp16" and t.engine == "megatron"
    assert {c.recompute for s in layouts_of(plan) for c in s.layers} == {"full"}  # --checkpoint-activations: every layer
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.ffn_size) == (40, 5120, 40, 20480)
    assert (model.vocab_size, model.position_embedding, model.bias, model.tie_embeddings, model.dropout) == \
        (50432, "learned", True, True, 0.1)  # the padded vocabulary the log prints; GPT-2-era biases, dropout


def test_the_parameters_per_stage_equal_megatrons_count_on_every_rank():
    """Megatron printed the parameters each (tensor, pipeline) rank holds: gplan's stages hold the same,
    to the parameter (embedding and position table on the first, the tied head copy on the last)."""
    text = MEGATRON_2021.read_text()
    model = model_from_args(arguments_block(text, MEGATRON_2021), "logged")
    plan = launch_plan(read_log_launch(MEGATRON_2021, model, text), model, "dgx-a100-80g", None, None)
    step = StepModel(plan.model, plan.training, plan.cluster, plan.parallel)
    stated = stated_parameters(text)
    assert {i: {round(step.stage_params(s))} for i, s in enumerate(layouts_of(plan))} == stated


def test_from_a_log_prices_its_configuration_with_the_bundled_model(gplan):
    """`estimate --from LOG` takes the configuration the log ran; the bundled gpt-13b (vocabulary padded for
    tp 1) is the log's model, its vocabulary within Megatron's padding for tp 2."""
    launch = read_launch(MEGATRON_2021, load_model("gpt-13b"))
    assert (launch.engine, launch.given["tp"], launch.given["pp"], launch.gbs, launch.world_size) == \
        ("megatron", 2, 4, 1024, 8)
    r = gplan("estimate", "gpt-13b", "--from", str(MEGATRON_2021), "--cluster", "dgx-a100-80g", "--json")
    assert r.code == 0, r.stderr
    assert '"tp": 2' in r.stdout and '"pp": 4' in r.stdout


def test_calibrating_on_a_log_whose_iterations_were_all_skipped_is_refused(gplan, tmp_path):
    """fp16's loss-scale search skipped every logged iteration: no step of that log updated the model, so
    it says nothing of the steady step — refused, naming why."""
    r = gplan("calibrate", str(MEGATRON_2021), "--cluster", "dgx-a100-80g", "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "skipped" in r.stderr and not (tmp_path / "p.yaml").exists()


def test_a_log_of_another_model_is_refused(gplan):
    r = gplan("estimate", "llama2-13b", "--from", str(MEGATRON_2021), "--cluster", "dgx-a100-80g")
    assert r.code == 3 and "ffn_size" in r.stderr


TITAN_2025 = LOGS / "torchtitan_llama3_8b_cp2_flex_2025.log"


def test_a_torchtitan_log_without_its_config_is_read_with_the_launch_beside_it():
    """torchtitan prints no job config by default: the PR's own command (NGPU=4, llama3_8b.toml, flavor
    8B_flex_attn, full AC, cp 2) beside the log says what ran — FSDP over the 2 ranks cp leaves, local
    batch 1 each."""
    from gplan.calibration.runs import read_torchtitan_run

    run = read_torchtitan_run(TITAN_2025, "dgx-h100", None, None)
    c, t = run.plan.parallel, run.plan.training
    assert (run.plan.world_size, c.dp, c.cp, c.tp, c.pp, c.zero, c.recompute) == (4, 2, 2, 1, 1, 3, "full")
    assert (t.gbs, t.seq_length, t.precision, t.engine, run.plan.model.name) == (2, 8192, "bf16", "torchtitan", "llama3-8b")
    # every rank logged step 1 (warm-up, left out); step 10's 5,615 tokens/s per device is the steady step
    assert run.measured_step_s == 2 * 8192 / (5615 * 4)


def test_from_a_torchtitan_log_prices_the_launch_beside_it(gplan):
    r = gplan("estimate", "llama3-8b", "--from", str(TITAN_2025), "--cluster", "dgx-h100", "--json")
    assert r.code == 0, r.stderr
    c = r.json()["parallel"]
    assert (c["dp"], c["cp"], c["recompute"]) == (2, 2, "full")
