"""Real engine logs (tests/data/logs, sources in its SOURCES.md): the configuration gplan reads from each
is the one stated beside it, exactly — degrees, batch, sequence, precision, recompute, the model's shape
— and what the log cannot support (iterations all skipped) is refused, not guessed."""

from __future__ import annotations

import re

import pytest
from pathlib import Path

from gplan.calibration.runs import plan_of_launch
from gplan.cost_models.step import StepModel
from gplan.planner.launch_files import read_launch, read_log_launch
from gplan.engines.megatron.logs import arguments_block, model_from_args
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
    plan = plan_of_launch(launch, model, "dgx-a100-80g", None, None)
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
    plan = plan_of_launch(read_log_launch(MEGATRON_2021, model, text), model, "dgx-a100-80g", None, None)
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
    from gplan.calibration.runs import read_log_run

    run = read_log_run(TITAN_2025, "dgx-h100", None, None)
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


MDS_2023 = LOGS / "megatron_deepspeed_llama_1b_tp2_pp2_fp16_2023.log"


def test_a_megatron_deepspeed_log_gives_the_configuration_it_states():
    """A Llama-shaped 1.3B under Megatron-DeepSpeed (DeepSpeed 0.9.5): its arguments block (where
    `num_experts [1]` is a dense model) and the DeepSpeedEngine's JSON say what ran; priced as DeepSpeed
    runs it."""
    text = MDS_2023.read_text()
    args = arguments_block(text, MDS_2023)
    model = model_from_args(args, "logged")
    plan = plan_of_launch(read_log_launch(MDS_2023, model, text), model, "dgx-a100-80g", None, None)
    c, t = plan.parallel, plan.training
    assert {"world": plan.world_size, "dp": c.dp, "tp": c.tp, "pp": c.pp} == stated_degrees(text)
    assert (c.mbs, c.zero, c.sp, t.gbs, t.seq_length, t.precision, t.engine) == (4, 0, False, 32, 2048, "fp16",
                                                                                  "deepspeed")
    assert {c.recompute for s in layouts_of(plan) for c in s.layers} == {"none"}
    assert not model.is_moe and (model.num_layers, model.hidden_size, model.ffn_size, model.kv_heads) == (24, 2048, 5504, 16)
    assert (model.vocab_size, model.bias, model.tie_embeddings, model.norm) == (32000, False, False, "rmsnorm")
    step = StepModel(plan.model, plan.training, plan.cluster, plan.parallel)
    assert {i: {round(step.stage_params(s))} for i, s in enumerate(layouts_of(plan))} == stated_parameters(text)


def test_steps_deepspeed_skipped_are_left_out_though_megatrons_line_counts_none():
    """Megatron-DeepSpeed's iteration line says 0 skipped while DeepSpeed's engine skipped step 2500 (an
    fp16 overflow: `step=2500, skipped=1586` after 1585): the steady step leaves it out with the warm-up
    interval, the median of iterations 2, 3, 2498 and 2499."""
    from gplan.engines.megatron.logs import read_megatron_log

    log = read_megatron_log(MDS_2023)
    assert log.intervals == 4 and log.step_s == (1250.2 + 1210.3) / 2 / 1000


def test_from_the_real_megatron_deepspeed_log_prices_its_layout(gplan, tmp_path):
    """`estimate MODEL --from LOG`, MODEL the 1.3B written as a model.yaml: the log's layout, priced as
    DeepSpeed runs it."""
    import yaml

    model = model_from_args(arguments_block(MDS_2023.read_text(), MDS_2023), "llama-1.3b")
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in model.model_dump(mode="json").items() if v is not None}))
    r = gplan("estimate", str(path), "--from", str(MDS_2023), "--cluster", "dgx-a100-80g", "--json")
    assert r.code == 0, r.stderr
    data = r.json()
    assert data["engine"] == "deepspeed" and (data["parallel"]["tp"], data["parallel"]["pp"], data["parallel"]["dp"]) == (2, 2, 2)


MINDFORMERS_2025 = LOGS / "mindformers_llama2_13b_dp8_2025.log"


def test_a_mindformers_log_is_read_with_the_yaml_beside_it():
    """The MindSpore Transformers guide's worker_0.log lines, with the YAML it states beside them: Llama 2
    13B (SwiGLU width 13824 from `multiple_of`, as LlamaFeedForward builds it), dp 8 with optimizer
    parallelism, batch 4 per rank, every layer recomputed; the steady step after two warm-up steps."""
    from gplan.calibration.runs import read_log_run

    run = read_log_run(MINDFORMERS_2025, "atlas-800-910b", None, None)
    c, t, m = run.plan.parallel, run.plan.training, run.plan.model
    assert (run.plan.world_size, c.dp, c.tp, c.pp, c.mbs, c.zero) == (8, 8, 1, 1, 4, 1)
    assert (t.gbs, t.seq_length, t.precision, t.engine) == (32, 4096, "bf16", "mindformers")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.ffn_size, m.vocab_size) == (40, 5120, 40, 13824, 32000)
    assert {x.recompute for s in layouts_of(run.plan) for x in s.layers} == {"full"}
    assert run.measured_step_s == 1.756


def test_a_step_faster_than_the_hardware_allows_is_refused_not_fitted(gplan, tmp_path):
    """That guide's steps (1.75 s, its own counter: ~170 TFLOP/s per NPU) are far shorter than 32 × 4096
    tokens of a 13B model take at the 910B's peak: the YAML beside it is not the job that wrote the log,
    and calibrating on it would teach the profile an impossible speed. Refused, naming why."""
    import shutil

    for name in ("a", "b"):
        shutil.copy(MINDFORMERS_2025, tmp_path / f"{name}.log")
        shutil.copy(MINDFORMERS_2025.with_suffix(".yaml"), tmp_path / f"{name}.yaml")
    r = gplan("calibrate", str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--cluster", "atlas-800-910b",
              "--out", str(tmp_path / "p.yaml"))
    assert r.code == 3 and "above" in r.stderr and "peak" in r.stderr and not (tmp_path / "p.yaml").exists()


def test_estimate_from_a_log_shows_its_measured_step_beside_the_prediction(gplan, tmp_path):
    """The log's own step (the one `gplan calibrate` reads), and one log calibrates the compute speed."""
    from gplan.calibration.runs import read_any_run

    run = read_any_run(TITAN_2025, "dgx-h100", None, None)
    data = gplan("estimate", "llama3-8b", "--from", str(TITAN_2025), "--cluster", "dgx-h100", "--json").json()
    assert data["measured_step_s"] == pytest.approx(run.measured_step_s, rel=1e-9)
    text = gplan("estimate", "llama3-8b", "--from", str(TITAN_2025), "--cluster", "dgx-h100").stderr
    assert "the log's measured step" in text
    r = gplan("calibrate", str(TITAN_2025), "--cluster", "dgx-h100", "--out", str(tmp_path / "c.yaml"), "--json")
    assert r.code == 0 and r.json()["fitted"] == ["compute_scale"]
