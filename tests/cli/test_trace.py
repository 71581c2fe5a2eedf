"""`gplan explain --trace`: the predicted step in the Trace Event format, checked against the format
(types, microseconds, tracks without overlaps, counters in time order, paired flows) and against the
plan it came from (the step, each stage's compute and memory)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from golden import INSTANCES
from gplan.plan import read_plan
from gplan.planner.build import repredict
from gplan.planner.trace import predicted_trace, trace_totals

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The golden search instances' plans (dense, interleaved, MoE, heterogeneous), searched once."""
    from typer.testing import CliRunner

    from gplan.cli import app

    folder, plans = tmp_path_factory.mktemp("trace"), {}

    def plan_of(name: str) -> Path:
        if name not in plans:
            out = folder / f"{name}.json"
            r = CliRunner().invoke(app, ["search", *INSTANCES[name], "--out", str(out)])
            assert r.exit_code == 0, r.stderr
            plans[name] = out
        return plans[name]

    return plan_of


def check_trace_format(trace: dict) -> None:
    """What Perfetto and chrome://tracing need of a JSON trace, and what makes it readable: every event
    typed, times in µs as numbers, no two slices overlapping on one track, each counter in time order,
    every flow started once and finished once, no earlier than it started."""
    assert trace["displayTimeUnit"] in ("ms", "ns") and trace["otherData"]["time_unit"] == "us"
    slices, counters, flows = defaultdict(list), defaultdict(list), defaultdict(dict)
    named_threads = set()
    for e in trace["traceEvents"]:
        assert e["ph"] in ("M", "X", "C", "s", "f"), e
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["dur"] >= 0 and e["name"] and e["cat"]
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert all(isinstance(v, (int, float)) and v >= 0 for v in e["args"].values())
            counters[e["pid"], e["name"]].append(e["ts"])
        else:
            assert e["id"] not in flows[e["ph"]], "a flow id used twice"
            flows[e["ph"]][e["id"]] = e
    for track, spans in slices.items():
        assert track in named_threads, f"track {track} has no name"
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-6, f"slices overlap on track {track}"
    for times in counters.values():
        assert times == sorted(times)
    assert flows["s"].keys() == flows["f"].keys()
    for flow_id, start in flows["s"].items():
        assert flows["f"][flow_id]["ts"] >= start["ts"] - 1e-3 and flows["f"][flow_id].get("bp") == "e"


@pytest.mark.parametrize("name", ["dense-llama3-70b-h100-64", "interleaved-gpt3-175b-a100-1024",
                                  "moe-mixtral-8x7b-h100-64", "heterogeneous-llama3-8b-a100-v100"])
def test_the_trace_adds_up_to_the_plan(name, searched):
    plan = read_plan(searched(name))
    prediction = repredict(plan)
    trace = predicted_trace(plan)
    check_trace_format(trace)
    totals = trace_totals(trace)
    m = prediction.num_microbatches
    assert sorted(totals) == list(range(plan.parallel.pp)), "one process per stage"
    for stage in prediction.stages:
        t = totals[stage.index]
        # µs, and the step ends where the plan says
        assert t["by_category_us"]["step"] == pytest.approx(prediction.step_time_s * 1e6, rel=1e-9)
        assert max(t["end_us"] for t in totals.values()) == pytest.approx(prediction.step_time_s * 1e6, rel=1e-9)
        compute_us = t["by_category_us"]["forward"] + t["by_category_us"]["backward"]
        assert compute_us == pytest.approx(m * (stage.forward_s + stage.backward_s) * 1e6, rel=1e-9)
        assert t["by_category_us"].get("pp_comm", 0) == pytest.approx(m * stage.pp_comm_s * 1e6, rel=1e-9)
        assert t["memory_peak_GiB"] == pytest.approx(stage.memory_bytes / GIB, rel=1e-9)
    assert trace["otherData"]["pipeline_simulated_s"] <= trace["otherData"]["pipeline_formula_s"] * (1 + 1e-9)


def test_pipeline_sends_are_flows_between_neighbour_stages(searched):
    plan = read_plan(searched("interleaved-gpt3-175b-a100-1024"))
    trace = predicted_trace(plan)
    starts = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    pp, m, v = plan.parallel.pp, plan.parallel.num_microbatches, plan.parallel.vpp
    # forward: each micro-batch crosses pp·v − 1 virtual-stage boundaries, the backward as many back
    assert len(starts) == 2 * m * (pp * v - 1)
    hops = {(s["pid"], ends[s["id"]]["pid"]) for s in starts}
    assert all((b - a) % pp in (1, pp - 1) for a, b in hops), "only neighbours (and the chunk wrap-around) send"


def test_every_rank_on_request(gplan, tmp_path):
    out, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    assert gplan("search", "tiny-llama", "--cluster", "local-cpu", "--devices", "4", "--pp", "2", "--dp", "2",
                 "--out", str(out)).code == 0
    r = gplan("explain", str(out), "--trace", str(trace), "--trace-ranks", "all")
    assert r.code == 0 and f"wrote {trace}" in r.stderr.replace("\n", "")
    document = json.loads(trace.read_text())
    check_trace_format(document)
    assert sorted(trace_totals(document)) == [0, 1, 2, 3]
    names = {e["pid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    assert names[3].startswith("rank 3 (stage 1")


def test_a_16384_device_plan_traces(gplan, tmp_path):
    out, trace = tmp_path / "plan.json", tmp_path / "trace.json"
    assert gplan("search", "llama3-405b", "--cluster", "dgx-h100", "--devices", "16384", "--gbs", "2048",
                 "--out", str(out)).code == 0
    assert gplan("explain", str(out), "--trace", str(trace), "--json").code == 0
    document = json.loads(trace.read_text())
    check_trace_format(document)
    plan = read_plan(out)
    assert plan.world_size == 16384
    ends = [t["end_us"] for t in trace_totals(document).values()]
    assert max(ends) == pytest.approx(plan.prediction.step_time_s * 1e6, rel=1e-6)
    # every rank of 16,384 is more than a viewer opens: refused, nothing half-written
    every = tmp_path / "every.json"
    r = gplan("explain", str(out), "--trace", str(every), "--trace-ranks", "all")
    assert r.code == 3 and "every rank of a stage runs the same step" in r.stderr and "Traceback" not in r.stderr
    assert not every.exists()


def test_bad_trace_options_are_one_line(gplan, tmp_path, searched):
    plan = searched("interleaved-gpt3-175b-a100-1024")
    r = gplan("explain", str(plan), "--trace", str(tmp_path / "t.json"), "--trace-ranks", "some")
    assert r.code == 2 and "--trace-ranks some" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "t.json").exists(), "nothing half-written"
