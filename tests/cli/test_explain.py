"""`gplan explain`: stage breakdown, binding constraints, runner-ups, what-ifs, schedule picture."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    from typer.testing import CliRunner

    from gplan.cli import app

    out = tmp_path_factory.mktemp("explain") / "plan.json"
    r = CliRunner().invoke(app, ["search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
                                 "--out", str(out)])
    assert r.exit_code == 0
    return out


def test_explain_prints_stages_findings_picture_and_runner_ups(gplan, searched):
    r = gplan("explain", str(searched))
    assert r.code == 0 and r.stdout == ""
    for part in ("stages", "what binds", "pipeline schedule", "runner-ups (recorded by the search)"):
        assert part in r.stderr
    plan = json.loads(searched.read_text())
    assert r.stderr.count("stage  ") >= plan["parallel"]["pp"]


def test_explain_json_names_memory_first_and_runner_ups_slower(gplan, searched):
    data = gplan("explain", str(searched), "--json").json()
    plan = json.loads(searched.read_text())
    assert data["findings"][0]["constraint"] == "memory"
    assert [f for f in data["findings"] if f["binds"]], "something always binds"
    ups = data["runner_ups"]["plans"]
    assert len(ups) == len(plan["search"]["runner_ups"]) > 0
    assert all(u["step_time_s"] >= data["step_time_s"] for u in ups)
    assert data["simulated_pipeline_s"] >= max(s["time_s"] for s in plan["prediction"]["stages"]) * plan["parallel"]["num_microbatches"] - 1e-9


def test_what_if_more_devices_finds_a_faster_plan(gplan, searched):
    data = gplan("explain", str(searched), "--what-if", "devices=128", "--json").json()["what_if"]
    assert data["devices"] == 128
    best = data["best"]["prediction"]["step_time_s"]
    assert best < data["this_plan"]["step_time_s"]


def test_what_if_faster_links_never_slows_the_plan(gplan, searched):
    data = gplan("explain", str(searched), "--what-if", "inter_node_bandwidth=2x", "--json").json()
    assert data["what_if"]["this_plan"]["step_time_s"] <= data["step_time_s"] * (1 + 1e-12)
    assert data["what_if"]["best"]["prediction"]["step_time_s"] <= data["what_if"]["this_plan"]["step_time_s"] * (1 + 1e-12)


def test_what_if_less_memory_says_when_this_plan_no_longer_fits(gplan, searched):
    data = gplan("explain", str(searched), "--what-if", "memory=0.8x", "--json").json()["what_if"]
    assert data["this_plan"]["fits"] is False
    assert data["best"]["prediction"]["fits"] is True


def test_svg_is_refused_for_the_plotly_report(gplan, searched, tmp_path):
    """The hand-drawn SVG schedule is gone (charts are plotly's, in --report): --svg says where the picture
    went, exit 2, and writes nothing."""
    svg = tmp_path / "schedule.svg"
    result = gplan("explain", str(searched), "--svg", str(svg))
    assert result.code == 2 and "--report" in result.stderr and "schedule.html" in result.stderr
    assert not svg.exists()


def test_plan_without_search_record_gets_runner_ups_from_a_fresh_search(gplan, tmp_path):
    from gplan.planner.inputs import resolve_inputs
    from gplan.plan import write_plan
    from gplan.planner.build import make_plan
    from gplan.spec.parallel import ParallelConfig

    inputs = resolve_inputs("llama3-8b", 8, "dgx-a100-80g")
    out = tmp_path / "hand.json"
    write_plan(make_plan(inputs.model, inputs.training, inputs.cluster,
                         ParallelConfig(dp=4, tp=2, pp=1, zero=1, recompute="full")), out)
    data = gplan("explain", str(out), "--json").json()
    assert data["runner_ups"]["source"].startswith("from a fresh search")
    assert data["runner_ups"]["plans"]
    memory = data["findings"][0]
    assert memory["constraint"] == "memory" and memory["binds"] is True  # every layer recomputes


@pytest.mark.parametrize("what_if", ["bandwidth=2x", "devices", "devices=abc", "memory=-1x"])
def test_bad_what_if_is_one_line_exit_3(gplan, searched, what_if):
    r = gplan("explain", str(searched), "--what-if", what_if)
    assert r.code == 3
    assert r.stderr.startswith("error:") and "hint:" in r.stderr and "Traceback" not in r.stderr


def test_the_interleaved_picture_tells_forward_backward_and_chunks_apart(gplan, tmp_path):
    """Forward a digit, backward a letter (readable without colour); each virtual chunk its own colour,
    named in the legend."""
    from gplan.cost_models.timeline import Op
    from gplan.render import BACKWARD_STYLES, FORWARD_STYLES, timeline_cell, timeline_legend, timeline_text

    ops = [Op(0, "F", 3, 1, 0.0, 1.0), Op(0, "B", 3, 1, 1.0, 2.0), Op(1, "F", 3, 0, 1.0, 2.0)]
    assert timeline_cell(ops[0]) == ("3", FORWARD_STYLES[1]) and timeline_cell(ops[1]) == ("d", BACKWARD_STYLES[1])
    lines = timeline_text(ops, 2, 8)
    assert lines[0].plain == "stage  0 3333dddd" and lines[1].plain == "stage  1 ····3333"
    assert {str(span.style) for span in lines[0].spans} == {FORWARD_STYLES[1], BACKWARD_STYLES[1]}
    assert "F2" in timeline_legend(2).plain and "B2" in timeline_legend(2).plain
    path = tmp_path / "v.json"
    assert gplan("search", "llama3-8b", "--devices", "16", "--pp", "4", "--vpp", "2", "--gbs", "32",
                 "--out", str(path)).code == 0
    text = gplan("explain", str(path)).stderr
    assert "2 chunks per rank" in text and "F1" in text and "B2" in text
    rows = [line for line in text.splitlines() if line.startswith("stage  0 ")]
    assert any(ch.isdigit() for ch in rows[0][9:]) and any(ch in "abcdefghij" for ch in rows[0][9:])


@pytest.mark.parametrize("ep, said", [(1, "most of it the MoE layers' host time"), (8, "most of it ep_comm")])
def test_a_costly_exposed_term_is_named_for_what_it_is(ep, said):
    """The search's warning names the term that idles the step and what shrinks it: at ep 1 the MoE layers' ep_comm
    is no traffic but the time they wait on the host (torchtitan's 6.7 ms a pass), so a smaller ep is no remedy."""
    from gplan.cost_models.step import predict
    from gplan.planner.explain import large_costs
    from gplan.planner.inputs import resolve_inputs
    from gplan.spec.parallel import ParallelConfig, even_stage_sizes, layout_from_sizes

    inputs = resolve_inputs("qwen3-30b-a3b", 32, "dgx-h100", gbs=256, seq_length=4096, target="torchtitan")
    config = ParallelConfig(dp=32, ep=ep, zero=3, mbs=1, recompute="full")
    model = inputs.model
    layouts = layout_from_sizes(model, even_stage_sizes(model.total_layers, 1, 1), ["full"])
    prediction = predict(model, inputs.training, inputs.cluster, config, layouts)
    assert prediction.breakdown.ep_comm / prediction.step_time_s > 0.2  # the term that idles the step
    lines = large_costs(config, prediction)
    assert len(lines) == 1 and said in lines[0]
    assert ("a smaller ep" in lines[0]) == (ep > 1)
