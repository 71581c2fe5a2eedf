"""`gplan search`: ranked table, plan.json written and reproducible, exit 4 when nothing fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gplan.plan import read_plan
from helpers import mixed_cluster_file


def test_search_writes_a_plan_that_validates_and_estimate_reproduces(gplan, tmp_path):
    out = tmp_path / "plan.json"
    r = gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512", "--out", str(out))
    assert r.code == 0 and r.stdout == ""
    assert "MFU" in r.stderr and "wrote" in r.stderr
    assert gplan("validate", str(out)).code == 0
    plan = json.loads(out.read_text())
    par = plan["parallel"]
    assert plan["provenance"]["solver"]["status"] in ("optimal", "none")
    assert par["dp"] * par["tp"] * par["pp"] * par["cp"] == sum(r["count"] for r in plan["placement"]["stage_devices"])
    reproduced = gplan("estimate", str(out), "--json").json()
    assert reproduced == plan["prediction"]


def test_estimate_with_the_plans_flags_reproduces_a_uniform_plan(gplan, tmp_path):
    out = tmp_path / "plan.json"
    assert gplan("search", "llama3-8b", "--devices", "8", "--recompute", "none", "--pp", "1", "--out", str(out)).code == 0
    plan = json.loads(out.read_text())
    par = plan["parallel"]
    flags = [f"--{k}={par[k]}" for k in ("dp", "tp", "pp", "vpp", "cp", "mbs", "zero")] + (["--sp"] if par["sp"] else [])
    est = gplan("estimate", "llama3-8b", "--devices", str(sum(r["count"] for r in plan["placement"]["stage_devices"])),
                "--gbs", str(plan["training"]["gbs"]), *flags, "--json").json()
    assert est["step_time_s"] == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-12)


def test_search_json_ranks_plans(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--out", str(tmp_path / "p.json"), "--json", "--top", "3")
    assert r.code == 0
    data = r.json()
    times = [c["prediction"]["step_time_s"] for c in data["ranked"]]
    assert times == sorted(times) and 1 <= len(times) <= 3
    assert all(c["prediction"]["fits"] for c in data["ranked"])


def test_the_best_plan_beats_the_megatron_heuristic(gplan, tmp_path):
    from gplan.cost_models.step import StepModel
    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.reference import megatron_heuristic

    r = gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
              "--out", str(tmp_path / "p.json"), "--json")
    best = r.json()["ranked"][0]["prediction"]["step_time_s"]
    inputs = resolve_inputs("llama3-70b", 64, "dgx-h100", gbs=512)
    config = megatron_heuristic(inputs.model, inputs.training, inputs.cluster, 64)
    assert best <= StepModel(inputs.model, inputs.training, inputs.cluster, config).predict().step_time_s


def test_limits_are_respected(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "16", "--tp", "2", "--pp", "2", "--recompute", "full",
              "--out", str(tmp_path / "p.json"), "--json")
    assert r.code == 0
    for c in r.json()["ranked"]:
        assert c["parallel"]["tp"] == 2 and c["parallel"]["pp"] == 2
        assert all(l["recompute"] == "full" for stage in c["stage_layers"] for l in stage)


def test_model_that_cannot_fit_exits_4_with_the_least_change(gplan, tmp_path):
    r = gplan("search", "gpt-1t", "--cluster", "dgx-a100-80g", "--devices", "8", "--gbs", "64",
              "--out", str(tmp_path / "p.json"))
    assert r.code == 4
    assert "does not fit" in r.stderr and "needs ≥" in r.stderr and "devices of a100-80g" in r.stderr
    assert not (tmp_path / "p.json").exists()


def test_contradictory_limits_exit_4(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--tp", "3", "--out", str(tmp_path / "p.json"))
    assert r.code == 4 and "no configuration of 8 devices" in r.stderr


def test_unfactorable_request_exit_4(gplan, tmp_path):
    r = gplan("search", "llama3-8b", "--devices", "8", "--dp", "3", "--all-devices", "--out", str(tmp_path / "p.json"))
    assert r.code == 4


def test_bad_limit_syntax_exit_3(gplan, tmp_path):
    assert gplan("search", "llama3-8b", "--devices", "8", "--tp", "two").code == 3
    assert gplan("search", "llama3-8b", "--devices", "8", "--recompute", "some").code == 3


def test_heterogeneous_cluster_file_uses_both_groups(gplan, tmp_path):
    cluster = mixed_cluster_file(tmp_path / "mixed.yaml", nodes=4)
    out = tmp_path / "p.json"
    r = gplan("search", "llama2-13b", "--cluster", str(cluster), "--gbs", "256", "--precision", "fp16",
              "--pp", "2,4", "--out", str(out))
    assert r.code == 0, r.stderr
    plan = json.loads(out.read_text())
    groups = [s["node_group"] for s in plan["stages"]]
    assert set(groups) == {0, 1}
    per_group = {g: sum(s["layer_end"] - s["layer_start"] for s in plan["stages"] if s["node_group"] == g) /
                 groups.count(g) for g in (0, 1)}
    assert per_group[0] > per_group[1]  # the A100 stages carry more layers each
    devices = read_plan(out).rank_devices()
    for s in plan["stages"]:
        ranks = range(s["first_rank"], s["first_rank"] + s["num_ranks"])
        assert {devices[r].node_group for r in ranks} == {s["node_group"]}
    # the header names both kinds of device, not "64 × a100-80g"
    assert "32 × a100-80g + 32 × v100-32g" in " ".join(r.stderr.split())
    # memory against each stage's own budget, not the largest stage beside the V100's smaller budget
    said = " ".join(gplan("estimate", str(out)).stderr.split())
    assert "of its budget at most" in said and "— fits" in said


def test_a_megatron_search_says_it_priced_tp_overlapped_and_a_torch_one_does_not(gplan, tmp_path):
    """The overlap the prediction takes (and the Megatron export turns on) is shown, not silent."""
    args = ["search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "2", "--pp", "1"]
    megatron = gplan(*args, "--target", "megatron", "--precision", "fp8", "--out", str(tmp_path / "m.json"))
    assert megatron.code == 0 and "tp's collectives priced overlapped with the GEMMs" in " ".join(megatron.stderr.split())
    torch = gplan(*args, "--target", "torch", "--out", str(tmp_path / "t.json"))
    assert torch.code == 0 and "priced overlapped" not in torch.stderr


def test_a_search_reports_its_progress_on_a_terminal_past_its_delay():
    """The search calls its progress with every candidate it visits (visited of total, splits solved,
    the best step so far); `SearchProgress` shows that as one line on a terminal once the search has run
    past its delay, and nothing on a log or before the delay."""
    import io

    from rich.console import Console

    from gplan.planner.inputs import resolve_inputs
    from gplan.planner.search import search
    from gplan.render import SearchProgress

    calls = []
    inputs = resolve_inputs("llama3-8b", 8, "dgx-a100-80g")
    result = search(inputs.model, inputs.training, inputs.cluster, 8, progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == list(range(1, len(calls) + 1)) and all(c[1] == calls[0][1] for c in calls)
    assert calls[-1][2] <= result.solved and calls[-1][3] >= result.best.prediction.step_time_s
    assert all(b is None or a is None or b <= a for (*_, a), (*_, b) in zip(calls, calls[1:]))  # best only improves

    def shown(terminal: bool, after_s: float) -> str:
        out = io.StringIO()
        with SearchProgress(Console(file=out, force_terminal=terminal, color_system=None, width=120), after_s=after_s) as progress:
            progress(3, 10, 1, 12.5)
        return out.getvalue()

    assert "searching: 3/10 candidates by bound, 1 splits solved, best 12.50 s" in shown(True, 0.0)
    assert shown(False, 0.0) == "" and shown(True, 60.0) == ""


def test_your_own_hardware_file_changes_only_what_it_says_and_the_header_names_it(gplan, tmp_path):
    """--hardware FILE.yaml: a bundled base with the numbers changed (memory, power-capped peak), the base's
    links; the header lists every changed number; the memory budget is the file's."""
    from gplan.planner.inputs import resolve_inputs

    hardware = Path(__file__).parents[2] / "bench" / "data" / "h100-96g-500w.yaml"
    inputs = resolve_inputs("llama3-8b", 16, None, str(hardware))
    device = inputs.cluster.node_groups[0].hardware
    assert (device.name, device.memory_GiB, device.peak_tflops["bf16"], device.peak_tflops["fp8"]) == (
        "h100-96g-500w", 96, 800, 1979)  # fp8 not in the file: the base's
    assert inputs.cluster.node_groups[0].intra_node.bandwidth_GBps == 450  # dgx-h100's NVLink
    r = gplan("estimate", "llama3-8b", "--hardware", str(hardware), "--devices", "16", "--tp", "2")
    said = " ".join((r.stdout + r.stderr).split())
    assert r.code == 0 and "hardware h100-96g-500w from" in said and "memory_GiB 80 → 96" in said
    assert "peak_tflops.bf16 989 → 800" in said and "72.0 GiB budget" not in said  # 96 GiB × 0.9 = 86.4


@pytest.mark.parametrize("text, fragment", [
    ("base: h100-sxm\nmemory_GB: 96\n", "memory_GB"),
    ("name: mine\nkind: gpu\nmemory_GiB: 40\n", "no bundled links"),
    ("base: h100-sm\n", "unknown hardware 'h100-sm'"),
])
def test_a_hardware_file_gplan_cannot_use_is_one_line(gplan, tmp_path, text, fragment):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    r = gplan("estimate", "llama3-8b", "--hardware", str(path), "--devices", "8")
    assert r.code == 3 and fragment in r.stderr and "Traceback" not in r.stderr, r.stderr
